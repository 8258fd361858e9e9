"""Where grove keeps local state on this machine: a stack's home (embedded object store, Temporal DB,
infra state, tools) and the model cache, which is separate so that several stacks share built models.

    $GROVE_HOME    default ~/.cache/grove           one stack's state
    $GROVE_MODELS  default ~/.cache/grove/models    built and converted models, shared by every stack

A second, isolated stack (its own GROVE_HOME: its own Temporal database and object store) finds the
models the first one built: the cache does not move with GROVE_HOME. Builds take a per-entry file lock
(models/registry.py), so stacks building the same model at once build it once.
"""

from __future__ import annotations

import os
from pathlib import Path

HOME_ENV = "GROVE_HOME"
MODELS_ENV = "GROVE_MODELS"
DEFAULT_HOME = "~/.cache/grove"


def grove_home() -> Path:
    """$GROVE_HOME, default ~/.cache/grove (not created here)."""
    return Path(os.environ.get(HOME_ENV, DEFAULT_HOME)).expanduser()


def models_home() -> Path:
    """$GROVE_MODELS, default ~/.cache/grove/models whatever $GROVE_HOME says (not created here)."""
    return Path(os.environ.get(MODELS_ENV) or f"{DEFAULT_HOME}/models").expanduser()
