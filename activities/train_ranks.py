"""One optimizer step on N rank processes (`LearnerConfig.ranks > 1`): launched, supervised, committed.

The train_step activity (activities/training.py) prepares an attempt folder: the job (RankJob), the
step's rows (Parquet files, as stored) and episode records, and the previous committed checkpoint
downloaded and sha256-verified (none at step 1: the base model). It then starts one process per rank
(`python -m activities.train_ranks JOB RANK`, this module's `main`) and supervises them:

- the ranks meet through a FileStore in the attempt folder (no port to pick, nothing shared with
  another attempt), gloo on CPU, NCCL on CUDA (rank r on cuda:r);
- every rank builds a DistributedLearner (trainer/distributed.py) from the previous checkpoint's
  weights, loads its optimizer state (DCP shards resharded to this rank count, or a single-process
  `optimizer.pt` whole), takes the step on the same batch (the split of micro-batches over ranks
  is a pure function of the batch), and writes its optimizer shard; rank 0 writes the gathered
  weights as a Hugging Face folder, trainer_state.json and the step's metrics;
- the supervisor waits for the processes' exits (no polling). The first rank that exits non-zero
  or is killed makes the attempt fail with RankLostError (retryable: Temporal runs the activity
  again) after every other rank is SIGKILLed and reaped; cancellation of the activity does the same.
  A rank whose step the gradient guard refused (trainer/grad_guard.py: every rank refuses the same
  pass, the guard's numbers being global) writes the refusal to `refusal-<rank>.json` and exits with
  REFUSED_EXIT: the supervisor raises that refusal (deterministic, so not retried);
  A rank also dies with the worker process (PR_SET_PDEATHSIG), so none outlives the activity;
  a rank ends through `end_rank` (os._exit after flushing), never interpreter finalization,
  which races gloo's threads and can abort a rank whose work succeeded;
- only when every rank exited 0 does the activity upload the files and write COMMIT last
  (trainer/checkpoint.py commit_files). A failed attempt has written nothing to the store, so the
  retry starts from the same committed checkpoint and the step is trained exactly once.

Test gate (grove/gates.py) `train_rank`: after each forward/backward pass, key
`{run}/step-{N:06d}/rank-{r}/pass-{k}`, so a test can hold a rank mid-step and SIGKILL it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import json
import os
import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Literal, NoReturn

from pydantic import BaseModel

from grove.episodes import EpisodeRecord
from grove.learner_config import LearnerConfig

RANK_GATE = "train_rank"
JOB_FILE = "job.json"
OUT_DIR = "out"
CHECKPOINT_DIR = "checkpoint"  # under OUT_DIR: the files of the step's checkpoint, by relative name
METRICS_FILE = "metrics.json"  # under OUT_DIR
ADVANTAGES_FILE = "advantages.json"  # under OUT_DIR
GUARD_FILE = "guard_refusal.json"  # under OUT_DIR: a skipped or accepted refusal's evidence
REFUSED_EXIT = 3  # a rank's step was refused by the gradient guard (refusal-<rank>.json says how)
PARENT_ENV = "GROVE_RANK_PARENT"
ROOT = Path(__file__).resolve().parents[1]
LOG_TAIL_BYTES = 3000


class RankLostError(RuntimeError):
    """A rank process of a train_step attempt died or failed; the attempt is lost and retried."""


class RankJob(BaseModel):
    """What every rank of one attempt reads (job.json in the attempt folder)."""

    run_id: str
    step: int  # the step this attempt trains (weights of step - 1 in, step out)
    world: int
    backend: Literal["gloo", "nccl"]
    device: Literal["cpu", "cuda"]
    threads: int  # torch intra-op threads per rank
    config: LearnerConfig
    model_dir: str  # the weights to start from: the base model, or the previous checkpoint's model/
    start_dir: str | None  # the previous committed checkpoint, downloaded; None at step 1
    rows: list[str]  # Parquet files of the step's rows
    episodes: list[EpisodeRecord] | None  # None: rows-only batch
    is_cap: float = 2.0  # truncated IS cap of stale tokens (RunConfig.off_policy_is_cap)


def rank_gate_key(run_id: str, step: int, rank: int, k: int) -> str:
    return f"{run_id}/step-{step:06d}/rank-{rank}/pass-{k}"


# ------------------------------------------------------------------------- supervisor (in the worker)


def _tail(path: Path) -> str:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return ""
    return data[-LOG_TAIL_BYTES:].decode(errors="replace")


def _exit_text(code: int) -> str:
    return f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"


async def run_ranks(attempt_dir: Path, job: RankJob) -> None:
    """Start the job's ranks, wait for all of them; RankLostError as soon as one fails.

    Whatever happens (a failed rank, cancellation), every rank started here is SIGKILLed if still
    running and reaped before this returns or raises.
    """
    job_path = Path(attempt_dir) / JOB_FILE
    job_path.write_text(job.model_dump_json())
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    env[PARENT_ENV] = str(os.getpid())
    procs: list[asyncio.subprocess.Process] = []
    try:
        for rank in range(job.world):
            with (Path(attempt_dir) / f"rank-{rank}.log").open("wb") as log:
                procs.append(
                    await asyncio.create_subprocess_exec(
                        sys.executable, "-m", "activities.train_ranks", str(job_path), str(rank),
                        stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=asyncio.subprocess.STDOUT,
                        env=env, cwd=str(ROOT),
                    )
                )  # fmt: skip
        waits = {asyncio.ensure_future(p.wait()): rank for rank, p in enumerate(procs)}
        pending = set(waits)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            failed = sorted((waits[t], t.result()) for t in done if t.result() != 0)
            if failed:
                rank, code = failed[0]
                _raise_refusal(Path(attempt_dir), rank, code)
                raise RankLostError(
                    f"run {job.run_id!r} step {job.step}: rank {rank} of {job.world} {_exit_text(code)}; "
                    "the attempt is lost (nothing was committed) and the other ranks were stopped. "
                    f"Temporal retries the step from the last commit. Rank {rank}'s log ends:\n"
                    f"{_tail(Path(attempt_dir) / f'rank-{rank}.log')}"
                )
    finally:
        for p in procs:
            if p.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
        for p in procs:
            await p.wait()


def refusal_file(attempt_dir: Path, rank: int) -> Path:
    return attempt_dir / f"refusal-{rank}.json"


def _raise_refusal(attempt_dir: Path, rank: int, code: int) -> None:
    """The rank's gradient-guard refusal, raised as the error it was, if that is why it exited."""
    path = refusal_file(attempt_dir, rank)
    if code != REFUSED_EXIT or not path.exists():
        return
    from trainer.grad_guard import ImplausibleGradientError, NonFiniteError

    refusal = json.loads(path.read_text())
    kind = {"NonFiniteError": NonFiniteError, "ImplausibleGradientError": ImplausibleGradientError}
    raise kind[refusal["type"]](f"rank {rank}: {refusal['message']}", refusal["evidence"])


