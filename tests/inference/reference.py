"""The learner-side reference: transformers forward + trainer/logprobs.py, independent of vLLM."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from trainer.logprobs import processed_logprobs


@lru_cache(maxsize=4)
def _model(folder: str, fingerprint: float):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def learner_logprobs(
    model_dir: Path, prompt_ids, completion_ids, *, temperature: float = 1.0, top_p: float = 1.0
) -> np.ndarray:
    """Processed logprobs of `completion_ids` after `prompt_ids` under the weights in `model_dir`."""
    folder = Path(model_dir)
    model = _model(str(folder), (folder / "model.safetensors").stat().st_mtime)
    prompt, completion = list(map(int, prompt_ids)), list(map(int, completion_ids))
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0]
    scoring = logits[len(prompt) - 1 : len(prompt) - 1 + len(completion)]
    out = processed_logprobs(scoring, torch.tensor(completion), temperature=temperature, top_p=top_p)
    return out.numpy()
