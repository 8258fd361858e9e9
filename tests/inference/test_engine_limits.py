"""Engine limits (max_model_len, step token budget, KV cache) from `grove worker` flags and RunConfig,
checked against the model before vLLM starts; and a long context served by a model with the positions
for it (OpenCode's default first request, ~15k tokens in the tiny tokenizer).

The checks need only the model folder's config.json; the last test starts a real engine (heavy: run it
under the heavy lock)."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from activities.engine import PolicyEngine
from activities.engine_config import EngineConfig, check_engine_limits
from activities.engine_errors import KVCacheTooSmallError, StepBudgetTooSmallError
from cli.demo import engine_flags
from cli.main import app
from cli.run_commands import EXIT_INVALID_CONFIG
from grove.contracts import EngineLimits, RunConfig
from grove.sampling import SamplingConfig
from models.limits import ContextExceedsModelError
from models.tiny import TinyModelSpec, build_tiny_model
from models.tool_drills import harness_requests

runner = CliRunner()
TINY_POSITIONS = 2048  # TinyModelSpec's default max_position_embeddings (models/tiny.py)


def with_positions(src: Path, dst: Path, positions: int) -> Path:
    """A copy of `src`'s config.json claiming `positions` (all the limit checks read)."""
    dst.mkdir()
    config = json.loads((src / "config.json").read_text())
    config["max_position_embeddings"] = positions
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def test_a_context_past_the_models_positions_is_refused(tiny_model_dir):
    check_engine_limits(EngineConfig(model_dir=tiny_model_dir, max_model_len=TINY_POSITIONS))
    with pytest.raises(ContextExceedsModelError, match="max_position_embeddings=2048") as err:
        check_engine_limits(EngineConfig(model_dir=tiny_model_dir, max_model_len=TINY_POSITIONS + 1))
    assert "--max-model-len" in str(err.value) and str(tiny_model_dir) in str(err.value)


def test_the_step_budget_must_hold_a_whole_prompt_without_chunked_prefill(tiny_model_dir, tmp_path):
    model = with_positions(tiny_model_dir, tmp_path / "m", 8192)
    config = EngineConfig(model_dir=model, max_model_len=4096, max_num_batched_tokens=2048)
    with pytest.raises(StepBudgetTooSmallError, match="max_num_batched_tokens=2048 < max_model_len=4096"):
        check_engine_limits(config)
    check_engine_limits(config, chunked_prefill=True)  # a GPU engine splits prompts over steps
    assert EngineConfig(model_dir=model, max_model_len=4096).step_token_budget == 4096
    assert EngineConfig(model_dir=model, max_model_len=1024).step_token_budget == 2048


def test_the_kv_cache_must_hold_one_full_context(tiny_model_dir, tmp_path):
    model = with_positions(tiny_model_dir, tmp_path / "m", 32768)
    # K and V of 4 layers x 2 KV heads x 32 dims in float32 = 2,048 bytes a token: 32,768 tokens = 64 MiB
    check_engine_limits(EngineConfig(model_dir=model, max_model_len=32768, kv_cache_bytes=64 * 2**20))
    with pytest.raises(KVCacheTooSmallError, match="at least 67108864"):
        check_engine_limits(EngineConfig(model_dir=model, max_model_len=32768, kv_cache_bytes=48 * 2**20))


def test_engine_start_refuses_before_vllm_starts(tiny_model_dir):
    with pytest.raises(ContextExceedsModelError):
        asyncio.run(PolicyEngine.start(EngineConfig(model_dir=tiny_model_dir, max_model_len=4096)))


def test_worker_flags_are_checked_before_connecting(tiny_model_dir):
    """No Temporal server is needed: the worker refuses its flags first (exit 2, the reason on stderr)."""
    args = ["worker", "--queues", "inference", "--model", str(tiny_model_dir), "--address", "127.0.0.1:9"]
    bad = runner.invoke(app, [*args, "--max-model-len", "4096"])
    assert bad.exit_code == 2 and "max_position_embeddings=2048" in bad.output
    small = runner.invoke(app, [*args, "--kv-cache-bytes", "1000"])
    assert small.exit_code == 2 and "kv_cache_bytes" in small.output


