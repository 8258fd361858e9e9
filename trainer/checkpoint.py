"""Learner checkpoints in the object store: atomic by a commit marker, loadable without unpickling.

Layout (grove/store_layout.py): under `checkpoints/{run}/step-{N:06d}/`
- `model/`: a complete Hugging Face folder (config.json, generation_config.json, model.safetensors
  from `save_pretrained`, plus the base model's tokenizer files and chat template), which
  transformers and vLLM load as a model path;
- `optimizer.pt`: {"optimizer": AdamW state_dict, "scheduler": {"rollouts_consumed": n}} via
  torch.save, read back with torch.load(weights_only=True) (tensors and plain containers only);
- `trainer_state.json`: step, data cursor (= step: data order is a pure function of seed and step),
  policy version (= step), rollouts consumed, config and its fingerprint, RNG states (python,
  numpy, torch, cuda when present) as JSON and base64;
- `COMMIT`, written last: {"step": N, "files": {relative name: sha256}}.

A step trained on N > 1 ranks (LearnerConfig.ranks, trainer/distributed.py) has `optimizer/`
instead of `optimizer.pt`: the AdamW state as torch.distributed.checkpoint shards, one
`__{rank}_0.distcp` per rank plus `.metadata` (keys are parameter names), and its trainer_state says
`optimizer_format: sharded` and the rank count. The weights are always the full `model/` folder, so
publication to vLLM never depends on the rank count. Either form resumes onto any rank count: DCP
reshards the optimizer state, and a full `optimizer.pt` is loaded whole by every rank.

A step without COMMIT does not exist for readers, so a crash mid-save leaves the previous
checkpoint the latest. Saving a step that is already committed returns its manifest unchanged
(idempotent trainer activity); saving over an uncommitted step overwrites its leftovers.
"""

from __future__ import annotations

import base64
import io
import json
import random
import tempfile
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from pydantic import BaseModel
from transformers import PreTrainedModel

from grove.learner_config import NOT_FINGERPRINTED, LearnerConfig
from grove.store_layout import (
    COMMIT,
    MODEL_DIR,
    checkpoint_prefix,
    checkpoints_prefix,
    commit_key,
    parse_step,
)
from storage.base import ObjectNotFoundError, ObjectStore, sha256_hex
from trainer.grad_guard import GradientGuard
from trainer.learner import Learner

OPTIMIZER_FILE = "optimizer.pt"
SHARDS_DIR = "optimizer"  # torch.distributed.checkpoint files of a step trained on several ranks
STATE_FILE = "trainer_state.json"
# What a model folder needs besides save_pretrained's output; copied from the folder the learner loaded.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)


class CheckpointError(Exception):
    """Base of checkpoint errors."""


class CheckpointNotFoundError(CheckpointError):
    """No committed checkpoint for the requested run and step."""


class CheckpointCorruptError(CheckpointError):
    """A committed file is missing or its sha256 differs from the COMMIT manifest."""


class CheckpointConfigMismatchError(CheckpointError):
    """The checkpoint was written by a run with a different learner config."""


class MissingTokenizerError(CheckpointError):
    """The learner's model folder has no tokenizer files to copy into the checkpoint."""


class RngStates(BaseModel):
    python: list  # random.getstate() as JSON lists
    numpy: dict  # legacy MT19937 state: keys, pos, has_gauss, cached_gaussian
    torch: str  # base64 of torch.get_rng_state()
    cuda: list[str] | None  # base64 per device, None without CUDA


class TrainerState(BaseModel):
    format_version: int = 1
    run_id: str
    step: int
    data_cursor: int  # the next step's task_indices(seed, step + 1, ...) continue the data order
    policy_version: int
    rollouts_consumed: int
    config_fingerprint: str
    config: dict
    rng: RngStates
    ranks: int = 1  # processes that trained this step
    optimizer_format: Literal["full", "sharded"] = "full"  # optimizer.pt, or optimizer/ DCP shards
    # the gradient guard's anchor and recent accepted scales (trainer/grad_guard.py); a checkpoint
    # without an anchor (older ones) makes the next step measure it
    gradient_scales: list[float] = []
    gradient_anchor: float | None = None


