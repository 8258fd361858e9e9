"""The model cache has its own root ($GROVE_MODELS, default ~/.cache/grove/models), apart from a stack's
$GROVE_HOME: two stacks with their own homes (their own Temporal database, store and infra state) share
the models either of them built, and build nothing twice."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import models.registry as registry
from infra.stack import infra_dir
from models.registry import ensure_model, models_cache_dir
from storage.config import default_store_url
from tests.bounds import PROCESS_WAIT

REPO = Path(__file__).resolve().parents[2]
FINGERPRINT = registry.TINY_SPECS["tiny-random"].fingerprint()


def test_two_stacks_with_their_own_homes_share_one_model_cache(tmp_path, monkeypatch):
    cache, home_a, home_b = tmp_path / "models", tmp_path / "stack-a", tmp_path / "stack-b"
    monkeypatch.setenv("GROVE_MODELS", str(cache))
    builds, real_build = [], registry.build_tiny_model

    def counting_build(out, spec):
        builds.append(out)
        return real_build(out, spec)

    monkeypatch.setattr(registry, "build_tiny_model", counting_build)
    monkeypatch.setenv("GROVE_HOME", str(home_a))
    built = ensure_model("tiny-random")
    # the stack's own state follows its home; the model does not
    assert infra_dir() == home_a / "infra" and str(home_a) in default_store_url()
    assert built == cache / f"tiny-random-{FINGERPRINT}" and len(builds) == 1

    monkeypatch.setenv("GROVE_HOME", str(home_b))
    assert infra_dir() == home_b / "infra"
    assert ensure_model("tiny-random") == built and len(builds) == 1  # found, not rebuilt
    assert not home_a.exists() and not home_b.exists()  # no model went into either home

    # the command line of the second stack, in a process of its own, finds the same entry
    env = {**os.environ, "GROVE_HOME": str(home_b), "GROVE_MODELS": str(cache), "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "cli.main", "model", "init", "tiny-random"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=PROCESS_WAIT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == str(built)
    assert sorted(p.name for p in cache.iterdir() if not p.name.startswith(".")) == [built.name]


def test_the_default_cache_stays_put_when_grove_home_moves(tmp_path, monkeypatch):
    monkeypatch.delenv("GROVE_MODELS", raising=False)
    monkeypatch.setenv("GROVE_HOME", str(tmp_path / "elsewhere"))
    assert models_cache_dir() == Path.home() / ".cache" / "grove" / "models"
    monkeypatch.setenv("GROVE_MODELS", "~/my-models")
    assert models_cache_dir() == Path.home() / "my-models"
