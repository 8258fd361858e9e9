"""Python with some top-level packages unimportable: `blocked_imports.py a,b (-c CODE | SCRIPT) ARGS`.

The learner's GPU machine has torch, transformers, numpy and pyarrow but no Temporal and no vLLM;
tests/learner/test_bench_learner.py runs the learner and its benchmark under this to prove they never
import either (nor `tests`: a benchmark imports only the product and bench/).
"""

from __future__ import annotations

import importlib.abc
import runpy
import sys


class Blocker(importlib.abc.MetaPathFinder):
    def __init__(self, names: set[str]) -> None:
        self.names = names

    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] in self.names:
            raise ImportError(f"blocked import of {fullname!r} (the learner and its bench must not need it)")
        return None


def main() -> None:
    names, rest = set(sys.argv[1].split(",")), sys.argv[2:]
    sys.meta_path.insert(0, Blocker(names))
    if rest[0] == "-c":
        sys.argv = ["-c", *rest[2:]]
        exec(compile(rest[1], "<blocked -c>", "exec"), {"__name__": "__main__"})
    else:
        sys.argv = rest
        runpy.run_path(rest[0], run_name="__main__")


if __name__ == "__main__":
    main()
