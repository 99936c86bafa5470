"""Where the shared reference material lives (beside the repo, or VMA_SHARED_DIR)."""

import os
from pathlib import Path

SHARED = Path(
    os.environ.get("VMA_SHARED_DIR") or Path(__file__).resolve().parents[1].parent / "shared"
)
