"""A long completion crosses Temporal as a claim check (docs/design.md section 8): the generate
activity stores it beside the call's staged arrays and the activity result and the `call` Update's result
carry a reference; the gateway reads it back (verified) and answers the harness.

Real stack: uvicorn gateway, Temporal dev server, one grove worker with vLLM on the tiny model, a local
object store. What the client got is compared with what the engine served (`recording_engine`), what is
staged and what is trained; what crossed Temporal is read from the workflow's real history.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from google.protobuf.message import Message
from temporalio.api.common.v1 import Payload
from temporalio.client import Client

from grove import queues
from grove.contracts import COMPLETION_INLINE_MAX, EpisodeResult, EpisodeSpec, HarnessOutcome, HarnessSpec
from grove.sampling import SamplingConfig
from grove.staging_format import decode_call_tokens
from grove.store_layout import staging_key
from harnesses import scenario
from tests.gateway.test_app_e2e import MODEL, SYSTEM, close, gateway_url, oai  # noqa: F401 (fixture)
from trainer.rows import rows_from_parquet

pytestmark = pytest.mark.timeout(900)  # the first test starts Temporal and vLLM (minutes on a loaded machine)

LONG = 400  # tokens of each long completion (ignore_eos): two fit the engine's 1,024-token context
SMALL_PAYLOAD = 2_048  # bytes: what a call's largest payload may be with its completion by reference


def _payloads(message) -> list[Payload]:
    """Every Payload inside a history event (any attribute, any depth)."""
    found = []
    for _field, value in message.ListFields():
        if isinstance(value, Message):
            values = [value]
        elif hasattr(value, "values") and hasattr(value, "keys"):  # a map field: its values
            values = list(value.values())
        elif isinstance(value, str | bytes | int | float | bool):
            continue
        else:  # a repeated field
            values = list(value)
        for v in values:
            if isinstance(v, Payload):
                found.append(v)
            elif isinstance(v, Message):
                found.extend(_payloads(v))
    return found


async def _events(client: Client, episode_id: str) -> list:
    return list((await client.get_workflow_handle(episode_id).fetch_history()).events)


def _grown(before: list, after: list) -> tuple[int, int]:
    """History bytes added between two reads, and the largest payload among the added events."""
    added = after[len(before) :]
    largest = max((p.ByteSize() for e in added for p in _payloads(e)), default=0)
    return sum(e.ByteSize() for e in added), largest


def _served_text(tokenizer, stops: frozenset[int], ids: np.ndarray) -> str:
    """The completion's text as a harness should read it: the tokens decoded, a final stop token left out."""
    body = ids[:-1] if ids.size and int(ids[-1]) in stops else ids
    return tokenizer.decode(body.tolist(), skip_special_tokens=False)


