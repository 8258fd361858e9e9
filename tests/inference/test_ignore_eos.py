"""A completion cut at max_tokens just after a sampled stop token (`ignore_eos`) continues like any other.

With `ignore_eos` the engine samples through EOS / <|im_end|>, and a completion can end on one with
finish reason "length". A final stop token is never text, whatever the finish reason: the continuation
check derives the predecessor's response without it and the splice closes the turn with it, so a text
that kept it ("...<|im_end|>", or "<|endoftext|>" for a one-token call) would make the harness's echo of
what it got an undeclared discontinuity (expected "", got "<|endoftext|>"), and where the gateway passes
its own record, render a second <|im_end|> that the model never saw.

Real vLLM engine on the pretrained tiny model (it ends its turns with <|im_end|>), the real generate
activity and a local store.
"""

from __future__ import annotations

import numpy as np
import pytest
from temporalio.testing import ActivityEnvironment

from activities.generate import call_seed
from activities.inference_worker import InferenceActivities
from chat.render import render_root, render_text, response_of
from grove.contracts import ChatPrompt, GenerateInput, PromptSpec
from grove.sampling import SamplingConfig
from grove.staging_format import decode_call_tokens

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.slow]  # slow: real vLLM

MESSAGES = [{"role": "user", "content": "What is 2 + 2?"}]
NEXT = {"role": "user", "content": "And 3 + 3?"}
PROBE = SamplingConfig(max_tokens=200, ignore_eos=True)


async def _first_turn_end(engine) -> tuple[str, int]:
    """An episode id whose call `c0` (seeded by its ids) samples <|im_end|> as its first stop token, at
    position k: the same call with max_tokens k + 1 ends on it with finish reason "length"."""
    im_end = engine.tokenizer.convert_tokens_to_ids("<|im_end|>")
    prompt = render_root(engine.tokenizer, MESSAGES)
    for i in range(8):
        episode = f"ep-ignore-eos-{i}"
        probe = await engine.generate(prompt, PROBE, call_seed(episode, "c0"), f"probe-{episode}")
        stops = [t for t in probe.completion_ids.tolist() if t in engine.stop_ids()]
        if stops and stops[0] == im_end:
            return episode, probe.completion_ids.tolist().index(im_end)
    pytest.fail("the pretrained tiny model ended no turn with <|im_end|> within 200 tokens in 8 seeds")


async def _generate(acts: InferenceActivities, inp: GenerateInput):
    return await ActivityEnvironment().run(acts.generate, inp)


async def test_a_turn_end_sampled_last_under_ignore_eos_continues_exactly(policy_engine, store):
    tok = policy_engine.tokenizer
    acts = InferenceActivities(policy_engine, store)
    episode, k = await _first_turn_end(policy_engine)
    cut = SamplingConfig(max_tokens=k + 1, ignore_eos=True)
    root = PromptSpec(chat=ChatPrompt(messages=MESSAGES))
    parent = await _generate(acts, GenerateInput(episode_id=episode, call_id="c0", prompt=root, sampling=cut))
    assert parent.finish_reason == "length"
    assert parent.completion_ids[-1] == tok.convert_tokens_to_ids("<|im_end|>")  # the moment
    assert parent.text == tok.decode(parent.completion_ids[:-1], skip_special_tokens=False)
    assert "<|im_end|>" not in parent.text

    staged_parent = decode_call_tokens(store.get(parent.staging_key))
    head = [*staged_parent.prompt_ids.tolist(), *staged_parent.completion_ids.tolist()]
    history = [*MESSAGES, parent.assistant_message, NEXT]  # what the harness sends next: the text it got
    # c1: the native harness's request (the activity derives the parent's response); c2: the gateway's
    # (it passes the response it served)
    for call_id, served in (("c1", None), ("c2", parent.assistant_message)):
        chat = ChatPrompt(messages=history, parent_messages=MESSAGES, parent_response=served)
        spec = PromptSpec(chat=chat, parent_call_id="c0", parent_staging_key=parent.staging_key)
        child = await _generate(
            acts,
            GenerateInput(
                episode_id=episode, call_id=call_id, prompt=spec, sampling=SamplingConfig(max_tokens=4)
            ),
        )
        prompt = decode_call_tokens(store.get(child.staging_key)).prompt_ids.tolist()
        assert prompt[: len(head)] == head, call_id  # the parent's exact tokens, spliced
        # what the model saw is what the harness's history renders to: one <|im_end|> closes the turn
        seen = tok.decode(prompt, skip_special_tokens=False)
        assert seen == render_text(tok, history, None, generation_prompt=True), call_id


async def test_a_final_end_of_text_is_never_text(policy_engine):
    """The one-token case of bench/bench_async.py: <|endoftext|> sampled as the only (and last) token."""
    tok = policy_engine.tokenizer
    eos = tok.convert_tokens_to_ids("<|endoftext|>")
    answer = tok("4", add_special_tokens=False)["input_ids"]
    sampling = SamplingConfig(max_tokens=len(answer) + 1, ignore_eos=True)
    stops = sorted(policy_engine.stop_ids(sampling))
    assert eos in stops
    for ids in ([eos], [*answer, eos]):
        served = policy_engine.decode_completion(np.asarray(ids), sampling)
        assert served == tok.decode(ids[:-1], skip_special_tokens=False)
        # the continuation check derives the same response from the tokens
        assert response_of(tok, ids, stops).message(with_ids=False)["content"] == served
