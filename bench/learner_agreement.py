"""The `--agreement` section of bench/bench_learner.py: every layout, as the learner runs it on the device,
against the float32 per-call computation of the same batch.

Reference: each eligible call as its own row (prompt + completion), padded layout, on the reference
computations (trainer/scoring.py with `trusted=True`: float32, SDPA's MATH kernel, full logits) — on CPU the
tests prove this equals the independent per-call reference of tests/learner/test_reference.py to 1e-6.
Checked: padded, packed and tree rows and the per-call rows themselves, each through the production
path (CUDA: bf16 autocast, FlexAttention or segments, chunked LM head). Measures, as in the tests:
|loss - ref| / |ref| and, per parameter, ||g - g_ref|| / ||g_ref|| (the worst one printed with its name).
Tolerances (docs/learner.md): bf16 autocast 1e-3 on the loss and 2e-2 on every gradient; float32 1e-5.
Batch: random multi-agent forests with mixed per-call sampling plus two long-prefix episodes of one
group (shared prefixes, forks, compactions: the shapes that broke under cuDNN attention).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from bench.forests import (
    long_prefix_episode,
    per_call_rows,
    random_batch,
    rows_from_calls,
    with_mixed_sampling,
)
from grove.learner_config import LearnerConfig
from trainer.learner import Learner, PassOptions, accumulate_gradients, prepare_batch

TOLERANCE = {"bf16": (1e-3, 2e-2), "float32": (1e-5, 1e-5)}  # (loss, gradient) relative
SAMPLING = [(1.0, 1.0), (0.7, 0.9), (1.3, 0.8), (0.5, 1.0)]


def agreement_episodes(vocab: int, parent_tokens: int) -> list:
    episodes = with_mixed_sampling(random_batch(9, vocab=vocab, groups=2, group_size=3, size=4), SAMPLING, 9)
    rng = np.random.default_rng(9)
    for j, reward in enumerate([1.0, 0.0]):
        episodes.append(long_prefix_episode(rng, f"long-{j}", "long", reward, vocab=vocab,
                                            parent_tokens=parent_tokens, worker_tokens=parent_tokens // 2,
                                            workers=3))  # fmt: skip
    return episodes


def _gradients(learner: Learner, rows, layout: str, budget: int, trusted: bool) -> tuple[float, dict]:
    cfg = learner.config.model_copy(update={"layout": layout, "micro_batch_tokens": budget})
    batch = prepare_batch(rows, cfg)
    learner.model.zero_grad(set_to_none=True)
    options = PassOptions(backend=learner.attention_backend, trusted=trusted)
    total = accumulate_gradients(
        learner.model, batch.plan, batch.denominator, cfg, learner.device, options=options
    )
    grads = {
        n: p.grad.detach().float().clone() for n, p in learner.model.named_parameters() if p.grad is not None
    }
    learner.model.zero_grad(set_to_none=True)
    return total.loss, grads


def run_agreement(model_dir: Path, a, device: torch.device) -> None:
    learner = Learner(model_dir, LearnerConfig(lr=1e-6), device=device)
    if a.attention:
        learner.attention_backend = a.attention
    vocab = learner.model.config.vocab_size
    episodes = agreement_episodes(vocab, min(a.parent_tokens, 512))
    rows = [r for ep in episodes for r in rows_from_calls(ep)]
    calls = per_call_rows(episodes)
    kind = "bf16" if device.type == "cuda" else "float32"
    loss_tol, grad_tol = TOLERANCE[kind]
    ref_loss, ref = _gradients(learner, calls, "padded", a.micro_batch_tokens, trusted=True)
    print(f"\nagreement with the float32 per-call computation ({len(episodes)} episodes, {len(rows)} rows, "
          f"{len(calls)} calls; {device.type}, {kind}, attention {learner.attention_backend}; tolerance loss "
          f"{loss_tol:g}, gradient {grad_tol:g})")  # fmt: skip
    print(f"{'layout':14s} {'budget':>7s} {'loss err':>9s} {'grad err':>9s}  worst parameter")
    variants = [("padded rows", rows, "padded"), ("packed rows", rows, "packed"), ("tree", rows, "tree"),
                ("per-call rows", calls, "padded")]  # fmt: skip
    failed = 0
    for label, vrows, layout in variants:
        for budget in (a.micro_batch_tokens, 256):  # one micro-batch, and many
            loss, grads = _gradients(learner, vrows, layout, budget, trusted=False)
            loss_err = abs(loss - ref_loss) / abs(ref_loss)
            errs = {n: float((grads[n] - g).norm() / g.norm()) for n, g in ref.items() if float(g.norm()) > 0}
            worst = max(errs, key=errs.get)
            ok = loss_err <= loss_tol and errs[worst] <= grad_tol
            failed += not ok
            verdict = "ok" if ok else "FAIL"
            print(
                f"{label:14s} {budget:7d} {loss_err:9.2e} {errs[worst]:9.2e}  {worst}  {verdict}", flush=True
            )
    print("agreement: " + ("every layout within tolerance" if not failed else f"{failed} FAILED"))
