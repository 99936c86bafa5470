"""Where the recorded reference samples are: the repository's copy (``tests/reference``), or
``$VMA_SHARED_DIR/reference`` when that is set."""

import os
from pathlib import Path

_override = os.environ.get("VMA_SHARED_DIR")
REFERENCE = (
    Path(_override) / "reference" if _override else Path(__file__).resolve().parent / "reference"
)