def capture_rng() -> RngStates:
    version, keys, gauss = random.getstate()
    legacy = np.random.get_state(legacy=True)
    if not isinstance(legacy, tuple):  # a dict: the global generator is not MT19937
        raise TypeError(f"numpy's global generator is {legacy.get('bit_generator')}, not MT19937")
    name, mt, pos, has_gauss, cached = legacy
    cuda = None
    if torch.cuda.is_available():
        cuda = [base64.b64encode(s.numpy().tobytes()).decode() for s in torch.cuda.get_rng_state_all()]
    return RngStates(
        python=[version, list(keys), gauss],
        numpy={"name": name, "keys": mt.tolist(), "pos": pos, "has_gauss": has_gauss, "cached": cached},
        torch=base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode(),
        cuda=cuda,
    )


def _bytes_tensor(b64: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(b64)), dtype=torch.uint8)


def restore_rng(states: RngStates) -> None:
    version, keys, gauss = states.python
    random.setstate((version, tuple(keys), gauss))
    n = states.numpy
    np.random.set_state(
        (n["name"], np.array(n["keys"], dtype=np.uint32), n["pos"], n["has_gauss"], n["cached"])
    )
    torch.set_rng_state(_bytes_tensor(states.torch))
    if states.cuda is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([_bytes_tensor(s) for s in states.cuda])


def _without_tied_copies(model: torch.nn.Module, state_dict: dict) -> dict:
    """A gathered state dict holds a tied parameter under every name (lm_head.weight beside
    embed_tokens.weight): two tensors, so save_pretrained cannot see they are one and writes both;
    vLLM refuses the extra key. Keep the first name of each parameter, as model.state_dict() does."""
    first: dict[int, str] = {}
    copies = set()
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in first:
            copies.add(name)
        else:
            first[id(param)] = name
    return {k: v for k, v in state_dict.items() if k not in copies}


