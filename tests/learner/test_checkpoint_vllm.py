"""A checkpoint's model folder is a vLLM model path: vLLM serves the *trained* weights.

One optimizer step with a large LR, save through LocalStore, download the committed folder, generate
with real vLLM (child process, models/vllm_smoke.py); the sampled tokens' logprobs must equal the
learner's own scoring of them under the trained weights, and differ from the base model's.
"""

from __future__ import annotations

import pytest
import torch

from bench.forests import random_batch, rows_from_calls
from grove.learner_config import LearnerConfig
from models.vllm_smoke import SmokeGeneration, SmokeRequest, run_smoke_subprocess
from trainer.checkpoint import download_model_folder, save_checkpoint
from trainer.learner import Learner, load_policy
from trainer.logprobs import processed_logprobs


def _score(model, prompt: list[int], completion: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0]
    at = slice(len(prompt) - 1, len(prompt) - 1 + len(completion))
    return processed_logprobs(logits[at], torch.tensor(completion), temperature=1.0, top_p=1.0)


@pytest.mark.slow
def test_vllm_serves_the_checkpointed_weights(store, learner_model_dir, tmp_path):
    learner = Learner(learner_model_dir, LearnerConfig(lr=3e-2), device="cpu")
    learner.step([r for ep in random_batch(1, vocab=2048) for r in rows_from_calls(ep)])
    save_checkpoint(store, "run-vllm", learner)
    folder = download_model_folder(store, "run-vllm", 1, tmp_path / "model")

    prompt = [1, 334, 201, 1030, 2, 201, 1, 335, 201]
    request = SmokeRequest(
        kv_cache_memory_bytes=64 * 2**20,
        generations=[SmokeGeneration(prompt_token_ids=prompt, sampling_params={"max_tokens": 24, "seed": 3})],
    )
    out = run_smoke_subprocess(folder, request, tmp_path).outputs[0]
    served = torch.tensor(out.logprobs)
    trained = _score(learner.model, prompt, out.token_ids)
    base = _score(load_policy(learner_model_dir, torch.device("cpu"), trainable=False), prompt, out.token_ids)
    assert float((served - trained).abs().max()) < 1e-4
    assert float((served - base).abs().max()) > 1e-2
