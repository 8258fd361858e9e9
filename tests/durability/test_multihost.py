"""A run across hosts, rehearsed on one machine (docs/rollout-scale.md section 5): hosts that share
nothing but the Temporal address and the S3 bucket; a second inference host joins midway, the first
one leaves, and the trainer host is SIGKILLed right after a step's COMMIT and restarted.

Each host is a `grove worker` in namespaces of its own (tests/durability/hosts.py): its own HOME,
GROVE_HOME, GROVE_MODELS, TMPDIR, working directory, /tmp and /dev/shm, and every other host's folder,
the services' data folders and the machine's grove home and model cache hidden from it. The only store
is a `localbucket` S3 server reached over HTTP (minio):

  orchestration  --queues episodes,io
  inference-1    --queues inference: an engine on its own model folder
  trainer        --queues trainer: the run's base model (RunConfig.model) is a folder on this host only
  inference-2    --queues inference, its own model folder: joins once step 1 is committed, before step 2

The inference hosts' model folders hold other weights (same architecture) than the trainer's: an engine
that served version 0 from its own disk, not the base model the trainer host staged in the store, would
give step 1's tokens behaviour logprobs of another policy, and the logprob check below fails on them.

The moments are made, not waited for: the trainer host holds right after writing a step's COMMIT (its
`store_put` gate), so with max_policy_lag 0 nothing else of the run is in flight (the step's episodes all
ended, the next step's not started). At step 1's, inference-2 starts and polls, then the trainer goes on:
step 2 rolls out with both engines polling (which one gets which call is Temporal's choice). At step 2's,
the test SIGKILLs the trainer host, lets inference-1 leave (SIGTERM) and starts the trainer host again with
the same environment: train_step 2 is retried there after its heartbeat timeout and must reuse the
committed checkpoint; step 3 rolls out on inference-2 alone and trains on the new trainer.

Checked at the end, from the store and the histories: the run completed; the base model in the store is
the trainer host's folder byte for byte; each step committed once (manifests hashed here), trained once
(train_step 1 / 2 (reused) / 3 on the first / restarted / restarted trainer; trainer_state counters; final
weights equal to one uninterrupted learner on the same rows); every step's rows exact: every episode of
the step, each call generated once, the scenario's rows, each span's tokens and logprobs equal to its
call's receipt (digests from the generate activity's result in the episode's history), and every token of
step S sampled by exactly version S - 1 as committed in the store (transformers on those weights gives its
behaviour logprobs); step 1 served by inference-1 only, step 3 by inference-2 only.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle

import grove.contracts.training
from grove import queues
from grove.client import connect
from grove.contracts import (
    EpisodeResult,
    GenerateResult,
    HarnessSpec,
    RunConfig,
    RunResult,
    RunState,
    TrainStepInput,
    TrainStepResult,
)
from grove.contracts.training import StageBaseModelResult
from grove.gates import GateControl
from grove.learner_config import LearnerConfig
from grove.paths import grove_home, models_home
from grove.sampling import SamplingConfig
from grove.store_layout import base_model_prefix, checkpoint_prefix, commit_key
from harnesses import scenario
from infra.s3server import ACCESS_KEY, SECRET_KEY, LocalBucketServer
from infra.temporal import TemporalDevServer
from infra.worker_process import wait_until
from storage.base import ObjectStore
from tests.bounds import RESULT_WAIT, SERVICE_TEST_TIMEOUT, STATE_WAIT
from tests.durability.helpers import (
    activity_attempts,
    activity_identities,
    activity_results,
    decoded_inputs,
)
from tests.durability.hosts import Host, HostProcess, provision_model
from tests.durability.test_worker_kill import ALL_CALLS, EXPECTED_ROWS, renamed
from tests.inference.reference import learner_logprobs
from trainer.base_model import base_manifest, download_base_model
from trainer.checkpoint import download_model_folder, read_manifest, read_trainer_state
from trainer.learner import Learner
from trainer.rows import Row, Span, rows_from_parquet
from workflows.training_run import STATUS, TrainingRunWorkflow, step_specs

pytestmark = [pytest.mark.long, pytest.mark.slow, pytest.mark.timeout(SERVICE_TEST_TIMEOUT)]

ORCHESTRATION, INFERENCE_1, TRAINER, INFERENCE_2 = "orchestration", "inference-1", "trainer", "inference-2"
STEPS, TASKS_PER_STEP, GROUP_SIZE = 3, 1, 2
JOIN_AFTER = 1  # inference-2 joins while the trainer holds right after this step's COMMIT
KILL_STEP = 2  # the trainer host dies right after writing this step's COMMIT
BUCKET = "grove-hosts"
SIDECARS = ("metrics.json", "episodes.json")  # train_step writes them beside the checkpoint
LOGPROB_TOLERANCE = 1e-4  # vLLM vs transformers on the same weights (tests/e2e/test_acceptance.py)


@dataclass
class Fleet:
    """The services (test-owned, outside every host) and the hosts, each with its own folders."""

    root: Path
    temporal: TemporalDevServer
    s3: LocalBucketServer
    hosts: dict[str, Host]
    procs: dict[str, HostProcess] = field(default_factory=dict)

    @property
    def store_url(self) -> str:
        return f"s3://{BUCKET}?endpoint={self.s3.endpoint}&secure=0&create=1"

    @property
    def check_dir(self) -> Path:
        return self.root / "check"  # the test's own downloads: no host sees them

    def hidden_from(self, name: str) -> list[Path]:
        others = [h.root for n, h in self.hosts.items() if n != name]
        machine = {grove_home().resolve(), models_home().resolve()}  # this machine's grove state and models
        return [*others, self.root / "services", self.check_dir, *sorted(machine)]

    def process(
        self, name: str, queue_names: list[str], model: Path | str, *, gates: bool = False
    ) -> HostProcess:
        host = self.hosts[name]
        env = {"GROVE_S3_ACCESS_KEY": ACCESS_KEY, "GROVE_S3_SECRET_KEY": SECRET_KEY}
        if gates:
            env.update(GateControl(host.gates_dir).env)
        self.procs[name] = HostProcess(
            host, queue_names, hide=self.hidden_from(name), address=self.temporal.address,
            store_url=self.store_url, model=Path(model), log_dir=self.root / "logs", extra_env=env,
        )  # fmt: skip
        return self.procs[name]

    def logs(self) -> list[Path]:
        return [p.log_path for p in self.procs.values()] + [self.temporal.log_path]

    def check_alive(self) -> None:
        for proc in self.procs.values():
            proc.check_alive()


@pytest.fixture
def fleet(tmp_path):
    services = tmp_path / "services"
    names = (ORCHESTRATION, INFERENCE_1, TRAINER, INFERENCE_2)
    fleet = Fleet(
        tmp_path, TemporalDevServer(services / "temporal"), LocalBucketServer(services / "s3"),
        {name: Host(name, tmp_path / "hosts" / name) for name in names},
    )  # fmt: skip
    try:
        yield fleet
    finally:
        for proc in fleet.procs.values():
            proc.stop()
        fleet.s3.stop()
        fleet.temporal.stop()


def check_isolation(fleet: Fleet, models: dict[str, Path], shared_model: Path) -> None:
    """Each host sees its own root and model, and no other host's folder, model or service data, nor the
    machine's grove home or model cache; and it runs the code under test (probe processes in the host's
    namespaces, as its worker will run)."""
    probes = [
        *(h.root for h in fleet.hosts.values()),
        *models.values(),
        fleet.root / "services",
        shared_model,
    ]
    for name, host in fleet.hosts.items():
        seen = host.visible(probes, fleet.hidden_from(name))
        visible = {p for p, yes in seen.items() if yes}
        assert visible == {host.root} | ({models[name]} if name in models else set()), (name, visible)
        assert (
            host.imports_from("grove.contracts.training", fleet.hidden_from(name))
            == grove.contracts.training.__file__
        )


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def array_sha(values: np.ndarray, dtype: str) -> str:
    return sha256(np.ascontiguousarray(values, dtype=dtype).tobytes())


def folder_manifest(folder: Path) -> dict[str, str]:
    """{model/<relative path>: sha256} of every file in a model folder, hashed here."""
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    return {f"model/{p.relative_to(folder).as_posix()}": sha256(p.read_bytes()) for p in files}


def check_committed(store: ObjectStore, run_id: str, step: int) -> None:
    """A COMMIT whose manifest names files that hash as it says, and nothing else under the step."""
    manifest = read_manifest(store, run_id, step)
    prefix = checkpoint_prefix(run_id, step)
    for name, digest in manifest.items():
        assert sha256(store.get(prefix + name)) == digest, f"step {step}: {name} differs from its manifest"
    assert set(store.list(prefix)) == {prefix + n for n in [*manifest, "COMMIT", *SIDECARS]}
    state = read_trainer_state(store, run_id, step)  # trained once: a step twice would count twice
    assert (state.step, state.rollouts_consumed) == (step, step * TASKS_PER_STEP * GROUP_SIZE), state


def check_span(row: Row, span: Span, receipt: GenerateResult, version: int, weights: Path) -> None:
    """The span holds its call's exact tokens and logprobs, sampled by exactly `weights` (version)."""
    assert span.policy_version == version, (span.call_id, span.policy_version, version)
    prompt, completion = row.input_ids[: span.start], row.input_ids[span.start : span.end]
    logprobs = row.behavior_logprobs[span.start : span.end]
    got = (len(prompt), len(completion), array_sha(prompt, "<i4"), array_sha(completion, "<i4"))
    digests = receipt.digests
    assert got == (
        digests.prompt_len, digests.completion_len, digests.prompt_sha256, digests.completion_sha256
    ), span.call_id  # fmt: skip
    assert array_sha(logprobs, "<f4") == digests.logprobs_sha256, span.call_id
    reference = learner_logprobs(weights, prompt, completion, temperature=span.temperature, top_p=span.top_p)
    worst = float(np.abs(reference - logprobs).max())
    assert worst <= LOGPROB_TOLERANCE, (
        f"{row.episode_id} {span.call_id}: version {version} is {worst:.3g} off"
    )


