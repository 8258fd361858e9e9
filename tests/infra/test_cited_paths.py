"""Every repository file that the docs, docstrings and comments cite exists.

A moved or renamed file leaves its old path behind in prose that no import checks; readers then open a
file that is not there. This test reads every tracked text file, takes each token that starts with one
of the repository's own top-level folders (`gateway/...`, `docs/...`) and names a file (its last part
has a suffix: `gateway/http/app.py`, `infra/test.sh`) or a module's member (`activities/generate.call_seed`
cites activities/generate.py), and fails listing the citations whose file is missing, with the file and
line that cite them. Tokens without a suffix (`bench/s000001/t0/g0` is an episode id, `grove/grove` a
model name) are not citations of a file.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TEXT_SUFFIXES = {".py", ".md", ".sh", ".yaml", ".yml", ".toml", ".txt", ".cfg", ".ini"}
# Places that cite paths which are not the repository's own: the changelog names files as they were,
# this file's own check of the pattern cites missing paths on purpose, and the store layout's test pins
# object keys, some under the store's `ledger/` root (a repository folder's name too).
NOT_CHECKED = {"CHANGELOG.md", "test_cited_paths.py", "test_store_layout.py"}
# Characters that mark a path as a pattern or a placeholder rather than one file: `runs/<name>/`,
# `rows/{episode}.parquet`, `tests/*/conftest.py`, `checkpoints/step-N`.
PLACEHOLDER = re.compile(r"[<>{}*$]|\.\.\.|/step-N|-N\b")


def tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, check=True, capture_output=True, text=True)
    return out.stdout.split()


def cited(text: str, tops: list[str]) -> list[tuple[int, str]]:
    alternatives = "|".join(re.escape(t) for t in sorted(tops, key=len, reverse=True))
    # a top-level folder, then one or more path segments; stops at anything that cannot be in a path
    pattern = re.compile(rf"(?<![\w./-])((?:{alternatives})/[\w./<>{{}}*$-]*[\w/])")
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for match in pattern.finditer(line):
            found.append((number, match.group(1)))
    return found


def names_a_file(citation: str) -> bool:
    return "." in citation.rsplit("/", 1)[-1]


def exists(citation: str) -> bool:
    """The cited file, or the module whose member `folder/module.member` names."""
    if (ROOT / citation).exists():
        return True
    folder, _, last = citation.rpartition("/")
    return (ROOT / folder / (last.split(".", 1)[0] + ".py")).is_file()


def test_every_cited_repository_path_exists() -> None:
    files = tracked()
    tops = sorted({f.split("/", 1)[0] for f in files if "/" in f})
    missing = []
    for name in files:
        path = ROOT / name
        if path.suffix not in TEXT_SUFFIXES or path.name in NOT_CHECKED or not path.is_file():
            continue
        for number, citation in cited(path.read_text(errors="replace"), tops):
            if not names_a_file(citation) or PLACEHOLDER.search(citation) or exists(citation):
                continue
            missing.append(f"{name}:{number}: {citation}")
    assert not missing, "cited paths that do not exist (fix the citation or the file):\n" + "\n".join(missing)


def test_the_check_sees_a_missing_path() -> None:
    # the pattern itself: a real file, a missing one, a placeholder, a module's member and an id
    tops = ["gateway", "docs", "activities", "bench"]
    text = (
        "see gateway/http/app.py and docs/nowhere.md, rows in gateway/<x>/y.py; "
        "activities/generate.call_seed, activities/gone.call_seed, episode bench/s000001/t0/g0"
    )
    citations = [c for _, c in cited(text, tops)]
    assert citations == [
        "gateway/http/app.py",
        "docs/nowhere.md",
        "gateway/<x>/y.py",
        "activities/generate.call_seed",
        "activities/gone.call_seed",
        "bench/s000001/t0/g0",
    ]
    broken = [c for c in citations if names_a_file(c) and not PLACEHOLDER.search(c) and not exists(c)]
    assert broken == ["docs/nowhere.md", "activities/gone.call_seed"]
