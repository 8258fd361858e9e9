"""The object store's layout (grove/store_layout.py) is a contract with stores written by earlier versions.

Every key function is pinned to the literal key it builds: a changed string would orphan the rows,
checkpoints and ledger pages a resumed run or a closed episode left behind. The store map (the module's
docstring) and docs/design.md's "Where data lives" list the same key patterns, every pinned key matches
one of them and every pattern is pinned. No other source module writes a store root as a literal.
"""

from __future__ import annotations

import ast
import inspect
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from grove import store_layout as layout

ROOT = Path(__file__).resolve().parents[2]
EPISODE = "run-a/s000003/t1/g0"
SHA = "0123456789abcdef" * 4

# (function, arguments, the key it must build): written out by hand, never computed like the module does.
PINNED: list[tuple[Callable[..., str], tuple, str]] = [
    (layout.staging_prefix, (EPISODE,), "staging/run-a/s000003/t1/g0/"),
    (layout.staging_key, (EPISODE, "parent.0.c2"), "staging/run-a/s000003/t1/g0/parent.0.c2.safetensors"),
    (
        layout.staged_receipt_key,
        (EPISODE, "parent.0.c2", SHA),
        f"staging/run-a/s000003/t1/g0/parent.0.c2.receipt-{SHA}.json",
    ),
    (layout.chat_record_key, (EPISODE, "parent.0.c2"), "staging/run-a/s000003/t1/g0/parent.0.c2.chat.json"),
    (
        layout.chat_prompt_key,
        (EPISODE, "parent.0.c2", SHA),
        "staging/run-a/s000003/t1/g0/requests/parent.0.c2-0123456789abcdef.json",
    ),
    (
        layout.conversation_prefix,
        (EPISODE, "parent.0.c2"),
        "staging/run-a/s000003/t1/g0/conversations/parent.0.c2-",
    ),
    (
        layout.conversation_key,
        (EPISODE, "parent.0.c2", SHA),
        "staging/run-a/s000003/t1/g0/conversations/parent.0.c2-0123456789abcdef.json",
    ),
    (
        layout.completion_key,
        (EPISODE, "parent.0.c2", SHA),
        "staging/run-a/s000003/t1/g0/completions/parent.0.c2-0123456789abcdef.json",
    ),
    (layout.prompt_index_prefix, (EPISODE, "d1g"), "staging/run-a/s000003/t1/g0/prompts/d1g/"),
    (
        layout.prompt_index_key,
        (EPISODE, "d1g", "parent.0.c2"),
        "staging/run-a/s000003/t1/g0/prompts/d1g/parent.0.c2",
    ),
    (layout.session_aliases_prefix, (EPISODE, 2), "staging/run-a/s000003/t1/g0/sessions/2/"),
    (layout.session_alias_key, (EPISODE, 2, "ses_9"), "staging/run-a/s000003/t1/g0/sessions/2/ses_9"),
    (layout.opencode_names_prefix, (EPISODE,), "staging/run-a/s000003/t1/g0/opencode/"),
    (layout.opencode_name_key, (EPISODE, "ses_9"), "staging/run-a/s000003/t1/g0/opencode/ses_9"),
    (layout.claude_code_names_prefix, (EPISODE,), "staging/run-a/s000003/t1/g0/claude-code/"),
    (
        layout.claude_code_name_key,
        (EPISODE, "a2fbef0582"),
        "staging/run-a/s000003/t1/g0/claude-code/a2fbef0582",
    ),
    (layout.ledger_prefix, (EPISODE,), "ledger/run-a/s000003/t1/g0/"),
    (
        layout.ledger_page_key,
        (EPISODE, 4, "handover", 12),
        "ledger/run-a/s000003/t1/g0/run-00004/handover/page-00012.json",
    ),
    (layout.ledger_index_key, (EPISODE, 4), "ledger/run-a/s000003/t1/g0/run-00004/index.json"),
    (layout.rows_key, (EPISODE,), "rows/run-a/s000003/t1/g0.parquet"),
    (layout.contexts_key, (EPISODE,), "contexts/run-a/s000003/t1/g0.jsonl"),
    (layout.call_archive_key, (EPISODE,), "calls/run-a/s000003/t1/g0.json"),
    (layout.checkpoints_prefix, ("run-a",), "checkpoints/run-a/"),
    (layout.checkpoint_prefix, ("run-a", 7), "checkpoints/run-a/step-000007/"),
    (layout.commit_key, ("run-a", 7), "checkpoints/run-a/step-000007/COMMIT"),
    (
        layout.model_file_key,
        ("run-a", 7, "model.safetensors"),
        "checkpoints/run-a/step-000007/model/model.safetensors",
    ),
    (layout.metrics_key, ("run-a", 7), "checkpoints/run-a/step-000007/metrics.json"),
    (layout.episodes_key, ("run-a", 7), "checkpoints/run-a/step-000007/episodes.json"),
    (layout.guard_refusal_key, ("run-a", 7), "checkpoints/run-a/step-000007/guard_refusal.json"),
    (layout.base_model_prefix, ("run-a",), "runs/run-a/base-model/"),
    (layout.base_model_commit_key, ("run-a",), "runs/run-a/base-model/COMMIT"),
    (layout.step_records_prefix, ("run-a",), "runs/run-a/steps/"),
    (layout.step_record_key, ("run-a", 7), "runs/run-a/steps/step-000007.json"),
    (layout.engine_statuses_prefix, ("inference",), "engines/inference/"),
    (layout.engine_status_key, ("inference", "host-1234"), "engines/inference/host-1234.json"),
]
# Keys the map lists that no function builds whole: a checkpoint's own files, named by trainer/checkpoint.py.
CHECKPOINT_FILES = [
    "checkpoints/run-a/step-000007/optimizer.pt",
    "runs/run-a/base-model/model/config.json",
]
# Literals of other modules that start like a store key and are not one: (file, literal, why).
NOT_KEYS = {
    ("bench/bench_async.py", "calls/s"),  # a column heading: calls per second
    ("cli/run_commands.py", "runs/"),  # `grove run view`'s local output folder, runs/{run}/view
    ("bench/harness_drive.py", "runs/harness-drive"),  # the bench's local work folder (--out)
}


