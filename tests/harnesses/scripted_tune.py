"""The fine-tune both scripted test models share (script_model.py for OpenCode, agents_stream_model.py
for the Agents SDK): a base model trained on (prompt + reply ids, reply start) examples until its greedy
replies are a script, then saved as a model folder vLLM serves.

Each model chooses its own examples per step (`next_batch`); the loop, the loss (the reply's tokens
only) and what is saved are one piece, so the two models cannot drift apart in how they are trained.
Deterministic (models/tiny.py `_deterministic_torch`, seed 0): a rebuild makes the same weights.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from pathlib import Path

import torch

from models.progress import BuildProgress
from models.tiny import _deterministic_torch

log = logging.getLogger(__name__)

Example = tuple[list[int], int]  # token ids of prompt + reply, and where the reply starts


def batch_loss(model: torch.nn.Module, batch: list[Example]) -> torch.Tensor:
    """Mean cross-entropy over the replies' tokens (prompts are conditioning only)."""
    width = max(len(ids) for ids, _ in batch)
    ids = torch.zeros((len(batch), width), dtype=torch.long)
    weights = torch.zeros((len(batch), width), dtype=torch.float32)
    for i, (seq, n_prompt) in enumerate(batch):
        ids[i, : len(seq)] = torch.tensor(seq)
        weights[i, n_prompt : len(seq)] = 1.0
    logits = model(input_ids=ids).logits[:, :-1]
    per_token = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="none"
    )
    w = weights[:, 1:].reshape(-1)
    return (per_token * w).sum() / w.sum()


def fine_tune(
    base_dir: Path,
    out: Path,
    next_batch: Callable[[random.Random], list[Example]],
    *,
    steps: int,
    lr: float,
    label: str,
) -> float:
    """Train `base_dir`'s model for `steps` steps on `next_batch(rng)` (rng seeded 0) and save it, with the
    base's tokenizer, generation config and chat template, into `out`. Returns the last step's loss."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with _deterministic_torch():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
        opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
        rng = random.Random(0)
        model.train()
        progress = BuildProgress(label, steps)
        for step in range(steps):
            loss = batch_loss(model, next_batch(rng))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            progress.report(step, loss.item())
        model.eval()
        model.save_pretrained(str(out))
    AutoTokenizer.from_pretrained(str(base_dir)).save_pretrained(str(out))
    for name in ("generation_config.json", "chat_template.jinja"):
        if (base_dir / name).exists():
            (out / name).write_bytes((base_dir / name).read_bytes())
    return loss.item()
