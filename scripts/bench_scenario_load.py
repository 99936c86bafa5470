"""Benchmark (not a test): reading a fleet-sized scenario file, C YAML loader against pure Python.

Writes the fleet ``bench_simulator.py`` runs (1,000 nodes, 20,000 VMs with their own traces by
default) as a scenario YAML file, then parses it with the simulator's loader
(``protocol.strict_yaml.StrictLoader``: libyaml's CSafeLoader, duplicate keys refused) and with
the same loader in pure Python (on PyYAML's SafeLoader, what the simulator used before), each
``--repeat`` times, best kept. Both
must give the same Scenario. Prints one JSON object: the file's size, seconds for each, the
ratio, and how long ``parse_scenario`` as a whole takes (YAML plus msgspec's checks).

    .venv/bin/python scripts/bench_scenario_load.py [--nodes N] [--vms N] [--repeat N]
"""

from __future__ import annotations

import time
from collections.abc import Callable

import msgspec
import yaml

from protocol.strict_yaml import PyStrictLoader, StrictLoader
from simulator import scenario as scenario_module
from simulator.fleet import fleet
from testkit import bench as kit


def _best(repeat: int, run: Callable[[], object]) -> tuple[float, object]:
    best = float("inf")
    result: object = None
    for _ in range(repeat):
        started = time.perf_counter()
        result = run()
        best = min(best, time.perf_counter() - started)
    return best, result


def main() -> int:
    parser = kit.command(__doc__)
    parser.add_argument("--nodes", type=int, default=1000, help="nodes in the fleet (1000)")
    parser.add_argument("--vms", type=int, default=20_000, help="VMs in the fleet (20000)")
    parser.add_argument(
        "--seconds", type=float, default=3600.0, help="the fleet's simulated seconds (3600)"
    )
    parser.add_argument("--seed", type=int, default=1, help="seed of the load traces (1)")
    parser.add_argument(
        "--repeat", type=int, default=1, help="parses of each kind; the fastest is kept (1)"
    )
    args = parser.parse_args()

    data = msgspec.to_builtins(fleet(args.nodes, args.vms, args.seconds, args.seed))
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    text = yaml.dump(data, Dumper=dumper, sort_keys=False).encode()

    c_seconds, c_data = _best(args.repeat, lambda: yaml.load(text, Loader=StrictLoader))
    py_seconds, py_data = _best(args.repeat, lambda: yaml.load(text, Loader=PyStrictLoader))
    if c_data != py_data:
        raise kit.BenchError("the two loaders disagree")
    whole_seconds, _ = _best(args.repeat, lambda: scenario_module.parse_scenario(text))
    kit.emit(
        {
            "nodes": args.nodes,
            "vms": args.vms,
            "file_bytes": len(text),
            "c_loader": StrictLoader.__mro__[1].__name__,
            "python_yaml_seconds": round(py_seconds, 3),
            "c_yaml_seconds": round(c_seconds, 3),
            "speedup": round(py_seconds / c_seconds, 2),
            "parse_scenario_seconds": round(whole_seconds, 3),
        }
    )
    return 0


if __name__ == "__main__":
    kit.main(main)
