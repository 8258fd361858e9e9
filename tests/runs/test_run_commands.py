"""`grove run` commands against the real Temporal dev server, with a real worker (vLLM on the tiny model,
the learner on CPU) serving the example config's run.

One run, followed through its life with the commands as a user types them (subprocesses of
`python -m cli.main`): start from examples/ with overrides, start again (attach), a refused start with
another config, cancel while step 1's episodes are in flight, status, episodes, list, then start
again, which resumes at step 2 without redoing step 1. The moment of the cancel is made by a gate the
test controls on the engine (step 1's first model call waits until the cancel was sent), never by
timing. Exit codes of the failure kinds are checked here too.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from pathlib import Path

import pytest
from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError
from temporalio.common import WorkflowIDReusePolicy

from cli.demo import attach
from cli.run_commands import EXIT_CONFLICT, EXIT_INVALID_CONFIG, EXIT_NOT_FOUND, EXIT_UNREACHABLE
from grove import queues
from grove.contracts import EpisodeResult, RunResult, RunState
from grove.runconfig import load_run_config
from grove.store_layout import CHECKPOINTS_ROOT, commit_key
from tests.bounds import SERVICE_TEST_TIMEOUT
from workflows.training_run import TrainingRunWorkflow

pytestmark = pytest.mark.timeout(SERVICE_TEST_TIMEOUT)

ROOT = Path(__file__).parents[2]
EXAMPLE = ROOT / "examples" / "delegation-parent-and-workers.yaml"


async def grove_run(address: str | None, *args: str) -> tuple[int, str, str]:
    """`python -m cli.main run ARGS --address ADDRESS` as a subprocess: (exit code, stdout, stderr)."""
    extra = ["--address", address] if address else []
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "cli.main", "run", *args, *extra,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT,
    )  # fmt: skip
    out, err = await proc.communicate()
    return proc.returncode, out.decode(), err.decode()


def small(run_id: str, model_dir: Path, steps: int) -> list[str]:
    """Overrides that shrink the example to a test-sized run on the session's engine and queues."""
    return [
        f"run_id={run_id}", f"model={model_dir}", f"steps={steps}", "tasks_per_step=1", "group_size=2",
        "sampling.max_tokens=4", "inference_queue=inference", "tracking.tensorboard=false",
    ]  # fmt: skip


class Gate:
    """Holds the engine's calls of one run until opened; `entered` is set by the first held call."""

    def __init__(self, engine, run_id: str) -> None:
        self.entered, self.open = asyncio.Event(), asyncio.Event()
        self.generate = engine.generate  # the real engine's bound method
        self.run_id = run_id

    async def __call__(self, prompt_ids, sampling, seed, request_id):
        if request_id.startswith(self.run_id + "/"):
            self.entered.set()
            await self.open.wait()
        return await self.generate(prompt_ids, sampling, seed, request_id)