def test_demo_passes_a_runs_limits_as_worker_flags():
    limits = EngineLimits(max_model_len=16384, max_num_batched_tokens=16384, kv_cache_bytes=2**30)
    flags = engine_flags(limits)
    assert flags == [
        "--max-model-len", "16384", "--kv-cache-bytes", str(2**30), "--max-num-batched-tokens", "16384",
    ]  # fmt: skip
    assert "--max-num-batched-tokens" not in engine_flags(EngineLimits())


def test_run_config_engine_limits_are_checked_against_the_model(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("run_id: r\nmodel: tiny\n")
    bad = runner.invoke(app, ["run", "validate", str(path), "engine.max_model_len=4096"])
    assert bad.exit_code == EXIT_INVALID_CONFIG and "max_position_embeddings=2048" in bad.output
    # tiny-tools' positions are known from its spec: nothing is built to check them
    ok = runner.invoke(
        app, ["run", "validate", str(path), "model=tiny-tools", "engine.max_model_len=16384", "--json"]
    )
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.output)["engine"]["max_model_len"] == 16384
    assert RunConfig(run_id="r").engine == EngineLimits()


def test_a_runs_kv_cache_is_checked_against_a_model_folder_before_it_starts(tiny_model_dir, tmp_path):
    """A model given as a folder says its bytes per token: a run whose KV cache cannot hold one context is
    refused by `grove run validate` (the worker would refuse it only after the run had started)."""
    model = with_positions(tiny_model_dir, tmp_path / "m", 32768)
    path = tmp_path / "run.yaml"
    path.write_text(f"run_id: r\nmodel: {model}\nengine:\n  max_model_len: 32768\n")
    small = runner.invoke(app, ["run", "validate", str(path), f"engine.kv_cache_bytes={48 * 2**20}"])
    assert small.exit_code == EXIT_INVALID_CONFIG and "at least 67108864" in small.output, small.output
    ok = runner.invoke(app, ["run", "validate", str(path), f"engine.kv_cache_bytes={64 * 2**20}"])
    assert ok.exit_code == 0, ok.output
    # the step budget is the worker's (a GPU engine prefills in chunks): not refused here
    wide = [f"engine.kv_cache_bytes={2**30}", "engine.max_num_batched_tokens=4096"]
    budget = runner.invoke(app, ["run", "validate", str(path), *wide])
    assert budget.exit_code == 0, budget.output


@pytest.mark.slow
@pytest.mark.long  # a 15k-token prefill on CPU takes minutes
def test_a_model_with_the_positions_serves_opencodes_default_prompt(tmp_path, tiny_model_dir):
    """OpenCode's default agent's first request (~15k tokens here) through a real engine with
    max_model_len 16384 on a model with 32768 positions: finite logprobs, the whole prompt kept."""
    model = tmp_path / "long"
    build_tiny_model(model, TinyModelSpec(max_position_embeddings=32768))
    shutil.copy(tiny_model_dir / "chat_template.jinja", model / "chat_template.jinja")
    body = harness_requests()["default_first"]

    async def serve() -> tuple[int, object]:
        engine = await PolicyEngine.start(
            EngineConfig(model_dir=model, max_model_len=16384, kv_cache_bytes=64 * 2**20, max_num_seqs=4)
        )
        try:
            tok = engine.tokenizer
            text = tok.apply_chat_template(
                body["messages"], tools=body["tools"], add_generation_prompt=True, tokenize=False
            )
            ids = tok(text, add_special_tokens=False)["input_ids"]
            sampling = SamplingConfig(temperature=1.0, max_tokens=8, ignore_eos=True)
            return len(ids), await engine.generate(ids, sampling, seed=1, request_id="opencode-default")
        finally:
            await engine.shutdown()

    n, gen = asyncio.run(serve())
    assert 2048 < n < 16384
    assert gen.prompt_ids.size == n and gen.completion_ids.size == 8
    assert np.isfinite(gen.logprobs).all()
