"""One step of a TrainingRunWorkflow whose episodes a LangGraph program drives (and one whose episodes an
OpenAI Agents SDK program drives), on real services: the
Temporal dev server, a grove worker serving every queue (the harness queue with its embedded gateway), a
real vLLM engine on the tiny model, the local object store.

The runs are examples/langgraph-delegation.yaml and agents-sdk-delegation.yaml loaded through the config
path (sized down by overrides). Per episode the harness runner launched the program in its own process; the
rows are checked against the calls the engine served, like the native acceptance episode: exact
conditioning, tokens, masks and behaviour logprobs; the workers' answers masked where they enter the
parent's context; every action owned once, the summary call in no row; complete accounting. Each program
has a compacting worker: LangGraph's with SummarizationMiddleware, the Agents SDK's with the program's own
`call_model_input_filter` (a summariser agent); both are an auxiliary summary call and a declared rewrite.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli.row_check import check_episode, check_run
from grove import queues
from grove.contracts import EpisodeResult, HarnessRunResult, RunResult, RunState
from grove.receipts import ContextOrigin
from grove.runconfig import load_run_config
from tests.bounds import SERVICE_TEST_TIMEOUT
from tests.e2e.test_acceptance import check_row_against_served, endpoint_of
from tests.gateway.test_app_e2e import contexts, summary
from tests.harnesses.framework_kit import published_rows
from trainer.rows import Row
from workflows.training_run import TrainingRunWorkflow, step_specs

pytestmark = [pytest.mark.timeout(SERVICE_TEST_TIMEOUT), pytest.mark.slow]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


async def harness_launches(client, episode_id: str) -> list[HarnessRunResult]:
    """The run_harness results in the episode's history."""
    history = await client.get_workflow_handle(episode_id).fetch_history()
    scheduled, results = set(), []
    for event in history.events:
        if event.HasField("activity_task_scheduled_event_attributes"):
            if event.activity_task_scheduled_event_attributes.activity_type.name == "run_harness":
                scheduled.add(event.event_id)
        elif event.HasField("activity_task_completed_event_attributes"):
            attrs = event.activity_task_completed_event_attributes
            if attrs.scheduled_event_id in scheduled:
                results.append(HarnessRunResult.model_validate(json.loads(attrs.result.payloads[0].data)))
    return results


async def run_one_step(client, example: str, model_dir: Path, *extra: str) -> tuple[RunResult, list]:
    # The run id is fixed (one run per example in a session): episode ids, so the calls' seeds
    # (activities/generate.call_seed), and the programs' requests are then the same every run, and so are
    # the replies the checks below meet. A fresh id drew fresh replies, and one draw breaks them: an
    # EOS-only first reply of the Agents SDK lead (P ~0.1 % a call on tiny-random) is no output item, its
    # second request leaves the empty turn out and the gateway discards that call (counts, rows differ).
    cfg = load_run_config(
        EXAMPLES / example,
        [
            f"run_id={example.split('.')[0]}", f"model={model_dir}", "steps=1",
            "tasks_per_step=1", "group_size=2", "sampling.max_tokens=10", "inference_queue=inference",
            "harness.deadline_s=300", *extra,
        ],
    )  # fmt: skip
    run: RunResult = await client.execute_workflow(
        TrainingRunWorkflow.run, RunState(config=cfg), id=cfg.run_id, task_queue=queues.EPISODES
    )
    [step] = run.history
    assert (step.episodes, step.failed_episodes) == (2, 0), step
    return run, step_specs(RunState(config=cfg), 1)


async def finished(client, episode_id: str) -> EpisodeResult:
    result = await client.get_workflow_handle(episode_id, result_type=EpisodeResult).result()
    assert result.status == "ok", result.failure
    [launch] = await harness_launches(client, episode_id)
    assert (launch.launch, launch.exit_code, launch.failure) == (1, 0, None)
    return result


def check_rows(rows: list[Row], result: EpisodeResult, served: dict, actions: set[str]) -> None:
    """Rows as the engine served the calls; workers' answers masked in the parent; loss once per action."""
    for row in rows:
        assert all(s.owned for s in row.spans)
        check_row_against_served(row, served)
        assert row.reward == result.reward
    parent_row = next(r for r in rows if endpoint_of(r) == "parent.0.c1")
    c0, c1 = parent_row.spans
    # the workers' answers entered the parent's context between its calls: observations, no loss
    assert c1.start - c0.end > 0 and not parent_row.loss_mask[c0.end : c1.start].any()
    owned = [s.call_id for r in rows for s in r.spans if s.owned]
    assert sorted(owned) == sorted(actions)  # once-only loss; auxiliary calls train nowhere
    assert sum(r.num_loss_tokens for r in rows) == sum(served[c].completion_ids.size for c in actions)
    assert set(result.reward_details) == {"workers", "parent"}


