"""``python -m simulator``: the same as ``vm-simulator``."""

import sys

from simulator.cli import main

sys.exit(main(prog="python -m simulator"))
