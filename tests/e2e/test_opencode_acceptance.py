"""Acceptance on OpenCode's own traffic: one step of a training run whose episodes are
driven by stock OpenCode (launched per episode by the harness runner), on real services - a Temporal dev
server of this module's own, vLLM, the capture gateway, grove's workers - checked against the calls the
engine actually served, as the native acceptance test does (tests/e2e/test_acceptance.py).

The policy is real and served by vLLM, but it plays a script (tests/harnesses/script_model.py: tiny-tools
fine-tuned on the episode's requests), because no local model delegates reliably on its own: the lead
calls `task` twice in one response, OpenCode runs both `worker` subagents concurrently, one worker fills
its `max_tokens` and - its agent's `limit.context` set just under that usage - OpenCode compacts that
session (a summary call, then the rewritten history), the other answers at once, the lead resumes with
both answers and replies. Checked per episode:

- exact conditioning: every row's tokens, masks and behaviour logprobs are what the engine served;
- the two workers' first calls were in the engine at once (held there together by a test gate);
- the subagents are named after their agent type in the ledger and the rows: `worker` for the lead's
  first `task` call ("Say red", the compacting one), `worker-2` for its second, whichever session reached
  the gateway first;
- the compaction: the summary call is auxiliary and untrained, the next request is a declared rewrite;
- the workers' answers come back into the lead's resumption as tool results: masked there;
- once-only loss; complete accounting; one logical rollout per episode in the step's advantages;
- the learner step trained every row's eligible tokens, the workers' included.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from activities.harness import episode_folder
from grove import queues
from grove.client import connect
from grove.contracts import EpisodeResult, RunResult, RunState
from grove.receipts import ContextOrigin
from grove.runconfig import load_run_config
from harnesses.opencode_install import opencode_binary
from infra.temporal import TemporalDevServer
from ledger.accounting import LedgerSummary
from models.tool_drills import WORKER_PROMPT, _env_template
from tests.e2e.test_acceptance import check_row_against_served, endpoint_of
from tests.fixtures.models import build_in_fresh_interpreter
from tests.harnesses.opencode_kit import REPO, opencode_stack, until_reached
from tests.harnesses.script_model import SUMMARY, WORDS
from trainer.advantages import episode_advantages
from trainer.rows import rows_from_parquet
from workflows.training_run import TrainingRunWorkflow, step_specs

pytestmark = [pytest.mark.timeout(1500), pytest.mark.long]

CONTEXT = 4096  # the engine's and the lead's context
MAX_TOKENS = 128  # every call's max_tokens and OpenCode's limit.output
# The compacting worker's usage is its prompt + MAX_TOKENS; the post-compaction prompt is ~25 tokens
# longer than its first prompt, the other worker's usage ~2 tokens: the threshold sits between.
THRESHOLD_ABOVE_PROMPT = 75
# The script's tokens lead the next-best token by >= 8.5 logits (script_model.logit_gaps on a held-out
# variant): at 0.3 every other token is e^-28 behind; the learner scores each token at this temperature.
TEMPERATURE = 0.3
EXAMPLE = REPO / "examples" / "opencode-delegation.yaml"


@pytest.fixture(scope="module")
def oc_server(tmp_path_factory):
    """This module's own dev server: its stack runs in-process workers of grove's queues, which the SDK
    refuses beside the session's `grove_worker` on one client (see test_opencode_runner.py)."""
    server = TemporalDevServer(tmp_path_factory.mktemp("oc-accept-temporal")).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
async def stack(oc_server, tmp_path_factory):
    model = await asyncio.to_thread(
        build_in_fresh_interpreter, "tests.harnesses.script_model", "ensure_script_model"
    )
    await asyncio.to_thread(opencode_binary)
    client = await connect(oc_server.address)
    tmp = tmp_path_factory.mktemp("oc-accept")
    async with opencode_stack(client, oc_server, model, tmp, max_model_len=CONTEXT) as s:
        yield s


