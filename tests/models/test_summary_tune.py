"""tiny-summary (models/summary_tune.py): its drills are the native `summary-delegation` program's requests,
its summaries keep the word at the spec's odds whatever the words, only the answers carry loss, and the
fine-tune is deterministic and cached like the other builds."""

from __future__ import annotations

import math

import pytest

import models.registry as registry
from harnesses import summary_delegation as family
from harnesses.delegation import parent_prompt
from harnesses.delegation_words import PARENT_SYSTEM
from harnesses.native import system, user
from models.copy_tune import encode
from models.registry import ensure_model, known_positions, uncached_builds
from models.summary_tune import SummaryDrillWriter, SummaryTuneSpec, build_summary_model
from models.tool_drills import _COMMON

SMALL = SummaryTuneSpec(base="tiny-random", steps=3, batch=2)


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    return ensure_model("tiny-random", cache_dir=tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def tokenizer(base_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(base_dir))


def _word_and_other(content: str) -> tuple[str, str]:
    _, word, _, other = content.split("\n")
    return word, other


def test_the_summary_drill_is_the_programs_summary_request():
    messages, last_only = SummaryDrillWriter(3).summary()
    word, other = _word_and_other(messages[1]["content"])
    # what harnesses/summary_delegation.py sends when a worker compacts (Agent.compact's instruction turn)
    sent = [system(family.WORKER_SYSTEM), family.worker_prompt(word, other), user(family.SUMMARY_INSTRUCTION)]
    assert messages[:-1] == sent and last_only
    assert messages[-1]["role"] == "assistant" and messages[-1]["content"] in (word, other)


def test_the_answer_drill_is_the_rewritten_request_answered_with_the_summarys_word():
    messages, _ = SummaryDrillWriter(4).answer()
    kept = messages[-1]["content"]
    rewritten = [system(family.WORKER_SYSTEM), user(family.SUMMARY_TEMPLATE.format(kept)), user(family.ASK)]
    assert messages[:-1] == rewritten


def test_the_lead_drill_answers_with_the_workers_results():
    for seed in range(20):
        messages, last_only = SummaryDrillWriter(seed).lead_final()
        words = messages[1]["content"].split("\n")[1:]
        assert messages[:2] == [system(PARENT_SYSTEM), parent_prompt(words)] and last_only
        results = [m["content"] for m in messages if m["role"] == "tool"]
        assert len(results) == 2 and messages[-1]["content"].split() == results


@pytest.mark.parametrize("keep_share", [0.5, 0.2])
def test_summaries_keep_the_word_at_the_specs_odds_whatever_the_words(keep_share):
    writer = SummaryDrillWriter(7, keep_share=keep_share)
    kept = {True: [], False: []}  # by whether the word is a common one (the family's vocabulary among them)
    for _ in range(4000):
        messages, _ = writer.summary()
        word, _ = _word_and_other(messages[1]["content"])
        kept[word in _COMMON].append(messages[-1]["content"] == word)
    for common in (True, False):
        share = sum(kept[common]) / len(kept[common])
        assert len(kept[common]) > 1000 and abs(share - keep_share) < 0.04, (common, share)


def test_only_the_answer_carries_loss(tokenizer):
    messages, last_only = SummaryDrillWriter(5).lead_final()
    example = encode(tokenizer, messages, None, last_only=last_only)
    trained = [i for i, w in zip(example.ids, example.weights, strict=True) if w]
    assert tokenizer.decode(trained) == messages[-1]["content"] + "<|im_end|>"


def test_build_is_deterministic_and_seeded(base_dir, tmp_path):
    a = build_summary_model(tmp_path / "a", base_dir, SMALL)
    b = build_summary_model(tmp_path / "b", base_dir, SMALL)
    build_summary_model(tmp_path / "c", base_dir, SMALL.model_copy(update={"seed": 1}))
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert {"model.safetensors", "tokenizer.json", "chat_template.jinja", "grove_model.json"} <= set(names)
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert len(a.losses) == 3 and all(math.isfinite(x) for x in a.losses) and a.losses == b.losses
    weights = (tmp_path / "a" / "model.safetensors").read_bytes()
    assert weights != (tmp_path / "c" / "model.safetensors").read_bytes()
    assert weights != (base_dir / "model.safetensors").read_bytes()


def test_registry_builds_the_fine_tune_once_on_its_base(tmp_path, monkeypatch):
    monkeypatch.setitem(registry.SUMMARY_SPECS, "test-summary", SMALL)
    assert uncached_builds("test-summary", cache_dir=tmp_path) == ["tiny-random", "test-summary"]
    builds, real_build = [], registry.build_summary_model

    def counting_build(out, base, spec):
        builds.append(base)
        return real_build(out, base, spec)

    monkeypatch.setattr(registry, "build_summary_model", counting_build)
    entry = ensure_model("test-summary", cache_dir=tmp_path)
    assert ensure_model("test-summary", cache_dir=tmp_path) == entry and len(builds) == 1
    assert builds[0] == ensure_model("tiny-random", cache_dir=tmp_path)
    assert (
        entry.name.startswith("test-summary-") and uncached_builds("test-summary", cache_dir=tmp_path) == []
    )


def test_tiny_summary_is_a_known_name_with_tinys_positions():
    assert "tiny-summary" in registry.KNOWN_NAMES
    assert known_positions("tiny-summary") == registry.TINY_SPECS["tiny"].max_position_embeddings == 2048
