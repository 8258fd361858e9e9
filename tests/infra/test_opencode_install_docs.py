"""What the docs say bootstrap installs is what infra/bootstrap.sh installs: OpenCode is installed on first
use by infra/opencode.sh (or by hand), so every line of the docs that speaks of bootstrap and OpenCode
together, and every line of infra/opencode.sh that speaks of bootstrap, must say it does not (a new user
followed such a line and had no `opencode`), unless bootstrap.sh does call infra/opencode.sh."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DENIES = re.compile(r"\bnot\b|first use", re.IGNORECASE)


def _claims() -> list[str]:
    docs = [*(REPO / "docs").glob("*.md"), REPO / "README.md"]
    lines = [
        (p, line)
        for p in docs
        for line in p.read_text().splitlines()
        if "bootstrap" in line.lower() and "opencode" in line.lower()
    ]
    script = REPO / "infra" / "opencode.sh"
    lines += [(script, line) for line in script.read_text().splitlines() if "bootstrap" in line.lower()]
    return [f"{p.relative_to(REPO)}: {line.strip()}" for p, line in lines if not DENIES.search(line)]


def test_no_doc_says_bootstrap_installs_opencode_unless_it_does():
    if "opencode.sh" in (REPO / "infra" / "bootstrap.sh").read_text():
        return  # bootstrap installs it: any line may say so
    assert _claims() == []
