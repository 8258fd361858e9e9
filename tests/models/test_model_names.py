"""The models the command line's help lists (models/names.py) are the models grove builds
(models/registry.py KNOWN_NAMES), and both `grove model init --help` and `grove worker --help` list them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from models.names import MODELS
from models.registry import KNOWN_NAMES

REPO = Path(__file__).resolve().parents[2]


def test_the_listed_models_are_the_built_ones():
    assert list(MODELS) == list(KNOWN_NAMES)


@pytest.mark.parametrize("command", [["model", "init"], ["worker"]])
def test_the_help_lists_every_model(command):
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", *command, "--help"], cwd=REPO, capture_output=True, text=True,
        env={"PYTHONPATH": str(REPO), "COLUMNS": "400", "PATH": "/usr/bin:/bin"}, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert all(f"{name} = " in done.stdout for name in KNOWN_NAMES), done.stdout
