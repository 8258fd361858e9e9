"""Methods grove adds to vLLM's model worker: in-place weight reload that is correct on CPU and GPU.

vLLM imports this class inside its engine-core process (`worker_extension_cls`), so the methods run
next to the model and are called from the driver through `collective_rpc("grove_...")`. Only plain
values (paths, strings, lists) cross the process boundary.

Why not plain `reload_weights`: on CPU (vLLM 0.32) two things go wrong:
- tied embeddings: the output layer keeps its own pre-packed copy of the embedding matrix, which a
  reload never re-processes, so logits keep the old weights unless the head is repacked;
- a failure in the middle of a layerwise reload can leave parameters on the meta device, and the next
  forward pass then kills the engine; we check for that and report it instead.

Importing this module also ties the engine's processes to the process that owns the engine (the
grove worker), so they never outlive it, not even a SIGKILL of it (docs/reliability.md). vLLM
0.32 on CPU runs: grove worker -> `EngineCore` (multiprocessing spawn) -> `VLLM::Worker` (spawn, the
model; this module is imported there when the worker class is built). Neither child watches the
grove worker: EngineCore only reacts to signals, the model worker only to EngineCore's death pipe
(and it may spin for tens of seconds inside an OpenMP region before it reads it). So here:
- `PR_SET_PDEATHSIG(SIGKILL)`: the kernel kills this model worker the moment its parent (EngineCore)
  exits, however it exits;
- a watcher thread blocks on a pidfd of the owner ($GROVE_ENGINE_OWNER_PID, set by PolicyEngine.start
  before vLLM spawns anything): when the owner exits it SIGKILLs EngineCore (our parent) and so, by
  the death signal, this process. No polling: the pidfd becomes readable when the owner exits.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import logging
import multiprocessing
import os
import select
import signal
import threading
from typing import Any

import torch

from activities.engine import OWNER_PID_ENV

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _die_with_parent(parent: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        log.warning("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
    if os.getppid() != parent:  # the parent exited before prctl ran: we were already re-parented
        os.kill(os.getpid(), signal.SIGKILL)


def _kill_engine_when_owner_exits(owner: int) -> None:
    try:
        fd = os.pidfd_open(owner)
    except ProcessLookupError:
        fd = None  # the owner is already gone
    if fd is not None:
        select.select([fd], [], [])  # readable once the owner has exited
    parent = os.getppid()
    if parent not in (owner, 1):  # model worker in its own process: take EngineCore down first
        with contextlib.suppress(ProcessLookupError):
            os.kill(parent, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def _hold_while_loading() -> None:
    """Test gate `engine_loading` (grove/gates.py): the model worker holds while its engine loads, so a
    test can signal the owner while vLLM's start blocks it; key = the owner's pid."""
    from grove.gates import Gates

    gates, owner = Gates.from_env(), os.environ.get(OWNER_PID_ENV)
    if gates is not None and owner and multiprocessing.parent_process() is not None:
        gates.hold_sync("engine_loading", owner)


def tie_engine_to_owner() -> None:
    """Make this engine process die with its owner; a no-op outside an engine child process."""
    owner = os.environ.get(OWNER_PID_ENV)
    parent = multiprocessing.parent_process()
    if not owner or parent is None or parent.pid is None or int(owner) == os.getpid():
        return  # not a process spawned for a PolicyEngine's engine
    _die_with_parent(parent.pid)
    threading.Thread(
        target=_kill_engine_when_owner_exits, args=(int(owner),), name="grove-owner-watch", daemon=True
    ).start()


tie_engine_to_owner()
_hold_while_loading()


class GroveWorkerExtension:
    """Mixed into vLLM's worker class; `self.model_runner` is the worker's model runner."""

    model_runner: Any  # the vLLM worker's, which this class is mixed into

    def grove_reload_weights(self, weights_path: str) -> list[str]:
        """Reload every weight from the HF folder `weights_path` in place; returns repacked module names."""
        self.model_runner.reload_weights(weights_path=weights_path, is_checkpoint_format=True)
        repacked = self._grove_repack_embedding_heads()
        self.grove_check_no_meta()
        return repacked

    def _grove_repack_embedding_heads(self) -> list[str]:
        # Why: with tie_word_embeddings the LM head shares the embedding's weight tensor but holds its
        # own packed GEMM handle on CPU; re-running the embedding method's post-load step repacks it.
        # On GPU the method is a no-op, so the same call is safe everywhere.
        from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

        repacked = []
        for name, module in self.model_runner.get_model().named_modules():
            if isinstance(getattr(module, "quant_method", None), UnquantizedEmbeddingMethod):
                module.quant_method.process_weights_after_loading(module)
                repacked.append(name)
        return repacked

    def grove_check_no_meta(self) -> None:
        """Raise if any parameter or buffer is on the meta device (a half-finished reload)."""
        model = self.model_runner.get_model()
        on_meta = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
        if on_meta:
            raise RuntimeError(
                f"after the weight reload {len(on_meta)} tensors are on the meta device "
                f"(first: {on_meta[:3]}); the engine cannot run a forward pass and must be restarted"
            )

    def grove_weights_digest(self) -> str:
        """sha256 over all parameters in name order (tests use it to see that weights changed)."""
        h = hashlib.sha256()
        for name, param in sorted(self.model_runner.get_model().named_parameters()):
            h.update(name.encode())
            h.update(param.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
        return h.hexdigest()
