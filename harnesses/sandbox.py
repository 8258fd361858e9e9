"""The environment a harness process starts with: built from scratch, never inherited from the worker.

A launched harness (stock OpenCode, a Python harness program) runs the policy's tool calls, so it gets
nothing of the worker's environment (secrets, cloud credentials, the worker's own HOME): only a PATH, its
own HOME, XDG and TMPDIR folders under the launch's folder, a UTF-8 locale, and what its kind adds
(harnesses/opencode.py, harnesses/python_harness.py).
"""

from __future__ import annotations

SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"


def sandbox_env(home: str, path: str = SYSTEM_PATH, **extra: str) -> dict[str, str]:
    """The whole environment of a harness process whose home folder is `home`, plus `extra`."""
    return {
        "PATH": path,
        "HOME": home,
        "XDG_CONFIG_HOME": f"{home}/.config",
        "XDG_DATA_HOME": f"{home}/.local/share",
        "XDG_CACHE_HOME": f"{home}/.cache",
        "XDG_STATE_HOME": f"{home}/.local/state",
        "TMPDIR": f"{home}/tmp",
        "LANG": "C.UTF-8",
        **extra,
    }
