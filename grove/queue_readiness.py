"""Is a grove worker serving a task queue? Temporal's own record of the workers polling it.

A `grove worker` polls each of its queues only once it can serve it: the `episodes`, `io`, `trainer` and
`harness` queues at once, an inference queue only after its vLLM engine is loaded (cli/worker.py). So
"the inference queue has a live poller" is exactly "an engine is ready to generate", and a gateway, `grove
infra status` or a script can tell a stack that is up from one still warming, without a file or a port of
its own: Temporal's DescribeTaskQueue lists the workers that polled a queue recently.

A worker keeps one long poll open per queue and opens the next as soon as one ends (the server ends an
idle one after about a minute), so a live worker was last seen less than `LIVE_POLL_S` ago; the server
also lists, for a few minutes, workers that stopped: those are older and not counted.
"""

from __future__ import annotations

import time
from typing import Literal

from pydantic import BaseModel
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client

from grove import queues

LIVE_POLL_S = 120.0  # a poller seen this recently is a live worker (module docstring)
QueueKind = Literal["workflow", "activity"]
_TYPES = {
    "workflow": TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
    "activity": TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
}
# what serves each of grove's queues: workflows on `episodes`, activities on the others
KIND_OF: dict[str, QueueKind] = {queues.EPISODES: "workflow"}


class QueueState(BaseModel):
    queue: str
    kind: QueueKind
    workers: list[str]  # identities of the live pollers (`pid@host` for grove's workers)

    @property
    def ready(self) -> bool:
        return bool(self.workers)


class Readiness(BaseModel):
    """Whether episodes can run and generate: a workflow worker on `episodes` and an engine on the
    inference queue."""

    queues: list[QueueState]

    @property
    def ready(self) -> bool:
        return all(q.ready for q in self.queues)

    def waiting_for(self) -> list[str]:
        return [f"{q.queue} ({q.kind} worker)" for q in self.queues if not q.ready]


async def queue_state(client: Client, queue: str, kind: QueueKind | None = None) -> QueueState:
    """The live workers polling `queue` for `kind` tasks (default: grove's kind for that queue)."""
    kind = kind or KIND_OF.get(queue, "activity")
    request = DescribeTaskQueueRequest(
        namespace=client.namespace, task_queue=TaskQueue(name=queue), task_queue_type=_TYPES[kind]
    )
    response = await client.workflow_service.describe_task_queue(request)
    now = time.time()
    live = [p.identity for p in response.pollers if now - p.last_access_time.ToSeconds() <= LIVE_POLL_S]
    return QueueState(queue=queue, kind=kind, workers=sorted(live))


async def readiness(client: Client, inference_queue: str = queues.INFERENCE) -> Readiness:
    """Episodes can run (`episodes` polled) and generate (`inference_queue` polled by a loaded engine)."""
    states = [await queue_state(client, queues.EPISODES), await queue_state(client, inference_queue)]
    return Readiness(queues=states)
