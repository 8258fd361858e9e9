"""The demo (README's main command): parent+worker GRPO on the `delegation` task, beside the
parent-only baseline, on the real stack (Temporal dev server with its UI, vLLM, the learner).

    grove demo [--model tiny|smollm2|DIR] [--steps N] [--name demo] [--lr X] [--temperature T] ...
    grove demo --harness opencode [--steps N] ...   # the same two runs, episodes driven by stock OpenCode
    grove demo --harness langgraph|agents-sdk ...    # ... by a LangGraph / OpenAI Agents SDK program
    grove demo --summaries ...                       # summaries trained vs not, on summary-delegation

Both runs train at the same time, each with its own inference engine (one engine holds one policy).
Progress bars show step, mean reward and episodes; metrics go to runs/<name>/metrics.csv and the
plot to runs/<name>/reward.png (per run: raw mean reward per step and its trailing mean; beside it the
reward's components, delegation's parent and workers, per run). Ctrl-C stops the workers and leaves
the Temporal server and the runs where they are; running the same command again re-attaches to the
same workflows and resumes them.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from statistics import mean
from typing import Literal
from urllib.parse import quote

from pydantic import BaseModel, Field
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode
from tqdm import tqdm

from cli.demo_plots import plot, write_metrics
from cli.runs import check_run_engine, start_run
from grove import queues
from grove.client import connect
from grove.contracts import (
    DEFAULT_KV_CACHE_BYTES,
    EngineLimits,
    HarnessSpec,
    OpenCodeOptions,
    PythonHarnessOptions,
    RunConfig,
    RunLive,
    RunResult,
    RunState,
    StepRecord,
)
from grove.learner_config import LearnerConfig
from grove.paths import grove_home
from grove.runconfig import OverrideError, apply_overrides, parse_override, validate_run_config
from grove.sampling import SamplingConfig
from grove.visibility import run_clause
from infra.procs import ServiceStartError, log_tail, stop_pid
from models.limits import EngineLimitsError, kv_bytes_per_token


class DemoConfig(BaseModel):
    """The demo's settings. The defaults are the native demo's (tiny, 20 steps, 2 tasks x 8 episodes, lr
    5e-4, T 0.7): on them the parent-and-workers run's reward rises while parent-only's does not
    (docs/results.md section 1.1). `--harness langgraph|agents-sdk` keep them (sections 1.2-1.3). `--harness
    opencode` uses tiny-copy at OPENCODE_LR, since a larger lr breaks the lead's `task`-call JSON within a
    few updates; on the OpenCode families parent-and-workers has not yet risen apart from parent-only
    (sections 1.4-1.6). `--summaries` uses tiny-summary (SUMMARIES_MODEL; section 1.7). group_size and
    tasks_per_step keep the native defaults for every harness; the OpenCode pairs measured used 4 x 1 or
    4 x 2 on 2 cores."""

    name: str = "demo"
    # native: harnesses/delegation.py inside the episode workflows; opencode: stock OpenCode launched per
    # episode by the harness runner on the `opencode-delegation` family (examples/opencode-delegation.yaml);
    # langgraph / agents-sdk: a Python harness program launched per episode the same way, on the
    # `langgraph-delegation` / `agents-sdk-delegation` family (harnesses/framework_delegation.py)
    # claude-code / codex: stock Claude Code on `claude-code-delegation`, stock Codex on `delegation` (the
    # lead starts a worker per word with its own subagent tool), driven by smol-agent (CODING_MODEL)
    harness: Literal["native", "opencode", "langgraph", "agents-sdk", "claude-code", "codex"] = "native"
    # opencode only: `opencode-delegation` (None), `opencode-reader` (its workers read notes.txt and
    # compact mid-way; harnesses/opencode_reader.py) or `opencode-report` (the same episodes, rewarded for
    # the shape of the workers' reports and the lead's answer; harnesses/opencode_report.py)
    family: Literal["opencode-delegation", "opencode-reader", "opencode-report"] | None = None
    # native only: the pair is `summaries-trained` vs `summaries-not-trained` on `summary-delegation`
    # (harnesses/summary_delegation.py), every agent's actions trained in both; the pair differs only in
    # RunConfig.train_auxiliary ([summary] or [])
    summaries: bool = False
    # None: tiny (native), tiny-summary (`summaries`: see SUMMARIES_MODEL) or tiny-copy (opencode: tiny-tools,
    # drilled on OpenCode's calls, fine-tuned to copy made-up words into them; tiny-tools writes the calls
    # but copies no word, so its groups give no signal)
    model: str | None = None
    steps: int = 20
    group_size: int = 8
    tasks_per_step: int = 2
    # None: 5e-4 (native, langgraph, agents-sdk), 1e-4 (opencode; see OPENCODE_LR) or 1e-5 (claude-code,
    # codex: CODING_LR)
    lr: float | None = None
    # KL penalty to the frozen start model (k3 estimator, learner.kl_coef); 0: off
    kl_coef: float = Field(0.0, ge=0.0)
    # None: 8 (native: one word), 128 (opencode: two `task` calls with made-up words take ~90 tokens) or
    # 256 (claude-code, codex: two subagent calls with their descriptions)
    max_tokens: int | None = None
    temperature: float = 0.7
    eval_every: int = 5  # held-out evaluation (8 tasks never trained on) every this many steps
    # RunConfig.seed: the tasks of step N are a pure function of (seed, N), the same for both runs, so
    # a pair compares the agents trained on the same tasks; another seed gives the pair other tasks
    seed: int = Field(0, ge=0)
    # `dotted.path=value` overrides applied to both runs' RunConfig (grove/runconfig.py), e.g.
    # learner.adv_std_scaling=false: the pair stays identical but for the agents it trains
    overrides: list[str] = Field(default_factory=list)
    port: int = 7233
    ui_port: int = 8233
    out_dir: Path = Path("runs")


OPENCODE_CONTEXT = 4096  # tiny-copy's engines and OpenCode's `limit.context`: holds the lead's resumption
# OpenCode's `limit.output`: the lead's two `task` calls, each with a made-up word written twice, take
# ~90-105 tokens (at 64 the second call was cut, and a cut call leaves the whole reply plain text)
OPENCODE_MAX_TOKENS = 128
# GRPO on tiny-copy's OpenCode episodes: at the native demo's 5e-4 the lead's task-call JSON broke
# within a few updates and the reward fell to 0 (docs/results.md section 1.4, D1)
OPENCODE_LR = 1e-4
# a progress query nobody answered yet, not one that was refused: the server's query timeout (a loaded
# machine), a dropped call, or FAILED_PRECONDITION "no poller seen" while the workers are still starting
UNANSWERED = frozenset(
    {
        RPCStatusCode.DEADLINE_EXCEEDED,
        RPCStatusCode.CANCELLED,
        RPCStatusCode.UNAVAILABLE,
        RPCStatusCode.FAILED_PRECONDITION,
    }
)
PYTHON_FAMILIES = {"langgraph": "langgraph-delegation", "agents-sdk": "agents-sdk-delegation"}
# the stock coding harnesses: their family, driven by the tool policy that calls whatever subagent tool
# its prompt offers (models/agent_tune.py), in its 8,192 positions (Codex's lead with subagents on is
# ~3.8k tokens in its tokenizer)
CODING_FAMILIES = {"claude-code": "claude-code-delegation", "codex": "delegation"}
CODING_MODEL = "smol-agent"
CODING_CONTEXT = 8192
CODING_MAX_TOKENS = 256
# KV cache of each coding run's engine, in full CODING_CONTEXT contexts at the engine's float32: a lead
# and its subagents run at once (one full context alone is 360 MiB for smol-agent, past the default)
CODING_KV_CONTEXTS = 4
CODING_LR = 1e-5  # a pretrained 135M policy tuned at 5e-5: far below the tiny models' rates (no pair run yet)
HARNESSES = ("native", "opencode", *PYTHON_FAMILIES, *CODING_FAMILIES)


def coding_kv_bytes(model_dir: Path) -> int:
    """The coding runs' KV cache: CODING_KV_CONTEXTS full contexts of this model at float32. Before the
    model is built (the pair's first validation, given its name) its size is unknown: the default stands
    there, and `main` sizes the runs it starts from the built folder."""
    if not (model_dir / "config.json").is_file():
        return DEFAULT_KV_CACHE_BYTES
    return kv_bytes_per_token(model_dir, "float32") * CODING_CONTEXT * CODING_KV_CONTEXTS


def learning_rate(cfg: DemoConfig) -> float:
    if cfg.lr:
        return cfg.lr
    if cfg.harness in CODING_FAMILIES:
        return CODING_LR
    return OPENCODE_LR if cfg.harness == "opencode" else 5e-4


OPENCODE_MODELS = {
    "opencode-delegation": "tiny-copy",
    "opencode-reader": "tiny-reader",
    "opencode-report": "tiny-report",
}


# `--summaries`: tiny writes no summary that keeps a word, so every summary scores alike and training it has
# nothing to learn (docs/results.md section 1.7, S1); tiny-summary (models/summary_tune.py) keeps the
# worker's word in some episodes of a group and the distractor in others
SUMMARIES_MODEL = "tiny-summary"


def opencode_family(cfg: DemoConfig) -> str:
    return cfg.family or "opencode-delegation"


def model_name(cfg: DemoConfig) -> str:
    if cfg.model:
        return cfg.model
    if cfg.harness == "opencode":
        return OPENCODE_MODELS[opencode_family(cfg)]
    if cfg.harness in CODING_FAMILIES:
        return CODING_MODEL
    return SUMMARIES_MODEL if cfg.summaries else "tiny"


def run_configs(cfg: DemoConfig, model_dir: Path) -> list[RunConfig]:
    """The two runs: identical but for which agents' actions (or, `summaries`, which calls) are trained."""
    if cfg.harness == "opencode":
        family = opencode_family(cfg)
        harness = HarnessSpec(kind="opencode", opencode=OpenCodeOptions(context_limit=OPENCODE_CONTEXT))
        engine = EngineLimits(max_model_len=OPENCODE_CONTEXT)
        max_tokens = cfg.max_tokens or OPENCODE_MAX_TOKENS
    elif cfg.harness in CODING_FAMILIES:
        family = CODING_FAMILIES[cfg.harness]
        harness = HarnessSpec(kind=cfg.harness, deadline_s=900)
        engine = EngineLimits(max_model_len=CODING_CONTEXT, kv_cache_bytes=coding_kv_bytes(model_dir))
        max_tokens = cfg.max_tokens or CODING_MAX_TOKENS
    elif cfg.harness in PYTHON_FAMILIES:
        from harnesses.framework_delegation import ENTRIES

        family = PYTHON_FAMILIES[cfg.harness]  # the same runs as examples/<family>.yaml
        harness = HarnessSpec(
            kind="python", python=PythonHarnessOptions(entry=ENTRIES[family]), deadline_s=600
        )
        engine, max_tokens = EngineLimits(), cfg.max_tokens or 8
    else:
        family = "summary-delegation" if cfg.summaries else "delegation"
        harness = HarnessSpec(program=family)
        engine, max_tokens = EngineLimits(), cfg.max_tokens or 8
    runs = []
    for agents, auxiliary, suffix in pair_of(cfg):
        run_id = f"{cfg.name}-{suffix}"
        runs.append(
            _overridden(
                cfg.overrides,
                RunConfig(
                    run_id=run_id,
                    model=str(model_dir),
                    steps=cfg.steps,
                    task_family=family,
                    num_tasks=64,
                    tasks_per_step=cfg.tasks_per_step,
                    group_size=cfg.group_size,
                    harness=harness,
                    engine=engine,
                    sampling=SamplingConfig(max_tokens=max_tokens, temperature=cfg.temperature),
                    train_agents=agents,
                    train_auxiliary=auxiliary,
                    learner=LearnerConfig(lr=learning_rate(cfg), weight_decay=0.0, kl_coef=cfg.kl_coef),
                    inference_queue=f"{queues.INFERENCE}-{run_id}",
                    eval_every=cfg.eval_every,
                    eval_tasks=8,
                    seed=cfg.seed,
                ),
            )
        )
    return runs


def pair_of(cfg: DemoConfig) -> list[tuple[str, list[str], str]]:
    """(train_agents, train_auxiliary, run name suffix) of the pair's two runs."""
    if cfg.summaries:
        return [("all", ["summary"], "summaries-trained"), ("all", [], "summaries-not-trained")]
    return [("all", [], "parent-and-workers"), ("parent_only", [], "parent-only")]


# what makes the two runs a pair: an override of one of these would make them something else
PAIR_FIELDS = ("run_id", "train_agents", "train_auxiliary", "inference_queue")


def _overridden(overrides: list[str], run: RunConfig) -> RunConfig:
    """`run` with `overrides` applied and validated again. Raises OverrideError (also for a field that
    names the pair itself) or ConfigValidationError."""
    if not overrides:
        return run
    for text in overrides:
        path, _ = parse_override(text)
        if path[0] in PAIR_FIELDS:
            raise OverrideError(
                f"override {text!r}: {path[0]} is set by the demo for each run of the pair; "
                "use --name for other run ids"
            )
    data = apply_overrides(run.model_dump(mode="json"), overrides)
    return validate_run_config(data, f"demo run {run.run_id} with {' '.join(overrides)}")


def engine_flags(limits: EngineLimits) -> list[str]:
    """`grove worker` flags that give an inference worker the run's engine limits."""
    flags = ["--max-model-len", str(limits.max_model_len), "--kv-cache-bytes", str(limits.kv_cache_bytes)]
    if limits.max_num_batched_tokens is not None:
        flags += ["--max-num-batched-tokens", str(limits.max_num_batched_tokens)]
    return flags


def start_worker(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "cli.main", "worker", *args],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True,
        )  # fmt: skip


