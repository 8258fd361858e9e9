"""What OpenCode's subagents are called: after their agent type, with an index when a type runs again.

    researcher, critic, researcher-2, ...

The gateway names each subagent session so in the ledger (gateway/pipeline/opencode_names.py: from the `task`
call that started it), and the harness runner names each subagent's answer so in the episode's outcome
(harnesses/opencode.py), so rows, the summary, the UI and the reward's outputs say the same name. The
k-th `task` call of a type, counted in the order the calls were written (a response's calls in their
order, responses in theirs), is `<type>` for k = 1 and `<type>-<k>` after; a type that would read as
the root agent (`parent`) always carries its index. Names are made header-safe (the gateway's
canonical agent ids: `Code reviewer` -> `Code-reviewer-<8 hex>`).

Pure module, light on purpose (the gateway imports it).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from harnesses.clients import ROOT_AGENT, header_safe


def subagent_name(subagent_type: str, index: int) -> str:
    """The name of the `index`-th (from 1) subagent of this type."""
    base = header_safe(subagent_type)
    return base if index == 1 and base != ROOT_AGENT else f"{base}-{index}"


def subagent_names(types: Iterable[str]) -> list[str]:
    """The names of subagents started by `task` calls of these types, in the calls' order."""
    seen: Counter[str] = Counter()
    names = []
    for subagent_type in types:
        seen[subagent_type] += 1
        names.append(subagent_name(subagent_type, seen[subagent_type]))
    return names
