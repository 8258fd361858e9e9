"""The generate activity (ActivityEnvironment, real engine, LocalStore): staging, idempotency, splices."""

from __future__ import annotations

import json

import numpy as np
import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.generate import call_seed, stage
from activities.inference_worker import InferenceActivities
from grove.contracts import ChatPrompt, GenerateInput, PromptSpec
from grove.sampling import SamplingConfig
from grove.staging_format import decode_call_tokens
from grove.store_layout import staged_receipt_key, staging_key
from storage.base import sha256_hex
from tests.inference.reference import learner_logprobs

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.slow]  # slow: real vLLM

SAMPLING = SamplingConfig(max_tokens=20, ignore_eos=True)
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


def ids_of(engine, text: str) -> list[int]:
    return engine.tokenizer(text, add_special_tokens=False)["input_ids"]


async def run(acts: InferenceActivities, inp: GenerateInput, heartbeats: list | None = None):
    env = ActivityEnvironment()
    if heartbeats is not None:
        env.on_heartbeat = lambda *details: heartbeats.append(details)
    return await env.run(acts.generate, inp)


async def test_root_call_stages_exactly_what_the_engine_sampled(policy_engine, store):
    acts = InferenceActivities(policy_engine, store)
    prompt = ids_of(policy_engine, "<|im_start|>user\nWhat is 5 + 6?<|im_end|>\n<|im_start|>assistant\n")
    inp = GenerateInput(episode_id="ep-1", call_id="c0", prompt=PromptSpec(ids=prompt), sampling=SAMPLING)
    beats: list = []

    result = await run(acts, inp, beats)

    key = staging_key("ep-1", "c0")
    assert result.staging_key == key and not result.reused_staged
    staged = decode_call_tokens(store.get(key))
    assert staged.prompt_ids.tolist() == prompt
    assert staged.completion_ids.tolist() == result.completion_ids and len(result.completion_ids) == 20
    assert result.digests == staged.digests()
    assert result.policy_version == policy_engine.version
    # The staged logprobs are the behaviour logprobs of those tokens under the served weights.
    ref = learner_logprobs(policy_engine.source_dir, prompt, staged.completion_ids)
    assert float(np.abs(ref - staged.logprobs).max()) <= 1e-4
    # Same seed (a function of the call id), same prompt: the engine samples the same tokens again.
    direct = await policy_engine.generate(prompt, SAMPLING, call_seed("ep-1", "c0"), "direct-c0")
    assert direct.completion_ids.tolist() == result.completion_ids
    receipt = json.loads(store.get(staged_receipt_key("ep-1", "c0", sha256_hex(store.get(key)))))
    assert receipt["policy_version"] == result.policy_version and receipt["finish_reason"] == "length"
    # What it sampled with travels in the result (-> the ledger's receipt) and in the staged receipt.
    assert result.sampling == SAMPLING.processing()
    assert receipt["sampling"] == {"temperature": SAMPLING.temperature, "top_p": SAMPLING.top_p}
    assert beats and beats[0][0]["call_id"] == "c0"


async def test_rerun_of_a_staged_call_returns_its_receipt_without_generating(policy_engine, store):
    acts = InferenceActivities(policy_engine, store)
    inp = GenerateInput(
        episode_id="ep-2", call_id="c0", prompt=PromptSpec(ids=[1, 5, 6, 7]), sampling=SAMPLING
    )
    first = await run(acts, inp)
    policy_engine.batch_stats.reset()

    again = await run(acts, inp)

    assert again.reused_staged and not first.reused_staged
    assert again.model_dump(exclude={"reused_staged"}) == first.model_dump(exclude={"reused_staged"})
    assert policy_engine.batch_stats.steps == 0  # the engine ran no forward pass


