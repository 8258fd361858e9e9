"""Methods grove adds to vLLM's model worker: in-place weight reload that is correct on CPU and GPU.

vLLM imports this class inside its engine-core process (`worker_extension_cls`), so the methods run
next to the model and are called from the driver through `collective_rpc("grove_...")`. Only plain
values (paths, strings, lists) cross the process boundary.

Why not plain `reload_weights`: on CPU two things go wrong (shared/research/vllm_cpu.md section 4):
- tied embeddings: the output layer keeps its own pre-packed copy of the embedding matrix, which a
  reload never re-processes, so logits keep the old weights unless the head is repacked (pitfall 1);
- a failure in the middle of a layerwise reload can leave parameters on the meta device, and the next
  forward pass then kills the engine (pitfall 6); we check for that and report it instead.
"""

from __future__ import annotations

import hashlib

import torch


class GroveWorkerExtension:
    """Mixed into vLLM's worker class; `self.model_runner` is the worker's model runner."""

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
