"""What the docs say bootstrap installs is what infra/bootstrap.sh installs. OpenCode, Codex and Claude
Code are installed on first use by their own scripts (infra/opencode.sh, codex.sh, claude_code.sh), so no
sentence of the docs, and none of the harness's own script, may say bootstrap installs one of them (a new
user followed such a line and had no `opencode`), unless bootstrap.sh does call that script.

A claim is one sentence (or table cell) that names bootstrap, installing and the harness together and does
not deny it; a results row that merely mentions bootstrap and a Codex drive is not one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DENIES = re.compile(r"\bnot\b|first use", re.IGNORECASE)
SENTENCE_END = re.compile(r"(?<=[.;:!?])\s+|\s*\|\s*|\n")
HARNESSES = {  # script -> how the docs name the harness
    "opencode.sh": re.compile(r"opencode", re.IGNORECASE),
    "codex.sh": re.compile(r"codex", re.IGNORECASE),
    "claude_code.sh": re.compile(r"claude[ -_]?code", re.IGNORECASE),
}


def claims(text: str, harness: re.Pattern[str]) -> list[str]:
    """The sentences of `text` that say bootstrap installs the harness."""
    sentences = (s.strip() for s in SENTENCE_END.split(text))
    return [
        s
        for s in sentences
        if "bootstrap" in s.lower() and "install" in s.lower() and harness.search(s) and not DENIES.search(s)
    ]


def _doc_claims(script: str) -> list[str]:
    found = [
        f"{p.relative_to(REPO)}: {claim}"
        for p in [*(REPO / "docs").glob("*.md"), REPO / "README.md"]
        for claim in claims(p.read_text(), HARNESSES[script])
    ]
    # the script's own comments speak of itself: any sentence naming bootstrap and installing counts
    own = claims((REPO / "infra" / script).read_text(), re.compile(""))
    return found + [f"infra/{script}: {claim}" for claim in own]


@pytest.mark.parametrize("script", sorted(HARNESSES))
def test_no_doc_says_bootstrap_installs_a_harness_unless_it_does(script):
    if script in (REPO / "infra" / "bootstrap.sh").read_text():
        return  # bootstrap installs it: any line may say so
    assert _doc_claims(script) == []


def test_a_claim_is_found_and_a_mention_is_not():
    codex = HARNESSES["codex.sh"]
    assert claims("Run bootstrap. It installs Codex and the venv.", codex) == []  # two sentences
    assert claims("bash infra/bootstrap.sh  # installs the venv and Codex", codex) != []
    assert claims("Bootstrap does not install Codex: a worker installs it on first use.", codex) == []
    row = "| ~2-4 (a Codex drive beside it) | the whole of `.ci/run` ~68 min after bootstrap |"
    assert claims(row, codex) == []
    assert claims("| bootstrap installs Claude Code |", HARNESSES["claude_code.sh"]) != []
