"""The harness runner: one external harness process per episode, owned by the run (docs/harnesses.md).

    EpisodeWorkflow (harness.kind "opencode", "claude-code", "codex" or "python")
        -> run_harness(HarnessRunInput) on the `harness` task queue (this module)
             mint the episode's token, write opencode.json (provider = the episode's gateway URL),
             launch `opencode run --pure --format json <message>` in the episode's own folder,
             heartbeat HarnessHeartbeat {launch, pid, elapsed_s, calls, last_request, last_event},
             wait (deadline: HarnessSpec.deadline_s), read its events
        -> POST {gateway}/episodes/{ref}/close  (final answer, each agent's last output, or the failure
             with the last stderr lines); the ledger discards responses never delivered, and closes
        <- HarnessRunResult (launch, exit code, wall time, events)

Three kinds of process, one supervision (a `LaunchPlan` says what to run and how its events read):

- `opencode`: stock OpenCode (harnesses/opencode.py writes its config, reads its `--format json` events);
- `claude-code`: stock Claude Code (harnesses/claude_code.py builds its command line and environment:
  `ANTHROPIC_BASE_URL` is the episode's prefix without `/v1`; reads its `stream-json` events);
- `codex`: stock Codex CLI, `codex exec --json` (harnesses/codex.py writes its `config.toml` and model
  catalog into the launch's own CODEX_HOME, reads its events; it speaks the Responses API);
- `python`: a Python harness program, `harness.python.entry = "package.module:function"`, run by
  `python -m harnesses.clients.program` with the episode's URL, token, launch and task
  (harnesses/python_harness.py); e.g. the LangGraph and Agents SDK delegation families.

Interface for task families (harnesses/opencode.py): `TASK_SETUPS[family] = fn(task) -> OpenCodeSetup`
gives the first message and the `agent` section; `RunConfig.harness = {kind: opencode, opencode: {...}}`
(grove/contracts/harness.py OpenCodeOptions: context/output limits, overrides) selects the runner for a run.
The
worker that serves the `harness` queue is built by `harness_worker` (cli/worker.py, `grove worker
--queues harness [--gateway-url URL]`); without a URL the worker serves an embedded gateway itself.

Isolation: each episode gets `<root>/<sha256(episode id)[:16]>/{project,home}`, wiped at every launch,
with the whole process environment built from scratch (harnesses/opencode.opencode_env,
harnesses/claude_code.claude_env, harnesses/codex.codex_env): own HOME and XDG folders (Claude Code: its
own config folder too; Codex: its CODEX_HOME beside them, wiped too: harnesses/codex.codex_home_for), the
harness's offline switches, only its own token. The project folder's path is the same at every launch,
because OpenCode and Claude Code write it into their prompts: a relaunch then sends the same requests.

Process lifetime: the process leads its own process group and gets SIGKILL when the worker thread that
started it dies (PR_SET_PDEATHSIG), so a killed worker leaves no harness behind; at the deadline, on
cancellation (the workflow's, or a heartbeat the server refused) and after a normal exit the whole group is
killed. A runner that died is noticed by its heartbeat timeout; Temporal retries the activity, which
relaunches the harness (launch n+1): the gateway answers its requests from the calls recorded in the
episode while they match (gateway/pipeline/launch_records.py), so nothing is generated or admitted twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import hashlib
import importlib.util
import json
import os
import shutil
import signal
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError

from gateway.http.auth import issue_token
from gateway.http.episode_ref import episode_ref
from grove.contracts import (
    CloseRequest,
    EpisodeSpec,
    HarnessHeartbeat,
    HarnessOutcome,
    HarnessRunInput,
    HarnessRunResult,
)
from grove.gates import Gates
from harnesses import claude_code, codex, python_harness
from harnesses.claude_code import ClaudeCodeSetupError
from harnesses.claude_code_install import ClaudeCodeInstallError, claude_code_binary
from harnesses.codex_install import CodexInstallError, codex_binary
from harnesses.json_events import parse_events
from harnesses.opencode import (
    OpenCodeSetupError,
    opencode_argv,
    opencode_config,
    opencode_env,
    outcome_of_events,
    setup_for,
)
from harnesses.opencode_install import OpenCodeInstallError, opencode_binary
from harnesses.toml_text import to_toml

HEARTBEAT_EVERY_S = 2.0
# The heartbeat's ledger queries wait on the episode's workflow worker; past this they are dropped for the
# details of the previous beat (well inside HarnessSpec.heartbeat_timeout_s, 30 s by default).
QUERY_TIMEOUT_S = 5.0
STDERR_LINES = 30  # the last stderr lines kept for failure messages
CLOSE_TIMEOUT_S = 120.0
_PR_SET_PDEATHSIG = 1


class HarnessConfigError(ValueError):
    """A harness spec the runner cannot launch (unknown kind, no first message, no binary)."""


@dataclass(frozen=True)
class RunnerConfig:
    """Where the runner's harnesses reach the gateway, and where their folders live."""

    gateway_url: str  # e.g. http://127.0.0.1:8400 (the harness gets {gateway_url}/episodes/<ref>/v1)
    secret: str  # the gateway's token secret (GROVE_GATEWAY_SECRET)
    root: Path  # launch folders: <root>/<episode hash>/{project,home}
    keep_dirs: bool = False  # keep finished launch folders (events.jsonl, stderr.log); failed ones stay
    model_name: str = "grove"  # the model id the gateway serves (GatewaySettings.model_name)


