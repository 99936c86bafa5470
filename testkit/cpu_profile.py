"""Run a module under cProfile timed by CPU time, not wall time: ``python -m testkit.cpu_profile
-o FILE -m MODULE ARGS...`` (the stats are written when the module returns or raises).

``python -m cProfile`` times by the wall clock: on a busy machine a ``send()`` that wakes the
receiver and loses the CPU to it is charged the whole time the process waited, and so is
anything else preempted. A benchmark that splits a process's CPU by the work behind it needs
the process's own CPU time (``time.process_time``), which costs more per call but counts only
what the process ran.
"""

from __future__ import annotations

import cProfile
import runpy
import sys
import time


def main() -> int:
    argv = sys.argv[1:]
    if len(argv) < 4 or argv[0] != "-o" or argv[2] != "-m":
        print("usage: python -m testkit.cpu_profile -o FILE -m MODULE [ARGS...]", file=sys.stderr)
        return 2
    out, module, rest = argv[1], argv[3], argv[4:]
    sys.argv = [module, *rest]
    profile = cProfile.Profile(time.process_time)
    try:
        profile.runcall(runpy.run_module, module, run_name="__main__", alter_sys=True)
    finally:
        profile.dump_stats(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
