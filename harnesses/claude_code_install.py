"""Where the pinned Claude Code binary is, installing it on first use (infra/claude_code.sh, npm).

    claude_code_binary("2.1.332")
    -> $GROVE_HOME/tools/claude-code-2.1.332/node_modules/@anthropic-ai/claude-code-linux-x64/claude

`$GROVE_CLAUDE_CODE_BIN` names a binary to use instead (no install). The install runs under a file lock,
so concurrent workers and tests install once; it is idempotent, so a fresh machine needs no hand step.
Claude Code comes from the npm registry by this command on the user's machine; the repository never
ships it.
"""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

from grove.file_lock import exclusive
from grove.paths import grove_home

SCRIPT = Path(__file__).resolve().parent.parent / "infra" / "claude_code.sh"
BIN_ENV = "GROVE_CLAUDE_CODE_BIN"
VERSION = "2.1.332"  # the request shape changes between versions: one pinned version at a time
INSTALL_TIMEOUT_S = 600


class ClaudeCodeInstallError(RuntimeError):
    """Claude Code could not be installed or found (npm missing, registry unreachable, odd machine)."""


def _arch() -> str:
    machine = platform.machine()
    return {"x86_64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(machine, machine)


def install_dir(version: str) -> Path:
    return grove_home() / "tools" / f"claude-code-{version}"


def binary_path(version: str) -> Path:
    return install_dir(version) / "node_modules" / "@anthropic-ai" / f"claude-code-linux-{_arch()}" / "claude"


def claude_code_binary(version: str = VERSION) -> Path:
    """The binary of Claude Code `version`, installed first if missing."""
    override = os.environ.get(BIN_ENV)
    if override:
        path = Path(override)
        if not os.access(path, os.X_OK):
            raise ClaudeCodeInstallError(
                f"${BIN_ENV}={override!r} is not an executable file; point it at a Claude Code binary or "
                f"unset it to install @anthropic-ai/claude-code@{version} with `bash {SCRIPT}`"
            )
        return path
    path = binary_path(version)
    if os.access(path, os.X_OK):
        return path
    with exclusive(grove_home() / "tools" / ".claude-code.lock"):  # one install at a time
        if not os.access(path, os.X_OK):
            _install(version)
    return path


def _install(version: str) -> None:
    env = {**os.environ, "GROVE_CLAUDE_CODE_VERSION": version, "GROVE_HOME": str(grove_home())}
    try:
        done = subprocess.run(
            ["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        raise ClaudeCodeInstallError(
            f"installing @anthropic-ai/claude-code@{version} took over {INSTALL_TIMEOUT_S} s; run "
            f"`bash {SCRIPT}` by hand and check that npm reaches its registry"
        ) from None
    if done.returncode != 0 or not os.access(binary_path(version), os.X_OK):
        raise ClaudeCodeInstallError(
            f"installing @anthropic-ai/claude-code@{version} failed (exit {done.returncode}): "
            f"{done.stderr[-2000:]}; run `bash {SCRIPT}` by hand to see why, or set ${BIN_ENV} to a Claude "
            "Code binary"
        )