# ------------------------------------------------------------------------------- a rank (its process)


def _die_with_parent() -> None:
    """SIGKILL this rank when the process that started it dies (Linux), then check it is still there:
    a worker killed before prctl ran would otherwise leave the rank orphaned."""
    parent = int(os.environ[PARENT_ENV])
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)


def _train(job: RankJob, rank: int, attempt_dir: Path) -> None:
    import torch

    from grove.gates import Gates
    from trainer.checkpoint import (
        OPTIMIZER_FILE,
        SHARDS_DIR,
        STATE_FILE,
        CheckpointCorruptError,
        TrainerState,
        model_folder_files,
        restore_trainer_state,
        trainer_state,
    )
    from trainer.distributed import (
        DistributedLearner,
        load_full_optimizer,
        load_sharded_optimizer,
        save_sharded_optimizer,
    )
    from trainer.grad_guard import GradientRefusal
    from trainer.rows import rows_from_parquet

    device = f"cuda:{rank}" if job.device == "cuda" else "cpu"
    start = None if job.start_dir is None else Path(job.start_dir)
    state = None
    if start is not None:
        state = TrainerState.model_validate_json((start / STATE_FILE).read_bytes())
    learner = DistributedLearner(
        Path(job.model_dir), job.config, device=device,
        step_count=state.step if state else 0, rollouts_consumed=state.rollouts_consumed if state else 0,
    )  # fmt: skip
    if start is not None and state is not None:
        if state.optimizer_format == "sharded":
            load_sharded_optimizer(learner.model, learner.optimizer, start / SHARDS_DIR)
        else:
            saved = torch.load(start / OPTIMIZER_FILE, map_location=device, weights_only=True)
            if saved["scheduler"]["rollouts_consumed"] != state.rollouts_consumed:
                raise CheckpointCorruptError(
                    f"{start}: optimizer.pt and trainer_state.json come from different saves"
                )
            load_full_optimizer(learner, saved["optimizer"])
        restore_trainer_state(learner, state)
    learner.is_cap = job.is_cap
    gates = Gates.from_env()  # tests only: hold this rank mid-step
    if gates is not None:
        learner.after_pass = lambda k: gates.hold_sync(
            RANK_GATE, rank_gate_key(job.run_id, job.step, rank, k)
        )
    rows = [row for path in job.rows for row in rows_from_parquet(Path(path).read_bytes())]
    try:
        metrics = learner.step(rows, job.episodes)
    except GradientRefusal as refusal:
        record = {"type": type(refusal).__name__, "message": str(refusal), "evidence": refusal.evidence}
        refusal_file(attempt_dir, rank).write_text(json.dumps(record))
        raise SystemExit(REFUSED_EXIT) from refusal
    if learner.step_count != job.step:
        raise RuntimeError(f"rank {rank}: trained step {learner.step_count}, the job is step {job.step}")
    out = attempt_dir / OUT_DIR
    full = learner.full_model_state()  # collective: every rank gathers
    save_sharded_optimizer(learner, out / CHECKPOINT_DIR / SHARDS_DIR)  # collective: one file per rank
    if rank != 0:
        return
    state_out = trainer_state(job.run_id, learner, ranks=job.world, optimizer_format="sharded")
    files = model_folder_files(learner, full)
    files[STATE_FILE] = state_out.model_dump_json(indent=1).encode()
    for name, data in files.items():
        path = out / CHECKPOINT_DIR / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    values = {k: float(v) for k, v in metrics.model_dump().items() if isinstance(v, int | float)}
    (out / METRICS_FILE).write_text(json.dumps(values, sort_keys=True))
    advantages = {e: dataclasses.asdict(a) for e, a in learner.last_advantages.items()}
    (out / ADVANTAGES_FILE).write_text(json.dumps(advantages, sort_keys=True))
    if learner.last_refusal is not None:  # skipped or accepted (LearnerConfig.guard_refusal)
        (out / GUARD_FILE).write_text(json.dumps(learner.last_refusal, sort_keys=True))


