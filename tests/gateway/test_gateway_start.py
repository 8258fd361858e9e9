"""The gateway refuses, at start, a context (`--max-model-len`) past the served model's positions.

No engine serves such a context (`grove worker` refuses to start one: models/limits.py
`check_positions`), so a gateway measuring prompts against it would admit prompts every engine refuses.
Real tiny model folders from the grove cache (tiny-random, 2,048 positions; tiny-tools' untrained twin,
32,768), the real `python -m gateway` process; no Temporal server (the refusal comes before the gateway
connects).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.intake.context_window import ContextWindow
from models.limits import ContextExceedsModelError
from storage.local import LocalStore
from tests.bounds import PROCESS_WAIT

REPO = Path(__file__).resolve().parents[2]


def positions(model_dir: Path) -> int:
    return json.loads((model_dir / "config.json").read_text())["max_position_embeddings"]


def test_the_context_window_refuses_a_context_past_the_models_positions(
    tiny_model_dir, tools_twin_dir, tmp_path
):
    store = LocalStore(tmp_path / "store")
    limit = positions(tiny_model_dir)
    assert ContextWindow.load("tiny-random", limit, store).max_model_len == limit
    with pytest.raises(ContextExceedsModelError) as err:
        ContextWindow.load("tiny-random", limit + 1, store)
    text = str(err.value)
    assert "gateway for model 'tiny-random'" in text
    assert f"max_model_len={limit + 1}" in text and f"max_position_embeddings={limit}" in text
    # per model: a model with more positions takes the same context
    assert positions(tools_twin_dir) > limit
    assert ContextWindow.load(str(tools_twin_dir), limit + 1, store).max_model_len == limit + 1


def test_the_gateway_command_exits_with_the_named_error_before_serving(tiny_model_dir, tmp_path):
    limit = positions(tiny_model_dir)
    env = {
        **os.environ,
        "GROVE_GATEWAY_SECRET": "s" * 64,
        "GROVE_STORE": str(tmp_path / "store"),
        "PYTHONPATH": str(REPO),
    }
    # port 1 of loopback: nothing listens there; a gateway that got as far as connecting would fail otherwise
    args = ["--policy-model", "tiny-random", "--max-model-len", str(limit + 1), "--address", "127.0.0.1:1"]
    command = [sys.executable, "-m", "gateway", *args]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=PROCESS_WAIT)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "ContextExceedsModelError" in done.stderr
    assert f"max_position_embeddings={limit}" in done.stderr
    assert "Uvicorn running" not in done.stderr and "Traceback" not in done.stderr
