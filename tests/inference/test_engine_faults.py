"""Engine faults against real vLLM: a GRPO group of long prompts at once, and non-finite logits.

- A group of distinct prompts that together exceed one engine step's token budget must not make vLLM
  chunk a seeded prefill, which on CPU raises "CPU Generator does not use offset" and kills the engine
  core (docs/reliability.md). Each prompt here is as long as the engine allows (max_model_len 1024,
  minus the completion) and the group holds 4x the budget (2048 tokens a step).
- Weights that give NaN logits must fail the call at generation with a named error.
"""

from __future__ import annotations

import asyncio
import shutil

import numpy as np
import pytest
from safetensors.torch import load_file, save_file

from activities.engine_errors import NonFiniteLogprobError
from grove.sampling import SamplingConfig
from tests.inference.reference import learner_logprobs

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.slow]  # slow: real vLLM

TOL = 1e-4
GROUP = 8
COMPLETION = 16


def long_distinct_prompts(engine, n: int, length: int) -> list[list[int]]:
    """`n` prompts of exactly `length` tokens of real text, different from their first tokens on."""
    tok = engine.tokenizer
    prompts = []
    for j in range(n):
        text = " ".join(f"Episode {j}, line {i}: {j * 7 + i} apples cost {i + j} coins." for i in range(200))
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert len(ids) >= length
        prompts.append(ids[:length])
    assert len({tuple(p[:8]) for p in prompts}) == n
    return prompts


async def test_a_grpo_group_of_long_distinct_prompts_at_once_all_succeed(policy_engine):
    length = policy_engine.config.max_model_len - COMPLETION - 1
    budget = policy_engine.config.step_token_budget
    assert GROUP * length > 3 * budget  # the group cannot share one engine step: prompts queue up
    prompts = long_distinct_prompts(policy_engine, GROUP, length)
    sampling = SamplingConfig(max_tokens=COMPLETION, ignore_eos=True)

    group = await asyncio.gather(
        *(
            policy_engine.generate(p, sampling, seed=500 + j, request_id=f"group-{j}")
            for j, p in enumerate(prompts)
        )
    )

    for j, gen in enumerate(group):
        assert gen.completion_ids.size == COMPLETION == gen.logprobs.size
        ref = learner_logprobs(policy_engine.source_dir, prompts[j], gen.completion_ids)
        assert float(np.abs(ref - gen.logprobs).max()) <= TOL, f"prompt {j}"
    # per-call determinism: a call's seed alone decides its tokens, batched or not
    for j in (0, GROUP - 1):
        alone = await policy_engine.generate(prompts[j], sampling, seed=500 + j, request_id=f"alone-{j}")
        assert alone.completion_ids.tolist() == group[j].completion_ids.tolist()
        assert float(np.abs(alone.logprobs - group[j].logprobs).max()) <= TOL


async def test_nan_weights_fail_the_call_at_generation(policy_engine, tmp_path):
    """A checkpoint whose final norm is NaN (every logit NaN) is served by the real engine; the call
    fails with NonFiniteLogprobError naming the request, and the engine is restored afterwards."""
    source, version = policy_engine.source_dir, policy_engine.version
    corrupt = tmp_path / "nan"
    shutil.copytree(source, corrupt)
    weights = load_file(str(corrupt / "model.safetensors"))
    weights["model.norm.weight"] = weights["model.norm.weight"] * float("nan")
    save_file(weights, str(corrupt / "model.safetensors"), metadata={"format": "pt"})
    await policy_engine.publish(corrupt, version + 1)
    try:
        prompt = long_distinct_prompts(policy_engine, 1, 40)[0]
        with pytest.raises(NonFiniteLogprobError, match=r"request nan-call: the behaviour logprob .* is nan"):
            await policy_engine.generate(prompt, SamplingConfig(max_tokens=4), seed=1, request_id="nan-call")
    finally:
        restored = tmp_path / "restored"
        shutil.copytree(source, restored)
        await policy_engine.publish(restored, version + 2)
    gen = await policy_engine.generate(prompt, SamplingConfig(max_tokens=4), seed=1, request_id="after-nan")
    assert np.isfinite(gen.logprobs).all()