async def test_run_commands_start_attach_cancel_inspect_resume(
    temporal_server, temporal_client, grove_worker, recording_engine, e2e_store, tiny_model_dir, monkeypatch
):
    addr = temporal_server.address
    run_id = f"cli-{uuid.uuid4().hex[:6]}"
    gate = Gate(recording_engine, run_id)
    monkeypatch.setattr(recording_engine, "generate", gate)

    # start: a new run from the example file with overrides
    code, out, err = await grove_run(addr, "start", str(EXAMPLE), *small(run_id, tiny_model_dir, 2), "--json")
    assert code == 0, err
    started = json.loads(out)
    assert (started["action"], started["next_step"], started["steps"]) == ("started", 1, 2)
    assert started["ui"].endswith(f"/namespaces/default/workflows/{run_id}")
    await asyncio.wait_for(gate.entered.wait(), 300)  # step 1's first model call is now held

    # the same command again attaches to the running run; another config is refused, naming the field
    code, out, err = await grove_run(addr, "start", str(EXAMPLE), *small(run_id, tiny_model_dir, 2), "--json")
    assert code == 0 and json.loads(out)["action"] == "attached", err
    code, out, err = await grove_run(
        addr, "start", str(EXAMPLE), *small(run_id, tiny_model_dir, 2), "learner.lr=0.1", "--json"
    )
    assert code == EXIT_CONFLICT and "learner differ" in json.loads(out)["message"], err

    # cancel while step 1 is in flight: it finishes, no step 2 starts
    code, out, err = await grove_run(addr, "cancel", run_id, "--json")
    assert code == 0 and json.loads(out)["requested"] is True, err
    gate.open.set()
    handle = temporal_client.get_workflow_handle(run_id, result_type=RunResult)
    result: RunResult = await handle.result()
    assert result.cancelled and [r.step for r in result.history] == [1]
    assert e2e_store.exists(commit_key(run_id, 1))  # step 1's checkpoint committed whole
    assert not e2e_store.list(f"{CHECKPOINTS_ROOT}/{run_id}/step-000002/")  # nothing of step 2

    # status: step, last metrics (the run's own record), the UI link
    code, out, err = await grove_run(addr, "status", run_id, "--json")
    assert code == 0, err
    status = json.loads(out)
    assert status["run_status"] == "cancelled" and status["cancelled"] is True
    assert (status["steps_done"], status["steps"]) == (1, 2)
    assert status["last"] == result.history[0].model_dump(mode="json")
    assert len(status["failed_episodes"]) == result.history[0].failed_episodes
    assert status["ui"] == started["ui"]

    # episodes of step 1: the run's children, with the rewards and rows their workflows returned
    code, out, err = await grove_run(addr, "episodes", run_id, "--step", "1", "--json")
    assert code == 0, err
    episodes = json.loads(out)
    children = {}
    for j in range(2):
        ids = [eid for eid in (e["episode_id"] for e in episodes) if eid.endswith(f"/g{j}")]
        assert len(ids) == 1
        children[ids[0]] = await temporal_client.get_workflow_handle(
            ids[0], result_type=EpisodeResult
        ).result()
    assert {e["episode_id"] for e in episodes} == set(children)
    for e in episodes:
        child = children[e["episode_id"]]
        assert (e["status"], e["reward"], e["num_rows"]) == (child.status, child.reward, child.num_rows)
        assert e["num_rows"] > 0
    assert sum(e["reward"] for e in episodes) / 2 == pytest.approx(result.history[0].mean_reward)
    # per-agent reward components reach the step record: delegation's reward is 0.5*workers + 0.5*parent
    for child in children.values():
        parts = child.reward_details
        assert child.reward == pytest.approx(0.5 * parts["workers"] + 0.5 * parts["parent"])
    for part in ("parent", "workers"):
        mean = sum(c.reward_details[part] for c in children.values()) / 2
        assert status["last"]["reward_components"][part] == pytest.approx(mean)
    code, out, err = await grove_run(addr, "episodes", run_id, "--step", "2", "--json")
    assert code == EXIT_NOT_FOUND and "no episodes at step 2" in json.loads(out)["message"], err

    # list: the run is there with its state
    code, out, err = await grove_run(addr, "list", "--json")
    assert code == 0, err
    mine = [r for r in json.loads(out) if r["run_id"] == run_id]
    assert len(mine) == 1 and mine[0]["run_status"] == "cancelled" and mine[0]["step"] == 1

    # start again: resumes at step 2; step 1 is not redone (its episodes ran once, its record is kept)
    code, out, err = await grove_run(
        addr, "start", str(EXAMPLE), *small(run_id, tiny_model_dir, 2), "--wait", "--json"
    )
    assert code == 0, err
    resumed = json.loads(out)
    assert (resumed["action"], resumed["next_step"]) == ("resumed", 2)
    final = RunResult.model_validate(resumed["result"])
    assert not final.cancelled and [r.step for r in final.history] == [1, 2]
    assert final.history[0] == result.history[0]
    query = f"GroveRun = '{run_id}' AND GroveStep = 1 AND WorkflowType = 'EpisodeWorkflow'"
    step1 = [wf async for wf in temporal_client.list_workflows(query)]
    assert sorted(wf.id for wf in step1) == sorted(children)  # one execution each
    assert e2e_store.exists(commit_key(run_id, 2))
    code, out, err = await grove_run(addr, "episodes", run_id, "--step", "2", "--json")
    assert code == 0 and all(e["episode_id"].startswith(f"{run_id}/s000002/") for e in json.loads(out))
    assert len(json.loads(out)) == 2, err

    # a finished run started again with the same config: nothing to do
    code, out, err = await grove_run(addr, "start", str(EXAMPLE), *small(run_id, tiny_model_dir, 2), "--json")
    assert code == 0 and json.loads(out)["action"] == "already-completed", err
    # the demo re-attaching to it (`grove demo` run again with the same name): the same execution, done
    before = await temporal_client.get_workflow_handle(run_id).describe()
    handle = await attach(temporal_client, load_run_config(str(EXAMPLE), small(run_id, tiny_model_dir, 2)))
    after = await temporal_client.get_workflow_handle(run_id).describe()
    assert (after.run_id, after.status) == (before.run_id, WorkflowExecutionStatus.COMPLETED)
    assert [r.step for r in (await handle.result()).history] == [1, 2]
    # the run's workflow started anew under its id from its config alone (a client's own start_workflow):
    # refused before any episode, step 1 is not trained twice
    config = load_run_config(str(EXAMPLE), small(run_id, tiny_model_dir, 2))
    again = await temporal_client.start_workflow(
        TrainingRunWorkflow.run, RunState(config=config), id=run_id, task_queue=queues.EPISODES,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
    )  # fmt: skip
    with pytest.raises(WorkflowFailureError) as failed:
        await again.result()
    assert failed.value.cause.cause.type == "RunAlreadyTrainedError"
    assert "already committed step 1" in failed.value.cause.cause.message
    step1 = [wf async for wf in temporal_client.list_workflows(query)]
    assert sorted(wf.id for wf in step1) == sorted(children)  # still one execution each


async def test_run_command_exit_codes(temporal_server, tmp_path):
    addr = temporal_server.address
    code, out, err = await grove_run(addr, "status", "no-such-run", "--json")
    assert code == EXIT_NOT_FOUND and "not found" in json.loads(out)["message"], err
    code, out, err = await grove_run(addr, "cancel", "no-such-run", "--json")
    assert code == EXIT_NOT_FOUND, err
    code, out, err = await grove_run(addr, "start", str(EXAMPLE), "learner.lr=-1", "--json")
    assert code == EXIT_INVALID_CONFIG and "learner.lr = -1" in json.loads(out)["message"], err
    code, out, err = await grove_run("127.0.0.1:1", "status", "any", "--json")
    assert code == EXIT_UNREACHABLE and json.loads(out)["error"] == "ServerUnreachableError", err