async def attach(client: Client, run: RunConfig):
    """Start the run, re-attach to it while it runs, or resume it after its last step once it completed,
    as `grove run start` does (cli/runs.py `start_run`). Starting a completed run's workflow again from
    its config alone began it anew at step 1 and version 0 under the same episode ids."""
    outcome = await start_run(client, run)
    if outcome.action != "started":
        print(f"[demo] {run.run_id}: {outcome.action} (next step {outcome.next_step} of {outcome.steps})")
    return outcome.handle or client.get_workflow_handle(run.run_id, result_type=RunResult)


async def history_of(handle) -> tuple[list[StepRecord], bool, RunLive | None] | None:
    """(steps done so far, finished?, moving parts) of a run, from its result or its `progress` query;
    None when the server or the query gave no answer this time (the workers still starting, a loaded
    machine: a stalled dev server answered describe with UNAVAILABLE "http2 error" after 57 s and the
    demo, whose runs went on, stopped watching them)."""
    try:
        desc = await handle.describe()
        if desc.status == WorkflowExecutionStatus.COMPLETED:
            result: RunResult = await handle.result()
            return _all_steps(handle.id, result.history, result.history_from), True, None
        if desc.status != WorkflowExecutionStatus.RUNNING:
            raise RuntimeError(f"run {handle.id} is {desc.status.name}; inspect it in the Temporal UI")
        state = await handle.query("progress", result_type=RunState)
    except RPCError as err:  # no answer within the server's timeout: ask again next round
        if err.status not in UNANSWERED:
            raise
        return None
    if state is None:
        return [], False, None
    return _all_steps(handle.id, state.history, state.history_from), False, state.live


