"""tiny-copy (models/copy_tune.py): its drills copy the words they draw on the right side of the held-out
split, only the answers carry loss, and the fine-tune is deterministic and cached like the other builds."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

import models.registry as registry
from models.copy_tune import (
    CopyDrillWriter,
    CopyTuneSpec,
    _common_prefix,
    _group_loss,
    _prefixed_loss,
    _step_groups,
    build_copy_model,
    encode,
)
from models.registry import ensure_model, known_positions
from models.tool_drills import is_held_out

SMALL = CopyTuneSpec(
    base="tiny-random",
    dense_steps=2,
    dense_batch=2,
    lead_every=2,
    dense_leads=2,
    real_steps=1,
    real_leads=2,
    real_workers=1,
    real_dense=1,
)


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    return ensure_model("tiny-random", cache_dir=tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def tokenizer(base_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(base_dir))


def _user_words(content: str) -> list[str]:
    return content.strip('"').removeprefix("Words: ").split()


@pytest.mark.parametrize("held_out", [False, True])
def test_lead_calls_carry_the_users_words_from_one_side_of_the_split(held_out):
    writer = CopyDrillWriter(7, held_out=held_out)
    for _ in range(40):
        messages, tools = writer.lead_first()
        words = _user_words(messages[1]["content"])
        prompts = [c["function"]["arguments"]["prompt"] for c in messages[2]["tool_calls"]]
        assert prompts == [f"Reply with the word {w}." for w in words] and len(words) == 2
        assert [t["function"]["name"] for t in tools] == ["task"]
        made_up = [w for w in words if re.fullmatch(r"[a-z]+", w) and len(w) > 4]
        assert all(is_held_out(w) == held_out for w in made_up)


def test_resumption_answers_with_the_words_the_workers_returned():
    messages, _ = CopyDrillWriter(3).lead_resume()
    words = _user_words(messages[1]["content"])
    results = [m["content"] for m in messages if m["role"] == "tool"]
    assert all(f"<task_result>\n{w}" in r for w, r in zip(words, results, strict=True))
    assert messages[-1]["content"].split() == words


def test_only_the_assistant_turns_carry_loss(tokenizer):
    messages, tools = CopyDrillWriter(5).lead_resume()
    example = encode(tokenizer, messages, tools)
    weighted = tokenizer.decode([i for i, w in zip(example.ids, example.weights, strict=True) if w])
    calls = "".join(
        '<tool_call>{"name": "task", "arguments": '
        + json.dumps(c["function"]["arguments"])
        + "}</tool_call>\n"
        for c in messages[2]["tool_calls"]
    ).rstrip("\n")
    assert weighted == calls + "<|im_end|>" + messages[-1]["content"] + "<|im_end|>"


def test_a_resume_example_weighs_the_final_answer_only(tokenizer):
    messages, tools = CopyDrillWriter(5).lead_resume()
    example = encode(tokenizer, messages, tools, last_only=True)
    weighted = tokenizer.decode([i for i, w in zip(example.ids, example.weights, strict=True) if w])
    assert weighted == messages[-1]["content"] + "<|im_end|>"
    assert example.ids == encode(tokenizer, messages, tools).ids  # the same tokens, less loss


def test_resume_steps_train_resumptions_of_one_environment_on_their_final_answers(tokenizer):
    spec = SMALL.model_copy(update={"resume_steps": 2, "resume_leads": 3})
    writer = CopyDrillWriter(0, max_words=spec.max_words)
    groups = _step_groups(writer, tokenizer, spec, spec.dense_steps + spec.real_steps)
    finals = groups[0]
    assert finals.shared_prefix and len(finals.examples) == 3
    for e in finals.examples:
        weighted = tokenizer.decode([i for i, w in zip(e.ids, e.weights, strict=True) if w])
        assert weighted.endswith("<|im_end|>") and "<tool_call>" not in weighted
    assert _common_prefix(finals.examples) > 500  # one system prompt and tool schema for all three
    assert spec.total_steps == SMALL.total_steps + 2
    # with resume_firsts, first lead turns (their `task` calls, every token) train beside the finals
    spec = spec.model_copy(update={"resume_firsts": 2})
    firsts = _step_groups(writer, tokenizer, spec, spec.dense_steps + spec.real_steps)[1]
    assert firsts.shared_prefix and len(firsts.examples) == 2
    for e in firsts.examples:
        weighted = tokenizer.decode([i for i, w in zip(e.ids, e.weights, strict=True) if w])
        assert weighted.startswith("<tool_call>") and weighted.count("<tool_call>") == 2


def test_a_spec_without_resume_steps_keeps_the_fingerprint_it_had_before_they_existed():
    """tiny-copy's cache entry stays valid: its spec JSON is what it was (no resume fields)."""
    before = (
        '{"version":"copy-1","base":"tiny-tools","seed":0,"dense_steps":500,"dense_batch":16,'
        '"lead_every":4,"dense_leads":2,"real_steps":150,"real_leads":8,"real_workers":4,"real_dense":4,'
        '"learning_rate":0.003,"warmup_steps":20,"max_words":8}'
    )  # CopyTuneSpec().model_dump_json() at 625f23c
    assert CopyTuneSpec().fingerprint_json() == before
    assert "resume_steps" in CopyTuneSpec(resume_steps=1).fingerprint_json()


