"""The tool-calling drills of `tiny-tools`: OpenCode's own text, calls of offered tools with the user's
words, the held-out split, and the loss weights of the builder's drill phases."""

from __future__ import annotations

import json
import random
import re

import pytest

from chat.toolcalls import parse_tool_calls
from models.tiny import _weighted_stream, assistant_spans
from models.tokenizer import train_tokenizer
from models.tool_drills import (
    _COMMON as COMMON,
)
from models.tool_drills import (
    ToolDrillWriter,
    draw_words,
    generate_tool_drills,
    harness_requests,
    is_held_out,
    task_tool,
)

SHAPES = ("short", "long")


def _dialogues(kind: str, shape: str, n: int = 40, seed: int = 11):
    writer = ToolDrillWriter(seed)
    return [getattr(writer, kind)(shape) for _ in range(n)]


def _letters(text: str) -> set[str]:
    return set(re.findall(r"[a-z]+", text.lower()))


def test_drills_are_a_pure_function_of_the_seed():
    for shape in SHAPES:
        a = generate_tool_drills(5, n_documents=30, shape=shape)
        assert a == generate_tool_drills(5, n_documents=30, shape=shape)
        assert a != generate_tool_drills(6, n_documents=30, shape=shape)


def test_held_out_words_never_reach_training_and_evaluation_gets_only_them():
    rng = random.Random(0)
    train = draw_words(rng, 3000)
    held = draw_words(rng, 400, held_out=True)
    assert not any(is_held_out(w) for w in train if w not in COMMON)
    assert not set(held) & set(COMMON)
    writer = ToolDrillWriter(2)
    assert not any(is_held_out(writer.name()) for _ in range(3000))
    assert all(is_held_out(w) for w in held)
    assert not set(train) & set(held)
    # about an eighth of all made-up words are held out: the pool left for training stays large
    share = sum(is_held_out(f"w{i}") for i in range(8000)) / 8000
    assert 0.09 < share < 0.16


@pytest.mark.parametrize("shape", SHAPES)
def test_lead_calls_the_task_tool_once_per_user_word(shape):
    for d in _dialogues("lead", shape):
        tool_names = [t["function"]["name"] for t in d.tools]
        assert "task" in tool_names
        task = next(t for t in d.tools if t["function"]["name"] == "task")["function"]
        agents = re.findall(r"^- ([a-z]+): ", task["description"], flags=re.M)
        user = next(m for m in d.messages if m["role"] == "user")["content"]
        calls = next(m for m in d.messages if m["role"] == "assistant")["tool_calls"]
        results = [m for m in d.messages if m["role"] == "tool"]
        assert len(calls) == len(results) >= 1
        for call in calls:
            args = call["function"]["arguments"]
            assert call["function"]["name"] == "task"
            assert set(task["parameters"]["required"]) <= set(args)
            assert args["subagent_type"] in agents
            # the word the call hands out is one the user gave
            assert _letters(args["prompt"]) & _letters(user)
        final = d.messages[-1]
        assert final["role"] == "assistant"
        for call in calls:
            word = sorted(_letters(call["function"]["arguments"]["description"]) & _letters(user))
            assert word and set(word) <= _letters(final["content"])


@pytest.mark.parametrize("shape", SHAPES)
def test_tool_use_fills_every_required_string_with_the_users_values(shape):
    for d in _dialogues("tool_use", shape):
        offered = {t["function"]["name"]: t["function"]["parameters"] for t in d.tools}
        user = next(m for m in d.messages if m["role"] == "user")["content"]
        (call,) = next(m for m in d.messages if m["role"] == "assistant")["tool_calls"]
        params = offered[call["function"]["name"]]
        args = call["function"]["arguments"]
        assert set(args) == {p for p in params["required"] if params["properties"][p].get("type") == "string"}
        assert all(v in user for v in args.values())
        result = d.messages[3]["content"]
        assert _letters(d.messages[4]["content"]) <= _letters(result) | {"the", "result", "is"}


@pytest.mark.parametrize("kind", ["lead", "tool_use"])
def test_rendered_calls_parse_back_with_the_gateways_parser(kind):
    """What the model is trained to write is what the gateway parses into `tool_calls`."""
    for d in _dialogues(kind, "short", n=20):
        text = d.render()
        calls = next(m for m in d.messages if m["role"] == "assistant")["tool_calls"]
        a, b = assistant_spans(text)[0]
        parsed = parse_tool_calls(text[a:b].removesuffix("<|im_end|>"))
        assert parsed.malformed is None
        got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.tool_calls]
        assert got == [(c["function"]["name"], c["function"]["arguments"]) for c in calls]


def test_long_shape_uses_opencodes_captured_task_tool_and_prompts():
    captured = harness_requests()["lead_first"]
    assert task_tool([("worker", "Repeats the word it is given.")], "long") == captured["tools"][0]
    (d,) = _dialogues("lead", "long", n=1)
    system = d.messages[0]["content"]
    assert "Here is some useful information about the environment you are running in:\n<env>" in system
    assert "/tmp/tm-oc" not in system  # the captured directory is replaced by drawn ones
    summary = _dialogues("summary", "long", n=1)[0]
    assert summary.messages[0] == harness_requests()["summary"]["messages"][0]


def test_weights_mark_exactly_the_assistant_turns():
    docs = generate_tool_drills(3, n_documents=12, shape="short")
    tok = train_tokenizer(generate_tool_drills(4, n_documents=200, shape="short"), vocab_size=600)
    ids, weights, starts = _weighted_stream(tok, docs, 0.25)
    assert len(ids) == len(weights) and starts[0] == 0 and len(starts) == len(docs)
    assert set(weights.tolist()) == {1.0, 0.25}
    trained = tok.decode(
        [int(i) for i, w in zip(ids, weights, strict=True) if w == 1.0], skip_special_tokens=False
    )
    expected = "".join(doc[a:b] for doc in docs for a, b in assistant_spans(doc))
    assert trained == expected