def _all_steps(run_id: str, history: list[StepRecord], history_from: int) -> list[StepRecord]:
    """The carried records, plus (a run longer than RunConfig.carried_history_steps) the archived ones."""
    if history_from == 1:
        return history
    from cli.runs import step_history
    from storage.config import store_from_env

    return step_history(store_from_env(), run_id, history, history_from)


def live_postfix(live: RunLive | None) -> dict[str, str]:
    """The learner's step, the lag and each engine's version/in-flight calls, for the progress bar."""
    if live is None:
        return {}
    engines = " ".join(f"v{e.version}/{e.in_flight}" for e in live.engines)
    return {
        "training": str(live.training_step or "-"),
        "lag": f"{live.lag}/{live.max_policy_lag}",
        "engines(v/in-flight)": engines or "-",
    }


def orchestration_worker_args(runs: list[RunConfig], model_dir: Path) -> list[str]:
    """`grove worker` arguments of the demo's one non-inference worker: episodes, io and the learner, and
    for runs of a launched harness the harness queue too (its embedded gateway measures prompts with
    the runs' model tokenizer and engine context)."""
    names = ["episodes", "io", "trainer"]
    args = ["--model", str(model_dir)]
    if any(r.harness.kind != "native" for r in runs):
        names.append(queues.HARNESS)
        args += ["--max-model-len", str(max(r.engine.max_model_len for r in runs))]
    return ["--queues", ",".join(names), *args]


