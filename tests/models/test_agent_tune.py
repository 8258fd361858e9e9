"""The agent fine-tune (models/agent_tune.py) on the random tiny model: its phases' batches, a
deterministic build whose folder vLLM and transformers load with the raised positions, and the registry
building it once on its base."""

from __future__ import annotations

import json
import math

import pytest

import models.registry as registry
from models.agent_drills import AgentDrillWriter
from models.agent_tune import AgentTuneSpec, build_agent_model, step_groups
from models.registry import ensure_model, known_positions, uncached_builds

SMALL = AgentTuneSpec(
    base="tiny-random",
    induction_steps=1,
    induction_batch=2,
    induction_len=8,
    induction_chats=1,
    copy_steps=1,
    copy_batch=2,
    copy_mix=1,
    steps=2,
    opencode_cases=1,
    opencode_every=2,
    mixed_cases=2,
    max_position_embeddings=4096,
)


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    return ensure_model("tiny-random", cache_dir=tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def tokenizer(base_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(base_dir))


def test_each_phase_trains_what_it_says(tokenizer):
    writer = AgentDrillWriter(0)
    (repeats, _), *chats = step_groups(writer, tokenizer, SMALL, 0)
    for e in repeats:  # the loss is on the repeat, after its first token
        assert e.ids[:8] == e.ids[8:] and e.weights == [0.0] * 9 + [1.0] * 7
    assert sum(len(g) for g, _ in chats) == SMALL.induction_chats
    (copies, shared), *_ = step_groups(writer, tokenizer, SMALL, 1)
    assert not shared and len(copies) == SMALL.copy_batch
    groups = step_groups(writer, tokenizer, SMALL, 2)
    opencode, prefixed = groups[0]
    assert not prefixed and len(opencode) == SMALL.opencode_cases == 1  # one chat shares no prefix
    weighted = [i for i, w in zip(opencode[0].ids, opencode[0].weights, strict=True) if w]
    assert "<tool_call>" in tokenizer.decode(weighted)
    spec = SMALL.model_copy(update={"opencode_cases": 3})
    opencode, prefixed = step_groups(writer, tokenizer, spec, 2)[0]
    assert prefixed and len(opencode) == 3
    assert not step_groups(writer, tokenizer, SMALL, 3)[0][1]  # no OpenCode group on odd drill steps


def test_build_is_deterministic_and_raises_the_positions(base_dir, tmp_path):
    a = build_agent_model(tmp_path / "a", base_dir, SMALL)
    b = build_agent_model(tmp_path / "b", base_dir, SMALL)
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert {"model.safetensors", "tokenizer.json", "chat_template.jinja", "grove_model.json"} <= set(names)
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert len(a.losses) == 4 and all(math.isfinite(x) for x in a.losses) and a.losses == b.losses
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    assert config["max_position_embeddings"] == 4096
    assert (tmp_path / "a" / "model.safetensors").read_bytes() != (
        base_dir / "model.safetensors"
    ).read_bytes()


def test_the_registry_builds_it_once_on_its_base(tmp_path, monkeypatch):
    monkeypatch.setitem(registry.AGENT_SPECS, "test-agent", SMALL)
    assert uncached_builds("test-agent", cache_dir=tmp_path) == ["tiny-random", "test-agent"]
    entry = ensure_model("test-agent", cache_dir=tmp_path)
    assert ensure_model("test-agent", cache_dir=tmp_path) == entry and entry.name.startswith("test-agent-")
    assert uncached_builds("test-agent", cache_dir=tmp_path) == []
    assert known_positions("test-agent") == 4096 and known_positions("smol-agent") == 8192


def test_a_spec_without_induction_chats_or_stock_cases_keeps_its_fingerprint():
    for knob in ("induction_chats", "stock_cases"):
        assert knob not in AgentTuneSpec().fingerprint_json()
        assert knob in AgentTuneSpec(**{knob: 1}).fingerprint_json()


def test_stock_cases_share_their_harness_prefix_and_send_the_subagents_to_the_mix(tokenizer):
    """A step's stock group is one harness (Claude Code on even steps, Codex on odd) with one system prompt
    and tool list, so its examples share that prefix; each case's subagent chat trains in the mixed groups."""
    from models.copy_tune import _common_prefix

    spec = SMALL.model_copy(update={"induction_steps": 0, "copy_steps": 0, "stock_cases": 2, "copy_mix": 0})
    for step, marker in ((2, "Claude Agent SDK"), (1, "spawn_agent")):
        groups = step_groups(AgentDrillWriter(step), tokenizer, spec, step)
        stock = [(g, shared) for g, shared in groups if marker in tokenizer.decode(g[0].ids)]
        (leads, shared), *_ = stock
        assert shared and len(leads) == 2
        assert marker in tokenizer.decode(leads[0].ids[: _common_prefix(leads)])
        answered = sum(len(g) for g, _ in groups) - len(leads)
        assert answered >= 2 + spec.mixed_cases  # the two subagent chats and the mixed shapes


def test_a_fine_tune_on_smollm2_lists_the_conversion_first_and_builds_nothing(tmp_path):
    """`uncached_builds` is a look, not a build: on an empty cache smollm2's conversion is a step the
    fine-tune waits for, and the cache stays empty."""
    assert uncached_builds("smollm2", cache_dir=tmp_path) == ["smollm2"]
    assert uncached_builds("smol-agent", cache_dir=tmp_path) == ["smollm2", "smol-agent-base", "smol-agent"]
    assert list(tmp_path.iterdir()) == []
