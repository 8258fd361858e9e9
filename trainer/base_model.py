"""A run's base model (policy version 0) in the object store: staged once, read by every host.

`RunConfig.model` names the base model as a name (tiny, smollm2, ...) or a folder, and a name or folder
means something only on the machine that resolves it. Were every host to resolve it for itself, a
folder would have to exist on every host at the same path (a shared filesystem), and a name would have
to build to the same bytes on every host (a model trained on the spot need not, across CPUs or library
versions); an engine serving version 0 from other bytes than the learner starts from would silently
give every step-1 token a behaviour logprob of another policy.

So the trainer host resolves the model once, when the run starts (the `stage_base_model` activity), and
writes the folder's files under `runs/{run_id}/base-model/` (grove/store_layout.py) with a
COMMIT manifest {file: sha256} written last, like a checkpoint. The learner of step 1 (on whichever
trainer host runs it), its KL reference, and every engine that serves version 0 then download those
bytes, sha256-verified, to their own disk: version 0 is one set of bytes, and no host reads another's
folder. Staging is idempotent (a committed base is kept as it is; an uncommitted leftover is written
over). A run whose history has no staged base (started before the `grove-base-model-in-store` patch) has none:
its hosts resolve the model themselves.
"""

from __future__ import annotations

import json
from pathlib import Path

from grove.store_layout import MODEL_DIR, base_model_commit_key, base_model_prefix
from storage.base import ObjectNotFoundError, ObjectStore
from trainer.checkpoint import commit_under, download_model_files

FORMAT = 1


class BaseModelFolderError(ValueError):
    """The base model's folder cannot be staged as it is (no files, or a file the store cannot name)."""


def folder_files(folder: Path) -> dict[str, bytes]:
    """Every file of a model folder under `model/<relative path>` (hidden files, e.g. a build's lock or
    temporary files, left out). Symlinks (a hub snapshot's) are followed."""
    folder = Path(folder)
    paths = sorted(
        p
        for p in folder.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    )
    if not paths:
        raise BaseModelFolderError(f"base model folder {str(folder)!r} holds no files to stage")
    return {f"{MODEL_DIR}/{p.relative_to(folder).as_posix()}": p.read_bytes() for p in paths}


def base_manifest(store: ObjectStore, run_id: str) -> dict[str, str] | None:
    """The committed base model's manifest {file: sha256}, or None when the run staged none."""
    try:
        return dict(json.loads(store.get(base_model_commit_key(run_id)))["files"])
    except ObjectNotFoundError:
        return None


def stage_base_model(
    store: ObjectStore, run_id: str, folder: Path, model: str
) -> tuple[dict[str, str], bool]:
    """Write `folder` as the run's base model unless it is committed already; (manifest, written)."""
    committed = base_manifest(store, run_id)
    if committed is not None:
        return committed, False
    header = {"format": FORMAT, "run_id": run_id, "model": model}
    return commit_under(store, base_model_prefix(run_id), folder_files(folder), header), True


def download_base_model(store: ObjectStore, run_id: str, manifest: dict[str, str], dest_dir: Path) -> Path:
    """The committed base model's folder into `dest_dir`, every file sha256-verified; returns dest_dir."""
    prefix = base_model_prefix(run_id)
    what_to_do = f"stage the base model of run {run_id!r} again (delete {prefix!r}) or start a new run"
    return download_model_files(store, prefix, manifest, dest_dir, what_to_do)