async def follow(client: Client, runs: list[RunConfig], out: Path, workers: list[subprocess.Popen]) -> dict:
    handles = {r.run_id: await attach(client, r) for r in runs}
    bars = {
        rid: tqdm(total=r.steps, desc=rid, position=i, unit="step", dynamic_ncols=True)
        for i, (rid, r) in enumerate(zip(handles, runs, strict=True))
    }
    histories: dict[str, list[StepRecord]] = {rid: [] for rid in handles}
    finished: set[str] = set()
    while len(finished) < len(handles):
        for p in workers:
            if p.poll() is not None:
                raise RuntimeError(f"a worker exited with code {p.returncode}; see runs/*/logs")
        for rid, handle in handles.items():
            if rid in finished:
                continue
            progress = await history_of(handle)
            if progress is None:
                continue
            history, done, live = progress
            if len(history) != len(histories[rid]) or live is not None:
                new = len(history) != len(histories[rid])
                histories[rid] = history
                reward = f"{history[-1].mean_reward:.3f}" if history else "-"
                bars[rid].n = len(history)
                bars[rid].set_postfix(
                    reward=reward, episodes=sum(h.episodes for h in history), **live_postfix(live),
                    refresh=False,
                )  # fmt: skip
                bars[rid].refresh()
                if new:
                    write_metrics(out / "metrics.csv", histories)
                    plot(out / "reward.png", histories, f"{runs[0].task_family}: mean reward per step")
            if done:
                finished.add(rid)
        await asyncio.sleep(2.0)
    for bar in bars.values():
        bar.close()
    return histories


