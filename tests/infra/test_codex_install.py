"""infra/codex.sh installs the pinned Codex CLI into a grove-local folder, once: the first run puts a
complete install in place (the platform binary answers `--version` with the pin) and prints its path;
the next run finds it without npm; nothing half-done is left beside it. harnesses/codex_install.py finds
the same path. What the docs say of bootstrap and Codex is checked in tests/infra/test_install_docs.py."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from harnesses.codex_install import BIN_ENV, VERSION, CodexInstallError, binary_path, codex_binary

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "infra" / "codex.sh"


def _run(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["/bin/bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=600)


def _path_without_npm(folder: Path) -> str:
    """A PATH with only what the script needs to find an install: no npm, no apt-get."""
    folder.mkdir()
    for tool in ("uname", "tail"):
        (folder / tool).symlink_to(subprocess.check_output(["which", tool], text=True).strip())
    return str(folder)


@pytest.fixture
def grove_home(tmp_path):
    yield tmp_path
    shutil.rmtree(tmp_path / "tools", ignore_errors=True)  # ~400 MB: not kept among pytest's old tmp dirs


def test_the_script_installs_once_and_the_second_run_needs_no_npm(grove_home, monkeypatch):
    tmp_path = grove_home
    env = {**os.environ, "GROVE_HOME": str(tmp_path)}
    first = _run(env)
    assert first.returncode == 0, first.stderr[-2000:]
    monkeypatch.setenv("GROVE_HOME", str(tmp_path))
    binary = binary_path(VERSION)
    assert first.stdout.strip().splitlines()[-1] == str(binary)
    version = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
    assert version.stdout.strip() == f"codex-cli {VERSION}"
    assert sorted(p.name for p in (tmp_path / "tools").iterdir()) == [f"openai-codex-{VERSION}"]
    # a complete install is kept: npm is never needed again
    second = _run({**env, "PATH": _path_without_npm(tmp_path / "bin")})
    assert second.returncode == 0 and second.stdout.strip() == str(binary), second.stderr
    assert codex_binary(VERSION) == binary


def test_an_override_that_is_not_executable_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv(BIN_ENV, str(tmp_path / "missing"))
    with pytest.raises(CodexInstallError, match=BIN_ENV):
        codex_binary(VERSION)
