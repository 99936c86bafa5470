"""``python -m simulator``: the same as ``scheduler-extender simulate``."""

import sys

from simulator.cli import main

sys.exit(main(prog="python -m simulator"))