def prepare_model(name: str) -> Path:
    """The model's folder, building whatever it needs first and saying so: on a fresh machine an OpenCode
    family's model is a chain of builds and fine-tunes (tiny-tools, tiny-copy, ...), each trained on the
    CPU once and cached under $GROVE_HOME/models."""
    from models.registry import ensure_model, uncached_builds

    builds = uncached_builds(name)
    if builds:
        print(
            f"[demo] model {name!r} is not in the model cache: building {', '.join(builds)} first (trained "
            "here on the CPU, once; README says how long)",
            flush=True,
        )
    for build in builds:
        print(f"[demo] building model {build!r} ...", flush=True)
        started = time.monotonic()
        ensure_model(build)
        print(f"[demo] built {build!r} in {(time.monotonic() - started) / 60:.1f} min", flush=True)
    model_dir = ensure_model(name)
    print(f"[demo] model {name!r}: {model_dir}", flush=True)
    return model_dir


def main(cfg: DemoConfig) -> int:
    from infra import stack

    out = cfg.out_dir / cfg.name
    out.mkdir(parents=True, exist_ok=True)
    model_dir = prepare_model(model_name(cfg))
    runs = run_configs(cfg, model_dir)
    try:  # before anything starts: a worker would refuse these limits only once the runs had begun
        for run in runs:
            check_run_engine(run)
    except EngineLimitsError as exc:
        print(f"[demo] {exc}", file=sys.stderr, flush=True)
        return 1
    if cfg.harness == "opencode":
        from harnesses.opencode_install import opencode_binary

        print(f"[demo] OpenCode: {opencode_binary()}", flush=True)  # installs the pinned version if missing
    if cfg.harness == "claude-code":
        from harnesses.claude_code_install import claude_code_binary

        print(f"[demo] Claude Code: {claude_code_binary()}", flush=True)  # the same, pinned
    if cfg.harness == "codex":
        from harnesses.codex_install import codex_binary

        print(f"[demo] Codex: {codex_binary()}", flush=True)
    try:
        rec = stack.up_temporal(port=cfg.port, ui=True, ui_port=cfg.ui_port)
    except ServiceStartError as exc:  # TemporalDatabaseInUseError among them: the message says what to do
        print(f"[demo] {exc}", file=sys.stderr, flush=True)
        return 1
    if not rec.address.endswith(f":{cfg.port}"):  # a live recorded server is reused, whatever its port
        print(
            f"[demo] note: the Temporal dev server grove started earlier (pid {rec.pid}) is still running at "
            f"{rec.address}; the demo uses it (--port {cfg.port} applies only when the demo starts the "
            "server). Workers of every demo on one server share its task queues: stop the other demo's "
            "workers, or `grove infra down`, before starting another version of grove on it.",
            flush=True,
        )
    env = dict(os.environ, GROVE_TEMPORAL_ADDRESS=rec.address)
    env.setdefault("GROVE_STORE", f"file://{grove_home() / 'store'}")
    logs = out / "logs"
    workers = [start_worker(orchestration_worker_args(runs, model_dir), logs / "worker.log", env)]
    for r in runs:
        workers.append(
            start_worker(
                [
                    *[
                        "--queues",
                        "inference",
                        "--inference-queue",
                        r.inference_queue,
                        "--model",
                        str(model_dir),
                    ],
                    *engine_flags(r.engine),
                ],
                logs / f"inference-{r.run_id}.log",
                env,
            )  # fmt: skip
        )
    print(f"[demo] Temporal UI: {rec.ui_url}   (address {rec.address})")
    workflows = f"{rec.ui_url}/namespaces/default/workflows"
    for r in runs:
        print(f"[demo] run workflow: {r.run_id}   {workflows}/{quote(r.run_id, safe='')}")
    episodes = quote(run_clause(runs[0].run_id), safe="")
    print(f"[demo] episodes: {workflows}?query={episodes}")
    print(f"[demo] metrics {out / 'metrics.csv'}, plot {out / 'reward.png'}, worker logs {logs}", flush=True)
    started = time.monotonic()
    signal.signal(signal.SIGTERM, _interrupt)  # a terminated demo stops its workers like Ctrl-C does
    try:
        histories = asyncio.run(_follow(rec.address, runs, out, workers))
    except KeyboardInterrupt:
        print("\n[demo] interrupted: workers stopped, runs kept in Temporal. Run the same command to resume.")
        return 130
    except RuntimeError as err:
        print(f"[demo] {err}\n{log_tail(logs / 'worker.log')}")
        return 1
    finally:
        for p in workers:
            stop_pid(p.pid)
    minutes = (time.monotonic() - started) / 60
    print(f"[demo] done in {minutes:.1f} min (this invocation).")
    for line in summary_lines(histories):
        print(line)
    print(f"[demo] plot: {out / 'reward.png'}   UI (still running): {rec.ui_url}   stop it: grove infra down")
    return 0


