"""``vm-simulator [SCENARIO.yaml] [--out DIR] [--no-plot] [--seed N] [--processes N]``.

Shell: reads the scenario, shows a progress bar on a terminal, prints the summary table and
writes the JSON report and the PNG plot, printing their paths. All decisions are in
``simulator.engine``; this module only moves bytes and measures wall time (which it prints,
never puts in the report, so reports of the same scenario stay identical). A scenario whose
nodes share nothing runs split by node over ``--processes`` (``simulator.split``: the same
report, byte for byte); any other runs in this process, with the progress bar.

Exit status: 0 when every invariant held, 1 when one broke (the table says which, when and
what happened before), 3 for a scenario that cannot run (every error with its ``$.path``),
2 for a bad command line (``observability.exits``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final, TextIO

import msgspec

from observability.exits import EXIT_CODES_HELP, ExitCode, OneLineParser
from simulator import plot
from simulator.builtin import default_scenario
from simulator.engine import simulate
from simulator.report import encode_report, format_table
from simulator.scenario import Scenario, ScenarioError, load_scenario_file
from simulator.split import node_parts, simulate_split

EXIT_OK: Final = 0
EXIT_VIOLATION: Final = 1
EXIT_SCENARIO: Final = ExitCode.CONFIG
DEFAULT_OUT: Final = Path("out/simulate")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "scenario",
        nargs="?",
        type=Path,
        metavar="SCENARIO.yaml",
        help="scenario file (see examples/scenarios/); without it, the built-in scenario",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        metavar="DIR",
        help=f"where to write NAME.json and NAME.png (default: {DEFAULT_OUT})",
    )
    parser.add_argument("--no-plot", action="store_true", help="do not draw the PNG")
    parser.add_argument(
        "--seed", type=int, metavar="N", help="override the scenario's seed (backoff jitter)"
    )
    parser.add_argument(
        "--processes",
        type=_positive,
        default=len(os.sched_getaffinity(0)),
        metavar="N",
        help="split a scenario whose nodes share nothing over N processes by node (default:"
        " one per usable CPU; the report is the same for any N); 1: one process",
    )


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def build_parser(prog: str = "vm-simulator") -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=prog,
        description="Run the extender's and the agent's pure cores against a simulated fleet"
        " in virtual time; no cluster needed. Prints a summary table with a key, writes"
        " DIR/NAME.json (the report) and DIR/NAME.png (the plot). Paths are relative to the"
        " current directory.",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    return parser


class ProgressBar:
    """A one-line bar on stderr, redrawn at most ten times a second; only on a terminal."""

    def __init__(self, stream: TextIO, total_seconds: float) -> None:
        self._stream = stream
        self._total = total_seconds
        self._drawn_at = 0.0

    def __call__(self, t: float) -> None:
        now = time.monotonic()
        if now - self._drawn_at < 0.1 and t < self._total:
            return
        self._drawn_at = now
        done = min(1.0, t / self._total) if self._total else 1.0
        bar = "#" * int(done * 40)
        self._stream.write(f"\r[{bar:<40}] {done:4.0%}  {t:7.0f}s of {self._total:.0f}s simulated")
        self._stream.flush()

    def close(self) -> None:
        self._stream.write("\n")
        self._stream.flush()


def run(args: argparse.Namespace, *, stdout: TextIO, stderr: TextIO) -> int:
    try:
        scenario: Scenario = (
            load_scenario_file(args.scenario) if args.scenario is not None else default_scenario()
        )
    except ScenarioError as e:
        for error in e.errors:
            print(f"simulate: scenario error: {error}", file=stderr)
        return EXIT_SCENARIO
    if args.seed is not None:
        scenario = msgspec.structs.replace(scenario, seed=args.seed)
    # A split run has no progress to show (its parts report only when they end).
    is_split = node_parts(scenario, args.processes) is not None
    bar = (
        ProgressBar(stderr, scenario.duration_seconds) if stderr.isatty() and not is_split else None
    )
    progress: Callable[[float], None] | None = bar
    started = time.perf_counter()
    if is_split:
        report = simulate_split(scenario, parts=args.processes)
    else:
        report = simulate(scenario, progress=progress)
    wall = time.perf_counter() - started
    if bar is not None:
        bar.close()
    print(format_table(report), file=stdout)
    if report.relief is not None and scenario.relief is not None and report.relief.is_enabled:
        # The figure relief is judged by, against the same run without it (one more run).
        without = simulate(
            msgspec.structs.replace(
                scenario, relief=msgspec.structs.replace(scenario.relief, enabled=False)
            )
        ).relief
        assert without is not None
        print(
            f"without relief: cut-short VM-seconds {without.cut_short_vm_seconds:.0f} of"
            f" {without.vm_seconds:.0f} ({without.cut_short_share:.1%})",
            file=stdout,
        )
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / f"{scenario.name}.json"
    json_path.write_bytes(encode_report(report) + b"\n")
    print("", file=stdout)
    print(f"simulated {report.ended_at_seconds:.0f}s in {wall:.2f}s of wall time", file=stdout)
    print(f"report: {json_path}", file=stdout)
    if not args.no_plot:
        if plot.is_available():
            png_path = out / f"{scenario.name}.png"
            plot.write_plot(report, png_path)
            print(f"plot:   {png_path}", file=stdout)
        else:
            print(
                "plot:   skipped (matplotlib is not installed: pip install '.[plot]')", file=stdout
            )
    return EXIT_OK if report.is_ok else EXIT_VIOLATION


def main(argv: Sequence[str] | None = None, *, prog: str = "vm-simulator") -> int:
    args = build_parser(prog).parse_args(sys.argv[1:] if argv is None else argv)
    return run(args, stdout=sys.stdout, stderr=sys.stderr)
