"""The benchmarks' kit: what every ``scripts/bench_*.py`` shares, so that each measures its own
thing and nothing else differs between them.

- **The command.** ``command(doc)`` is the argparse parser every benchmark starts from: the
  description is the first paragraph of the script's docstring, the help ends with the exit
  statuses (``EXIT_STATUSES``). ``main(run)`` runs the benchmark's ``run()`` and turns its
  outcome into the exit status: what ``run`` returns (0 when it returns None); a
  ``BenchError`` (something the benchmark needs is missing or broke) is one line on stderr
  and 1; ^C is 130.
- **The output.** ``emit(result)`` prints the one JSON object on stdout (``to_json``: indented,
  every key in snake_case, checked: ``camel_keys``). Keys that are data (a mode such as
  ``cache@floor+pinned``, an API verb and resource, a process's or an exception's name) keep
  their own spelling; what is refused is a key in camelCase. ``snake_keys`` converts the
  product's wire structs (camelCase, as the API speaks) for a benchmark that reports one.
- **The figures.** ``percentile(values, q)`` by the nearest-rank rule, the one rule every
  benchmark uses (below); ``summary(samples, unit=...)`` is the latency block built on it:
  ``n``, ``p50_<unit>``, ``p99_<unit>`` (or the percentiles asked for), ``max_<unit>``,
  ``mean_<unit>``.
- **The CPUs.** ``split_cpus()``: the last CPU of this process's affinity for the process
  under test, the others for everything else (both the same on one CPU);
  ``spawning_on(cpus)`` starts children on ``cpus`` from their first instruction;
  ``pin_process(pid, cpus)`` moves a running process (every thread); ``cpus_in_force(pid)``
  reads back where the kernel lets it run.
- **The extender.** ``testkit.controlplane.Extender`` is the one way a benchmark starts the
  real ``scheduler-extender serve`` process (against an API server with a kubeconfig, or
  ``standalone`` from a cluster file); ``start_extender`` here starts one, on given CPUs.

Percentiles: the nearest-rank rule. ``percentile(values, q)`` is the smallest value ``v`` of
``values`` such that at least ``q`` percent of the values are ``<= v``: the value at rank
``ceil(q / 100 * n)`` (1-based) of the sorted values, the smallest for ``q == 0``. It is always
one of the values measured (never interpolated between two), ``q = 100`` is the maximum, and
the p99 of fewer than 100 samples is their maximum: a tail a run did not sample is not made up.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import signal
import statistics
import sys
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal, NoReturn

from testkit.controlplane import Extender

EXIT_STATUSES = (
    "Exit status: 0 when the benchmark ran and printed its JSON; 1 when something it needs is"
    " missing or broke (one line on stderr says what), or when a check of its own failed"
    " (the JSON says which); 2 for a bad option; 130 when interrupted."
)


class BenchError(Exception):
    """Something the benchmark needs is missing or broke; the message says what (and what to
    do). ``main`` prints it as one line on stderr and exits 1."""


# --- the command -------------------------------------------------------------------------------


def command(doc: str | None, *, prog: str | None = None) -> argparse.ArgumentParser:
    """The parser a benchmark adds its options to: ``doc``'s first paragraph as the
    description, the exit statuses at the end of ``--help``."""
    first = (doc or "").strip().split("\n\n")[0]
    return argparse.ArgumentParser(
        prog=prog,
        description=" ".join(first.split()),
        epilog=EXIT_STATUSES,
    )


def main(run: Callable[[], int | None], *, name: str | None = None) -> NoReturn:
    """Run a benchmark's ``run()`` and exit with its status (see ``EXIT_STATUSES``); ``name``
    (default: the script's) starts the line a ``BenchError`` prints."""
    name = name or Path(sys.argv[0]).stem
    # SIGTERM (``timeout``, a CI runner's cancel) ends the run as Ctrl-C does: through the
    # ``finally`` blocks that stop what it started (a control plane, extenders, guests), which
    # the default action would skip, leaving them running.
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        status = run()
    except BenchError as e:
        print(f"{name}: {e}", file=sys.stderr)
        sys.exit(1)
    except BaseException as e:
        # Stopping what it started may fail in turn once interrupted (a control plane that
        # got the signal too): still the interrupt, not a bug.
        if not _is_interrupt(e):
            raise
        print(f"{name}: interrupted; everything it started is stopped", file=sys.stderr)
        sys.exit(130)
    finally:
        signal.signal(signal.SIGTERM, previous)
    sys.exit(status or 0)


def _is_interrupt(error: BaseException | None) -> bool:
    """``error`` is a KeyboardInterrupt, or was raised while one was being handled."""
    while error is not None:
        if isinstance(error, KeyboardInterrupt):
            return True
        error = error.__context__
    return False


# --- the output --------------------------------------------------------------------------------

# camelCase: a key that starts as a lowercase word and goes on in capitals (``podsPerSecond``,
# ``p99Millis``). Data keys are not field names and may be spelt otherwise: an exception's name
# (``ConnectionResetError``), ``connect:TimeoutError``, an API verb (``POST pods/binding``).
_CAMEL = re.compile(r"^[a-z][a-z0-9_]*[A-Z]")
_CAMEL_BREAK = re.compile(r"(?<=[a-z0-9])([A-Z])")


def camel_keys(value: object, path: str = "$") -> list[str]:
    """The paths of every key in ``value`` (nested dicts and lists) written in camelCase."""
    found: list[str] = []
    if isinstance(value, Mapping):
        for key, item in value.items():
            here = f"{path}.{key}"
            if isinstance(key, str) and _CAMEL.search(key):
                found.append(here)
            found.extend(camel_keys(item, here))
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            found.extend(camel_keys(item, f"{path}[{i}]"))
    return found


def snake_keys(value: Any) -> Any:
    """``value`` with every dict key from camelCase into snake_case (``greedyExtraCost`` ->
    ``greedy_extra_cost``): the product's wire structs (``msgspec.to_builtins``) reported in
    the benchmarks' casing."""
    if isinstance(value, Mapping):
        return {_CAMEL_BREAK.sub(r"_\1", k).lower(): snake_keys(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [snake_keys(v) for v in value]
    return value


def to_json(result: Mapping[str, Any], *, indent: int = 2) -> str:
    """``result`` as the benchmarks print it; a camelCase key is a ``ValueError`` naming it."""
    if bad := camel_keys(result):
        raise ValueError(f"benchmark output keys must be snake_case: {', '.join(bad)}")
    return json.dumps(result, indent=indent)


def emit(result: Mapping[str, Any], *, write: Path | None = None) -> None:
    """Print the benchmark's one JSON object on stdout (and write it to ``write`` too)."""
    text = to_json(result)
    print(text, flush=True)
    if write is not None:
        write.write_text(text + "\n")


# --- the figures -------------------------------------------------------------------------------


def percentile(values: Collection[float], q: float) -> float:
    """The ``q``-th percentile (0 <= q <= 100) of ``values`` by the nearest-rank rule: the
    smallest value with at least ``q`` percent of the values at or below it (module
    docstring). ``ValueError`` for no values or ``q`` out of range."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is not within 0..100")
    ordered = sorted(values)
    # Exact arithmetic: 0.07 * 100 is 7.000000000000001 in floats, whose ceiling is 8.
    rank = math.ceil(Fraction(str(q)) * len(ordered) / 100)
    return ordered[max(rank, 1) - 1]


Unit = Literal["ms", "s"]
_SCALE: dict[str, float] = {"ms": 1000.0, "s": 1.0}


def summary(
    seconds: Sequence[float],
    *,
    unit: Unit,
    percentiles: Iterable[float] = (50, 99),
    digits: int = 3,
) -> dict[str, float]:
    """Samples in seconds as the benchmarks report them, in ``unit``: ``n``, each
    ``p<q>_<unit>`` (nearest rank), ``max_<unit>`` and ``mean_<unit>``; ``{"n": 0}`` for none."""
    if not seconds:
        return {"n": 0}
    scale = _SCALE[unit]
    out: dict[str, float] = {"n": len(seconds)}
    for q in percentiles:
        out[f"p{q:g}_{unit}".replace(".", "_")] = round(percentile(seconds, q) * scale, digits)
    out[f"max_{unit}"] = round(max(seconds) * scale, digits)
    out[f"mean_{unit}"] = round(statistics.fmean(seconds) * scale, digits)
    return out


# --- the CPUs ----------------------------------------------------------------------------------


def split_cpus() -> tuple[frozenset[int], frozenset[int]]:
    """(the CPU for the process under test, the CPUs for everything else), from this
    process's affinity: the last CPU alone, and the others; both every CPU when there is one."""
    mine = sorted(os.sched_getaffinity(0))
    if len(mine) < 2:
        return frozenset(mine), frozenset(mine)
    return frozenset(mine[-1:]), frozenset(mine[:-1])


@contextlib.contextmanager
def spawning_on(cpus: Collection[int] | None) -> Iterator[None]:
    """Processes started inside run on ``cpus`` from their first instruction (a child gets
    the mask of the thread that forked it; Go sizes GOMAXPROCS from it at start). None: as
    they would anyway. No ``preexec_fn``: this is safe with threads running."""
    if cpus is None:
        yield
        return
    before = os.sched_getaffinity(0)  # 0: the calling thread
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def pin_process(pid: int, cpus: Collection[int]) -> None:
    """Every thread of ``pid`` onto ``cpus`` (threads it starts later inherit the mask)."""
    with contextlib.suppress(FileNotFoundError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(int(task.name), cpus)


def cpus_in_force(pid: int) -> list[int]:
    """The CPUs a process may run on now, as the kernel has them (reported, not assumed);
    none once it is gone."""
    try:
        return sorted(os.sched_getaffinity(pid))
    except OSError:
        return []


# --- the extender ------------------------------------------------------------------------------


def start_extender(
    extender: Extender, *, cpus: Collection[int] | None = None, wait_ready: bool = True
) -> Extender:
    """Start ``extender`` (the real process, see ``testkit.controlplane.Extender``) on ``cpus``
    from its first instruction; it, started."""
    with spawning_on(cpus):
        extender.start(wait_ready=False)
    if wait_ready:
        extender.wait_ready()
    return extender
