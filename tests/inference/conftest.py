"""Fixtures of the inference tests: ONE real vLLM engine per session (slow to start).

The engine serves the pretrained tiny model (peaked distributions, ends turns with <|im_end|>).
Publication tests move its version forward; every test that compares logprobs compares against the
folder the engine currently serves (`engine.source_dir`), so test order does not matter.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from activities.engine import PolicyEngine
from activities.engine_config import EngineConfig
from storage.local import LocalStore


@pytest.fixture(scope="session")
async def policy_engine(tiny_trained_model_dir: Path):
    engine = await PolicyEngine.start(
        EngineConfig(model_dir=tiny_trained_model_dir, max_model_len=1024, kv_cache_bytes=64 * 2**20)
    )
    yield engine
    await engine.shutdown()


@pytest.fixture
def store(tmp_path: Path) -> LocalStore:
    return LocalStore(tmp_path / "store")
