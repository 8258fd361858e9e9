"""Object keys of learner checkpoints (shared by the learner that writes and the publisher that reads).

    checkpoints/{run_id}/step-{N:06d}/model/...        a complete Hugging Face model folder
                                                      (config.json, model.safetensors, tokenizer files)
    checkpoints/{run_id}/step-{N:06d}/optimizer.pt      optimizer + scheduler state (torch.load weights_only)
    checkpoints/{run_id}/step-{N:06d}/trainer_state.json step, data cursor, policy version, fingerprint, RNG
    checkpoints/{run_id}/step-{N:06d}/COMMIT            written last: JSON manifest {file: sha256}

    runs/{run_id}/base-model/model/...                 the run's base model (policy version 0) as the
                                                      trainer host resolved it (trainer/base_model.py)
    runs/{run_id}/base-model/COMMIT                     written last: JSON manifest {file: sha256}

A step directory without COMMIT is invisible: readers list COMMIT markers only. The policy version of
the weights saved after optimizer step N is N; the base model is version 0.
"""

from __future__ import annotations

CHECKPOINTS_ROOT = "checkpoints"
COMMIT = "COMMIT"
MODEL_DIR = "model"


def run_prefix(run_id: str) -> str:
    return f"{CHECKPOINTS_ROOT}/{run_id}/"


def step_prefix(run_id: str, step: int) -> str:
    return f"{CHECKPOINTS_ROOT}/{run_id}/step-{step:06d}/"


def commit_key(run_id: str, step: int) -> str:
    return step_prefix(run_id, step) + COMMIT


def model_file_key(run_id: str, step: int, filename: str) -> str:
    return step_prefix(run_id, step) + f"{MODEL_DIR}/{filename}"


def base_prefix(run_id: str) -> str:
    """Where a run's base model lives: beside its step records, not under `checkpoints/{run_id}/`,
    whose COMMIT markers are the optimizer steps only."""
    return f"runs/{run_id}/base-model/"


def base_commit_key(run_id: str) -> str:
    return base_prefix(run_id) + COMMIT


def parse_step(key: str) -> int | None:
    """The step number of a `.../step-NNNNNN/COMMIT` key, else None."""
    parts = key.rstrip("/").split("/")
    if len(parts) < 2 or parts[-1] != COMMIT or not parts[-2].startswith("step-"):
        return None
    digits = parts[-2][len("step-") :]
    return int(digits) if digits.isdigit() else None
