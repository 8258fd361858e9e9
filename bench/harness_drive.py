"""How valid a policy's tool calls are inside stock harnesses: episodes of Claude Code, Codex and OpenCode
driven through grove's real stack, each with subagents of a configuration no drill used.

    python -m bench.harness_drive MODEL [--harness claude-code,codex,opencode] [--episodes 4]
        [--concurrency 2] [--max-tokens 256] [--temperature 0.7] [--json out.json]

MODEL: a registry name that is already built (`grove model init MODEL` first: this command never builds
one) or a model folder. The stack is the one a run uses, in this process: a Temporal dev server, one
vLLM engine on the model (`--max-model-len`, default 8,192), a worker on the episodes, io, inference
and harness queues whose harness runner launches the pinned binary per episode
(activities/harness.py) against its embedded gateway. Each episode is an `EpisodeWorkflow` with the
harness kind and its options (grove/contracts/harness.py), so every request goes through the gateway's
own wire (Anthropic Messages, Responses, chat completions), identity and capture.

The configurations (`CONFIGS`): a lead with subagents named `fact-finder` and `condenser`, asked in
words no drill uses for a fact about one made-up word and a shorter version of a note:

- claude-code: `--agents` JSON with the two custom agents (no tools of their own), the lead's only tool
  `Agent`; valid: `subagent_type` one of the two;
- codex: subagents on (`spawn_agent`, `wait_agent`, ...: the multi_agent_v1 namespace), no shell tools;
  the base instructions tell the lead to start one helper per part; valid: `message` or `items` given;
- opencode: a primary `coordinator` with only the `task` tool and the two subagents (OpenCode's own
  agents off); valid: `subagent_type` one of the two.

Per harness it prints the episodes (ok), the policy's completed calls (the lead's among them), the tool
calls written, how many parsed, how many are valid (bench/harness_calls.py states the rule), the
subagents that ran (spawned contexts with a completed call), the episodes whose harness reported a
final answer, the temperatures the calls were sampled at, and the wall time from the first episode's
start to the last one's end (the engine's start is printed apart). `--json` writes the same per episode.
Figures go to docs/results.md with the command, commit, wall time and load.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.harness_calls import Rules, Tally, tally_episode
from grove import queues
from grove.contracts import (
    ClaudeCodeOptions,
    CodexOptions,
    EpisodeResult,
    EpisodeSpec,
    HarnessOutcome,
    HarnessSpec,
    OpenCodeOptions,
    TaskSpec,
)
from grove.sampling import SamplingConfig
from grove.store_layout import STAGING_ROOT
from storage.local import LocalStore

HARNESSES = ("claude-code", "codex", "opencode")
AGENT_TYPES = ("fact-finder", "condenser")
# Claude Code's own Agent text offers "fork" besides the configured types ("choose `fork` or one of
# the listed agent types": a copy of the caller with its context), so a call naming it is valid.
CLAUDE_CODE_TYPES = (*AGENT_TYPES, "fork")
LEAD = "coordinator"  # OpenCode's primary agent
MAX_MODEL_LEN = 8192
KV_CACHE_BYTES = 2**30  # float32 KV of SmolLM2-135M: ~46 KB a token, so ~23k tokens (a lead and two helpers)


# ------------------------------------------------------------------------------------------ configurations


def user_message(task: TaskSpec) -> str:
    """Two jobs in plain words, one for each subagent type; the words are the task's made-up ones."""
    w1, w2 = task.params["words"][:2]
    return (
        f"I need two things. First, what is a {w1}? The fact-finder can look that up. Second, this note is "
        f"too long, so have the condenser shorten it: '{w1} and {w2} met at the harbour on Tuesday and "
        "talked about the weather for three hours.' Tell me both results."
    )


