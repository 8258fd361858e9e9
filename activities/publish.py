"""The `publish_weights` activity body: load a committed learner checkpoint into the running engine.

The checkpoint's model folder (grove/store_layout.py) is downloaded, sha256-verified against
its COMMIT manifest (trainer/checkpoint.py), into `weights_root/{run}/step-NNNNNN/`: first into a
temporary folder, renamed into place only when complete, so a folder under its final name is always
a whole checkpoint. The engine then loads it in place (activities/engine.py: publish). Folders of
older versions are deleted once the engine no longer needs them for a rollback. Version 0 is the run's
base model as the trainer host staged it in the store (trainer/base_model.py), fetched the same way,
so an engine serves the bytes the learner starts from, not its own host's copy of the model.

Idempotent: a retry after a successful publication finds the engine already at the version with
byte-identical weights and returns without reloading.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from activities.engine import PolicyEngine, PublishReport
from grove.contracts import PublishInput, PublishResult
from storage.base import ObjectStore
from trainer.base_model import base_manifest, download_base_model
from trainer.checkpoint import download_model_folder


def version_dir(weights_root: Path, run_id: str, version: int) -> Path:
    return Path(weights_root) / run_id / f"step-{version:06d}"


def fetch_model_folder(store: ObjectStore, run_id: str, version: int, weights_root: Path) -> Path:
    """The committed model folder of checkpoint `version`, downloaded once and complete."""
    return _download_once(
        version_dir(weights_root, run_id, version),
        lambda tmp: download_model_folder(store, run_id, version, tmp),
    )


def base_model_folder(store: ObjectStore, run_id: str, base_model: str, weights_root: Path) -> Path:
    """Version 0 of the run on this host: the base model the trainer host staged in the store
    (trainer/base_model.py), downloaded once and verified; a run that staged none (started before
    staging existed) gets `base_model` resolved on this host, as it always did."""
    manifest = base_manifest(store, run_id)
    if manifest is None:
        from models.registry import ensure_model

        return ensure_model(base_model)
    return _download_once(
        version_dir(weights_root, run_id, 0),
        lambda tmp: download_base_model(store, run_id, manifest, tmp),
    )


def _download_once(dest: Path, download: Callable[[Path], object]) -> Path:
    """`dest`, filled by `download` into a temporary folder beside it that is renamed only when complete."""
    if dest.is_dir():
        return dest  # only complete downloads are ever renamed to this name
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        download(tmp)
        tmp.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def prune_versions(weights_root: Path, run_id: str, keep: Path) -> list[Path]:
    """Delete the run's downloaded versions other than `keep` (the engine's current weights)."""
    removed = []
    for d in sorted((Path(weights_root) / run_id).glob("step-*")):
        if d.resolve() != Path(keep).resolve():
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


async def run_publish(
    inp: PublishInput, engine: PolicyEngine, store: ObjectStore, weights_root: Path
) -> tuple[PublishResult, PublishReport]:
    t0 = time.perf_counter()
    if inp.version == 0:  # the run's base model (the learner starts from it; no step checkpoint holds it)
        folder = await asyncio.to_thread(base_model_folder, store, inp.run_id, inp.base_model, weights_root)
    else:
        folder = await asyncio.to_thread(fetch_model_folder, store, inp.run_id, inp.version, weights_root)
    report = await engine.publish(folder, inp.version, run_id=inp.run_id)
    await asyncio.to_thread(prune_versions, weights_root, inp.run_id, engine.source_dir)
    result = PublishResult(
        version=report.version,
        previous_version=report.previous_version,
        seconds=time.perf_counter() - t0,
    )
    return result, report
