"""`grove infra status`'s queue lines: which of grove's task queues a live worker polls.

    queue episodes    workflow  ready    1 worker: 4711@host
    queue inference   activity  waiting  no worker polls it (an inference worker polls once its
                                         engine is loaded)

Read from Temporal (grove/queue_readiness.py), the same record the gateway's `/readyz` uses.
"""

from __future__ import annotations

from collections.abc import Sequence

from grove import queues
from grove.queue_readiness import QueueState, queue_state

_WAITING = {
    queues.EPISODES: "no worker polls it: start `grove worker` (episode workflows wait)",
    queues.INFERENCE: "no worker polls it (an inference worker polls once its engine is loaded)",
}


def queue_line(state: QueueState) -> str:
    if state.ready:
        n = len(state.workers)
        detail = f"{n} worker{'s' if n != 1 else ''}: {', '.join(state.workers)}"
    else:
        detail = _WAITING.get(state.queue, "no worker polls it")
    return f"queue {state.queue:12} {state.kind:9} {'ready  ' if state.ready else 'waiting'}  {detail}"


async def queue_lines(address: str, extra: Sequence[str] = ()) -> list[str]:
    """One line per grove queue (and per `extra` queue: a run's own inference queue, activities)."""
    from grove.client import connect

    client = await connect(address)
    names = [*queues.ALL, *(q for q in extra if q not in queues.ALL)]
    return [queue_line(await queue_state(client, name)) for name in names]
