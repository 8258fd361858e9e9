"""Checkpoints through the object store (LocalStore): layout, commit marker, resume state, refusals."""

from __future__ import annotations

import io
import json
import pickle
import random
import shutil

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from bench.forests import random_batch, rows_from_calls
from grove.learner_config import LearnerConfig
from grove.store_layout import checkpoint_prefix, commit_key
from storage.base import sha256_hex
from trainer.checkpoint import (
    CheckpointConfigMismatchError,
    CheckpointCorruptError,
    CheckpointNotFoundError,
    MissingTokenizerError,
    download_model_folder,
    latest_committed_step,
    load_checkpoint,
    read_trainer_state,
    save_checkpoint,
)
from trainer.learner import Learner

RUN = "run-ckpt"
CFG = LearnerConfig(lr=1e-3, seed=5)


def rows_for(step: int, vocab: int):
    return [r for ep in random_batch(100 + step, vocab=vocab, size=2) for r in rows_from_calls(ep)]


@pytest.fixture
def trained(learner_model_dir):
    learner = Learner(learner_model_dir, CFG, device="cpu")
    learner.step(rows_for(1, learner.model.config.vocab_size))
    return learner


class CrashBeforeCommit(Exception):
    pass


class CrashingStore:
    """Delegates to a real store but dies when asked to write a COMMIT marker."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def put(self, key, data):
        if key.endswith("/COMMIT"):
            raise CrashBeforeCommit(key)
        self.inner.put(key, data)


def test_layout_and_manifest(store, trained):
    manifest = save_checkpoint(store, RUN, trained)
    assert latest_committed_step(store, RUN) == 1
    for name in ("model/config.json", "model/model.safetensors", "model/tokenizer.json",
                 "model/tokenizer_config.json", "model/chat_template.jinja", "model/generation_config.json",
                 "optimizer.pt", "trainer_state.json"):  # fmt: skip
        assert name in manifest
        assert sha256_hex(store.get(checkpoint_prefix(RUN, 1) + name)) == manifest[name]
    commit = json.loads(store.get(commit_key(RUN, 1)))
    assert commit == {"step": 1, "files": manifest}
    state = read_trainer_state(store, RUN, 1)
    assert (state.step, state.data_cursor, state.policy_version, state.rollouts_consumed) == (1, 1, 1, 6)
    assert state.config_fingerprint == CFG.fingerprint()


def test_model_folder_loads_in_transformers_with_chat_template(store, trained, tmp_path):
    save_checkpoint(store, RUN, trained)
    folder = download_model_folder(store, RUN, 1, tmp_path / "m")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    for (name, p), q in zip(trained.model.state_dict().items(), model.state_dict().values(), strict=True):
        assert torch.equal(p, q), name
    chat = [{"role": "user", "content": "hi"}]
    ids = AutoTokenizer.from_pretrained(folder).apply_chat_template(
        chat, add_generation_prompt=True, return_dict=False
    )
    base = AutoTokenizer.from_pretrained(trained.model_dir).apply_chat_template(
        chat, add_generation_prompt=True, return_dict=False
    )
    assert ids == base and len(ids) > 3


def test_resume_restores_weights_optimizer_counters_and_rng(store, trained, tmp_path):
    save_checkpoint(store, RUN, trained)
    expected_draws = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(999), np.random.seed(999), torch.manual_seed(999)  # disturb the global RNGs
    resumed = load_checkpoint(store, RUN, 1, CFG, tmp_path / "m", device="cpu")
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected_draws
    assert (resumed.step_count, resumed.rollouts_consumed) == (1, 6)
    for p, q in zip(trained.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(p, q)
    ours, theirs = trained.optimizer.state_dict(), resumed.optimizer.state_dict()
    assert ours["param_groups"] == theirs["param_groups"]
    for k, st in ours["state"].items():
        for field, value in st.items():
            assert torch.equal(value, theirs["state"][k][field]), (k, field)


def test_crash_before_commit_leaves_the_previous_checkpoint_latest(store, trained, tmp_path):
    save_checkpoint(store, RUN, trained)
    trained.step(rows_for(2, trained.model.config.vocab_size))
    with pytest.raises(CrashBeforeCommit):
        save_checkpoint(CrashingStore(store), RUN, trained)
    assert store.exists(checkpoint_prefix(RUN, 2) + "model/model.safetensors")  # leftovers, invisible
    assert latest_committed_step(store, RUN) == 1
    with pytest.raises(CheckpointNotFoundError, match="latest committed step: 1"):
        load_checkpoint(store, RUN, 2, CFG, tmp_path / "m", device="cpu")
    save_checkpoint(store, RUN, trained)  # the retried save overwrites the leftovers and commits
    assert latest_committed_step(store, RUN) == 2


def test_saving_a_committed_step_again_changes_nothing(store, trained):
    first = save_checkpoint(store, RUN, trained)
    before = {k: store.get(k) for k in store.list(checkpoint_prefix(RUN, 1))}
    with torch.no_grad():
        next(trained.model.parameters()).add_(1.0)  # even different weights: step 1 is final
    assert save_checkpoint(store, RUN, trained) == first
    assert {k: store.get(k) for k in store.list(checkpoint_prefix(RUN, 1))} == before


def test_config_mismatch_is_refused_with_the_differing_fields(store, trained, tmp_path):
    save_checkpoint(store, RUN, trained)
    other = LearnerConfig(lr=2e-3, seed=5)
    with pytest.raises(CheckpointConfigMismatchError, match=r"'lr': \(0.001, 0.002\)"):
        load_checkpoint(store, RUN, 1, other, tmp_path / "m", device="cpu")
    assert not (tmp_path / "m").exists()  # refused before any weights were downloaded


def test_a_file_changed_after_commit_is_refused(store, trained, tmp_path):
    save_checkpoint(store, RUN, trained)
    key = checkpoint_prefix(RUN, 1) + "model/model.safetensors"
    data = bytearray(store.get(key))
    data[-1] ^= 0xFF
    store.put(key, bytes(data))
    with pytest.raises(CheckpointCorruptError, match="model.safetensors"):
        download_model_folder(store, RUN, 1, tmp_path / "m")


def test_optimizer_file_is_never_unpickled_as_arbitrary_objects(store, trained, tmp_path):
    save_checkpoint(store, RUN, trained)
    evil = io.BytesIO()
    torch.save({"optimizer": {"payload": _Evil()}, "scheduler": {}}, evil)
    key = checkpoint_prefix(RUN, 1) + "optimizer.pt"
    store.put(key, evil.getvalue())
    commit = json.loads(store.get(commit_key(RUN, 1)))
    commit["files"]["optimizer.pt"] = sha256_hex(evil.getvalue())  # a consistent but hostile commit
    store.put(commit_key(RUN, 1), json.dumps(commit).encode())
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        load_checkpoint(store, RUN, 1, CFG, tmp_path / "m", device="cpu")
    assert not _Evil.ran


class _Evil:
    ran = False

    def __reduce__(self):
        return (_Evil._run, ())

    @staticmethod
    def _run():
        _Evil.ran = True
        return _Evil()


def test_model_folder_without_tokenizer_is_refused(store, learner_model_dir, tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors", "generation_config.json"):
        shutil.copy(learner_model_dir / name, bare / name)
    with pytest.raises(MissingTokenizerError, match="tokenizer.json"):
        save_checkpoint(store, RUN, Learner(bare, CFG, device="cpu"))
    assert latest_committed_step(store, RUN) is None