async def held(gates: GateControl, keys: list[str], fleet: Fleet) -> bool:
    fleet.check_alive()
    return gates.held("store_put") == keys


def host_of(identity: str) -> str:
    return identity.split("@", 1)[1]  # Temporal's worker identity: pid@hostname


async def check_trained_once(
    client: Client,
    handle: WorkflowHandle,
    store: ObjectStore,
    cfg: RunConfig,
    base: Path,
    trainers: list[int],
) -> dict[str, str]:
    """The base model staged once, by the first trainer, byte for byte its folder; each step committed
    once and trained once, step 2's retry on the restarted trainer reusing its commit. The base manifest."""
    first, restarted = (f"{pid}@{TRAINER}" for pid in trainers)
    [staged] = await activity_results(client, handle, "stage_base_model", StageBaseModelResult)
    assert staged.written and await activity_identities(handle, "stage_base_model") == [first]
    manifest, prefix = folder_manifest(base), base_model_prefix(cfg.run_id)
    assert base_manifest(store, cfg.run_id) == manifest
    assert set(store.list(prefix)) == {prefix + n for n in [*manifest, "COMMIT"]}
    for name, digest in manifest.items():
        assert sha256(store.get(prefix + name)) == digest
    results = await activity_results(client, handle, "train_step", TrainStepResult)
    assert [(r.step, r.reused_checkpoint) for r in results] == [(1, False), (2, True), (3, False)]
    assert await activity_attempts(handle, "train_step") == [1, 2, 1]
    assert await activity_identities(handle, "train_step") == [first, restarted, restarted]
    commits = [k for k in store.list(f"checkpoints/{cfg.run_id}/") if k.endswith("/COMMIT")]
    assert commits == [commit_key(cfg.run_id, s) for s in (1, 2, 3)]
    for step in (1, 2, 3):
        check_committed(store, cfg.run_id, step)
    return manifest


