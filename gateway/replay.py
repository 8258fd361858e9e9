"""Relaunch without regeneration: a relaunched harness is answered from the calls already recorded.

When the harness runner's worker dies mid-episode, Temporal retries the `run_harness` activity, which
launches the harness again (activities/harness.py) with `x-grove-launch: <n>` on every request. A fresh
OpenCode run sends the same requests as before (same folder, same prompts) until it reaches the point
where the first launch died, but under new session ids. For each request of launch n > 1:

1. its prompt digest (messages and tools in their canonical, type-strict form: chat.render's semantic
   equality, tool-call ids left out) is looked up in the episode's prompt index
   (`staging/{episode}/prompts/{digest}/{call id}`, written with every chat record);
2. a recorded call of an earlier launch with that prompt, still live in the ledger (completed: not
   discarded, failed or cancelled), of the same kind of agent (a root session's request -> `parent` or
   its auxiliary agents; a child session's -> a worker), and not already claimed by another session of
   this launch, answers it: the gateway returns that call's record, no generation, no admission;
3. the session is then an *alias* of the recorded agent (`staging/{episode}/sessions/{launch}/{session}`
   = agent + the last call replayed), so the session's later requests route to that agent's context, and
   the first request that matches no record (where the harness diverges) continues the last replayed call
   of the session: calls of the earlier launch after it, which the relaunched harness never got, are
   discarded (accounted, never trained).

A request whose prompt has no live record is an ordinary request (a new admission); so is every request
without `x-grove-launch` or of the first launch: a hand-run harness that re-sends a request is retried,
never replayed. Requests of one episode go to one gateway (the episode is in the URL path), whose claim
step is serialised per episode.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from chat.render import _canonical_tools, canonical_message, typed
from gateway.identity import AUX_SEPARATOR
from storage.base import ObjectNotFoundError, ObjectStore
from trainer.staging_format import staging_prefix

LAUNCH_HEADER = "x-grove-launch"
MAX_LAUNCH = 1000


class InvalidLaunchHeaderError(ValueError):
    """An `x-grove-launch` header that is not a launch number 1..1000 (HTTP 400)."""


class SessionAlias(BaseModel):
    """A relaunched harness session answered from the records of `agent` (an earlier launch's)."""

    agent: str
    last_replayed: str | None = None  # the agent's last call replayed to this session


def launch_of(headers: Mapping[str, str]) -> int | None:
    raw = headers.get(LAUNCH_HEADER)
    if raw is None:
        return None
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_LAUNCH:
        raise InvalidLaunchHeaderError(
            f"{LAUNCH_HEADER}: {raw!r} is not a launch number 1..{MAX_LAUNCH}; the harness runner sets it "
            "(1 for the first launch of an episode's harness, n for its (n-1)th relaunch)"
        )
    return int(raw)


def prompt_digest(messages: Sequence[dict[str, Any]], tools: Any) -> str:
    """sha256 of the prompt's canonical form: equal for semantically equal requests (module docstring)."""
    canonical = [[typed(canonical_message(m)) for m in messages], typed(_canonical_tools(tools))]
    return hashlib.sha256(json.dumps(canonical, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def index_key(episode_id: str, digest: str, call_id: str) -> str:
    return f"{staging_prefix(episode_id)}prompts/{digest}/{call_id}"


def index_prefix(episode_id: str, digest: str) -> str:
    return f"{staging_prefix(episode_id)}prompts/{digest}/"


def alias_key(episode_id: str, launch: int, session_id: str) -> str:
    return f"{staging_prefix(episode_id)}sessions/{launch}/{session_id}"


def index_call(store: ObjectStore, episode_id: str, digest: str, call_id: str) -> None:
    store.put_if_absent(index_key(episode_id, digest, call_id), b"")


def indexed_calls(store: ObjectStore, episode_id: str, digest: str) -> list[str]:
    prefix = index_prefix(episode_id, digest)
    return sorted(key[len(prefix) :] for key in store.list(prefix))


def load_aliases(store: ObjectStore, episode_id: str, launch: int) -> dict[str, SessionAlias]:
    prefix = alias_key(episode_id, launch, "")
    out = {}
    for key in store.list(prefix):
        try:
            out[key[len(prefix) :]] = SessionAlias.model_validate_json(store.get(key))
        except ObjectNotFoundError:
            continue
    return out


def save_alias(
    store: ObjectStore, episode_id: str, launch: int, session_id: str, alias: SessionAlias
) -> None:
    store.put(alias_key(episode_id, launch, session_id), alias.model_dump_json().encode())


def base_agent(agent: str) -> str:
    """`parent~title` -> `parent`: the agent whose session an auxiliary call belongs to."""
    return agent.split(AUX_SEPARATOR, 1)[0]


def agent_fits(agent: str, child_session: bool) -> bool:
    """A root session replays the root agent's calls, a child session a worker's (gateway/opencode.py)."""
    base = base_agent(agent)
    return base.startswith("worker-") if child_session else not base.startswith("worker-")


def claimed_agents(aliases: Mapping[str, SessionAlias], session_id: str) -> set[str]:
    """Agents other sessions of this launch already answer for."""
    return {a.agent for s, a in aliases.items() if s != session_id}
