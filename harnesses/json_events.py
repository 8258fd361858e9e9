"""The JSON events a harness CLI prints one per line on stdout (OpenCode's `--format json`, Claude Code's
`stream-json`, Codex's `exec --json`); any other line it prints is skipped."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any


def parse_events(lines: Iterable[str]) -> list[dict[str, Any]]:
    """The JSON objects among the lines, in order."""
    events = []
    for line in lines:
        line = line.strip()
        if line.startswith("{"):
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(event, dict):
                events.append(event)
    return events
