"""`grove episode start`'s sampling: the flags over the run config's over grove's defaults, refused
before anything starts when grove cannot sample with it (exit 2, the field named)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from cli.episode_commands import episode_sampling
from grove.runconfig import load_run_config
from tests.bounds import PROCESS_WAIT

REPO = Path(__file__).resolve().parents[2]
RUN = str(REPO / "examples" / "opencode-delegation.yaml")


def test_flags_override_the_run_configs_sampling_which_overrides_the_defaults():
    run = load_run_config(RUN).sampling
    assert (run.temperature, run.max_tokens) == (0.7, 128)  # what this example trains with
    taken = episode_sampling(RUN, temperature=None, top_p=None, max_tokens=None)
    assert taken == run
    flags = episode_sampling(RUN, temperature=0.5, top_p=0.9, max_tokens=None)
    assert (flags.temperature, flags.top_p, flags.max_tokens) == (0.5, 0.9, 128)
    bare = episode_sampling(None, temperature=None, top_p=None, max_tokens=64)
    assert (bare.temperature, bare.top_p, bare.max_tokens) == (1.0, 1.0, 64)
    with pytest.raises(ValidationError, match="temperature"):
        episode_sampling(None, temperature=0.0, top_p=None, max_tokens=None)


def test_an_unusable_temperature_is_refused_before_anything_starts():
    env = {**os.environ, "GROVE_GATEWAY_SECRET": "x" * 32, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "cli.main", "episode", "start", "--external", "--temperature", "3",
           "--address", "127.0.0.1:1"]  # fmt: skip
    done = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=PROCESS_WAIT)
    assert done.returncode == 2, done.stderr
    assert "temperature" in done.stderr and "less than or equal to 2" in done.stderr
