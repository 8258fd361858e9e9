"""Fixtures of the learner tests: the tiny random Qwen3 folder and a local object store."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from models.registry import ensure_model
from storage.local import LocalStore


@pytest.fixture(scope="session")
def learner_model_dir() -> Path:
    """tiny-random: a ~1M-parameter Qwen3 (vocab 2048, head_dim 32) with tokenizer and chat template."""
    return ensure_model("tiny-random")


@pytest.fixture
def store(tmp_path: Path) -> LocalStore:
    return LocalStore(tmp_path / "store")


@pytest.fixture(autouse=True)
def _two_threads():
    # The reference comparisons are float32: keep the thread count (and so reduction order) fixed.
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)