def worker_prompt_tokens(tok, project: Path) -> int:
    """The worker's first prompt as OpenCode will send it (its system prompt with the environment block,
    the lead's task prompt), in the policy's tokens: where the compaction threshold is set from."""
    # OpenCode names the model by its API id; outside a git repository the workspace root is "/"
    env = _env_template().format(
        dir=project, provider="grove", model="grove", date=time.strftime("%a %b %d %Y")
    )
    env = env.replace(f"Workspace root folder: {project}", "Workspace root folder: /")
    messages = [
        {"role": "system", "content": WORKER_PROMPT + env.replace("git repo: yes", "git repo: no")},
        {"role": "user", "content": f"Say {WORDS[0]}"},
    ]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return len(tok(text, add_special_tokens=False)["input_ids"])


async def test_opencode_run_trains_parent_and_concurrent_subagents_with_a_compaction(stack):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(stack.model_dir))
    run_id = f"oc-accept-{uuid.uuid4().hex[:6]}"
    overrides = [
        f"run_id={run_id}", f"model={stack.model_dir}", "steps=1", "tasks_per_step=1", "group_size=2",
        f"inference_queue={queues.INFERENCE}", "tracking.tensorboard=false",
        f"sampling.max_tokens={MAX_TOKENS}", f"sampling.temperature={TEMPERATURE}",
        f"engine.max_model_len={CONTEXT}",
        f"harness.opencode.context_limit={CONTEXT}",
    ]  # fmt: skip
    specs = step_specs(RunState(config=load_run_config(EXAMPLE, overrides)), 1)
    prompt = max(
        worker_prompt_tokens(tok, episode_folder(stack.harness_root, s.episode_id) / "project") for s in specs
    )
    worker_limit = prompt + THRESHOLD_ABOVE_PROMPT + MAX_TOKENS  # OpenCode: threshold = context - output
    cfg = load_run_config(
        EXAMPLE, [*overrides, f"harness.opencode.agent_context_limits.worker={worker_limit}"]
    )
    assert cfg.harness.kind == "opencode" and cfg.task_family == "opencode-delegation"
    first = specs[0].episode_id
    # Both subagents' first calls of the first episode held in the engine at once: OpenCode runs them
    # concurrently (a sequential harness would never get the second one there).
    stack.gates.arm("generate", f"^{re.escape(first)}/worker(-2)?\\.0\\.c0/")
    handle = await stack.client.start_workflow(
        TrainingRunWorkflow.run, RunState(config=cfg), id=cfg.run_id, task_queue=queues.EPISODES
    )
    try:
        await until_reached(
            lambda: len(held_sessions(stack)) >= 2, "two subagents' calls in the engine at once", 900
        )
    finally:
        stack.gates.disarm("generate")
    run: RunResult = await asyncio.wait_for(handle.result(), 1200)

    held = held_sessions(stack)
    all_rows = []
    for spec in specs:
        result = await stack.client.get_workflow_handle(spec.episode_id, result_type=EpisodeResult).result()
        assert result.status == "ok", result.failure
        served = stack.engine.calls_of(spec.episode_id)
        summary = await stack.client.get_workflow_handle(spec.episode_id).query(
            "summary", result_type=LedgerSummary
        )
        rows = all_rows_of(stack, result)
        check_episode(tok, served, summary, result, rows, prompt)
        if spec.episode_id == first:  # the two sessions held together are this episode's two workers
            assert held == {"worker", "worker-2"}
        all_rows += rows

    # one logical rollout per episode in the group baseline, whatever its number of rows (4 each)
    advantages = episode_advantages(all_rows)
    assert sorted(advantages) == sorted(s.episode_id for s in specs)
    [record] = run.history
    assert record.episodes == len(specs) and record.failed_episodes == 0
    # the learner step took every row's eligible tokens, the workers' among them
    worker_tokens = sum(r.num_loss_tokens for r in all_rows if endpoint_of(r).startswith("worker"))
    assert worker_tokens > 0 and record.metrics["loss_tokens"] == sum(r.num_loss_tokens for r in all_rows)
    assert np.isfinite(record.metrics["loss"])
    print(f"opencode acceptance: {len(all_rows)} rows, {worker_tokens} worker tokens trained")


