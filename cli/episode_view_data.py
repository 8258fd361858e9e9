"""What `grove episode view` shows of one episode, assembled from where grove keeps it.

Sources, all bounded by the episode's own size (never the `summary` query, which grows with it):

- the workflow's description and result (`EpisodeResult`: reward, components, counts, failure);
- the call archive beside the rows (capture/call_archive.py): every context and call with its state,
  links, sampling processing, policy version, completion ids and behaviour log-probabilities, prompt
  tail and the harness's messages;
- the rows Parquet: which row owns which call, and the loss mask of each token;
- the workflow's history, every run of its continue-as-new chain: the `generate` activity of each call,
  scheduled / started / closed times and attempts (timing is nowhere else);
- the group's other episodes' results (same id up to `/g{j}`), for the advantage GRPO gives it, with the
  run's learner settings when the run's workflow has them (its memo), else the defaults.

`assemble_view` is pure (tests build views from it); `gather_view` does the reading.
Token marks: `trained` (the owning row's loss mask covers it), `conditioning` (the call is in a row, the
token is not trained there: an agent the run does not train, an auxiliary call) or `untrained` (the
call is in no row: discarded, failed, cancelled).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from capture.call_archive import CallArchive
from grove.contracts import EpisodeResult
from trainer.rows import Row

TokenText = Callable[[Sequence[int]], list[str]]  # ids -> one text piece per id


def ids_as_text(ids: Sequence[int]) -> list[str]:
    """The fallback when no tokenizer is at hand: each id as ⟨id⟩."""
    return [f"⟨{i}⟩" for i in ids]


def tokenizer_pieces(tokenizer: Any) -> TokenText:
    """Each id decoded alone (a piece of a multi-byte character shows as the tokenizer decodes it)."""

    def pieces(ids: Sequence[int]) -> list[str]:
        return [tokenizer.decode([int(i)]) for i in ids]

    return pieces


def _row_marks(rows: Sequence[Row]) -> tuple[dict[str, str], dict[str, list[bool]], dict[str, list[float]]]:
    """Per call: the row that owns it (else the first row holding it), its per-token loss, and the
    behaviour log-probabilities the row carries on those positions."""
    owner: dict[str, str] = {}
    loss: dict[str, list[bool]] = {}
    logprobs: dict[str, list[float]] = {}
    for row in rows:
        for span in row.spans:
            if span.call_id in owner and not span.owned:
                continue
            owner[span.call_id] = row.row_id
            loss[span.call_id] = [bool(x) for x in row.loss_mask[span.start : span.end]]
            logprobs[span.call_id] = [float(x) for x in row.behavior_logprobs[span.start : span.end]]
    return owner, loss, logprobs


def _token_entries(
    ids: list[int], logprobs: list[float] | None, loss: list[bool] | None, in_row: bool, text: TokenText
) -> list[list[Any]]:
    """[[text, mark, logprob], ...] for a completion."""
    pieces = text(ids)
    out = []
    for i, piece in enumerate(pieces):
        trained = loss is not None and i < len(loss) and loss[i]
        mark = "trained" if trained else "conditioning" if in_row else "untrained"
        lp = logprobs[i] if logprobs is not None and i < len(logprobs) else None
        out.append([piece, mark, None if lp is None else round(lp, 4)])
    return out


def _message_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        content = " ".join(str(p.get("text", p)) if isinstance(p, dict) else str(p) for p in content)
    text = f"[{message.get('role', '?')}] {content or ''}"
    for call in message.get("tool_calls") or []:
        fn = call.get("function", {})
        text += f"\n  tool_call {fn.get('name')}({fn.get('arguments')})"
    return text


def _call_view(
    call, owner: str | None, loss, row_logprobs, timing: dict | None, text: TokenText
) -> dict[str, Any]:
    r = call.receipt
    ids = call.completion_ids or []
    logprobs = call.logprobs if call.logprobs is not None else row_logprobs
    prompt_tail = "".join(text(call.prompt_tail_ids)) if call.prompt_tail_ids else ""
    return {
        "id": r.call_id,
        "context": r.context_id,
        "agent": r.agent,
        "kind": r.kind.value,
        "state": r.state.value,
        "parent": r.parent_call_id,
        "version": r.policy_version,
        "temperature": r.sampling.temperature if r.sampling else None,
        "top_p": r.sampling.top_p if r.sampling else None,
        "finish": r.finish_reason,
        "note": r.note,
        "tool_call": r.tool_call.value if r.tool_call else None,
        "prompt_len": call.prompt_len,
        "prompt_tail": prompt_tail,
        "messages": [_message_text(m) for m in call.messages_tail or []],
        "response": _message_text(call.response) if call.response else None,
        "row": owner,
        "tokens": _token_entries(ids, logprobs, loss, owner is not None, text),
        "launch": call.launch,
        "session": call.session_id,
        "timing": timing,
    }


def _contexts(archive: CallArchive) -> list[dict[str, Any]]:
    retired_by = {c.rewrite_of: c.context_id for c in archive.contexts if c.rewrite_of}
    return [
        {
            "id": c.context_id,
            "agent": c.agent,
            "origin": c.origin.value,
            "spawned_by": c.spawned_by_call,
            "rewrite_of": c.rewrite_of,
            "retired_by": retired_by.get(c.context_id),
        }
        for c in archive.contexts
    ]


def _agents(
    archive: CallArchive, rows: Sequence[Row], result: EpisodeResult | None, advantage: float | None
) -> list[dict[str, Any]]:
    names = list(dict.fromkeys(c.agent for c in archive.contexts))
    trained = {s.agent for row in rows for s in row.spans if s.owned and s.eligible}
    details = result.reward_details if result else {}
    out = []
    for name in names:
        components = {k: v for k, v in details.items() if k == name or k.startswith(f"{name}:")}
        out.append(
            {
                "name": name,
                "contexts": [c.context_id for c in archive.contexts if c.agent == name],
                "calls": sum(1 for c in archive.calls if c.receipt.agent == name),
                "components": components,
                "trained": name in trained,
                "advantage": advantage if name in trained else None,
            }
        )
    return out


def _rows(rows: Sequence[Row]) -> list[dict[str, Any]]:
    return [
        {
            "id": row.row_id,
            "tokens": int(row.input_ids.size),
            "loss_tokens": int(row.num_loss_tokens),
            "valid": row.valid,
            "calls": [
                {
                    "call": s.call_id,
                    "agent": s.agent,
                    "owned": s.owned,
                    "eligible": s.eligible,
                    "start": s.start,
                    "end": s.end,
                }  # fmt: skip
                for s in row.spans
            ],
        }
        for row in rows
    ]


def assemble_view(
    *,
    episode_id: str,
    workflow_status: str,
    ui_url: str,
    archive: CallArchive | None,
    rows: Sequence[Row],
    result: EpisodeResult | None,
    timing: dict[str, dict],
    advantage: dict[str, Any] | None,
    text: TokenText = ids_as_text,
) -> dict[str, Any]:
    """The page's data (JSON-able). `archive` None: an episode still running, or materialized before
    archives existed; the page then shows what the rows and the result hold."""
    archive = archive or CallArchive(episode_id=episode_id, group_id="", contexts=[], calls=[])
    owner, loss, row_logprobs = _row_marks(rows)
    value = advantage.get("value") if advantage else None
    calls = [
        _call_view(
            c,
            owner.get(c.receipt.call_id),
            loss.get(c.receipt.call_id),
            row_logprobs.get(c.receipt.call_id),
            timing.get(c.receipt.call_id),
            text,
        )  # fmt: skip
        for c in archive.calls
    ]
    return {
        "episode": {
            "id": episode_id,
            "group": result.group_id if result else archive.group_id,
            "workflow_status": workflow_status,
            "status": result.status if result else None,
            "reward": result.reward if result else None,
            "components": result.reward_details if result else {},
            "counts": result.counts if result else {},
            "failure": result.failure if result else None,
            "failure_kind": result.failure_kind if result else None,
            "rows_key": result.rows_key if result else None,
            "policy_versions": result.policy_versions if result else [],
            "ui": ui_url,
            "archived": bool(archive.calls or archive.contexts),
        },
        "advantage": advantage,
        "agents": _agents(archive, rows, result, value),
        "contexts": _contexts(archive),
        "calls": calls,
        "rows": _rows(rows),
    }


# ------------------------------------------------------------------------------------------ timing


def _payload_call_id(payloads) -> str | None:
    try:
        return json.loads(payloads[0].data).get("call_id")
    except (IndexError, ValueError, AttributeError):
        return None


def generate_timing(histories: Sequence[Any]) -> dict[str, dict]:
    """Per call id: the `generate` activity's scheduled / started / closed times (ISO), queue and run
    milliseconds, attempts and outcome, from the workflow histories of every run."""
    out: dict[str, dict] = {}
    for history in histories:
        scheduled: dict[int, str] = {}
        for ev in history.events:
            t = ev.event_time.ToDatetime()
            if ev.HasField("activity_task_scheduled_event_attributes"):
                attrs = ev.activity_task_scheduled_event_attributes
                call_id = (
                    _payload_call_id(attrs.input.payloads) if attrs.activity_type.name == "generate" else None
                )
                if call_id:
                    scheduled[ev.event_id] = call_id
                    out[call_id] = {"scheduled": t, "attempts": 0}
            elif ev.HasField("activity_task_started_event_attributes"):
                attrs = ev.activity_task_started_event_attributes
                if attrs.scheduled_event_id in scheduled:
                    entry = out[scheduled[attrs.scheduled_event_id]]
                    entry["started"], entry["attempts"] = t, attrs.attempt
            else:
                _closed(ev, t, scheduled, out)
    return {call_id: _timing_entry(e) for call_id, e in out.items()}


_CLOSED = {
    "activity_task_completed_event_attributes": "completed",
    "activity_task_failed_event_attributes": "failed",
    "activity_task_timed_out_event_attributes": "timed out",
    "activity_task_canceled_event_attributes": "cancelled",
}


def _closed(ev, t, scheduled: dict[int, str], out: dict[str, dict]) -> None:
    for field, outcome in _CLOSED.items():
        if ev.HasField(field):
            sid = getattr(ev, field).scheduled_event_id
            if sid in scheduled:
                out[scheduled[sid]] |= {"closed": t, "outcome": outcome}
            return


def _timing_entry(e: dict) -> dict:
    def ms(a, b) -> float | None:
        return None if a is None or b is None else round((b - a).total_seconds() * 1000, 1)

    return {
        "scheduled": e["scheduled"].isoformat(timespec="milliseconds"),
        "queue_ms": ms(e.get("scheduled"), e.get("started")),
        "run_ms": ms(e.get("started"), e.get("closed")),
        "total_ms": ms(e.get("scheduled"), e.get("closed")),
        "attempts": e.get("attempts", 0),
        "outcome": e.get("outcome", "open"),
    }