LEAD_PROMPT = (
    "You coordinate a small team and never do the work yourself. fact-finder looks things up; condenser "
    "shortens text. Give each job to the right one, then reply to the user with what they returned."
)
FACT_FINDER = ("Looks up what a word or a name means.", "You are fact-finder. Answer in one sentence.")
CONDENSER = (
    "Shortens a note to a few words.",
    "You are condenser. Reply with the note in five words or fewer.",
)
CODEX_INSTRUCTIONS = (
    "You coordinate helpers and never do the work yourself. For each job in the user's request start one "
    "helper with spawn_agent (its message: that job), wait for them with wait_agent, then reply with what "
    "they returned. If you are a helper, answer your message in one sentence."
)


def claude_code_harness(task: TaskSpec, max_tokens: int, deadline_s: float) -> HarnessSpec:
    agents = {
        name: {"description": desc, "prompt": prompt, "tools": []}
        for name, (desc, prompt) in zip(AGENT_TYPES, (FACT_FINDER, CONDENSER), strict=True)
    }
    options = ClaudeCodeOptions(
        message=user_message(task), system_prompt=LEAD_PROMPT, tools=["Agent"], agents=agents,
        output_limit=max_tokens,
    )  # fmt: skip
    return HarnessSpec(kind="claude-code", claude_code=options, deadline_s=deadline_s, **_patience())


def codex_harness(task: TaskSpec, max_tokens: int, deadline_s: float) -> HarnessSpec:
    options = CodexOptions(
        message=user_message(task), instructions=CODEX_INSTRUCTIONS, subagents=True, shell=False,
        context_window=MAX_MODEL_LEN, request_timeout_s=deadline_s,
    )  # fmt: skip
    return HarnessSpec(kind="codex", codex=options, deadline_s=deadline_s, **_patience())


def opencode_harness(task: TaskSpec, max_tokens: int, deadline_s: float) -> HarnessSpec:
    subagent = {"mode": "subagent", "tools": {"*": False}}
    agents: dict[str, dict[str, Any]] = {
        LEAD: {"mode": "primary", "prompt": LEAD_PROMPT, "tools": {"*": False, "task": True}},
        **{
            name: {**subagent, "description": desc, "prompt": prompt}
            for name, (desc, prompt) in zip(AGENT_TYPES, (FACT_FINDER, CONDENSER), strict=True)
        },
        "explore": {"disable": True},
        "general": {"disable": True},
        "title": {"disable": True},
    }
    options = OpenCodeOptions(
        agents=agents, default_agent=LEAD, message=user_message(task), context_limit=MAX_MODEL_LEN,
        output_limit=max_tokens,
    )  # fmt: skip
    return HarnessSpec(kind="opencode", opencode=options, deadline_s=deadline_s, **_patience())


def _patience() -> dict[str, Any]:
    """One launch per episode (a relaunch would replay the same calls and count nothing new) and a
    heartbeat timeout that a loaded two-core machine does not trip."""
    return {"max_launches": 1, "heartbeat_timeout_s": 120.0}


@dataclass(frozen=True)
class DriveConfig:
    # a registered task family: its tasks give the two made-up words (claude-code-delegation's for every
    # harness); its reward is not this configuration's and is not reported
    family: str
    harness: Callable[[TaskSpec, int, float], HarnessSpec]
    rules: Rules
    outcome: Callable[[list[dict[str, Any]]], HarnessOutcome]


def configs() -> dict[str, DriveConfig]:
    from harnesses import claude_code, codex, opencode

    return {
        "claude-code": DriveConfig(
            "claude-code-delegation", claude_code_harness,
            Rules(agent_types={"Agent": ("subagent_type", CLAUDE_CODE_TYPES)}), claude_code.outcome_of_events,
        ),
        "codex": DriveConfig(
            "claude-code-delegation", codex_harness, Rules(one_of={"spawn_agent": ("message", "items")}),
            codex.outcome_of_events,
        ),
        "opencode": DriveConfig(
            "claude-code-delegation", opencode_harness,
            Rules(agent_types={"task": ("subagent_type", AGENT_TYPES)}), opencode.outcome_of_events,
        ),
    }  # fmt: skip