async def test_a_completion_over_the_inline_limit_is_returned_by_reference(policy_engine, store):
    acts = InferenceActivities(policy_engine, store)
    prompt = ids_of(policy_engine, "<|im_start|>user\nCount to fifty.<|im_end|>\n<|im_start|>assistant\n")
    inline = await run(
        acts, GenerateInput(episode_id="ep-8", call_id="c0", prompt=PromptSpec(ids=prompt), sampling=SAMPLING)
    )
    inp = GenerateInput(
        episode_id="ep-8",
        call_id="c1",
        prompt=PromptSpec(ids=prompt),
        sampling=SAMPLING,
        completion_inline_max=64,
    )

    result = await run(acts, inp)

    # 20 tokens are more than 64 bytes inline: only the reference travels, the completion is in the store.
    assert result.completion_ref is not None and (result.text, result.completion_ids) == (None, None)
    staged = decode_call_tokens(store.get(staging_key("ep-8", "c1")))
    stored = json.loads(store.get(result.completion_ref.key))
    assert sha256_hex(store.get(result.completion_ref.key)) == result.completion_ref.sha256
    # The stored text is the staged tokens' (seeded per call id: c1 sampled its own tokens)
    ids = staged.completion_ids.tolist()
    ids = ids[:-1] if ids[-1] in policy_engine.stop_ids(SAMPLING) else ids  # a final stop ends the turn
    assert stored["text"] == policy_engine.tokenizer.decode(ids, skip_special_tokens=False)
    # The same call asked inline (a re-run without the limit) answers the same response inline.
    plain = await run(acts, inp.model_copy(update={"completion_inline_max": None}))
    assert plain.completion_ref is None and plain.completion_ids == staged.completion_ids.tolist()
    assert {"text": plain.text, "assistant_message": plain.assistant_message} == stored
    assert result.digests == staged.digests() and inline.completion_ref is None  # no limit: inline
    # A re-run (the staged call found) names the same object: deterministic key and bytes.
    again = await run(acts, inp)
    assert again.reused_staged and again.completion_ref == result.completion_ref


async def test_rerun_with_another_prompt_is_a_conflict(policy_engine, store):
    acts = InferenceActivities(policy_engine, store)
    await run(
        acts, GenerateInput(episode_id="ep-3", call_id="c0", prompt=PromptSpec(ids=[1, 5]), sampling=SAMPLING)
    )
    with pytest.raises(ApplicationError) as err:
        await run(
            acts,
            GenerateInput(episode_id="ep-3", call_id="c0", prompt=PromptSpec(ids=[1, 6]), sampling=SAMPLING),
        )
    assert err.value.type == "StagedCallConflictError" and err.value.non_retryable
    assert "different prompt" in str(err.value)


async def test_lost_staging_race_returns_the_winners_receipt(policy_engine, store):
    acts = InferenceActivities(policy_engine, store)
    inp = GenerateInput(episode_id="ep-4", call_id="c0", prompt=PromptSpec(ids=[1, 9, 9]), sampling=SAMPLING)
    winner = await run(acts, inp)
    # A second attempt of the same call sampled other tokens (another seed) and stages after the winner.
    loser_gen = await policy_engine.generate([1, 9, 9], SAMPLING, seed=12345, request_id="loser")
    assert loser_gen.completion_ids.tolist() != winner.completion_ids

    result = stage(inp, policy_engine, store, loser_gen, np.asarray([1, 9, 9], dtype=np.int32))

    assert result.reused_staged and result.completion_ids == winner.completion_ids
    assert result.digests == winner.digests


async def test_continuation_prompt_is_parent_prompt_completion_and_suffix(policy_engine, store):
    acts = InferenceActivities(policy_engine, store)
    root = await run(
        acts,
        GenerateInput(episode_id="ep-5", call_id="c0", prompt=PromptSpec(ids=[1, 20, 21]), sampling=SAMPLING),
    )
    suffix = ids_of(
        policy_engine, "<|im_end|>\n<|im_start|>user\nand then?<|im_end|>\n<|im_start|>assistant\n"
    )
    child = await run(
        acts,
        GenerateInput(
            episode_id="ep-5",
            call_id="c1",
            prompt=PromptSpec(suffix_ids=suffix, parent_call_id="c0", parent_staging_key=root.staging_key),
            sampling=SAMPLING,
        ),
    )
    staged = decode_call_tokens(store.get(child.staging_key))
    assert staged.prompt_ids.tolist() == [1, 20, 21] + root.completion_ids + suffix
    assert child.digests.prompt_len == 3 + 20 + len(suffix)


