"""PolicyEngine against real vLLM: behaviour logprobs equal the learner's, batching, seeds, bad prompts."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from activities.engine_errors import EmptyPromptError, PromptTooLongError, TokenIdOutOfRangeError
from grove.sampling import SamplingConfig
from tests.inference.reference import learner_logprobs

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.slow]  # slow: real vLLM

TOL = 1e-4  # engine and learner log-probabilities agree to <= 1e-4 absolute in float32 on CPU


def chat_prompt(tok, text: str) -> list[int]:
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )
    return tok(rendered, add_special_tokens=False)["input_ids"]


def prompts(tok) -> list[list[int]]:
    """Several prompt lengths: 1 token, a short chat turn, ~100 and ~500 tokens of plain text."""
    long_text = " ".join(f"The weather in city {i} is sunny and 12 + {i} = {12 + i}." for i in range(40))
    return [
        [1],
        chat_prompt(tok, "What is 12 + 7?"),
        tok(long_text[:400], add_special_tokens=False)["input_ids"],
        tok(long_text, add_special_tokens=False)["input_ids"],
    ]


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.9)], ids=["T1", "T0.7-top_p0.9"])
async def test_behaviour_logprobs_equal_the_learners(policy_engine, temperature, top_p):
    tok = policy_engine.tokenizer
    worst = 0.0
    for i, prompt in enumerate(prompts(tok)):
        for max_tokens in (1, 40):
            sampling = SamplingConfig(
                temperature=temperature, top_p=top_p, max_tokens=max_tokens, ignore_eos=True
            )
            gen = await policy_engine.generate(
                prompt, sampling, seed=100 + i, request_id=f"lp-{temperature}-{i}-{max_tokens}"
            )
            assert gen.prompt_ids.tolist() == list(prompt)
            assert gen.completion_ids.size == max_tokens == gen.logprobs.size
            assert gen.completion_ids.dtype == np.int32 and gen.logprobs.dtype == np.float32
            assert gen.policy_version == policy_engine.version
            ref = learner_logprobs(
                policy_engine.source_dir, prompt, gen.completion_ids, temperature=temperature, top_p=top_p
            )
            assert np.isfinite(ref).all(), "a sampled token fell outside the learner's top-p set"
            worst = max(worst, float(np.abs(ref - gen.logprobs).max()))
    print(f"max |vLLM - learner| at T={temperature}, top_p={top_p}: {worst:.1e}")
    assert worst <= TOL, f"max |vLLM - learner| = {worst:.2e}"


async def test_recorded_logprobs_are_the_processed_distribution(policy_engine):
    """At T=0.7/top_p=0.9 the raw (T=1, no mask) logprobs differ: the choice of mode is visible."""
    prompt = chat_prompt(policy_engine.tokenizer, "Tell me about the weather in Oslo.")
    sampling = SamplingConfig(temperature=0.7, top_p=0.9, max_tokens=32, ignore_eos=True)
    gen = await policy_engine.generate(prompt, sampling, seed=7, request_id="processed-vs-raw")
    raw = learner_logprobs(policy_engine.source_dir, prompt, gen.completion_ids)
    assert float(np.abs(raw - gen.logprobs).max()) > 1e-2


async def test_same_seed_same_tokens(policy_engine):
    prompt = chat_prompt(policy_engine.tokenizer, "What is 3 + 4?")
    sampling = SamplingConfig(max_tokens=24, ignore_eos=True)
    a, b, c = await asyncio.gather(
        policy_engine.generate(prompt, sampling, seed=42, request_id="seed-a"),
        policy_engine.generate(prompt, sampling, seed=42, request_id="seed-b"),
        policy_engine.generate(prompt, sampling, seed=43, request_id="seed-c"),
    )
    assert a.completion_ids.tolist() == b.completion_ids.tolist()
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-6)
    assert a.completion_ids.tolist() != c.completion_ids.tolist()


async def test_concurrent_generations_are_batched_by_the_engine(policy_engine):
    tok = policy_engine.tokenizer
    policy_engine.batch_stats.reset()
    sampling = SamplingConfig(max_tokens=48, ignore_eos=True)
    gens = await asyncio.gather(
        *[
            policy_engine.generate(
                chat_prompt(tok, f"Question {i}: what is {i} + {i}?"), sampling, i, f"batch-{i}"
            )
            for i in range(8)
        ]
    )
    assert [g.completion_ids.size for g in gens] == [48] * 8
    # vLLM's scheduler ran several of them in the same forward passes.
    assert policy_engine.batch_stats.max_running >= 4, policy_engine.batch_stats


async def test_stops_on_end_of_turn_and_text_drops_it(policy_engine):
    tok = policy_engine.tokenizer
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    gens = await asyncio.gather(
        *[
            policy_engine.generate(
                chat_prompt(tok, "What is 2 + 2?"), SamplingConfig(max_tokens=200), s, f"eot-{s}"
            )
            for s in range(4)
        ]
    )
    stopped = [g for g in gens if g.finish_reason == "stop"]
    assert stopped, "the pretrained tiny model should end some turns within 200 tokens"
    for g in stopped:
        assert int(g.completion_ids[-1]) in policy_engine.stop_ids()
        assert g.text == tok.decode(g.completion_ids[:-1].tolist(), skip_special_tokens=False)
    assert im_end in policy_engine.stop_ids()


async def test_bad_prompts_are_refused_with_named_errors(policy_engine):
    sampling = SamplingConfig(max_tokens=4)
    with pytest.raises(EmptyPromptError, match="no tokens"):
        await policy_engine.generate([], sampling, 0, "empty")
    with pytest.raises(PromptTooLongError, match="max_model_len is 1024"):
        await policy_engine.generate([5] * 1024, sampling, 0, "long")
    with pytest.raises(TokenIdOutOfRangeError, match="prompt token 1 is id 2048"):
        await policy_engine.generate([5, 2048], sampling, 0, "oov")