async def check_rows(
    client: Client,
    cfg: RunConfig,
    run: RunResult,
    trained: list[TrainStepInput],
    store: ObjectStore,
    versions: dict[int, Path],
) -> tuple[Counter[tuple[int, str]], tuple[Row, Span]]:
    """Every step's rows exact and every token sampled by exactly the version its step rolled out on.
    Returns generate calls per (step, host) and step 1's first span."""
    served: Counter[tuple[int, str]] = Counter()
    first_span = None
    for t, record in zip(trained, run.history, strict=True):
        specs = step_specs(RunState(config=cfg), t.step)
        assert t.row_keys == sorted(f"rows/{s.episode_id}.parquet" for s in specs)
        on_record = json.loads(store.get(checkpoint_prefix(cfg.run_id, t.step) + "episodes.json"))
        assert sorted(on_record) == sorted(s.episode_id for s in specs)
        loss_tokens = 0
        for spec in specs:
            child = client.get_workflow_handle(spec.episode_id, result_type=EpisodeResult)
            result = await child.result()
            generated = await activity_results(client, child, "generate", GenerateResult)
            receipts = {g.call_id: g for g in generated}
            # no host died with a call in flight, but a loaded machine may still lose an attempt (a missed
            # heartbeat): it is then discarded and re-run once as <call>.r1, which takes its place
            lost = {c for c in ALL_CALLS if c not in receipts}
            assert set(receipts) == {renamed(c, lost) for c in ALL_CALLS} and len(generated) == len(ALL_CALLS)
            assert result.status == "ok", result.failure
            # worker-1's summary call settles auxiliary (its kind) and trains (train_auxiliary: [summary])
            settled = {"selected": len(ALL_CALLS) - 1, "auxiliary": 1}
            assert result.counts == settled | ({"discarded": len(lost)} if lost else {})
            served.update((t.step, host_of(i)) for i in await activity_identities(child, "generate"))
            rows = rows_from_parquet(store.get(f"rows/{spec.episode_id}.parquet"))
            spans = sorted([s.call_id for s in row.spans] for row in rows)
            assert spans == sorted([renamed(c, lost) for c in row] for row in EXPECTED_ROWS), spans
            for row in rows:
                loss_tokens += row.num_loss_tokens
                for span in row.spans:
                    check_span(row, span, receipts[span.call_id], t.step - 1, versions[t.step - 1])
                    first_span = first_span or (row, span)
        assert loss_tokens == record.metrics["loss_tokens"], (t.step, loss_tokens, record.metrics)
    all_keys = sorted(k for t in trained for k in t.row_keys)
    assert sorted(store.list(f"rows/{cfg.run_id}/")) == all_keys
    assert first_span is not None
    return served, first_span


