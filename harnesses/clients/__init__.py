"""Harness-side helpers: identity for external harnesses without boilerplate.

A harness program talks to grove's capture gateway as to any OpenAI-compatible server, with one
episode's base URL and token. These modules add what grove needs on top, from what the harness
framework already knows, so user code stays the agent program itself:

    harnesses.clients            the episode binding (`Episode`): URL, token, identity headers, the
                                 last call of each agent (read from `x-grove-call-id`), `close`
    harnesses.clients.langgraph  LangChain / LangGraph: a chat model that names the agent from
                                 LangGraph's run config, spawn links from the parent's last call,
                                 SummarizationMiddleware's summary (kind summary) and rewrite
    harnesses.clients.agents_sdk OpenAI Agents SDK: a ModelProvider (agent from `agent.name`, spawner
                                 from the tool-call context or the handoff); also the model of
                                 Temporal-native runs (`temporalio.contrib.openai_agents`)
    harnesses.clients.report     what a program prints once its episode is closed (accounting, rows)

Light on purpose: nothing here imports torch, vLLM, Temporal or the rest of grove (only the header names,
grove/headers.py, which the gateway reads too), so a harness process (or a user's virtualenv with only
`httpx` and its framework) can import it.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from grove.headers import AGENT_HEADER, CALL_ID_HEADER, LAUNCH_HEADER

# `x-grove-call-kind` values (grove/receipts.py CallKind): the summary of an agent's context (a
# compaction's summary call, trainable), a title, any other helper call
SUMMARY, TITLE, AUXILIARY = "summary", "title", "auxiliary"
AUXILIARY_KINDS = (SUMMARY, TITLE, AUXILIARY)
ROOT_AGENT = "parent"  # the gateway's default agent; parent-only baselines train this one

BASE_URL_ENV = "GROVE_BASE_URL"  # http://host/episodes/<ref>/v1, set by whoever starts the harness
API_KEY_ENV = "GROVE_API_KEY"  # the episode's bearer token
LAUNCH_ENV = "GROVE_LAUNCH"  # set by grove's harness runner: 1, then n for the (n-1)th relaunch
_FALLBACK_ENV = ("OPENAI_BASE_URL", "OPENAI_API_KEY")  # an unmodified OpenAI program's variables

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,96}$")
_NOT_NAME = re.compile(r"[^A-Za-z0-9_-]+")
CANONICAL_STEM_CHARS = 80


class EpisodeConfigError(ValueError):
    """No episode to talk to: base URL or token missing or malformed."""


def header_safe(name: str) -> str:
    """The agent id the gateway makes of a framework's agent name (gateway.pipeline.identity.canonical_agent,
    the same rule; a unit test keeps them equal): a name of letters, digits, '_' and '-' (at most 96) as it
    is, else `<slug>-<8 hex of its sha256>` ("Research agent" -> "Research-agent-<8 hex>"), so distinct names
    stay distinct agents. Knowing it in advance lets a harness name spawners and read rows."""
    if _NAME.match(name):
        return name
    stem = _NOT_NAME.sub("-", name).strip("-")[:CANONICAL_STEM_CHARS].strip("-") or "agent"
    return f"{stem}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"


class ReadableAgents:
    """Agent ids that read as the framework's agent names: the name itself when it is header-safe, else
    its slug (runs of other characters -> '-': "Research agent" -> "Research-agent"), with
    `header_safe`'s hash only where a slug is empty, too long, or already taken by another name of the
    same program (the first name to reach a slug keeps it), so distinct names stay distinct agents."""

    def __init__(self) -> None:
        self._owners: dict[str, str] = {}  # agent id -> the name that took it

    def __call__(self, name: str) -> str:
        slug = name if _NAME.match(name) else _NOT_NAME.sub("-", name).strip("-")
        if not _NAME.match(slug):  # empty or longer than a header-safe name
            return header_safe(name)
        owner = self._owners.setdefault(slug, name)
        if owner == name:
            return slug
        stem = slug[:CANONICAL_STEM_CHARS].strip("-") or "agent"
        return f"{stem}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"


@dataclass
class Episode:
    """One episode as a harness sees it: where to send requests, with which token, and what it learned
    from the responses (each agent's last call id). Thread-safe: LangGraph runs sync nodes in threads."""

    base_url: str
    api_key: str
    launch: int | None = None  # a runner-launched harness: sent as x-grove-launch on every request
    _last_call: dict[str, str] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        self.base_url = self.base_url.rstrip("/")
        if not self.base_url.endswith("/v1") or "/episodes/" not in self.base_url:
            raise EpisodeConfigError(
                f"base URL {self.base_url!r} is not an episode's OpenAI base URL; expected "
                "http://HOST/episodes/<episode ref>/v1 (what grove gives the harness in $GROVE_BASE_URL)"
            )
        if not self.api_key:
            raise EpisodeConfigError("the episode's token is empty; pass it or set $GROVE_API_KEY")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Episode:
        """The episode from $GROVE_BASE_URL / $GROVE_API_KEY (else $OPENAI_BASE_URL / $OPENAI_API_KEY)."""
        source: Mapping[str, str] = os.environ if env is None else env
        base_url = source.get(BASE_URL_ENV) or source.get(_FALLBACK_ENV[0])
        api_key = source.get(API_KEY_ENV) or source.get(_FALLBACK_ENV[1])
        if not base_url or not api_key:
            raise EpisodeConfigError(
                f"no episode: set ${BASE_URL_ENV} and ${API_KEY_ENV} (the episode's base URL and token), "
                "or pass them to Episode(base_url, api_key)"
            )
        launch = source.get(LAUNCH_ENV)
        return cls(base_url, api_key, int(launch) if launch and launch.isdigit() else None)

    @property
    def headers(self) -> dict[str, str]:
        """Headers every request of this harness carries (the clients' default headers)."""
        return {LAUNCH_HEADER: str(self.launch)} if self.launch is not None else {}

    @property
    def close_url(self) -> str:
        return self.base_url.removesuffix("/v1") + "/close"

    def record(self, headers: Any) -> str | None:
        """Remember the call a response names (`x-grove-call-id`, `x-grove-agent`); returns its id."""
        call_id, agent = headers.get(CALL_ID_HEADER), headers.get(AGENT_HEADER)
        if call_id and agent:
            with self._lock:
                self._last_call[agent] = call_id
        return call_id

    def last_call(self, agent: str) -> str | None:
        with self._lock:
            return self._last_call.get(agent)

    def last_calls(self) -> dict[str, str]:
        """Each agent the responses named -> its last call id."""
        with self._lock:
            return dict(self._last_call)

    def close(
        self,
        final_answer: str = "",
        *,
        outputs: dict[str, list[str]] | None = None,
        failure: str | None = None,
        failure_kind: str | None = None,
        wait: bool = False,
        timeout: float = 600.0,
    ) -> dict:
        """End the harness's part of the episode (POST .../close). Idempotent for the same close.
        `failure_kind`: "infrastructure" for a failure that is grove's or the harness's own, not the
        policy's (unset: grove decides; a failure naming a gateway 5xx code is infrastructure)."""
        import httpx  # only here: the identity helpers need no HTTP client of their own

        request = self._close_request(final_answer, outputs, failure, failure_kind, wait)
        r = httpx.post(self.close_url, **request, timeout=timeout)
        r.raise_for_status()
        return r.json()

    async def aclose(
        self,
        final_answer: str = "",
        *,
        outputs: dict[str, list[str]] | None = None,
        failure: str | None = None,
        failure_kind: str | None = None,
        wait: bool = False,
        timeout: float = 600.0,
    ) -> dict:
        import httpx

        request = self._close_request(final_answer, outputs, failure, failure_kind, wait)
        async with httpx.AsyncClient(timeout=timeout) as c:
            r = await c.post(self.close_url, **request)
        r.raise_for_status()
        return r.json()

    def _close_request(
        self,
        final_answer: str,
        outputs: dict[str, list[str]] | None,
        failure: str | None,
        failure_kind: str | None,
        wait: bool,
    ) -> dict:
        """The close POST's query, body and auth: one shape for close and aclose."""
        body = {"final_answer": final_answer, "outputs": outputs or {}, "failure": failure}
        if failure_kind is not None:
            body["failure_kind"] = failure_kind
        return {
            "params": {"wait": str(wait).lower()},
            "json": body,
            "headers": {"authorization": f"Bearer {self.api_key}"},
        }