async def check_compacting_steps(client, engine, store, specs, workers) -> list[Row]:
    """Each episode of the step: the lead, two workers spawned by its first call, one of them compacted
    (warm-up, an auxiliary summary call, a declared rewrite); every call accounted, rows as served. `workers`
    names (plain, compacting) from the episode's contexts. Returns all the step's rows."""
    all_rows: list[Row] = []
    for spec in specs:
        eid = spec.episode_id
        result = await finished(client, eid)
        ctx = contexts(await summary(client, eid))
        plain, w = workers(ctx)
        for a in (plain, w):
            assert (
                ctx[f"{a}.0"].origin == ContextOrigin.SPAWN and ctx[f"{a}.0"].spawned_by_call == "parent.0.c0"
            )
        assert ctx[f"{w}.1"].origin == ContextOrigin.REWRITE and ctx[f"{w}.1"].rewrite_of == f"{w}.0"
        actions = {"parent.0.c0", "parent.0.c1", f"{plain}.0.c0", f"{w}.0.c0", f"{w}.1.c0"}
        served = engine.calls_of(eid)
        assert set(served) == actions | {f"{w}~summary.0.c0"}  # nothing lost, nothing extra
        assert result.counts == {"selected": 5, "auxiliary": 1}  # accounting complete
        rows = published_rows(store, result.rows_key)
        assert {endpoint_of(r): [s.call_id for s in r.spans] for r in rows} == {
            "parent.0.c1": ["parent.0.c0", "parent.0.c1"],
            **{f"{a}.0.c0": [f"{a}.0.c0"] for a in (plain, w)},
            f"{w}.1.c0": [f"{w}.1.c0"],
        }
        check_rows(rows, result, served, actions)
        # `grove episode check` reads the same episode from the server and the store and agrees
        audit = await check_episode(client, store, eid)
        assert audit.violations == [] and (audit.rows, audit.trained_calls) == (len(rows), len(actions))
        assert (audit.contexts["spawn"], audit.contexts["rewrite"], audit.summaries) == (2, 1, 1)
        all_rows += rows
    return all_rows


def send_workers(ctx: dict) -> tuple[str, str]:
    """LangGraph's `Send` workers: whichever has a second (rewritten) context compacted."""
    [w] = [a for a in ("worker-1", "worker-2") if f"{a}.1" in ctx]
    [plain] = {"worker-1", "worker-2"} - {w}
    return plain, w


def tool_workers(ctx: dict) -> tuple[str, str]:
    """header_safe(f"{agent.name}-{tool call id}"): the `as_tool` worker, the worker with a history."""
    return "Worker-call_w1", "Worker-call_w2"


async def test_one_step_of_a_langgraph_delegation_run(
    temporal_client, grove_worker, recording_engine, e2e_store, tiny_model_dir
):
    run, specs = await run_one_step(temporal_client, "langgraph-delegation.yaml", tiny_model_dir)
    rows = await check_compacting_steps(temporal_client, recording_engine, e2e_store, specs, send_workers)
    assert run.history[0].metrics["loss_tokens"] == sum(r.num_loss_tokens for r in rows)
    # `grove run check`: the run's every episode, found through the server
    audits, unchecked = await check_run(temporal_client, e2e_store, run.run_id)
    assert unchecked == [] and sorted(a.episode_id for a in audits) == sorted(s.episode_id for s in specs)
    assert all(a.ok for a in audits) and sum(a.trained_tokens for a in audits) == sum(
        r.num_loss_tokens for r in rows
    )


async def test_one_step_of_an_agents_sdk_delegation_run(
    temporal_client, grove_worker, recording_engine, e2e_store, tiny_model_dir
):
    # streamed (Runner.run_streamed, the worker tools' nested runs too): the program's option; its plain
    # Runner.run path is run by tests/harnesses/test_python_relaunch.py
    run, specs = await run_one_step(
        temporal_client, "agents-sdk-delegation.yaml", tiny_model_dir, "harness.python.options.stream=true"
    )
    rows = await check_compacting_steps(temporal_client, recording_engine, e2e_store, specs, tool_workers)
    assert run.history[0].metrics["loss_tokens"] == sum(r.num_loss_tokens for r in rows)
