"""Weight folders compared without loading a model: tensor shapes, a fingerprint of the bytes, and the check
that a publication's folder holds exactly the tensors the engine serves.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from safetensors import safe_open

from activities.engine_errors import WeightsMismatchError


def weight_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape over all *.safetensors files of an HF model folder."""
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise WeightsMismatchError(
            f"weights folder {folder} holds no *.safetensors file; expected an HF model folder "
            "written with save_pretrained(safe_serialization=True)"
        )
    shapes: dict[str, tuple[int, ...]] = {}
    for path in files:
        try:
            with safe_open(str(path), framework="np") as f:
                for name in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                    shapes[name] = tuple(f.get_slice(name).get_shape())
        except Exception as exc:  # safetensors raises its own error type on a corrupt header
            raise WeightsMismatchError(
                f"weights file {path} is not a readable safetensors file: {exc}"
            ) from exc
    return shapes


def weights_fingerprint(folder: Path) -> str:
    """sha256 over (file name, file sha256) of the folder's *.safetensors files, in name order."""
    h = hashlib.sha256()
    for path in sorted(Path(folder).glob("*.safetensors")):
        h.update(path.name.encode())
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


Shapes = dict[str, tuple[int, ...]]


def check_same_tensors(expected: Shapes, got: Shapes, folder: Path) -> None:
    """Fail unless `got` has exactly the names and shapes of `expected` (vLLM would silently keep
    the old values of a missing tensor, so a partial checkpoint must never reach it)."""
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    if missing or extra:
        raise WeightsMismatchError(
            f"weights folder {folder} does not match the served model: missing {missing[:5]} "
            f"({len(missing)}), unexpected {extra[:5]} ({len(extra)}); publish a checkpoint of the same "
            "architecture"
        )
    for name, shape in expected.items():
        if got[name] != shape:
            raise WeightsMismatchError(
                f"weights folder {folder}: tensor {name} has shape {got[name]}, the served model has "
                f"{shape}; publish a checkpoint of the same architecture"
            )