# ------------------------------------------------------------------------------------------ the stack


class RecordKeepingStore(LocalStore):
    """The local store, keeping a copy of every chat record the gateway writes: the episode deletes them
    with its staging area at close, and they hold the tools each request offered."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self._lock = threading.Lock()
        self.records: dict[str, dict[str, dict[str, Any]]] = {}  # episode id -> call id -> record

    def put(self, key: str, data: bytes) -> None:
        super().put(key, data)
        if key.startswith(f"{STAGING_ROOT}/") and key.endswith(".chat.json"):
            record = json.loads(data)
            with self._lock:
                self.records.setdefault(record["episode_id"], {})[record["call_id"]] = record


@dataclass
class Stack:
    client: Any
    store: RecordKeepingStore
    harness_root: Path
    worker: asyncio.Task


@contextlib.asynccontextmanager
async def stack(work: Path, model_dir: Path, max_model_len: int, kv_cache_bytes: int) -> AsyncIterator[Stack]:
    """Temporal dev server, vLLM engine, and one worker on the episodes, io, inference and harness queues
    (its harness runner serves an embedded gateway); all stopped on exit."""
    from activities.engine import PolicyEngine
    from activities.engine_config import EngineConfig
    from activities.harness import HarnessWorkerOptions
    from cli.worker import run_worker
    from grove.client import connect
    from infra.temporal import TemporalDevServer

    server = TemporalDevServer(work / "temporal").start()
    engine = worker = None
    try:
        started = time.monotonic()
        config = EngineConfig(model_dir=model_dir, max_model_len=max_model_len, kv_cache_bytes=kv_cache_bytes)
        engine = await PolicyEngine.start(config)
        print(f"[drive] engine loaded in {time.monotonic() - started:.0f} s ({model_dir.name})", flush=True)
        client = await connect(server.address)
        store = RecordKeepingStore(work / "store")
        options = HarnessWorkerOptions(
            policy_model=str(model_dir), max_model_len=max_model_len, keep_dirs=True, root=work / "harness"
        )
        names = [queues.EPISODES, queues.IO, queues.INFERENCE, queues.HARNESS]
        worker = asyncio.create_task(
            run_worker(client, names, store=store, model=str(model_dir), work_dir=work / "worker",
                       device="cpu", engine=engine, harness=options)
        )  # fmt: skip
        yield Stack(client, store, work / "harness", worker)
    finally:
        if worker is not None:
            worker.cancel()
            # a worker's shutdown waits for its in-flight activities; a generation still running would
            # hold it until the engine stops, so wait a bounded while, stop the engine, then wait again
            await asyncio.wait({worker}, timeout=30)
        if engine is not None:
            await engine.shutdown()
        if worker is not None:
            with contextlib.suppress(BaseException):
                await worker
        server.stop()


# ------------------------------------------------------------------------------------------ episodes


@dataclass
class EpisodeReport:
    episode_id: str
    status: str
    failure: str | None
    final_answer: str
    wall_s: float
    tally: Tally

    def as_json(self) -> dict[str, Any]:
        return {
            "episode_id": self.episode_id, "status": self.status, "failure": self.failure,
            "final_answer": self.final_answer, "wall_s": round(self.wall_s, 1), **self.tally.as_json(),
        }  # fmt: skip


def episode_spec(name: str, index: int, cfg: DriveConfig, sampling: SamplingConfig, deadline_s: float):
    from harnesses.programs import family

    make_task, _ = family(cfg.family)
    task = make_task(index)
    run = f"drive-{name}-{uuid.uuid4().hex[:6]}"
    group = f"{run}/s000001/t{index}"
    return EpisodeSpec(
        run_id=run, step=1, group_id=group, episode_id=f"{group}/g0", task=task,
        harness=cfg.harness(task, sampling.max_tokens, deadline_s), sampling=sampling,
    )  # fmt: skip


def harness_outcome(root: Path, episode_id: str, cfg: DriveConfig) -> HarnessOutcome:
    """What the harness's own events say it answered (the launch folder is kept)."""
    from activities.harness import episode_folder
    from harnesses.json_events import parse_events

    path = episode_folder(root, episode_id) / "home" / "events.jsonl"
    if not path.exists():
        return HarnessOutcome(failure=f"no events at {path}")
    return cfg.outcome(parse_events(path.read_text().splitlines()))