def test_a_shared_prefix_runs_once_and_gives_the_same_loss(base_dir, tokenizer):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
    batch = [encode(tokenizer, *d) for d in CopyDrillWriter(11).leads(3)]
    shared = _common_prefix(batch)
    assert shared > 500 and len({tuple(e.ids[:shared]) for e in batch}) == 1
    with torch.no_grad():
        whole = _group_loss(model, batch, pad_id=0).item()
        prefixed = _prefixed_loss(model, batch, pad_id=0).item()
    assert prefixed == pytest.approx(whole, rel=1e-4) and whole > 0


def test_build_is_deterministic_and_seeded(base_dir, tmp_path):
    a = build_copy_model(tmp_path / "a", base_dir, SMALL)
    b = build_copy_model(tmp_path / "b", base_dir, SMALL)
    build_copy_model(tmp_path / "c", base_dir, SMALL.model_copy(update={"seed": 1}))
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert "model.safetensors" in names and "tokenizer.json" in names and "chat_template.jinja" in names
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert len(a.losses) == 3 and all(math.isfinite(x) for x in a.losses) and a.losses == b.losses
    weights = (tmp_path / "a" / "model.safetensors").read_bytes()
    assert weights != (tmp_path / "c" / "model.safetensors").read_bytes()
    assert weights != (base_dir / "model.safetensors").read_bytes()


def test_registry_builds_a_fine_tune_once_on_its_base(tmp_path, monkeypatch):
    monkeypatch.setitem(registry.COPY_SPECS, "test-copy", SMALL)
    builds, real_build = [], registry.build_copy_model

    def counting_build(out, base, spec):
        builds.append(base)
        return real_build(out, base, spec)

    monkeypatch.setattr(registry, "build_copy_model", counting_build)
    entry = ensure_model("test-copy", cache_dir=tmp_path)
    assert ensure_model("test-copy", cache_dir=tmp_path) == entry and len(builds) == 1
    assert builds[0] == ensure_model("tiny-random", cache_dir=tmp_path)
    assert entry.name.startswith("test-copy-") and (entry / "grove_model.json").is_file()
    assert known_positions("test-copy") == registry.TINY_SPECS["tiny-random"].max_position_embeddings


def test_tiny_copy_is_a_known_name_with_tiny_tools_positions():
    assert "tiny-copy" in registry.KNOWN_NAMES
    assert known_positions("tiny-copy") == 32768
