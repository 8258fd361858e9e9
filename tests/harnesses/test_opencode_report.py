"""The opencode-report family: its reward on hand-written reports and final answers, its episodes
(opencode-reader's, with the worker's compaction), and which of the drilled shapes it pays for."""

from __future__ import annotations

import pytest

from grove.contracts import HarnessOutcome, OpenCodeOptions
from harnesses import opencode_reader
from harnesses.opencode import setup_for
from harnesses.opencode_report import FAMILY, final_score, make_task, report_score, score
from harnesses.programs import family
from models.report_drills import FINAL_SHAPES, REPORT_SHAPES

A, B, C = "ses_dcece9cdeffeW1lpdLszecT6AB", "ses_dcece9c52ffeikIH177Hv0454p", "ses_dcece9c52ffeikIH177Hv0455q"
RAMBLE = "I read notes.txt. The gate is red and the lamp is old."


@pytest.mark.parametrize(
    ("report", "expected"),
    [
        ("DONE zorblat", 1.0),
        ("  DONE zorblat\n", 1.0),  # OpenCode's task result keeps the text's own spacing
        ("DONE zor blat", 1.0),  # three words: still short
        ("zorblat", 0.5),  # short, no marker
        ("DONE zorblat.", 1.0),
        ("DONE: zorblat", 0.5),  # the marker is the word DONE itself
        ("done zorblat", 0.5),
        (f"DONE zorblat\n{RAMBLE}", 0.5),  # rambling after the answer
        ("The word is zorblat.", 0.0),
        (f"zorblat\n{RAMBLE}", 0.0),
        ("", 0.0),
        ("   \n", 0.0),
        ('<tool_call>{"name": "read", "arguments": {"filePath": "notes.txt"}}</tool_call>', 0.0),
        ("DONE {zorblat}", 0.0),  # markup: tool-call junk scores nothing
    ],
)
def test_a_workers_report_earns_half_for_the_marker_and_half_for_being_short(report, expected):
    assert report_score(report) == expected


@pytest.mark.parametrize(
    ("final", "expected"),
    [
        ("zorblat quintessa", 1.0),
        ("zorblat, quintessa", 1.0),
        ("zorblat\nquintessa", 0.5),  # two words, two lines
        ("The workers said zorblat and quintessa.", 0.5),  # one line, six words
        ("zorblatquintessa", 0.5),
        (f"zorblat quintessa\n{RAMBLE}", 0.0),
        ("DONE zorblat DONE quintessa", 0.5),  # the reports relayed whole
        ("", 0.0),
        ('<tool_call>{"name": "task"}</tool_call>', 0.0),
    ],
)
def test_the_leads_final_answer_earns_half_for_one_line_and_half_for_two_words(final, expected):
    assert final_score(final) == expected


def outcome(final: str, *reports: str) -> HarnessOutcome:
    """As the harness runner builds it: the parent's answer, one `worker-<n>` per completed task call."""
    outputs = {"parent": [final]} | {f"worker-{i}": [r] for i, r in enumerate(reports, start=1)}
    return HarnessOutcome(final_answer=final, outputs=outputs)


def test_the_reward_of_whole_episodes_and_its_components():
    task = make_task(0)
    best = score(task, outcome("zorblat quintessa", "DONE zorblat", "DONE quintessa"))
    assert best.reward == 1.0
    assert best.details == {
        "workers": 1.0, "parent": 1.0, "report_marker": 1.0, "report_short": 1.0, "delegated": 1.0,
        "final_one_line": 1.0, "final_two_words": 1.0,
    }  # fmt: skip
    mixed = score(task, outcome("zorblat\nquintessa", "zorblat", f"DONE quintessa\n{RAMBLE}"))
    assert mixed.reward == pytest.approx((0.5 + 0.5 + 0.5) / 3)  # each of the three texts weighs a third
    assert (mixed.details["report_marker"], mixed.details["report_short"]) == (0.5, 0.5)
    assert score(task, HarnessOutcome()).reward == 0.0


def test_the_lead_must_delegate_to_exactly_two_workers():
    task = make_task(1)
    alone = score(task, outcome("zorblat quintessa"))  # answered without delegating
    assert alone.reward == 0.0 and alone.details["delegated"] == 0.0
    one = score(task, outcome("zorblat quintessa", "DONE zorblat"))
    assert one.details["parent"] == 0.0 and one.details["workers"] == 0.5  # the missing worker scores 0
    assert one.reward == pytest.approx(1 / 3)
    three = score(task, outcome("zorblat quintessa", "DONE a", "DONE b", "DONE c"))
    assert three.details["parent"] == 0.0 and three.details["workers"] == 1.0  # three slots, all full
    assert three.reward == pytest.approx(2 / 3)
    two = score(task, outcome("zorblat quintessa", "DONE a", "DONE b"))
    assert two.reward == 1.0


def test_the_reward_reads_no_word_of_the_task():
    """A form reward: the same texts score the same on any task, whatever the words (what an update learns
    on one task's batch is what the next task pays for)."""
    episode = outcome("zorblat quintessa", "DONE zorblat", "quintessa")
    rewards = {score(make_task(i), episode).reward for i in range(20)}
    assert rewards == {(1.0 + 0.5 + 1.0) / 3}


def test_exactly_one_drilled_shape_of_each_is_the_rewarded_one():
    reports = [report_score(s.format(w="zorblat", ramble=RAMBLE)) for s in REPORT_SHAPES]
    assert reports == [0.5, 1.0, 0.0, 0.5, 0.0]
    finals = [final_score(s.format(w1="zorblat", w2="quintessa", ramble=RAMBLE)) for s in FINAL_SHAPES]
    assert finals == [1.0, 0.5, 0.5, 0.0]


def test_tasks_are_the_families_own_and_episodes_are_opencode_readers():
    assert family(FAMILY)[0] is make_task
    tasks = [make_task(i) for i in range(30)]
    assert all(t.family == FAMILY and t.task_id == f"{FAMILY}-{i}" for i, t in enumerate(tasks))
    assert len({tuple(t.params["words"]) for t in tasks}) == 30
    assert tasks[0].params != opencode_reader.make_task(0).params  # drawn under this family's name
    setup = setup_for(tasks[0], OpenCodeOptions())
    # the reader's episode: its agents, the worker's context limit that forces a compaction, the notes
    assert setup.agents == opencode_reader.OPENCODE_AGENTS
    assert setup.agent_context_limits == {"worker": opencode_reader.WORKER_CONTEXT}
    assert setup.files == {"notes.txt": opencode_reader.notes(tasks[0])}
    assert setup.message == "Words: " + " ".join(tasks[0].params["words"])
