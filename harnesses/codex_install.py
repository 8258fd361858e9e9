"""Where the pinned Codex CLI binary is, installing it on first use (infra/codex.sh, npm).

    codex_binary("0.171.0")
    -> $GROVE_HOME/tools/openai-codex-0.171.0/node_modules/@openai/codex-linux-x64/vendor/
       x86_64-unknown-linux-musl/bin/codex

The npm package `@openai/codex` is a launcher; the native binary comes from its optional dependency
`@openai/codex-linux-<arch>`, which the runner executes directly (no Node at run time).
`$GROVE_CODEX_BIN` names a binary to use instead (no install). The install runs under a file lock, so
concurrent workers and tests install once; it is idempotent, so a fresh machine needs no hand step.
"""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

from grove.file_lock import exclusive
from grove.paths import grove_home

SCRIPT = Path(__file__).resolve().parent.parent / "infra" / "codex.sh"
BIN_ENV = "GROVE_CODEX_BIN"
VERSION = "0.171.0"
INSTALL_TIMEOUT_S = 600
_TARGETS = {"x64": "x86_64-unknown-linux-musl", "arm64": "aarch64-unknown-linux-musl"}


class CodexInstallError(RuntimeError):
    """Codex could not be installed or found (npm missing, registry unreachable, odd machine)."""


def _arch() -> str:
    machine = platform.machine()
    return {"x86_64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(machine, machine)


def install_dir(version: str) -> Path:
    return grove_home() / "tools" / f"openai-codex-{version}"


def binary_path(version: str) -> Path:
    arch = _arch()
    vendor = Path("node_modules") / "@openai" / f"codex-linux-{arch}" / "vendor"
    return install_dir(version) / vendor / _TARGETS.get(arch, f"{arch}-unknown-linux-musl") / "bin" / "codex"


def codex_binary(version: str = VERSION) -> Path:
    """The binary of Codex `version`, installed first if missing."""
    override = os.environ.get(BIN_ENV)
    if override:
        path = Path(override)
        if not os.access(path, os.X_OK):
            raise CodexInstallError(f"${BIN_ENV}={override!r} is not an executable file")
        return path
    path = binary_path(version)
    if os.access(path, os.X_OK):
        return path
    with exclusive(grove_home() / "tools" / ".codex.lock"):  # one install at a time
        if not os.access(path, os.X_OK):
            _install(version)
    return path


def _install(version: str) -> None:
    env = {**os.environ, "GROVE_CODEX_VERSION": version, "GROVE_HOME": str(grove_home())}
    try:
        done = subprocess.run(
            ["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        raise CodexInstallError(
            f"installing @openai/codex@{version} took over {INSTALL_TIMEOUT_S} s; run `bash {SCRIPT}` by "
            "hand and check that npm reaches its registry"
        ) from None
    if done.returncode != 0 or not os.access(binary_path(version), os.X_OK):
        raise CodexInstallError(
            f"installing @openai/codex@{version} failed (exit {done.returncode}): {done.stderr[-2000:]}; "
            f"run `bash {SCRIPT}` by hand to see why, or set ${BIN_ENV} to a Codex binary"
        )