@dataclass(frozen=True)
class LaunchPlan:
    """What one launch runs (its whole command line and environment) and how its stdout events read."""

    name: str  # for messages: "OpenCode", "Python harness pkg.mod:fn"
    argv: list[str]
    env: dict[str, str]
    outcome: Callable[[list[dict]], HarnessOutcome]
    # a configuration error the events report (the launch is then not retried), else None
    config_error: Callable[[list[dict]], str | None] = field(default=lambda events: None)


def opencode_plan(binary: Path, message: str, home: Path) -> LaunchPlan:
    return LaunchPlan(
        "OpenCode", opencode_argv(str(binary), message), opencode_env(str(home)), outcome_of_events
    )


def claude_code_plan(argv: list[str], env: dict[str, str]) -> LaunchPlan:
    return LaunchPlan("Claude Code", argv, env, claude_code.outcome_of_events)


def codex_plan(binary: Path, message: str, home: Path, codex_home: Path, token: str) -> LaunchPlan:
    return LaunchPlan(
        "Codex", codex.codex_argv(str(binary), message), codex.codex_env(str(home), str(codex_home), token),
        codex.outcome_of_events,
    )  # fmt: skip


def python_plan(entry: str, job: str, home: Path, base_url: str, token: str, launch: int) -> LaunchPlan:
    return LaunchPlan(
        f"Python harness {entry}", python_harness.python_argv(sys.executable),
        python_harness.python_env(str(home), job, base_url, token, launch, sys.executable),
        python_harness.outcome_of_events, python_harness.entry_error,
    )  # fmt: skip


def episode_folder(root: Path, episode_id: str) -> Path:
    return root / hashlib.sha256(episode_id.encode()).hexdigest()[:16]


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the thread that forked it dies (Linux prctl)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def reap_previous(folder: Path) -> list[int]:
    """SIGKILL processes left by an earlier launch of this episode on this machine: members of the process
    group it recorded (`<folder>/pgid`) whose working directory is inside `folder` (so an unrelated group
    that reused the id is never touched). Returns their pids."""
    try:
        pgid = int((folder / "pgid").read_text())
    except (FileNotFoundError, ValueError):
        return []
    killed = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            group = int(stat[stat.rindex(")") + 2 :].split()[2])
            inside = Path(os.readlink(proc / "cwd")).is_relative_to(folder)
        except (OSError, ValueError, IndexError):
            continue
        if group == pgid and inside:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(proc.name), signal.SIGKILL)
                killed.append(int(proc.name))
    return killed