async def run_one(s: Stack, spec: EpisodeSpec, cfg: DriveConfig, timeout_s: float) -> EpisodeReport:
    from capture.call_archive import load_archive
    from grove.episode_start import start_episode

    started = time.monotonic()
    handle = await start_episode(s.client, spec, result_type=EpisodeResult)
    result: EpisodeResult = await asyncio.wait_for(handle.result(), timeout_s)
    wall = time.monotonic() - started
    outcome = harness_outcome(s.harness_root, spec.episode_id, cfg)
    archive = load_archive(s.store, spec.episode_id)
    final = outcome.final_answer.strip()
    if archive is None:
        tally = Tally(episodes=1, final_answers=int(bool(final)))
    else:
        records = s.store.records.get(spec.episode_id, {})
        tally = tally_episode(archive, records, cfg.rules, ok=result.status == "ok", final_answer=bool(final))
    failure = result.failure or outcome.failure
    return EpisodeReport(spec.episode_id, result.status, failure, final, wall, tally)


async def watched(s: Stack, coro):
    """`coro`'s result, or the worker's error if the worker stops first (the episodes would never end)."""
    task = asyncio.ensure_future(coro)
    done, _ = await asyncio.wait({task, s.worker}, return_when=asyncio.FIRST_COMPLETED)
    if task not in done:
        task.cancel()
        s.worker.result()  # raises the worker's error
        raise RuntimeError("the worker stopped before the episodes ended")
    return task.result()


async def drive_harness(s: Stack, name: str, args: argparse.Namespace) -> tuple[list[EpisodeReport], float]:
    cfg = configs()[name]
    sampling = SamplingConfig(max_tokens=args.max_tokens, temperature=args.temperature)
    specs = [episode_spec(name, i, cfg, sampling, args.deadline_s) for i in range(args.episodes)]
    gate = asyncio.Semaphore(args.concurrency)

    async def one(spec: EpisodeSpec) -> EpisodeReport:
        async with gate:
            try:
                report = await run_one(s, spec, cfg, args.deadline_s + 300)
            except Exception as err:  # reported; the other episodes go on
                report = EpisodeReport(
                    spec.episode_id, "error", f"{type(err).__name__}: {err}", "", 0.0, Tally(1)
                )
        t = report.tally
        print(f"[drive] {name} {spec.episode_id}: {report.status} in {report.wall_s:.0f} s, calls {t.calls}, "
              f"tool calls {t.written} (valid {t.valid}), subagents {t.subagents_ran}, final answer "
              f"{'yes' if report.final_answer else 'no'}"
              + (f"; failure: {report.failure[:300]}" if report.failure else ""), flush=True)  # fmt: skip
        return report

    started = time.monotonic()
    reports = await watched(s, asyncio.gather(*(one(spec) for spec in specs)))
    return reports, time.monotonic() - started


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


# ------------------------------------------------------------------------------------------ report


