"""Write the chat form of stock Claude Code's and Codex's captured requests, for the smol-agent drills.

    python -m cli.harness_chat          # rewrite models/harness_text/*.chat.json
    python -m cli.harness_chat --check  # exit 1 if a committed file differs from a fresh conversion

The drills (models/stock_drills.py) must show the policy each harness's request exactly as the gateway
hands it to the chat template: Claude Code's Messages body through gateway/intake/messages_request.py,
Codex's Responses body through gateway/intake/responses_chat.py (its `multi_agent_v1` namespace
flattened, `apply_patch` as a function taking `input`). The models package sits below the gateway and
cannot run those parsers, so this command runs them once over the captured requests
(models/harness_text/claude_code_2_1_332.json, codex_0_171_0.json) and commits the result;
tests/models/test_stock_drills.py fails when the two drift apart.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from gateway.intake.messages_request import parse_messages_request
from gateway.intake.responses_chat import accept
from gateway.intake.responses_request import parse_responses_request

TEXT_DIR = Path(__file__).resolve().parents[1] / "models" / "harness_text"
# captured file -> (chat-form file, the requests the drills read)
SOURCES: dict[str, tuple[str, tuple[str, ...]]] = {
    "claude_code_2_1_332.json": (
        "claude_code_2_1_332.chat.json",
        ("lead_first", "worker_first", "lead_resume", "lead_notified"),
    ),
    "codex_0_171_0.json": (
        "codex_0_171_0.chat.json",
        ("agents_lead_first", "agents_subagent_first", "agents_lead_after_wait"),
    ),
}


def chat_form(source: str, body: dict[str, Any]) -> dict[str, Any]:
    """The messages and tools the gateway renders for one captured request body."""
    if source.startswith("claude_code"):
        request = parse_messages_request(body, "grove").canonical()
    else:
        request = accept(parse_responses_request(body, "grove")).canonical()
    return {"messages": request.messages, "tools": request.tools}


def converted(source: str) -> str:
    """The chat-form file's text for one captured file."""
    captured = json.loads((TEXT_DIR / source).read_text())
    _, keys = SOURCES[source]
    forms = {k: chat_form(source, captured["requests"][k]["body"]) for k in keys}
    return json.dumps({"source": captured["source"], "requests": forms}, indent=1, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cli.harness_chat", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    stale = []
    for source, (target, _) in SOURCES.items():
        text = converted(source)
        path = TEXT_DIR / target
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(target)
        else:
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print(f"stale: {stale}; run `python -m cli.harness_chat`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