def end_rank(body: Callable[[], None]) -> NoReturn:
    """Run a rank process's `body`, then end the process with its exit code and no interpreter
    finalization: 0 when it returns, a `SystemExit`'s code, 1 after printing any other exception.

    Why: gloo's worker threads drop a finished collective's tensors after the collective has
    returned to Python, and dropping a tensor Python also knew takes the GIL. When that comes after
    the main thread has begun finalizing, the worker thread is ended inside a C++ destructor and the
    process aborts (SIGABRT, "terminate called without an active exception") after its work
    succeeded, which the supervisor must count as a lost rank. destroy_process_group does not join
    those threads (the sharded model's device mesh still holds the group), so a rank ends with
    `os._exit` after flushing its output; its files are written and closed by then.
    """
    try:
        body()
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 0 if stop.code is None else 1
        if not isinstance(stop.code, int | None):
            print(stop.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - every failure is printed and becomes exit code 1
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(job_path: str, rank_text: str) -> NoReturn:
    end_rank(lambda: _rank(job_path, rank_text))


def _rank(job_path: str, rank_text: str) -> None:
    _die_with_parent()
    import torch
    import torch.distributed as dist

    job = RankJob.model_validate_json(Path(job_path).read_text())
    rank = int(rank_text)
    attempt_dir = Path(job_path).parent
    torch.set_num_threads(job.threads)
    if job.device == "cuda":
        torch.cuda.set_device(rank)
    rendezvous = (attempt_dir / "rendezvous").as_uri()
    dist.init_process_group(job.backend, init_method=rendezvous, rank=rank, world_size=job.world)
    try:
        _train(job, rank, attempt_dir)
        dist.barrier()  # rank 0's files are complete before any rank reports success
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
