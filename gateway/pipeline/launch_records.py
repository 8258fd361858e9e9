"""Relaunch without regeneration: a relaunched harness is answered from the calls already recorded.

When the harness runner's worker dies mid-episode, Temporal retries the `run_harness` activity, which
launches the harness again (activities/harness.py) with `x-grove-launch: <n>` on every request. A fresh
OpenCode run sends the same requests as before (same folder, same prompts) until it reaches the point
where the first launch died, but under new session ids; a fresh `codex exec` likewise, under new thread
ids (a Codex thread is a session here, its parent thread making it a child: gateway/pipeline/codex.py).
For each request of launch n > 1:

1. its prompt digest (messages and tools in their canonical, type-strict form: chat.render's semantic
   equality, tool-call ids left out) is looked up in the episode's prompt index
   (`staging/{episode}/prompts/{digest}/{call id}`, written with every chat record);
2. a recorded call of an earlier launch with that prompt, still live in the ledger (completed: not
   discarded, failed or cancelled), of the same kind of agent (a root session's request -> `parent` or
   its auxiliary agents; a child session's -> a subagent), and not already claimed by another session of
   this launch, answers it: the gateway returns that call's record, no generation, no admission;
3. the session is then an *alias* of the recorded agent (`staging/{episode}/sessions/{launch}/{session}`
   = agent + the last call replayed), so the session's later requests route to that agent's context, and
   the first request that matches no record (where the harness diverges) continues the last replayed call
   of the session: calls of the earlier launch after it, which the relaunched harness never got, are
   discarded (accounted, never trained).

Python harness programs (RunConfig.harness.kind `python`: LangGraph, the Agents SDK, any program sending
grove's identity headers) have no sessions: they name their agents (`x-grove-agent`), and the adapters
give the same names at every launch (LangGraph: `{node}-{n}` in `Send` order; Agents SDK: the agent's
name and the tool call id of the recorded response). For them the "session" is the agent as named
(`program_session`: `agent~<agent>`, auxiliary agents `<agent>~aux` their own): step 2 takes a recorded
call of exactly that agent, and step 3 continues from the last call replayed to it. A program whose
agent names change between launches gets no replay for the renamed agents: their requests are ordinary
requests (docs/harnesses.md).

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
from gateway.pipeline.identity import AUX_SEPARATOR, DEFAULT_AGENT, grove_identity
from grove.headers import LAUNCH_HEADER
from grove.store_layout import (
    prompt_index_key,
    prompt_index_prefix,
    session_alias_key,
    session_aliases_prefix,
)
from storage.base import ObjectNotFoundError, ObjectStore

MAX_LAUNCH = 1000
# Alias keys of programs' agents; OpenCode session ids never contain '~' (opencode.SESSION_PATTERN).
PROGRAM_SESSION_PREFIX = "agent~"


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


def index_call(store: ObjectStore, episode_id: str, digest: str, call_id: str) -> None:
    store.put_if_absent(prompt_index_key(episode_id, digest, call_id), b"")


def indexed_calls(store: ObjectStore, episode_id: str, digest: str) -> list[str]:
    prefix = prompt_index_prefix(episode_id, digest)
    return sorted(key[len(prefix) :] for key in store.list(prefix))


def load_aliases(store: ObjectStore, episode_id: str, launch: int) -> dict[str, SessionAlias]:
    prefix = session_aliases_prefix(episode_id, launch)
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
    store.put(session_alias_key(episode_id, launch, session_id), alias.model_dump_json().encode())


def base_agent(agent: str) -> str:
    """`parent~title` -> `parent`: the agent whose session an auxiliary call belongs to."""
    return agent.split(AUX_SEPARATOR, 1)[0]


def agent_fits(agent: str, child_session: bool) -> bool:
    """A root session replays the root agent's calls, a child session a subagent's (any other agent:
    `researcher`, `worker-2`; gateway/pipeline/opencode_names.py)."""
    return (base_agent(agent) != DEFAULT_AGENT) == child_session


def claimed_agents(aliases: Mapping[str, SessionAlias], session_id: str) -> set[str]:
    """Agents other sessions of this launch already answer for."""
    return {a.agent for s, a in aliases.items() if s != session_id}


def program_agent(headers: Mapping[str, str]) -> str | None:
    """The agent a program's request (grove's headers, no OpenCode session) replays, as the gateway
    names it (`worker-2`, `worker-2~aux` for its auxiliary calls); None for a request that names its
    context explicitly (`x-grove-context`): such programs place their calls themselves, never replayed."""
    identity = grove_identity(headers)
    if identity.context_id is not None or identity.agent is None:
        return None
    return identity.agent


def program_session(agent: str) -> str:
    """The alias key of a program's agent (module docstring): one per agent as named, per launch."""
    return f"{PROGRAM_SESSION_PREFIX}{agent}"


def replay_agent(
    record_agent: str,
    program: str | None,
    mine: SessionAlias | None,
    taken: set[str],
    child_session: bool,
) -> str | None:
    """The agent a session would replay by answering with a live record of `record_agent`, or None when
    that record is not its to replay. A program's agent (`program`) replays only its own calls, under
    the same name; an OpenCode session replays the agent it already replays (`mine`), else an agent of
    its kind that no other session of the launch replays (`taken`)."""
    if program is not None:
        return program if record_agent == program else None
    agent = base_agent(record_agent)
    if mine is not None:
        return agent if agent == mine.agent else None
    if agent in taken or not agent_fits(record_agent, child_session):
        return None
    return agent
