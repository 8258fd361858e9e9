"""The manifest every built model folder carries (grove_model.json): what built it and its fingerprint.

The registry trusts a cache entry only if its manifest names the fingerprint the entry was built for.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

MANIFEST_NAME = "grove_model.json"


def write_manifest(out_dir: Path, manifest: dict[str, Any]) -> None:
    """Sorted keys and a trailing newline: the same manifest always gives the same bytes."""
    (out_dir / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def read_manifest(model_dir: Path) -> dict[str, Any] | None:
    """The manifest of `model_dir`, or None when the folder has none (not built by grove)."""
    path = model_dir / MANIFEST_NAME
    if not path.is_file():
        return None
    return json.loads(path.read_text())
