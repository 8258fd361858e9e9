"""The `opencode-reader` family's worker limit (harnesses/opencode_reader.py WORKER_CONTEXT) does what it
is for, counted in the tokens the gateway reports: OpenCode compacts after a step whose usage (prompt +
completion) reaches limit.context - limit.output, so the worker's first step must stay under that line,
its answer after the read must cross it, and its step after compaction must stay under it again (else
OpenCode compacts without end). The requests are the family's own, rendered from OpenCode's captured text
(models/reader_drills.py) with a harness runner's kind of folder, counted with tiny-reader's tokenizer:
tiny-tools' (every fine-tune on it keeps it), from its untrained twin (tests/fixtures/models.py)."""

from __future__ import annotations

import pytest

from grove.contracts import OpenCodeOptions
from harnesses import opencode_reader
from harnesses.opencode import setup_for
from models.reader_drills import (
    READER_PROMPT,
    after_compaction_turns,
    read_call,
    read_result,
    read_tool,
    worker_turns,
)
from models.tool_drills import _env_template

OUTPUT_LIMIT = 128  # the demo's and the example's max_tokens: OpenCode's limit.output
FOLDER = "/tmp/grove-worker-3k9x2m1q/harness/0123456789abcdef/project"  # a harness runner's project folder
LONGEST_REPLY = 16  # a worker's answer: 4-9 tokens in 256 samples at T 0.7 (docs/tool_model.md)


@pytest.fixture(scope="module")
def tokens(tools_twin_dir):
    from transformers import AutoTokenizer

    from models.corpus import render_chat

    tok = AutoTokenizer.from_pretrained(str(tools_twin_dir))

    def count(messages, tools, *, prompt: bool = True) -> int:
        text = render_chat(messages, tools) + ("<|im_start|>assistant\n" if prompt else "")
        return len(tok(text, add_special_tokens=False)["input_ids"])

    return count


@pytest.mark.parametrize("index", range(6))
def test_the_worker_compacts_once_after_its_read_and_not_again(index, tokens):
    task = opencode_reader.make_task(index)
    setup = setup_for(task, OpenCodeOptions())
    line = setup.agent_context_limits["worker"] - OUTPUT_LIMIT
    system = READER_PROMPT + _env_template().format(
        dir=FOLDER, provider="grove", model="grove", date="Wed Dec 02 2026"
    )
    tools = [read_tool()]
    result = read_result(FOLDER, setup.files["notes.txt"])
    for word in task.params["words"]:
        ask = f"Reply with the word {word}."
        chat = worker_turns(system, ask, result, word)
        first = tokens(chat[:2], tools)
        with_call = tokens(chat[:3], tools, prompt=False)
        after_read = tokens(chat[:4], tools)
        compacted = after_compaction_turns(system, ask, word)
        after = tokens(compacted[:4], tools)
        summary = tokens(compacted[:3], tools, prompt=False) - tokens(compacted[:2], tools)
        assert with_call < line, (first, with_call, line)  # the read call: no compaction yet
        assert after_read >= line, (after_read, line)  # the answer after the read: compaction
        # after compaction, even with a summary as long as limit.output allows: no second compaction
        assert after + (OUTPUT_LIMIT - summary) + LONGEST_REPLY < line, (after, summary, line)
    assert read_call()["function"]["arguments"] == {"filePath": "notes.txt"}