def summary_lines(name: str, reports: list[EpisodeReport], wall_s: float) -> list[str]:
    total = Tally()
    for r in reports:
        total.add(r.tally)
    share = f"{total.valid / total.written:.2f}" if total.written else "-"
    tools = ", ".join(f"{k} {v}" for k, v in sorted(total.by_tool.items()))
    lines = [
        f"{name}: {total.episodes} episodes ({total.episodes_ok} ok), wall {wall_s:.0f} s",
        f"  policy calls {total.calls} (lead {total.lead_calls}), text replies {total.text_replies}",
        f"  tool calls written {total.written}, parsed {total.parsed}, valid {total.valid} ({share})",
        f"  by tool: {tools or '-'}",
        f"  subagents that ran {total.subagents_ran} ({dict(total.subagent_names) or '-'}), "
        f"episodes with a final answer {total.final_answers}",
        f"  sampled at temperature {dict(total.temperatures) or '-'}",
    ]
    lines += [f"  invalid x{n}: {why}" for why, n in total.invalid.most_common(6)]
    failures = sorted({(r.failure or "")[:240] for r in reports if r.failure})
    lines += [f"  failure: {f}" for f in failures]
    return lines


def resolve_model(name: str) -> Path:
    """The model's folder; a registry name that is not built yet is refused (this command never builds)."""
    from models.registry import ensure_model, uncached_builds

    if not Path(name).is_dir():
        missing = uncached_builds(name)
        if missing:
            raise SystemExit(
                f"harness_drive: model {name!r} is not built (it would build {', '.join(missing)}); run "
                f"`grove model init {name}` first, or pass a model folder"
            )
    return ensure_model(name)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="a built registry model (grove model init NAME) or a model folder")
    p.add_argument(
        "--harness", default=",".join(HARNESSES), help=f"comma-separated, of {', '.join(HARNESSES)}"
    )
    p.add_argument("--episodes", type=int, default=4, help="episodes per harness")
    p.add_argument("--concurrency", type=int, default=2, help="episodes in flight at once")
    p.add_argument("--max-tokens", type=int, default=256, help="max tokens of each policy call")
    p.add_argument("--temperature", type=float, default=0.7, help="the episodes' sampling temperature")
    p.add_argument("--deadline-s", type=float, default=600.0, help="wall-clock limit of one launch")
    p.add_argument("--max-model-len", type=int, default=MAX_MODEL_LEN, help="the engine's context in tokens")
    p.add_argument("--kv-cache-bytes", type=int, default=KV_CACHE_BYTES, help="the engine's KV cache")
    p.add_argument("--out", type=Path, default=Path("runs/harness-drive"), help="work folder (kept)")
    p.add_argument("--json", type=Path, default=None, help="write every episode's figures here")
    args = p.parse_args(argv)
    if args.episodes < 1 or args.concurrency < 1:
        p.error("--episodes and --concurrency: at least 1")
    args.harnesses = [h.strip() for h in args.harness.split(",") if h.strip()]
    unknown = sorted(set(args.harnesses) - set(HARNESSES))
    if unknown or not args.harnesses:
        p.error(f"--harness {args.harness!r}: expected names from {', '.join(HARNESSES)}")
    return args


async def amain(args: argparse.Namespace) -> int:
    model_dir = resolve_model(args.model)
    # not under a temporary folder: Codex creates no helper binaries there (harnesses/codex.py)
    work = (args.out / f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}").resolve()
    work.mkdir(parents=True)
    print(f"[drive] model {model_dir}; work folder {work}; load {load()}", flush=True)
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "json")}
    results: dict[str, Any] = {"model": str(model_dir), "settings": settings, "harnesses": {}}
    lines: list[str] = []
    async with stack(work, model_dir, args.max_model_len, args.kv_cache_bytes) as s:
        for name in args.harnesses:
            before = load()
            reports, wall = await drive_harness(s, name, args)
            block = [
                *summary_lines(name, reports, wall),
                f"  load (1/5/15 min) before {before}, after {load()}",
            ]
            lines += block
            print("\n".join(block), flush=True)
            results["harnesses"][name] = {
                "wall_s": round(wall, 1),
                "episodes": [r.as_json() for r in reports],
            }
            if args.json is not None:  # after each harness: a later one's trouble keeps the earlier figures
                args.json.write_text(json.dumps(results, indent=2))
    print(f"[drive] load {load()}; summary:\n" + "\n".join(lines), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(amain(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