def held_sessions(stack) -> set[str]:
    """The worker sessions whose calls reached the engine while the gate held them (key: the request id
    `<episode>/<call>/attempt-<n>`)."""
    return {key.split("/")[-2].split(".")[0] for key in stack.gates.held("generate")}


def all_rows_of(stack, result):
    return rows_from_parquet(stack.store.get(result.rows_key))


def check_episode(tok, served, summary: LedgerSummary, result, rows, prompt: int) -> None:
    end = tok.convert_tokens_to_ids("<|im_end|>")
    text = {c: tok.decode(s.completion_ids[s.completion_ids != end]).strip() for c, s in served.items()}
    contexts = {c.context_id: c for c in summary.contexts}
    lead = sorted(c for c in served if c.startswith("parent."))
    assert lead == ["parent.0.c0", "parent.0.c1"], sorted(served)
    assert "<tool_call>" in text["parent.0.c0"] and text["parent.0.c1"] == " ".join(WORDS)
    sessions = sorted({c.split(".")[0] for c in served if not c.startswith("parent") and "~" not in c})
    assert sessions == ["worker", "worker-2"], sorted(served)  # named after their type, in call order
    # the compacting worker ("Say red", the lead's first task call): its first call filled max_tokens,
    # OpenCode summarised, then rewrote
    long, short = "worker", "worker-2"
    assert served[f"{long}.0.c0"].completion_ids.size == MAX_TOKENS
    got = served[f"{long}.0.c0"].prompt_ids.size
    assert abs(got - prompt) <= 10, (got, prompt)  # the threshold was set from a good estimate
    summaries = [c for c in served if c.startswith(f"{long}~summary")]
    assert len(summaries) == 1 and text[summaries[0]] == SUMMARY, sorted(served)
    for w in sessions:  # both subagents were spawned by the lead's response with the two task calls
        assert contexts[f"{w}.0"].origin == ContextOrigin.SPAWN
        assert contexts[f"{w}.0"].spawned_by_call == "parent.0.c0"
    rewritten = contexts[f"{long}.1"]
    assert rewritten.origin == ContextOrigin.REWRITE and rewritten.rewrite_of == f"{long}.0"
    assert text[f"{long}.1.c0"] == WORDS[0]
    assert sorted(c for c in served if c.startswith(short)) == [f"{short}.0.c0"]  # no compaction there
    assert text[f"{short}.0.c0"] == WORDS[1]
    assert not any(c.startswith("parent~") for c in served)  # the title agent is off; the lead never compacts
    # accounting: every served call exactly once; the summary auxiliary, the rest selected
    assert sum(result.counts.values()) == len(served) and result.counts == {"selected": 5, "auxiliary": 1}
    # rows: one per endpoint, each exactly what the engine served
    assert sorted(endpoint_of(r) for r in rows) == sorted(
        ["parent.0.c1", f"{long}.0.c0", f"{long}.1.c0", f"{short}.0.c0"]
    )
    for row in rows:
        check_row_against_served(row, served)
        assert row.episode_id == result.episode_id and row.reward == result.reward
    owned = [s.call_id for r in rows for s in r.spans if s.owned]
    assert sorted(owned) == sorted(set(owned))  # once-only loss
    assert sorted(owned) == sorted(c for c in served if "~" not in c)  # every selected action, no summary
    # the workers' answers are in the lead's row as tool results, with no loss on them
    lead_row = next(r for r in rows if endpoint_of(r) == "parent.0.c1")
    c0, c1 = lead_row.spans
    between = tok.decode(lead_row.input_ids[c0.end : c1.start])
    assert "<tool_response>" in between and all(w in between for w in WORDS)
    assert not lead_row.loss_mask[c0.end : c1.start].any()