@pytest.mark.parametrize(("fn", "args", "key"), PINNED, ids=[f.__name__ for f, _, _ in PINNED])
def test_key_is_byte_identical_to_the_layout_of_earlier_stores(fn, args, key) -> None:
    assert fn(*args) == key


def test_every_key_function_is_pinned() -> None:
    functions = {
        name
        for name, member in inspect.getmembers(layout, inspect.isfunction)
        if member.__module__ == layout.__name__ and name != "parse_step"
    }
    assert functions == {fn.__name__ for fn, _, _ in PINNED}


def test_parse_step_reads_commit_markers_only() -> None:
    assert layout.parse_step("checkpoints/run-a/step-000007/COMMIT") == 7
    assert layout.parse_step("checkpoints/run-a/step-000007/metrics.json") is None
    assert layout.parse_step("checkpoints/run-a/step-x/COMMIT") is None
    assert layout.parse_step("COMMIT") is None


def map_patterns(text: str) -> set[str]:
    """The key patterns of a markdown table's first column (each backticked pattern of the cell)."""
    found = set()
    for line in text.splitlines():
        cells = line.split(" | ")
        if line.startswith("| `") and len(cells) > 1:
            found.update(re.findall(r"`([^`]+)`", cells[0]))
    return found


def design_section() -> str:
    text = (ROOT / "docs" / "design.md").read_text()
    start = text.index("### Where data lives")
    end = text.index("\n## ", start)
    return text[start:end]


def as_regex(pattern: str) -> re.Pattern[str]:
    parts = re.split(r"\{[^}]*\}", pattern)  # every placeholder stands for one or more characters
    return re.compile(".+".join(re.escape(p) for p in parts) + "$")


def test_design_doc_lists_the_keys_of_the_store_map() -> None:
    module_map = map_patterns(layout.__doc__ or "")
    assert len(module_map) >= 20
    assert "grove/store_layout.py" in design_section()
    assert map_patterns(design_section()) == module_map


def test_every_key_matches_the_map_and_every_pattern_is_built() -> None:
    patterns = {p: as_regex(p) for p in map_patterns(layout.__doc__ or "")}
    keys = [key for fn, _, key in PINNED if fn.__name__.endswith("_key")] + CHECKPOINT_FILES
    unmapped = [k for k in keys if not any(r.match(k) for r in patterns.values())]
    assert unmapped == [], "keys the store map does not list"
    unbuilt = [p for p, r in patterns.items() if not any(r.match(k) for k in keys)]
    assert unbuilt == [], "store map rows that no key function builds"


def test_every_prefix_is_a_prefix_of_a_pinned_key() -> None:
    keys = [key for fn, _, key in PINNED if fn.__name__.endswith("_key")]
    for fn, _, prefix in PINNED:
        if fn.__name__.endswith("_prefix"):
            assert any(k.startswith(prefix) for k in keys), fn.__name__


def _docstrings(tree: ast.AST) -> set[int]:
    kinds = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, kinds)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }


def _leading_literals(tree: ast.AST) -> list[tuple[int, str]]:
    """Each string literal (and each f-string's leading text) that is not a docstring, with its line."""
    docs = _docstrings(tree)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
            out.append((node.lineno, str(node.values[0].value)))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            out.append((node.lineno, node.value))
    return out


def _root_constants(tree: ast.Module) -> list[tuple[int, str]]:
    """Module-level constants whose value is a store root (`STAGING_ROOT = "staging"`)."""
    assigns = [n for n in tree.body if isinstance(n, ast.Assign | ast.AnnAssign)]
    return [
        (n.lineno, n.value.value)
        for n in assigns
        if isinstance(n.value, ast.Constant) and n.value.value in layout.ROOTS
    ]


def test_no_other_module_builds_store_keys() -> None:
    """A string in the source (tests aside) that starts with a store root and `/` is a key built outside
    the layout module; so is a module-level constant naming a root."""
    starts_a_key = re.compile(rf"^({'|'.join(map(re.escape, layout.ROOTS))})/")
    files = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.split()
    sources = [f for f in files if not f.startswith("tests/") and f != "grove/store_layout.py"]
    assert "capture/records.py" in sources and "ledger/handover.py" in sources
    found, allowed = [], set()
    for name in sources:
        tree = ast.parse((ROOT / name).read_text(), name)
        for line, text in _leading_literals(tree):
            if not starts_a_key.match(text):
                continue
            if (name, text) in NOT_KEYS:
                allowed.add((name, text))
            else:
                found.append(f"{name}:{line}: {text!r}")
        found += [
            f"{name}:{line}: a store root {root!r} outside the layout" for line, root in _root_constants(tree)
        ]
    assert found == [], "store keys built outside grove/store_layout.py: use its functions"
    assert allowed == NOT_KEYS  # an exception that no longer exists is dropped from NOT_KEYS
