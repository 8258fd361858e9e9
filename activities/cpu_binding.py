"""Which CPU cores a vLLM-CPU engine binds its OpenMP threads to (`claim_cores`).

vLLM's default (`VLLM_CPU_OMP_THREADS_BIND=auto`) binds to the cores of the first NUMA node but one, the
same cores for every engine of a host: two engines (the demo's pair, a worker beside another) bind their
threads to the same core and fight over it while other cores idle (a worker sat 16+ minutes loading its
engine beside others, 24-39 s unbound). So grove chooses per engine, from the cores actually free:

- free cores: the cores this process may run on (`os.sched_getaffinity`) that no live engine of this host
  has claimed. An engine claims a core with an exclusive `flock` on `<claims dir>/core-<id>.lock`, held
  for the engine's life and released by the kernel when its process dies (no stale claim survives a
  kill);
- with two or more free cores it claims half of them (at least one; one always stays free for its own
  scheduler process and the worker), lowest ids first, and binds to those: a second engine finds the
  rest, and a fourth still finds one;
- with fewer it binds nothing (`nobind`): the OS spreads its threads over whatever is idle;
- a `VLLM_CPU_OMP_THREADS_BIND` the operator set is kept as it is (`auto` restores vLLM's own choice).

The choice (`CpuBinding.describe`) goes to the worker's log. The claims dir is `$GROVE_CPU_CLAIMS_DIR`,
else `<tmp>/grove-cpu-cores` (one per host, shared by every user's engines).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
CLAIMS_ENV = "GROVE_CPU_CLAIMS_DIR"


def claims_dir() -> Path:
    return Path(os.environ.get(CLAIMS_ENV) or Path(tempfile.gettempdir()) / "grove-cpu-cores")


@dataclass
class CpuBinding:
    """One engine's binding: the env value vLLM reads, the cores claimed, and why."""

    env: str  # VLLM_CPU_OMP_THREADS_BIND for the engine: "0,1", "nobind", or the operator's value
    cores: list[int]
    reason: str
    _fds: list[int] = field(default_factory=list, repr=False)

    def describe(self) -> str:
        return f"CPU engine binding: {BIND_ENV}={self.env} ({self.reason})"

    def release(self) -> None:
        """Give the claimed cores back (closing the lock files drops their flocks)."""
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()


def _try_claim(folder: Path, core: int) -> int | None:
    fd = os.open(folder / f"core-{core}.lock", os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def claim_cores(allowed: set[int] | None = None, folder: Path | None = None) -> CpuBinding:
    """Choose and claim this engine's cores (module docstring). `allowed`: the cores to choose from
    (default: this process's affinity)."""
    if os.environ.get(BIND_ENV):
        return CpuBinding(os.environ[BIND_ENV], [], f"set by the operator's ${BIND_ENV}")
    cores = sorted(os.sched_getaffinity(0) if allowed is None else allowed)
    folder = folder or claims_dir()
    folder.mkdir(parents=True, exist_ok=True)
    held: dict[int, int] = {}
    for core in cores:  # probe every core: a held lock is another live engine's
        fd = _try_claim(folder, core)
        if fd is not None:
            held[core] = fd
    free = sorted(held)
    want = len(free) // 2 if len(free) >= 2 else 0
    keep, rest = free[:want], free[want:]
    for core in rest:
        os.close(held[core])
    taken = sorted(set(cores) - set(free))
    others = f"cores {taken} held by other engines of this host" if taken else "no other engine's cores"
    if not keep:
        reason = f"{len(free)} free core(s) {free} of {cores}, {others}: no binding, the OS schedules"
        return CpuBinding("nobind", [], reason)
    reason = f"bound to cores {keep}: half of the free cores {free} of {cores}, {others}"
    return CpuBinding(",".join(map(str, keep)), keep, reason, [held[c] for c in keep])


@contextlib.contextmanager
def bound_env(binding: CpuBinding | None) -> Iterator[None]:
    """The binding in this process's environment while the engine's processes are spawned (they inherit
    it), restored afterwards: the next engine started here chooses afresh."""
    if binding is None:
        yield
        return
    before = os.environ.get(BIND_ENV)
    os.environ[BIND_ENV] = binding.env
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(BIND_ENV, None)
        else:
            os.environ[BIND_ENV] = before
