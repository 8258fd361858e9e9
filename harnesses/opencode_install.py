"""Where the pinned OpenCode binary is, installing it on first use (infra/opencode.sh, npm).

    opencode_binary("1.18.33")
    -> $GROVE_HOME/tools/opencode-ai-1.18.33/node_modules/opencode-linux-x64/bin/opencode

`$GROVE_OPENCODE_BIN` names a binary to use instead (no install). The install runs under a file lock,
so concurrent workers and tests install once; it is idempotent, so a fresh machine needs no hand step.
"""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

from grove.file_lock import exclusive
from grove.paths import grove_home

SCRIPT = Path(__file__).resolve().parent.parent / "infra" / "opencode.sh"
BIN_ENV = "GROVE_OPENCODE_BIN"
INSTALL_TIMEOUT_S = 600


class OpenCodeInstallError(RuntimeError):
    """OpenCode could not be installed or found (npm missing, registry unreachable, odd machine)."""


def _arch() -> str:
    machine = platform.machine()
    return {"x86_64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(machine, machine)


def install_dir(version: str) -> Path:
    return grove_home() / "tools" / f"opencode-ai-{version}"


def binary_path(version: str) -> Path:
    return install_dir(version) / "node_modules" / f"opencode-linux-{_arch()}" / "bin" / "opencode"


def opencode_binary(version: str = "1.18.33") -> Path:
    """The binary of OpenCode `version`, installed first if missing."""
    override = os.environ.get(BIN_ENV)
    if override:
        path = Path(override)
        if not os.access(path, os.X_OK):
            raise OpenCodeInstallError(f"${BIN_ENV}={override!r} is not an executable file")
        return path
    path = binary_path(version)
    if os.access(path, os.X_OK):
        return path
    with exclusive(grove_home() / "tools" / ".opencode.lock"):  # one install at a time
        if not os.access(path, os.X_OK):
            _install(version)
    return path


def _install(version: str) -> None:
    env = {**os.environ, "GROVE_OPENCODE_VERSION": version, "GROVE_HOME": str(grove_home())}
    try:
        done = subprocess.run(
            ["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        raise OpenCodeInstallError(
            f"installing opencode-ai@{version} took over {INSTALL_TIMEOUT_S} s; run `bash {SCRIPT}` by hand "
            "and check that npm reaches its registry"
        ) from None
    if done.returncode != 0 or not os.access(binary_path(version), os.X_OK):
        raise OpenCodeInstallError(
            f"installing opencode-ai@{version} failed (exit {done.returncode}): {done.stderr[-2000:]}; "
            f"run `bash {SCRIPT}` by hand to see why, or set ${BIN_ENV} to an OpenCode binary"
        )
