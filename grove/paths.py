"""Where grove keeps local state (model cache, embedded object store, Temporal DB) on this machine."""

from __future__ import annotations

import os
from pathlib import Path


def grove_home() -> Path:
    """$GROVE_HOME, default ~/.cache/grove (not created here)."""
    return Path(os.environ.get("GROVE_HOME", "~/.cache/grove")).expanduser()
