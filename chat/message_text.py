"""The text of a chat message's content: a string as it is, or the text parts of a content list joined
(OpenAI's `[{"type": "text", "text": ...}, ...]`; other parts carry no text).

Pure module (stdlib only).
"""

from __future__ import annotations

from typing import Any


def text_of(content: Any) -> str:
    """A message's text: the string, or its text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""