async def test_chat_continuation_splices_the_parents_exact_tokens(policy_engine, store):
    """A chat harness echoes the response (tool-call arguments re-serialised as compact JSON) and adds
    a tool result: the child's prompt starts with the parent's exact prompt + completion."""
    acts = InferenceActivities(policy_engine, store)
    messages = [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "Weather in Oslo?"},
    ]
    sampling = SamplingConfig(max_tokens=64)
    root_spec = PromptSpec(chat=ChatPrompt(messages=messages, tools=TOOLS))
    parent = await run(
        acts, GenerateInput(episode_id="ep-6", call_id="c0", prompt=root_spec, sampling=sampling)
    )
    echoed = dict(parent.assistant_message)
    for call in echoed.get("tool_calls") or []:
        compact = json.dumps(json.loads(call["function"]["arguments"]), separators=(",", ":"))
        call["function"] = {**call["function"], "arguments": compact}
    new_messages = [*messages, echoed, {"role": "user", "content": "Thanks! And tomorrow?"}]
    child = await run(
        acts,
        GenerateInput(
            episode_id="ep-6",
            call_id="c1",
            prompt=PromptSpec(
                chat=ChatPrompt(messages=new_messages, tools=TOOLS, parent_messages=messages),
                parent_call_id="c0",
                parent_staging_key=parent.staging_key,
            ),
            sampling=sampling,
        ),
    )
    parent_staged = decode_call_tokens(store.get(parent.staging_key))
    child_staged = decode_call_tokens(store.get(child.staging_key))
    head = parent_staged.prompt_ids.tolist() + parent_staged.completion_ids.tolist()
    assert child_staged.prompt_ids.tolist()[: len(head)] == head
    tail = policy_engine.tokenizer.decode(
        child_staged.prompt_ids.tolist()[len(head) :], skip_special_tokens=False
    )
    # The turn is closed by the model's own <|im_end|> when it sampled one; otherwise (length, or
    # another stop token such as <|endoftext|>: which one depends on the weights earlier tests loaded)
    # the template closes it.
    ended_itself = parent_staged.completion_ids.tolist()[-1:] == ids_of(policy_engine, "<|im_end|>")
    closing = "\n" if ended_itself else "<|im_end|>\n"
    assert tail == closing + "<|im_start|>user\nThanks! And tomorrow?<|im_end|>\n<|im_start|>assistant\n"


async def test_edited_history_is_an_undeclared_discontinuity(policy_engine, store):
    acts = InferenceActivities(policy_engine, store)
    messages = [{"role": "user", "content": "Hi"}]
    root_spec = PromptSpec(chat=ChatPrompt(messages=messages))
    parent = await run(
        acts, GenerateInput(episode_id="ep-7", call_id="c0", prompt=root_spec, sampling=SAMPLING)
    )
    edited = [
        {"role": "user", "content": "Hello"},
        parent.assistant_message,
        {"role": "user", "content": "?"},
    ]
    spec = PromptSpec(
        chat=ChatPrompt(messages=edited, parent_messages=messages), parent_call_id="c0",
        parent_staging_key=parent.staging_key,
    )  # fmt: skip
    with pytest.raises(ApplicationError) as err:
        await run(acts, GenerateInput(episode_id="ep-7", call_id="c1", prompt=spec, sampling=SAMPLING))
    assert err.value.type == "UndeclaredDiscontinuityError" and err.value.non_retryable
    assert "message 0 differs in 'content'" in str(err.value)


@pytest.mark.parametrize(
    ("spec", "error", "words"),
    [
        (PromptSpec(), "PromptSpecError", "exactly one of ids, suffix_ids, chat"),
        (PromptSpec(ids=[1], suffix_ids=[2]), "PromptSpecError", "exactly one of"),
        (PromptSpec(suffix_ids=[2]), "PromptSpecError", "set parent_call_id and parent_staging_key"),
        (PromptSpec(ids=[1], parent_call_id="p"), "PromptSpecError", "cannot name a parent"),
        (
            PromptSpec(suffix_ids=[2], parent_call_id="p", parent_staging_key="staging/other/p.safetensors"),
            "PromptSpecError",
            "is staged at 'staging/ep-8/p.safetensors'",
        ),
        (
            PromptSpec(suffix_ids=[2], parent_call_id="p", parent_staging_key="staging/ep-8/p.safetensors"),
            "ParentNotStagedError",
            "no staged arrays",
        ),
        (PromptSpec(ids=[]), "EmptyPromptError", "no tokens"),
    ],
)
async def test_bad_prompt_specs_fail_without_retry(policy_engine, store, spec, error, words):
    acts = InferenceActivities(policy_engine, store)
    with pytest.raises(ApplicationError) as err:
        await run(acts, GenerateInput(episode_id="ep-8", call_id="c9", prompt=spec, sampling=SAMPLING))
    assert err.value.type == error and err.value.non_retryable
    assert words in str(err.value)
    assert not store.exists(staging_key("ep-8", "c9"))
