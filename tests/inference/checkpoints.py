"""Test helpers: perturbed copies of a model folder, and committing a folder with the checkpoint layout."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from grove.store_layout import MODEL_DIR, checkpoint_prefix, commit_key
from storage.base import ObjectStore, sha256_hex


def perturbed_copy(
    src: Path,
    dest: Path,
    *,
    seed: int,
    scale: float = 0.05,
    only: str | None = None,
    drop: str | None = None,
    add: str | None = None,
) -> Path:
    """Copy the HF folder `src` to `dest` with Gaussian noise (std `scale`) added to every tensor whose
    name contains `only` (all tensors if None); optionally drop a tensor or add an unknown one."""
    shutil.copytree(src, dest)
    weights = load_file(str(dest / "model.safetensors"))
    gen = torch.Generator().manual_seed(seed)
    for name, tensor in weights.items():
        if only is None or only in name:
            weights[name] = tensor + scale * torch.randn(tensor.shape, generator=gen, dtype=tensor.dtype)
    if drop is not None:
        del weights[drop]
    if add is not None:
        weights[add] = torch.zeros(4)
    save_file(weights, str(dest / "model.safetensors"), metadata={"format": "pt"})
    return dest


def commit_checkpoint(store: ObjectStore, run_id: str, step: int, model_folder: Path) -> dict[str, str]:
    """Write `model_folder` as checkpoint `step` of `run_id` (model files, then the COMMIT manifest last)."""
    files = {
        f"{MODEL_DIR}/{p.name}": p.read_bytes() for p in sorted(Path(model_folder).iterdir()) if p.is_file()
    }
    for name, data in files.items():
        store.put(checkpoint_prefix(run_id, step) + name, data)
    manifest = {name: sha256_hex(data) for name, data in files.items()}
    store.put(commit_key(run_id, step), json.dumps({"step": step, "files": manifest}).encode())
    return manifest