async def test_a_long_completion_reaches_the_client_exactly_and_crosses_temporal_by_reference(
    gateway_url,  # noqa: F811
    temporal_client,
    recording_engine,
    e2e_store,
    tiny_tokenizer,
):
    sampling = SamplingConfig(max_tokens=LONG, ignore_eos=True)
    eid = (
        "claim-long/s000001/t0/g0"  # a fixed id: the calls' seeds (and so their tokens) are the same each run
    )
    spec = EpisodeSpec(
        run_id="claim-long", step=1, group_id="claim-long/t0", episode_id=eid, task=scenario.make_task(0),
        harness=HarnessSpec(kind="external"), sampling=sampling,
    )  # fmt: skip
    await temporal_client.start_workflow("EpisodeWorkflow", spec, id=eid, task_queue=queues.EPISODES)
    stops = recording_engine.stop_ids(sampling)

    # A short completion (the common path) stays inline: its text is in the history.
    short = await oai(gateway_url, eid).chat.completions.create(
        model=MODEL, messages=[SYSTEM, {"role": "user", "content": "Hi."}], max_tokens=8
    )
    short_text = short.choices[0].message.content
    history = await _events(temporal_client, eid)
    if short_text.strip():
        carried = b"".join(p.data for e in history for p in _payloads(e))
        assert json.dumps(short_text, ensure_ascii=False)[1:-1].encode() in carried

    # A long one, not streamed, then its continuation streamed (the harness echoes the long text back).
    reader = oai(gateway_url, eid, **{"x-grove-agent": "reader"})
    messages = [SYSTEM, {"role": "user", "content": "Tell me a long story."}]
    first = await reader.chat.completions.create(model=MODEL, messages=messages)
    after_first = await _events(temporal_client, eid)
    content = first.choices[0].message.content
    messages += [{"role": "assistant", "content": content}, {"role": "user", "content": "Go on."}]
    stream = await reader.chat.completions.create(model=MODEL, messages=messages, stream=True)
    streamed = "".join([ch.choices[0].delta.content or "" async for ch in stream if ch.choices])
    after_second = await _events(temporal_client, eid)

    served = recording_engine.calls_of(eid)
    c0, c1 = served["reader.0.c0"], served["reader.0.c1"]
    grown, largest = _grown(history, after_first)
    inline_bytes = len(json.dumps(c0.completion_ids.tolist())) + 2 * len(content.encode())
    print(
        f"\nlong completion ({c0.completion_ids.size} tokens, {inline_bytes} B inline): history +{grown} B "
        f"for its call, largest payload {largest} B; streamed continuation: "
        f"+{_grown(after_first, after_second)[0]} B, largest {_grown(after_first, after_second)[1]} B"
    )

    # Exact: what the client got is the staged tokens' text, and the staged tokens are the engine's.
    for call_id, got, usage in (("reader.0.c0", content, first.usage), ("reader.0.c1", streamed, None)):
        staged = decode_call_tokens(e2e_store.get(staging_key(eid, call_id)))
        np.testing.assert_array_equal(staged.completion_ids, served[call_id].completion_ids)
        assert staged.completion_ids.size == LONG
        assert got == _served_text(tiny_tokenizer, stops, staged.completion_ids)
        if usage is not None:
            assert usage.completion_tokens == LONG
    assert inline_bytes > COMPLETION_INLINE_MAX  # the case under test: over the inline limit
    # The continuation spliced the long call's exact tokens in front of the new message.
    head = np.concatenate([c0.prompt_ids, c0.completion_ids])
    np.testing.assert_array_equal(c1.prompt_ids[: head.size], head)

    # What crossed Temporal: references, never the completion (neither of the two long calls).
    assert largest < SMALL_PAYLOAD and _grown(after_first, after_second)[1] < SMALL_PAYLOAD
    carried = b"".join(p.data for e in after_second for p in _payloads(e))
    for text in (content, streamed):
        assert len(text) > 300
        assert json.dumps(text[100:300], ensure_ascii=False)[1:-1].encode() not in carried

    # Trained: the reader's row is the continuation's prompt + completion, loss on both long completions.
    r = await close(gateway_url, eid, {"final_answer": streamed}, wait=True)
    assert r.status_code == 200, r.text
    result = r.json()["result"]
    assert result["status"] == "ok" and result["counts"] == {"selected": 3}, result
    rows = {row.spans[0].call_id: row for row in rows_from_parquet(e2e_store.get(result["rows_key"]))}
    row = rows["reader.0.c0"]
    np.testing.assert_array_equal(row.input_ids, np.concatenate([c1.prompt_ids, c1.completion_ids]))
    for span in row.spans:
        np.testing.assert_array_equal(
            row.input_ids[span.start : span.end], served[span.call_id].completion_ids
        )
    assert not e2e_store.list(f"staging/{eid}/")  # the stored completions went with the staging area


async def test_a_native_program_reads_its_long_completion_from_the_store(
    temporal_client, grove_worker, recording_engine, tiny_tokenizer
):
    """The native harness runs in the workflow: it gets a long completion through the `load_completion`
    IO activity (verified), so the history holds its text once, as that activity's result, and the
    generate result only the reference."""
    sampling = SamplingConfig(max_tokens=LONG, ignore_eos=True)
    eid = "claim-native/s000001/t0/g1"
    spec = EpisodeSpec(
        run_id="claim-native", step=1, group_id="claim-native/t0", episode_id=eid, index_in_group=1,
        task=scenario.make_task(0), harness=HarnessSpec(program=scenario.OUTCOMES_NAME), sampling=sampling,
    )  # fmt: skip
    result = await temporal_client.execute_workflow(
        "EpisodeWorkflow", spec, id=eid, task_queue=queues.EPISODES, result_type=EpisodeResult
    )
    served = recording_engine.calls_of(eid)["parent.0.c0"]
    assert served.completion_ids.size == LONG
    text = _served_text(tiny_tokenizer, recording_engine.stop_ids(sampling), served.completion_ids)
    # The program's answer is the served text exactly: the reward is a hash of its final answer and outputs.
    expected = scenario.score(spec.task, HarnessOutcome(final_answer=text, outputs={"parent": [text]}))
    assert result.status == "ok" and result.reward == expected.reward, result

    events = await _events(temporal_client, eid)
    scheduled = {
        e.event_id: e.activity_task_scheduled_event_attributes.activity_type.name
        for e in events
        if e.HasField("activity_task_scheduled_event_attributes")
    }
    results: dict[str, list[int]] = {}
    for e in events:
        if e.HasField("activity_task_completed_event_attributes"):
            done = e.activity_task_completed_event_attributes
            size = sum(p.ByteSize() for p in done.result.payloads)
            results.setdefault(scheduled[done.scheduled_event_id], []).append(size)
    print(
        f"\nnative long completion: generate result {results['generate']} B, "
        f"load_completion result {results['load_completion']} B"
    )
    assert results["generate"][0] < SMALL_PAYLOAD and len(results["load_completion"]) == 1
    assert results["load_completion"][0] > len(text.encode())  # the text, once (no token ids)