def check_final_weights(
    store: ObjectStore, cfg: RunConfig, trained: list[TrainStepInput], versions: dict[int, Path]
) -> None:
    """Nothing trained twice: the final weights are those of one uninterrupted learner on the same rows."""
    learner = Learner(versions[0], cfg.learner, device="cpu")
    for t in trained:
        learner.step([row for key in t.row_keys for row in rows_from_parquet(store.get(key))], t.episodes)
    expected = learner.model.state_dict()
    saved = load_file(versions[3] / "model.safetensors")
    base = load_file(versions[0] / "model.safetensors")
    assert any(not torch.equal(saved[k], base[k]) for k in saved)  # it trained at all
    worst = max((saved[k] - expected[k]).abs().max().item() for k in saved)
    assert worst == 0.0, f"final weights differ from an uninterrupted run by up to {worst:.3g}"


async def test_a_run_across_hosts_sharing_only_temporal_and_s3(fleet: Fleet, tiny_model_dir: Path):
    t0 = time.monotonic()
    hosts = fleet.hosts
    # provisioning: every model a host uses is on its own disk; the run's base model on the trainer's only
    base = provision_model(hosts[TRAINER], tiny_model_dir)
    models = {TRAINER: base} | {
        name: provision_model(hosts[name], tiny_model_dir, perturb_seed=seed)
        for seed, name in enumerate((INFERENCE_1, INFERENCE_2), start=1)
    }
    fleet.temporal.start()
    fleet.s3.start()
    check_isolation(fleet, models, tiny_model_dir)
    store = fleet.s3.store(BUCKET, create_bucket=True)
    client = await connect(fleet.temporal.address)
    cfg = RunConfig(
        run_id=f"hosts-{uuid.uuid4().hex[:6]}", model=str(base), seed=11, steps=STEPS,
        task_family=scenario.NAME, num_tasks=4, tasks_per_step=TASKS_PER_STEP, group_size=GROUP_SIZE,
        harness=HarnessSpec(program=scenario.NAME), sampling=SamplingConfig(max_tokens=8),
        learner=LearnerConfig(lr=1e-2), train_auxiliary=["summary"],
    )  # fmt: skip
    orchestration = fleet.process(ORCHESTRATION, [queues.EPISODES, queues.IO], "tiny-random")
    inference_1 = fleet.process(INFERENCE_1, [queues.INFERENCE], models[INFERENCE_1])
    trainer = fleet.process(TRAINER, [queues.TRAINER], base, gates=True)
    trainer_gates = GateControl(hosts[TRAINER].gates_dir)
    join_key, kill_key = commit_key(cfg.run_id, JOIN_AFTER), commit_key(cfg.run_id, KILL_STEP)
    trainer_gates.arm("store_put", f"^({re.escape(join_key)}|{re.escape(kill_key)})$")
    for proc in (orchestration, inference_1, trainer):
        proc.start()
    for proc in (orchestration, inference_1, trainer):
        await proc.wait_ready(client)
    t_up = time.monotonic()
    handle = await client.start_workflow(
        TrainingRunWorkflow.run, RunState(config=cfg), id=cfg.run_id, task_queue=queues.EPISODES,
        result_type=RunResult,
    )  # fmt: skip

    # inference-2 joins while the trainer holds right after step 1's COMMIT: step 2 rolls out on both
    what = f"the trainer host held after writing {join_key}"
    await wait_until(lambda: held(trainer_gates, [join_key], fleet), STATE_WAIT, what, logs=fleet.logs())
    inference_2 = fleet.process(INFERENCE_2, [queues.INFERENCE], models[INFERENCE_2]).start()
    await inference_2.wait_ready(client)
    trainer_gates.release("store_put", join_key)

    # the trainer host holds right after writing step 2's COMMIT: nothing else of the run is in flight
    what = f"the trainer host held after writing {kill_key}"
    keys = [join_key, kill_key]  # held, or released since
    await wait_until(lambda: held(trainer_gates, keys, fleet), STATE_WAIT, what, logs=fleet.logs())
    for spec in step_specs(RunState(config=cfg), KILL_STEP):
        desc = await client.get_workflow_handle(spec.episode_id).describe()
        assert desc.status == WorkflowExecutionStatus.COMPLETED, (spec.episode_id, desc.status)
    first_trainer = trainer.pid
    trainer.kill()
    inference_1.stop()  # inference-1 leaves
    trainer_gates.disarm("store_put")
    trainer.start()  # the same host again: same folders, same environment
    await trainer.wait_ready(client)
    t_restarted = time.monotonic()
    run = await asyncio.wait_for(handle.result(), RESULT_WAIT)
    t_done = time.monotonic()

    # the run completed, every step once
    assert [h.step for h in run.history] == [1, 2, 3] and not run.cancelled
    assert [h.policy_version for h in run.history] == [1, 2, 3]
    desc = await handle.describe()
    assert desc.status == WorkflowExecutionStatus.COMPLETED
    assert desc.typed_search_attributes.get(STATUS) == "completed"
    manifest = await check_trained_once(client, handle, store, cfg, base, [first_trainer, trainer.pid])
    # the weights of each version, read from the store here (version 0: the staged base model)
    versions = {0: download_base_model(store, cfg.run_id, manifest, fleet.check_dir / "v0")}
    for v in (1, 2, 3):
        versions[v] = download_model_folder(store, cfg.run_id, v, fleet.check_dir / f"v{v}")
    trained = await decoded_inputs(client, handle, "train_step", TrainStepInput)
    assert [t.step for t in trained] == [1, 2, 3]
    served, (row, span) = await check_rows(client, cfg, run, trained, store, versions)
    # the check tells the models apart: the inference hosts' own weights give step 1's tokens other logprobs
    prompt, completion = row.input_ids[: span.start], row.input_ids[span.start : span.end]
    own = learner_logprobs(models[INFERENCE_1], prompt, completion)
    assert np.abs(own - row.behavior_logprobs[span.start : span.end]).max() > 100 * LOGPROB_TOLERANCE
    # who served: step 1 only inference-1 (alone then), step 3 only inference-2 (inference-1 had left)
    print(f"\ngenerate calls per (step, host): {dict(sorted(served.items()))}")
    assert {h for (s, h) in served if s == 1} == {INFERENCE_1}
    assert {h for (s, h) in served if s == 3} == {INFERENCE_2}
    # each host used its own disk: inference-2 downloaded the last version, the restarted trainer step 2
    assert list(hosts[INFERENCE_2].tmp.glob(f"grove-worker-*/weights/{cfg.run_id}/step-{STEPS:06d}"))
    assert list(hosts[TRAINER].tmp.glob(f"grove-worker-*/trainer/step-{KILL_STEP:06d}-*"))
    check_final_weights(store, cfg, trained, versions)
    print(
        f"hosts polling {t_up - t0:.0f} s; run start -> trainer restarted {t_restarted - t_up:.0f} s, "
        f"-> run completed {t_done - t_up:.0f} s; checks {time.monotonic() - t_done:.0f} s"
    )
