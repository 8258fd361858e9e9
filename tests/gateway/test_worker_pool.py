"""The gateway's worker-pool processes die with the gateway, SIGKILL included (nothing of the gateway
can clean up then; orphaned workers would hold ~87 MB each under init). A real process runs the gateway's
`WorkerPool` (spawned workers, as the gateway's tokenization and large-body pools do) and is SIGKILLed;
its workers must end too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.bounds import PROCESS_WAIT

REPO = Path(__file__).resolve().parents[2]
GONE_WITHIN = 30.0  # seconds (a bound: the kernel signals the workers at once)

PROGRAM = """
import asyncio, os
from gateway.intake.worker_pool import WorkerPool

async def main():
    pool = WorkerPool(2, os.getpid, ())  # the initializer: any importable callable
    pids = set()
    while len(pids) < 2:  # each run lands on a worker; both are started by the first submits
        pids |= set(await asyncio.gather(*(pool.run(os.getpid) for _ in range(4))))
    print(" ".join(map(str, sorted(pids))), flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper that may never come in a container counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_pool_workers_end_when_the_gateway_is_sigkilled():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    gateway = subprocess.Popen(
        [sys.executable, "-c", PROGRAM], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        line = gateway.stdout.readline()  # the workers are up once this is printed
        workers = [int(p) for p in line.split()]
        assert len(workers) == 2 and all(alive(p) for p in workers), line
        gateway.send_signal(signal.SIGKILL)
        gateway.wait(timeout=PROCESS_WAIT)
        deadline = time.monotonic() + GONE_WITHIN
        while any(alive(p) for p in workers) and time.monotonic() < deadline:
            time.sleep(0.1)  # a state that stays once reached: a dead process stays dead
        assert not any(alive(p) for p in workers), f"workers {workers} outlived the SIGKILLed gateway"
    finally:
        gateway.kill()
        for pid in workers if "workers" in locals() else []:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