def kill_group(pid: int) -> None:
    """SIGKILL the process group `pid` leads (the harness and whatever it started)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


class HarnessRunner:
    """Activities of the `harness` queue; `client` answers the heartbeat's ledger questions."""

    def __init__(self, config: RunnerConfig, client: Client | None = None) -> None:
        self.config = config
        self.client = client
        self._gates = Gates.from_env()  # tests only (grove/gates.py): hold a start, an exit, a query

    @activity.defn(name="run_harness")
    async def run_harness(self, inp: HarnessRunInput) -> HarnessRunResult:
        spec = inp.spec
        launch = activity.info().attempt
        planners = {
            "opencode": self._opencode_launch,
            "claude-code": self._claude_code_launch,
            "codex": self._codex_launch,
            "python": self._python_launch,
        }
        if spec.harness.kind not in planners:
            raise ApplicationError(
                f"episode {spec.episode_id!r}: the harness runner launches kinds {sorted(planners)}, not "
                f"{spec.harness.kind!r}",
                type="HarnessConfigError",
                non_retryable=True,
            )
        token = issue_token(self.config.secret, spec.episode_id)
        base_url = f"{self.config.gateway_url.rstrip('/')}/episodes/{episode_ref(spec.episode_id)}/v1"
        run = await planners[spec.harness.kind](spec, launch, token, base_url)
        activity.logger.info(
            "episode %s: %s launch %d in %s", spec.episode_id, run.plan.name, launch, run.project
        )
        started = time.monotonic()
        exit_code = await self._supervise(run, spec.episode_id, launch, spec.harness.deadline_s)
        wall = time.monotonic() - started
        if self._gates is not None:  # tests: the process has ended, its episode is not closed yet
            await self._gates.hold("harness_exited", spec.episode_id)
        config_error = run.plan.config_error(run.events)
        if config_error is not None:  # the workflow closes the episode as failed (infrastructure)
            raise ApplicationError(config_error, type="HarnessConfigError", non_retryable=True)
        close = self._close_request(run, exit_code, spec.harness.deadline_s)
        activity.heartbeat(run.beat(launch, last_event="closing"))
        await self._close(spec.episode_id, token, close)
        if close.failure is None and not self.config.keep_dirs:
            folder = episode_folder(self.config.root, spec.episode_id)
            shutil.rmtree(folder, ignore_errors=True)
            shutil.rmtree(codex.codex_home_for(folder), ignore_errors=True)
        return HarnessRunResult(
            launch=launch, exit_code=exit_code, wall_s=wall, events=len(run.events), failure=close.failure
        )

    async def _opencode_launch(self, spec: EpisodeSpec, launch: int, token: str, base_url: str) -> _Launch:
        try:
            setup = setup_for(spec.task, spec.harness.opencode)
            binary = await asyncio.to_thread(opencode_binary, spec.harness.opencode.version)
        except (OpenCodeSetupError, OpenCodeInstallError) as err:
            raise ApplicationError(str(err), type=type(err).__name__, non_retryable=True) from err
        project, home = self._prepare(spec.episode_id)
        options = spec.harness.opencode
        config = opencode_config(
            setup, base_url, token, launch=launch, context_limit=options.context_limit,
            output_limit=options.output_limit or spec.sampling.max_tokens, model=self.config.model_name,
            agent_context_limits=setup.agent_context_limits, request_timeout_s=options.request_timeout_s,
        )  # fmt: skip
        (project / "opencode.json").write_text(json.dumps(config, indent=2))
        write_project_files(project, setup.files)
        return _Launch(opencode_plan(binary, setup.message, home), project, home)

    async def _claude_code_launch(self, spec: EpisodeSpec, launch: int, token: str, base_url: str) -> _Launch:
        options = spec.harness.claude_code
        try:
            setup = claude_code.setup_for(spec.task, options)
            binary = await asyncio.to_thread(claude_code_binary, options.version)
        except (ClaudeCodeSetupError, ClaudeCodeInstallError) as err:
            raise ApplicationError(str(err), type=type(err).__name__, non_retryable=True) from err
        project, home = self._prepare(spec.episode_id)
        env = claude_code.claude_env(
            str(home), claude_code.anthropic_base_url(base_url), token, launch=launch,
            max_output_tokens=options.output_limit or spec.sampling.max_tokens,
            request_timeout_s=options.request_timeout_s or spec.harness.deadline_s,
            max_context_tokens=options.max_context_tokens,
        )  # fmt: skip
        argv = claude_code.claude_argv(
            str(binary), setup, model=self.config.model_name, episode_id=spec.episode_id
        )
        write_project_files(project, setup.files)
        return _Launch(claude_code_plan(argv, env), project, home)

    async def _codex_launch(self, spec: EpisodeSpec, launch: int, token: str, base_url: str) -> _Launch:
        options = spec.harness.codex
        try:
            setup = codex.setup_for(spec.task, options)
            binary = await asyncio.to_thread(codex_binary, options.version)
        except (codex.CodexSetupError, CodexInstallError) as err:
            raise ApplicationError(str(err), type=type(err).__name__, non_retryable=True) from err
        project, home = self._prepare(spec.episode_id)
        codex_home = codex.codex_home_for(project.parent)
        shutil.rmtree(codex_home, ignore_errors=True)  # a relaunch starts from nothing the last one left
        codex_home.mkdir(parents=True)
        model = self.config.model_name
        catalog_path = codex_home / codex.CATALOG_FILE
        entries = codex.catalog(model, setup.instructions, options.context_window, shell=options.shell)
        catalog_path.write_text(json.dumps(entries))
        config = codex.codex_config(base_url, str(catalog_path), options, launch=launch, model=model)
        (codex_home / codex.CONFIG_FILE).write_text(to_toml(config))
        write_project_files(project, setup.files)
        return _Launch(codex_plan(binary, setup.message, home, codex_home, token), project, home)

    async def _python_launch(self, spec: EpisodeSpec, launch: int, token: str, base_url: str) -> _Launch:
        options = spec.harness.python
        entry = options.entry or ""  # HarnessSpec refuses kind python without one
        module = entry.partition(":")[0]
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:  # a typo, or a program the worker's Python does not have: relaunching cannot help
            raise ApplicationError(
                f"episode {spec.episode_id!r}: harness.python.entry {entry!r}: no module {module!r} in the "
                f"harness worker's Python ({sys.executable}); fix the entry or install the program there",
                type="HarnessConfigError",
                non_retryable=True,
            )
        project, home = self._prepare(spec.episode_id)
        job = python_harness.python_job(entry, spec.task, options.options, self.config.model_name)
        return _Launch(python_plan(entry, job, home, base_url, token, launch), project, home)

    def _prepare(self, episode_id: str) -> tuple[Path, Path]:
        folder = episode_folder(self.config.root, episode_id)
        reap_previous(folder)  # a killed worker's harness got SIGKILL; whatever it had started did not
        shutil.rmtree(folder, ignore_errors=True)  # a relaunch starts from nothing the last launch left
        project, home = folder / "project", folder / "home"
        for path in (project, home, home / "tmp"):
            path.mkdir(parents=True, exist_ok=True)
        return project, home

    async def _supervise(self, run: _Launch, episode_id: str, launch: int, deadline_s: float) -> int | None:
        """Run the process to its end (exit code), its deadline (None) or a cancellation (re-raised).

        Whatever ends it, the harness's whole process group is killed before this returns. A cancellation
        that arrives while the process is being started must not skip that: the start runs shielded (it
        is short) and the `finally` waits for it, so the group it created is known and killed. (Unshielded,
        a cancelled asyncio spawn kills only the harness's own process and then waits for its pipes, which
        anything the harness already started keeps open: the activity never finished cancelling.)"""
        starting = asyncio.ensure_future(run.start(self._gates, episode_id))
        beat: asyncio.Task | None = None
        try:
            await asyncio.shield(starting)
            beat = asyncio.create_task(self._heartbeats(run, episode_id, launch))
            return await asyncio.wait_for(run.wait(), timeout=deadline_s)
        except TimeoutError:
            return None
        finally:
            with contextlib.suppress(BaseException):  # its own failure is what propagates, if any
                await starting
            if beat is not None:
                beat.cancel()
            run.kill()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                if beat is not None:
                    await beat
            await run.drain()

    async def _heartbeats(self, run: _Launch, episode_id: str, launch: int) -> None:
        while True:
            await self._ledger_progress(run, episode_id)
            activity.heartbeat(run.beat(launch))
            await asyncio.sleep(HEARTBEAT_EVERY_S)

    async def _ledger_progress(self, run: _Launch, episode_id: str) -> None:
        """Update the launch's calls and last request from the episode's queries, best effort: a query
        that fails or takes longer than QUERY_TIMEOUT_S leaves the last known details, so a slow history
        never holds the heartbeat back long enough to time the launch out."""
        try:  # asyncio.timeout, not wait_for: 3.11's wait_for can swallow the cancellation that ends the beat
            async with asyncio.timeout(QUERY_TIMEOUT_S):
                progress = await self._query_progress(episode_id)
        except Exception:  # noqa: BLE001 - TimeoutError included: a heartbeat must never fail the launch
            return
        run.calls, run.last_request = progress

    async def _query_progress(self, episode_id: str) -> tuple[int, str | None]:
        """(calls admitted so far, time of the last request) from the episode's queries."""
        if self._gates is not None:  # tests: a query that does not answer (a busy or unreachable history)
            await self._gates.hold("heartbeat_query", episode_id)
        if self.client is None:
            return 0, None
        # the progress query only: the summary (one entry per context) grows with the episode
        progress = await self.client.get_workflow_handle(episode_id).query("progress", result_type=dict)
        return int(progress.get("calls_admitted", 0)), progress.get("last_activity")

    def _close_request(self, run: _Launch, exit_code: int | None, deadline_s: float) -> CloseRequest:
        outcome = run.plan.outcome(run.events)
        failure = outcome.failure
        name = run.plan.name
        if exit_code is None:
            failure = f"HarnessDeadline: {name} ran past its deadline ({deadline_s:g} s) and was killed"
        elif exit_code != 0:
            failure = f"HarnessExit: {name} exited with {exit_code}" + (f" ({failure})" if failure else "")
        if failure is not None:
            tail = "\n".join(run.stderr_tail)
            failure = f"{failure}; last stderr lines:\n{tail}" if tail else failure
        return CloseRequest(final_answer=outcome.final_answer, outputs=outcome.outputs, failure=failure)

    async def _close(self, episode_id: str, token: str, close: CloseRequest) -> None:
        url = f"{self.config.gateway_url.rstrip('/')}/episodes/{episode_ref(episode_id)}/close"
        async with httpx.AsyncClient(timeout=CLOSE_TIMEOUT_S) as http:
            response = await http.post(
                url, json=close.model_dump(mode="json"), headers={"authorization": f"Bearer {token}"}
            )
        if response.status_code == 409 and "AlreadyClosed" in response.text:
            activity.logger.warning("episode %s was already closed: %s", episode_id, response.text[:300])
            return
        if response.status_code >= 400:
            # retryable: the relaunch is answered from the recorded calls and closes again
            raise ApplicationError(
                f"episode {episode_id!r}: the gateway refused the close ({response.status_code}): "
                f"{response.text[:1000]}",
                type="HarnessCloseError",
            )


