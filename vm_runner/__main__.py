"""Entry point: ``python -m vm_runner --help``."""

from __future__ import annotations

import sys

from vm_runner.cli import main
from vm_runner.log import configure_logging

if __name__ == "__main__":
    configure_logging()
    sys.exit(main())