def _keep_architectures(saved: Path, loaded: Path) -> None:
    """save_pretrained names the model's class in config.json `architectures`, which vLLM resolves; an
    FSDP2-sharded model's class is a generated subclass (FSDPQwen3ForCausalLM) that vLLM does not know.
    The weights are those of the folder's architecture, so its `architectures` are written back."""
    if not loaded.is_file():
        return
    original = json.loads(loaded.read_text()).get("architectures")
    config = json.loads(saved.read_text())
    if original and config.get("architectures") != original:
        config["architectures"] = original
        saved.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def model_folder_files(learner: Learner, state_dict: dict | None = None) -> dict[str, bytes]:
    """The `model/` files: save_pretrained output (of `state_dict` when given: the gathered weights of
    a sharded model) plus the tokenizer files of the folder the learner loaded."""
    model = learner.model
    if not isinstance(model, PreTrainedModel):
        raise TypeError(f"a checkpoint saves a transformers model, got {type(model).__name__}")
    if state_dict is not None:
        state_dict = _without_tied_copies(model, state_dict)
    with tempfile.TemporaryDirectory(prefix="grove-ckpt-") as tmp:
        model.save_pretrained(tmp, state_dict=state_dict)
        _keep_architectures(Path(tmp) / "config.json", learner.model_dir / "config.json")
        files = {f"{MODEL_DIR}/{p.name}": p.read_bytes() for p in sorted(Path(tmp).iterdir()) if p.is_file()}
    tokenizer = [name for name in TOKENIZER_FILES if (learner.model_dir / name).is_file()]
    if not any(name in tokenizer for name in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        raise MissingTokenizerError(
            f"model folder {learner.model_dir} has none of tokenizer.json, tokenizer.model, vocab.json; a "
            "checkpoint must be a complete model folder that vLLM can load; start from a folder with one"
        )
    for name in tokenizer:
        files[f"{MODEL_DIR}/{name}"] = (learner.model_dir / name).read_bytes()
    return files


def trainer_state(
    run_id: str, learner: Learner, *, ranks: int = 1, optimizer_format: str = "full"
) -> TrainerState:
    return TrainerState(
        run_id=run_id,
        step=learner.step_count,
        data_cursor=learner.step_count,
        policy_version=learner.step_count,
        rollouts_consumed=learner.rollouts_consumed,
        config_fingerprint=learner.config.fingerprint(),
        config=learner.config.model_dump(mode="json"),
        rng=capture_rng(),
        ranks=ranks,
        optimizer_format=optimizer_format,
        gradient_scales=list(learner.guard.history),
        gradient_anchor=learner.guard.anchor,
    )


def restore_trainer_state(learner: Learner, state: TrainerState) -> None:
    """What a learner carries across steps besides weights and optimizer: RNG states, guard history."""
    restore_rng(state.rng)
    learner.guard = GradientGuard(state.gradient_anchor, state.gradient_scales)


def _checkpoint_files(run_id: str, learner: Learner) -> dict[str, bytes]:
    buf = io.BytesIO()
    torch.save(
        {
            "optimizer": learner.optimizer.state_dict(),
            "scheduler": {"rollouts_consumed": learner.rollouts_consumed},
        },
        buf,
    )
    files = model_folder_files(learner)
    files[OPTIMIZER_FILE] = buf.getvalue()
    files[STATE_FILE] = trainer_state(run_id, learner).model_dump_json(indent=1).encode()
    return files


def save_checkpoint(store: ObjectStore, run_id: str, learner: Learner) -> dict[str, str]:
    """Write the learner's state as step `learner.step_count`; returns the COMMIT manifest {file: sha256}."""
    step = learner.step_count
    if store.exists(commit_key(run_id, step)):
        return verify_committed(store, run_id, step)
    return commit_files(store, run_id, step, _checkpoint_files(run_id, learner))


def commit_files(store: ObjectStore, run_id: str, step: int, files: dict[str, bytes]) -> dict[str, str]:
    """Write a step's files in sorted order, then COMMIT with their sha256 (what makes them visible).

    Overwrites the leftovers of a crashed, uncommitted attempt; a committed step is verified and its
    manifest returned unchanged (a retried save never rewrites a visible checkpoint)."""
    if store.exists(commit_key(run_id, step)):
        return verify_committed(store, run_id, step)
    return commit_under(store, checkpoint_prefix(run_id, step), files, {"step": step})


def commit_under(store: ObjectStore, prefix: str, files: dict[str, bytes], header: dict) -> dict[str, str]:
    """Write `files` under `prefix` in sorted order, then `prefix`COMMIT: `header` plus {"files": {name:
    sha256}}, the marker that makes them visible. Returns the manifest."""
    for name in sorted(files):
        store.put(prefix + name, files[name])
    manifest = {name: sha256_hex(data) for name, data in sorted(files.items())}
    store.put(prefix + COMMIT, json.dumps({**header, "files": manifest}, indent=1).encode())
    return manifest


def local_checkpoint_files(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` by its relative name (a checkpoint written to local disk by ranks)."""
    folder = Path(folder)
    paths = sorted(p for p in folder.rglob("*") if p.is_file())
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in paths}


def verify_committed(store: ObjectStore, run_id: str, step: int) -> dict[str, str]:
    """The manifest of a committed step after checking every file it names (CheckpointCorruptError)."""
    manifest = read_manifest(store, run_id, step)
    for name in manifest:
        _get_verified(store, run_id, step, name, manifest)
    return manifest


def latest_committed_step(store: ObjectStore, run_id: str) -> int | None:
    """The highest step of `run_id` with a COMMIT marker, or None if there is none."""
    steps = [s for s in (parse_step(k) for k in store.list(checkpoints_prefix(run_id))) if s is not None]
    return max(steps) if steps else None


def read_manifest(store: ObjectStore, run_id: str, step: int) -> dict[str, str]:
    """The committed files of a checkpoint {relative name: sha256}."""
    try:
        commit = json.loads(store.get(commit_key(run_id, step)))
    except ObjectNotFoundError:
        raise CheckpointNotFoundError(
            f"run {run_id!r} has no committed checkpoint at step {step} (no {commit_key(run_id, step)!r}); "
            f"latest committed step: {latest_committed_step(store, run_id)}"
        ) from None
    return dict(commit["files"])


def _get_verified(store: ObjectStore, run_id: str, step: int, name: str, manifest: dict[str, str]) -> bytes:
    return get_verified(store, checkpoint_prefix(run_id, step), name, manifest, "Resume from another step")


def get_verified(
    store: ObjectStore, prefix: str, name: str, manifest: dict[str, str], what_to_do: str
) -> bytes:
    """The committed file `prefix + name`, checked against its manifest's sha256 (CheckpointCorruptError)."""
    key = prefix + name
    try:
        data = store.get(key)
    except ObjectNotFoundError:
        raise CheckpointCorruptError(
            f"checkpoint file {key!r} is in its COMMIT manifest but missing"
        ) from None
    if sha256_hex(data) != manifest[name]:
        raise CheckpointCorruptError(
            f"checkpoint file {key!r} has sha256 {sha256_hex(data)[:16]}…, its COMMIT manifest says "
            f"{manifest[name][:16]}…; the object was changed after commit. {what_to_do}"
        )
    return data


def download_model_folder(store: ObjectStore, run_id: str, step: int, dest_dir: Path) -> Path:
    """Write the committed model folder of `step` into `dest_dir` (sha256-verified); returns dest_dir."""
    manifest = read_manifest(store, run_id, step)
    return download_model_files(
        store, checkpoint_prefix(run_id, step), manifest, dest_dir, "Resume from another step"
    )


def download_model_files(
    store: ObjectStore, prefix: str, manifest: dict[str, str], dest_dir: Path, what_to_do: str
) -> Path:
    """The manifest's `model/` files under `prefix` into `dest_dir` (sha256-verified); returns dest_dir."""
    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    for name in sorted(n for n in manifest if n.startswith(MODEL_DIR + "/")):
        path = dest_dir / name[len(MODEL_DIR) + 1 :]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(get_verified(store, prefix, name, manifest, what_to_do))
    return dest_dir


def download_checkpoint(store: ObjectStore, run_id: str, step: int, dest_dir: Path) -> TrainerState:
    """Every committed file of `step` into `dest_dir` (sha256-verified); returns its trainer state."""
    manifest = read_manifest(store, run_id, step)
    dest_dir = Path(dest_dir)
    for name in sorted(manifest):
        path = dest_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(_get_verified(store, run_id, step, name, manifest))
    return TrainerState.model_validate_json((dest_dir / STATE_FILE).read_bytes())


def read_trainer_state(store: ObjectStore, run_id: str, step: int) -> TrainerState:
    manifest = read_manifest(store, run_id, step)
    return TrainerState.model_validate_json(_get_verified(store, run_id, step, STATE_FILE, manifest))


def check_config(state: TrainerState, config: LearnerConfig, run_id: str) -> None:
    """CheckpointConfigMismatchError unless the checkpoint was written under `config` (ranks aside)."""
    if state.config_fingerprint == config.fingerprint():
        return
    ours = config.model_dump(mode="json", exclude=NOT_FINGERPRINTED)
    theirs = {k: v for k, v in state.config.items() if k not in NOT_FINGERPRINTED}
    diff = {k: (theirs.get(k), ours.get(k)) for k in sorted(set(ours) | set(theirs))}
    diff = {k: v for k, v in diff.items() if v[0] != v[1]}
    raise CheckpointConfigMismatchError(
        f"run {run_id!r} step {state.step}: checkpoint config fingerprint {state.config_fingerprint[:16]}… "
        f"differs from this run's {config.fingerprint()[:16]}…; differing fields (checkpoint, run): {diff}. "
        "Resume with the checkpoint's config, or start a new run id"
    )


def load_checkpoint(
    store: ObjectStore,
    run_id: str,
    step: int,
    config: LearnerConfig,
    dest_dir: Path,
    *,
    device: str | torch.device | None = None,
    reference_dir: Path | None = None,
) -> Learner:
    """A learner resumed from a committed step: weights, optimizer, counters and RNG states restored.

    The model folder is downloaded into `dest_dir`. Raises CheckpointNotFoundError,
    CheckpointCorruptError, or CheckpointConfigMismatchError (before any weights are read).
    """
    manifest = read_manifest(store, run_id, step)
    state = TrainerState.model_validate_json(_get_verified(store, run_id, step, STATE_FILE, manifest))
    check_config(state, config, run_id)
    model_dir = download_model_folder(store, run_id, step, dest_dir)
    learner = Learner(
        model_dir,
        config,
        device=device,
        reference_dir=reference_dir,
        step_count=state.step,
        rollouts_consumed=state.rollouts_consumed,
    )
    if state.optimizer_format == "sharded":
        _load_shards(store, run_id, step, manifest, learner)
        restore_trainer_state(learner, state)
        return learner
    saved = torch.load(
        io.BytesIO(_get_verified(store, run_id, step, OPTIMIZER_FILE, manifest)),
        map_location=learner.device,
        weights_only=True,
    )
    # The implementation flags belong to this device (fused AdamW on CUDA), not the saving one; set
    # them before loading, because load_state_dict places the step counters according to them.
    for saved_group, own in zip(
        saved["optimizer"]["param_groups"], learner.optimizer.param_groups, strict=True
    ):
        saved_group.update({k: own.get(k) for k in ("fused", "foreach", "capturable")})
    learner.optimizer.load_state_dict(saved["optimizer"])
    if saved["scheduler"]["rollouts_consumed"] != state.rollouts_consumed:
        raise CheckpointCorruptError(
            f"run {run_id!r} step {step}: optimizer.pt counts {saved['scheduler']['rollouts_consumed']} "
            f"rollouts, trainer_state.json {state.rollouts_consumed}; the files come from different saves"
        )
    restore_trainer_state(learner, state)
    return learner


def _load_shards(
    store: ObjectStore, run_id: str, step: int, manifest: dict[str, str], learner: Learner
) -> None:
    """A step trained on several ranks, resumed in one process: DCP reads the shards (no process group)."""
    from trainer.distributed import load_sharded_optimizer  # torch.distributed only when needed

    with tempfile.TemporaryDirectory(prefix="grove-shards-") as tmp:
        for name in sorted(n for n in manifest if n.startswith(SHARDS_DIR + "/")):
            path = Path(tmp) / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(_get_verified(store, run_id, step, name, manifest))
        load_sharded_optimizer(learner.model, learner.optimizer, Path(tmp) / SHARDS_DIR)


def open_learner(
    store: ObjectStore,
    run_id: str,
    base_model_dir: Path,
    config: LearnerConfig,
    work_dir: Path,
    *,
    device: str | torch.device | None = None,
    reference_dir: Path | None = None,
) -> Learner:
    """The run's learner: resumed from its latest committed checkpoint, else fresh from the base model.

    A resumed learner's next step is `latest + 1`; its model folder goes to work_dir/step-N.
    """
    latest = latest_committed_step(store, run_id)
    if latest is None:
        return Learner(base_model_dir, config, device=device, reference_dir=reference_dir)
    dest = Path(work_dir) / f"step-{latest:06d}"
    return load_checkpoint(store, run_id, latest, config, dest, device=device, reference_dir=reference_dir)