class _ExitNotingProtocol(asyncio.subprocess.SubprocessStreamProtocol):
    """asyncio's stream protocol plus `exited`: the exit code as soon as the child watcher reports it."""

    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=limit, loop=loop)
        self.exited: asyncio.Future[int] = loop.create_future()

    def process_exited(self) -> None:
        # read first: the base class may drop the transport (a private attribute typeshed does not declare)
        code = self._transport.get_returncode()  # type: ignore[attr-defined]
        super().process_exited()
        if not self.exited.done():
            self.exited.set_result(code)


class _Launch:
    """One harness process: its events (stdout JSON lines), the tail of its stderr, its process group.
    The events of both kinds are JSON lines with a `type` (OpenCode's, or harnesses/clients/program.py's)."""

    def __init__(self, plan: LaunchPlan, project: Path, home: Path) -> None:
        self.plan = plan
        self.project, self.home = project, home
        self.proc: asyncio.subprocess.Process | None = None
        self.events: list[dict] = []
        self.stderr_tail: deque[str] = deque(maxlen=STDERR_LINES)
        self.last_event: str | None = None
        # the episode's, as of the last heartbeat
        self.calls: int = 0
        self.last_request: str | None = None
        self._readers: list[asyncio.Task] = []
        self._exited: asyncio.Future[int] | None = None
        self._t0 = time.monotonic()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def elapsed(self) -> float:
        return time.monotonic() - self._t0

    def beat(self, launch: int, last_event: str | None = None) -> HarnessHeartbeat:
        return HarnessHeartbeat(
            launch=launch, pid=self.pid, elapsed_s=round(self.elapsed(), 1), calls=self.calls,
            last_request=self.last_request, last_event=last_event or self.last_event,
        )  # fmt: skip

    async def start(self, gates: Gates | None = None, key: str = "") -> None:
        loop = asyncio.get_running_loop()
        protocol = _ExitNotingProtocol(limit=16 * 1024 * 1024, loop=loop)
        transport, _ = await loop.subprocess_exec(
            lambda: protocol, *self.plan.argv, cwd=self.project, env=self.plan.env,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            start_new_session=True, preexec_fn=_die_with_parent,
        )  # fmt: skip
        self.proc = asyncio.subprocess.Process(transport, protocol, loop)
        self._exited = protocol.exited
        (self.project.parent / "pgid").write_text(str(self.proc.pid))  # for reap_previous after a crash
        if gates is not None:  # tests: spawned, the start not finished (a cancellation can land here)
            await gates.hold("harness_starting", key)
        self._readers = [asyncio.create_task(self._stdout()), asyncio.create_task(self._stderr())]

    async def _stdout(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        log = (self.home / "events.jsonl").open("w")
        async for raw in self.proc.stdout:
            line = raw.decode(errors="replace")
            log.write(line)
            for event in parse_events([line]):
                self.events.append(event)
                self.last_event = str(event.get("type"))
        log.close()

    async def _stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        log = (self.home / "stderr.log").open("w")
        async for raw in self.proc.stderr:
            line = raw.decode(errors="replace")
            log.write(line)
            if line.strip():
                self.stderr_tail.append(line.rstrip()[:500])
        log.close()

    async def wait(self) -> int:
        """The harness's exit code, once it exits: not once its pipes close (asyncio's Process.wait() in
        3.11 waits for both, and a process the harness left behind holds the pipes open)."""
        assert self._exited is not None
        code = await asyncio.shield(self._exited)
        self.kill()  # what the harness left in its group goes with it; its pipes close, the readers end
        await self.drain()
        return code

    async def drain(self) -> None:
        """Wait for the readers (the pipes close once the group is gone)."""
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.gather(*self._readers, return_exceptions=True), timeout=10)

    def kill(self) -> None:
        if self.proc is not None:
            kill_group(self.proc.pid)


