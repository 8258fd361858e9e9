"""Fixtures of the learner tests: the tiny random Qwen3 folder and a local object store."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from models.registry import ensure_model
from models.tiny import TinyModelSpec, build_tiny_model
from storage.local import LocalStore


@pytest.fixture(scope="session")
def learner_model_dir() -> Path:
    """tiny-random: a ~1M-parameter Qwen3 (vocab 2048, head_dim 32) with tokenizer and chat template."""
    return ensure_model("tiny-random")


@pytest.fixture(scope="session")
def small_model_dir(tmp_path_factory) -> Path:
    """A ~100k-parameter random Qwen3 (vocab 512, hidden 64, 2 layers, head_dim 32) with tokenizer:
    the per-call reference comparisons run many single-call passes and stay fast on it."""
    out = tmp_path_factory.mktemp("small-model")
    spec = TinyModelSpec(
        vocab_size=512,
        hidden_size=64,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=128,
        corpus_documents=300,
    )
    build_tiny_model(out, spec)
    return out


@pytest.fixture
def store(tmp_path: Path) -> LocalStore:
    return LocalStore(tmp_path / "store")


@pytest.fixture(autouse=True)
def _one_thread():
    # A fixed thread count keeps float32 reduction orders fixed; one thread because the 2 cores are
    # shared with other test sessions and oversubscribed OpenMP threads spin.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
