"""`tiny-report`'s drills (models/report_drills.py through models/copy_tune.py): workers' reports and the
lead's final answers come in every drilled shape, each around the task's own word(s); the unshaped
drills of the builds made before are untouched; report steps come after the reader steps."""

from __future__ import annotations

import random
import re
from collections import Counter

from models.copy_tune import CopyDrillWriter, CopyTuneSpec, _step_groups
from models.report_drills import FINAL_SHAPES, REPORT_MARKER, REPORT_SHAPES, final_answer, worker_report


def shape_of(text: str, shapes: tuple[str, ...], **words: str) -> int:
    """Index of the one shape `text` is, with the words filled in and any ramble."""
    found = [
        i
        for i, shape in enumerate(shapes)
        if re.fullmatch(re.escape(shape.format(**words, ramble="\x00")).replace("\x00", "I read .*"), text)
    ]
    assert len(found) == 1, (text, found)
    return found[0]


def test_every_shape_is_drawn_at_about_equal_odds():
    rng = random.Random(0)
    reports = Counter(
        shape_of(worker_report(rng, "zorblat"), REPORT_SHAPES, w="zorblat") for _ in range(1000)
    )
    finals = Counter(
        shape_of(final_answer(rng, ["zorblat", "quintessa"]), FINAL_SHAPES, w1="zorblat", w2="quintessa")
        for _ in range(1000)
    )
    assert set(reports) == set(range(len(REPORT_SHAPES))) and min(reports.values()) > 150  # 200 expected
    assert set(finals) == set(range(len(FINAL_SHAPES))) and min(finals.values()) > 200  # 250 expected
    assert REPORT_SHAPES[1] == REPORT_MARKER + " {w}"


def test_shaped_readers_report_their_own_word_in_some_shape():
    writer = CopyDrillWriter(7)
    seen = set()
    for _ in range(20):
        with_tool, _ = writer.readers(3, (12, 20), shaped=True)
        for (worker, _, _), (after, _, _) in zip(with_tool[::2], with_tool[1::2], strict=True):
            word = worker[-1]["content"]  # the answer before compaction stays the word
            assert worker[1]["content"] == f"Reply with the word {word}."
            seen.add(shape_of(after[-1]["content"], REPORT_SHAPES, w=word))
    assert seen == set(range(len(REPORT_SHAPES)))


def test_shaped_resumptions_carry_shaped_results_and_a_shaped_final_answer():
    writer = CopyDrillWriter(3)
    seen = set()
    for _ in range(30):
        messages, _ = writer.lead_resume(shaped=True)
        words = [c["function"]["arguments"]["prompt"].split()[-1][:-1] for c in messages[2]["tool_calls"]]
        results = [m["content"] for m in messages if m["role"] == "tool"]
        for word, result in zip(words, results, strict=True):
            report = re.search(r"<task_result>\n(.*)\n</task_result>", result, re.DOTALL).group(1)
            shape_of(report, REPORT_SHAPES, w=word)
        seen.add(shape_of(messages[-1]["content"], FINAL_SHAPES, w1=words[0], w2=words[1]))
    assert seen == set(range(len(FINAL_SHAPES)))


def test_unshaped_drills_draw_what_they_always_drew():
    """The builds made before (tiny-resume, tiny-reader) keep their fingerprint, so their drills must
    stay the same draws: the default is unshaped, and the unshaped stream is as recorded here."""
    messages, _ = CopyDrillWriter(3).lead_resume()
    results = [m["content"] for m in messages if m["role"] == "tool"]
    assert [re.search(r"<task_result>\n(.*)\n", r).group(1) for r in results] == [
        "drouxpliat",
        "plustorn.",
    ]  # as main's drills drew them before report shapes existed
    assert messages[-1]["content"] == "drouxpliat\nplustorn"
    with_tool, _ = CopyDrillWriter(7).readers(2, (12, 20))
    reports = [after[-1]["content"] for after, _, _ in with_tool[1::2]]
    assert reports == [worker[-1]["content"] for worker, _, _ in with_tool[::2]]  # the bare word


def test_report_steps_come_after_the_reader_steps():
    from transformers import AutoTokenizer

    from models.registry import ensure_model

    tok = AutoTokenizer.from_pretrained(str(ensure_model("tiny-random")))
    spec = CopyTuneSpec(
        base="tiny-random", dense_steps=0, real_steps=0, reader_steps=1, report_steps=1, reader_workers=2,
        reader_leads=1, real_workers=0, real_dense=0,
    )  # fmt: skip
    assert spec.total_steps == 2
    writer = CopyDrillWriter(0)
    reader, report = _step_groups(writer, tok, spec, 0), _step_groups(writer, tok, spec, 1)
    assert [len(g.examples) for g in reader] == [len(g.examples) for g in report] == [4, 2, 1]
    assert "report_steps" not in CopyTuneSpec().fingerprint_json()
    assert "report_steps" in spec.fingerprint_json() and "reader_workers" in spec.fingerprint_json()