def summary_lines(histories: dict[str, list[StepRecord]]) -> list[str]:
    """Each run's mean reward over its first and last half of steps, then the pair's per-step difference
    over the steps both ran. A single step's reward is mostly its tasks' difficulty (one or two tasks per
    step), so a first-vs-last-step comparison says little; both runs see the same tasks at a step
    (RunConfig.seed), so the paired difference is the figure that compares them."""
    lines = ["Mean reward, first half -> last half of the steps:"]
    by_step: dict[str, dict[int, float]] = {}
    for rid, h in histories.items():
        by_step[rid] = {r.step: r.mean_reward for r in h}
        if not h:
            continue
        half = max(1, len(h) // 2)
        first, last = mean(r.mean_reward for r in h[:half]), mean(r.mean_reward for r in h[-half:])
        lines.append(f"    {rid:28s} {first:.3f} -> {last:.3f}  ({len(h)} steps, {half} per half)")
    pw = next((rid for rid in by_step if rid.endswith("parent-and-workers")), None)
    po = next((rid for rid in by_step if rid.endswith("parent-only")), None)
    common = sorted(set(by_step[pw]) & set(by_step[po])) if pw is not None and po is not None else []
    if common and pw is not None and po is not None:
        diffs = [by_step[pw][s] - by_step[po][s] for s in common]
        lines.append(
            f"    parent+workers - parent-only, per step: {mean(diffs):+.3f} "
            f"(ahead at {sum(d > 0 for d in diffs)} of {len(diffs)} steps)"
        )
    return lines


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


async def _follow(address: str, runs: list[RunConfig], out: Path, workers: list[subprocess.Popen]):
    client = await connect(address)
    return await follow(client, runs, out, workers)
