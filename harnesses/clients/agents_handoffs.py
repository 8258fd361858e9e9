"""Agents SDK handoffs as spawn links: the agent a handoff transfers to is spawned by the call that handed
off, with nothing declared by the program.

A handoff is a tool call (`transfer_to_<agent>`, or a `Handoff`'s own `tool_name`) in the handing-off
agent's response. grove's model stamps every item of a response with the grove call id (agents_sdk.py
`_stamp`), and the SDK hands the receiving agent the history with that very item in it, followed by the
handoff's output (`{"assistant": "<agent name>"}`): so the receiving agent's first request names its
spawner in its own input, in a plain process, in a streamed run and inside a Temporal workflow alike (there
the stamped items come back from the model activity with the response).

`handoff_spawner` reads it: the last handoff call to this agent whose output is in the input and after
which the input holds nothing the model produced since (an assistant message, a tool call, reasoning):
that is the request that enters the agent. Its later requests in the same run have the agent's own items
after the handoff and name no spawner (they continue its context). An agent handed back to, the root
agent included, enters again and is spawned by the call that handed it back (a new context of that agent,
linked to that call). A handoff input filter that drops the handoff's tool items
(`handoff_filters.remove_all_tools`) or a nested handoff history leaves nothing to read: such an agent
opens a context without a spawner (the episode's summary warns, as before).

Pure module: items are dicts or pydantic models; the SDK is imported for its tool-name rule only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agents import Handoff

FAKE_ID = "__fake_id__"  # the SDK's placeholder item id for chat completions (not a grove call)
_MODEL_ITEMS = frozenset({"function_call", "reasoning", "message"})  # `message`: only role assistant


def _field(item: Any, name: str) -> Any:
    return item.get(name) if isinstance(item, Mapping) else getattr(item, name, None)


def handoff_targets(agent: Any) -> dict[str, str]:
    """The agent's handoffs as {tool name: name of the agent it transfers to}: an `Agent` entry by the
    SDK's own default tool name (`transfer_to_<name>`), a `Handoff` by its `tool_name` / `agent_name`."""
    out: dict[str, str] = {}
    for entry in getattr(agent, "handoffs", None) or ():
        tool, target = getattr(entry, "tool_name", None), getattr(entry, "agent_name", None)
        if isinstance(entry, Handoff) and isinstance(tool, str) and isinstance(target, str):
            out[tool] = target
        elif isinstance(getattr(entry, "name", None), str):  # an Agent
            out[Handoff.default_tool_name(entry)] = entry.name
    return out


def _produced_by_model(item: Any) -> bool:
    kind = _field(item, "type")
    if kind == "message" or (kind is None and _field(item, "role") is not None):
        return _field(item, "role") == "assistant"
    return kind in _MODEL_ITEMS


def handoff_spawner(items: Sequence[Any] | str, agent_name: str, targets: Mapping[str, str]) -> str | None:
    """The grove call id that handed off to `agent_name`, when `items` is the input that enters it (see
    the module docstring); None for any other input. `targets`: tool name -> target agent name, of every
    agent that may have handed off."""
    if isinstance(items, str):
        return None
    calls: dict[str, Any] = {}  # call_id -> the handoff call item to this agent
    entered: Any = None
    for item in items:
        kind = _field(item, "type")
        if kind == "function_call" and targets.get(_field(item, "name")) == agent_name:
            calls[_field(item, "call_id")] = item
            continue
        if kind == "function_call_output" and _field(item, "call_id") in calls:
            entered = calls[_field(item, "call_id")]
        elif entered is not None and _produced_by_model(item):
            entered = None  # the agent (or another) has spoken since: this request does not enter it
    if entered is None:
        return None
    spawner = _field(entered, "id")
    return spawner if isinstance(spawner, str) and spawner and spawner != FAKE_ID else None