# ------------------------------------------------------------------------------------------ the worker


@dataclass(frozen=True)
class HarnessWorkerOptions:
    """How `grove worker` serves the harness queue."""

    gateway_url: str | None = None  # a running gateway; None: serve an embedded one in this process
    secret: str | None = None  # the gateway's token secret; default $GROVE_GATEWAY_SECRET (embedded: random)
    root: Path | None = None  # launch folders; default <worker dir>/harness
    policy_model: str = "tiny"  # embedded gateway: the served model (its tokenizer measures prompts)
    max_model_len: int | None = None  # embedded gateway: the engines' context (default: the gateway's)
    temporal_address: str | None = None  # embedded gateway: default the worker client's
    keep_dirs: bool = False  # keep finished launch folders (debugging, tests)


@contextlib.asynccontextmanager
async def harness_runner(client: Client, store, options: HarnessWorkerOptions, work_dir: Path):
    """The runner of this worker, with its embedded gateway served while the context is open."""
    import secrets

    from gateway.http.settings import SECRET_VAR, GatewaySettings

    root = Path(options.root or work_dir / "harness")
    root.mkdir(parents=True, exist_ok=True)
    secret = options.secret or os.environ.get(SECRET_VAR)
    if options.gateway_url is not None:
        if not secret:
            raise HarnessConfigError(
                f"the harness worker needs the gateway's token secret to reach {options.gateway_url}: set "
                f"{SECRET_VAR} as for `grove gateway`"
            )
        model_name = os.environ.get("GROVE_GATEWAY_MODEL", "grove")  # what `grove gateway` serves
        config = RunnerConfig(options.gateway_url, secret, root, options.keep_dirs, model_name)
        yield HarnessRunner(config, client)
        return
    from gateway.http.embedded import serve_gateway

    settings = GatewaySettings(
        temporal_address=options.temporal_address or client.service_client.config.target_host,
        namespace=client.namespace, store="embedded", secret=secret or secrets.token_hex(32),
        policy_model=options.policy_model, port=0,
        **({"max_model_len": options.max_model_len} if options.max_model_len else {}),
    )  # fmt: skip
    async with serve_gateway(settings, store) as url:
        activity_log = f"harness worker: embedded gateway at {url}"
        print(activity_log, flush=True)
        config = RunnerConfig(
            url, settings.secret.get_secret_value(), root, options.keep_dirs, settings.model_name
        )
        yield HarnessRunner(config, client)


def build_harness_worker(client: Client, runner: HarnessRunner):
    from temporalio.worker import Worker

    from grove import queues

    # Each launch is a process plus a few coroutines; the engine, not this worker, bounds throughput.
    return Worker(
        client, task_queue=queues.HARNESS, activities=[runner.run_harness], max_concurrent_activities=64
    )


def write_project_files(project: Path, files: dict[str, str]) -> None:
    """The task family's files (paths checked by harnesses.opencode.setup_for) into the project folder."""
    for relative, text in files.items():
        path = project / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
