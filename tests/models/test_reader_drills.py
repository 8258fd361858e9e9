"""The `opencode-reader` worker's drills (models/reader_drills.py) are OpenCode's own requests: built from
the values of the captured episode (opencode-ai 1.18.33, models/harness_text/opencode_1_18_33_reader.json),
each drill's prompt equals the captured request message for message, and its answers carry the word."""

from __future__ import annotations

import json
import random
import re

import pytest

from chat.render import canonical_message
from models.copy_tune import CopyDrillWriter, CopyTuneSpec, _step_groups
from models.reader_drills import (
    READER_TEXT,
    after_compaction_turns,
    notes_text,
    read_result,
    read_tool,
    summary_turns,
    worker_turns,
)

CAPTURED = json.loads(READER_TEXT.read_text())["requests"]
# what the captured episode had: its project folder, its notes (16 lines), the worker's ask and answer
FOLDER = "/work/wt/cap/run/project"
NOTES = "".join(f"Note {k}: the gate is red and slow.\n" for k in range(1, 17))
ANSWER = "you"  # the scripted server's reply to the worker


def _ask(request: str) -> str:
    return CAPTURED[request]["messages"][1]["content"]


def _same(drill: list[dict], captured: list[dict]) -> None:
    """Equal as the chat template sees them (it renders no call ids, `tool_call_id` neither)."""

    def seen(m: dict) -> dict:
        return {k: v for k, v in canonical_message(m).items() if k != "tool_call_id"}

    assert [seen(m) for m in drill] == [seen(m) for m in captured]


def test_first_request_and_read_result_are_opencodes():
    system = CAPTURED["worker_first"]["messages"][0]["content"]
    for request, n in (("worker_first", 2), ("worker_read_result", 4)):
        turns = worker_turns(system, _ask(request), read_result(FOLDER, NOTES), ANSWER)
        _same(turns[:n], CAPTURED[request]["messages"])
    assert CAPTURED["worker_first"]["tools"] == [read_tool()]


def test_compaction_call_flattens_the_conversation_as_opencode_does():
    ask = re.search(r"\[User\]: (.*)\n", CAPTURED["summary"]["messages"][1]["content"]).group(1)
    turns = summary_turns(ask, read_result(FOLDER, NOTES), ANSWER)
    _same(turns[:2], CAPTURED["summary"]["messages"])
    assert ask in turns[2]["content"] and "The word is you." in turns[2]["content"]


def test_a_result_past_2000_characters_is_cut_as_opencode_cuts_it():
    long_notes = notes_text(random.Random(0), 120)
    user = summary_turns("Reply with the word quintessa.", read_result(FOLDER, long_notes), ANSWER)[1][
        "content"
    ]
    cut = user.split("[Tool result]: ", 1)[1].split("\n[truncated]\n\n[Assistant]: you\n", 1)
    assert len(cut) == 2 and len(cut[0]) == 2000


def test_after_compaction_is_opencodes_rewritten_session():
    captured = CAPTURED["after_compaction"]["messages"]
    turns = after_compaction_turns(captured[0]["content"], "Reply with the word quintessa.", "quintessa")
    assert [m["role"] for m in turns[:4]] == [m["role"] for m in captured]
    assert turns[1] == captured[1] and turns[3] == captured[3]  # OpenCode's fixed texts
    assert turns[0] == captured[0]
    assert turns[-1] == {"role": "assistant", "content": "quintessa"}


def test_notes_hold_only_common_words():
    text = notes_text(random.Random(3), 20)
    assert len(text.splitlines()) == 20
    nouns, adjectives = (
        "gate door road lamp tree wall bell ship desk rope mill well",
        "red slow old new cold wide dark calm loud tall soft dry",
    )
    assert set(re.findall(r"[a-z]+", text.lower())) <= {
        "note",
        "the",
        "is",
        "and",
        *nouns.split(),
        *adjectives.split(),
    }


@pytest.mark.parametrize("held_out", [False, True])
def test_readers_are_workers_of_one_environment_and_their_words(held_out):
    from models.tool_drills import is_held_out

    with_tool, summaries = CopyDrillWriter(7, held_out=held_out).readers(3, (12, 20))
    assert len(with_tool) == 6 and len(summaries) == 3
    for (worker, tools, last), (after, tools2, last2), (summary, none, last3) in zip(
        with_tool[::2], with_tool[1::2], summaries, strict=True
    ):
        word = worker[-1]["content"]
        assert worker[1]["content"] == f"Reply with the word {word}." and is_held_out(word) == held_out
        assert f"The word is {word}." in summary[-1]["content"] and after[-1]["content"] == word
        assert 12 <= worker[3]["content"].count(": Note ") <= 20
        assert worker[0] == after[0] == with_tool[0][0][0]  # one system prompt: a shared prefix
        assert tools == tools2 == [read_tool()] and none is None
        assert (last, last2, last3) == (False, True, False)


def test_reader_steps_come_after_the_resume_steps():
    from transformers import AutoTokenizer

    from models.registry import ensure_model

    tok = AutoTokenizer.from_pretrained(str(ensure_model("tiny-random")))
    spec = CopyTuneSpec(
        base="tiny-random", dense_steps=0, real_steps=0, resume_steps=1, resume_leads=1, reader_steps=1,
        reader_workers=2, reader_leads=1, real_workers=0, real_dense=0,
    )  # fmt: skip
    writer = CopyDrillWriter(0)
    resume, reader = _step_groups(writer, tok, spec, 0), _step_groups(writer, tok, spec, 1)
    assert [len(g.examples) for g in resume] == [1]
    assert [len(g.examples) for g in reader] == [4, 2, 1]  # 2 workers: 2 with the tool, 1 summary; 1 lead
    assert all(g.shared_prefix for g in reader)
    assert "reader_steps" not in CopyTuneSpec().fingerprint_json()
    assert "reader_steps" in spec.fingerprint_json()
