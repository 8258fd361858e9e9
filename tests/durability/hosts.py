"""Hosts on one machine that share no path: `grove worker` processes for rehearsing a run across hosts.

A `HostProcess` is a `grove worker` started in namespaces of its own (`unshare --user --map-root-user
--mount --uts`), with HOME, GROVE_HOME, TMPDIR and its working directory under its host's own root
folder, and its host name. Before grove starts, inside the namespaces:

- /tmp and /dev/shm are fresh private tmpfs: what another host or the test keeps there is not visible,
  and what this host writes there is seen by no other;
- its own root is bind-mounted back at the same path (the test's tmp folder is under /tmp);
- every other path the test names (the other hosts' roots, the services' data folders, the machine's
  grove home and model cache) is covered by an empty read-only tmpfs, in case it lies outside /tmp.

Each host also has a model cache of its own ($GROVE_MODELS under its root, set whatever the caller's
environment says, and XDG_CACHE_HOME for vLLM's and torch's caches): the model cache is a build cache
that machines of one site could share, but a host that finds a model another host built is exactly the
shortcut the rehearsal must not take (version 0 served from a host's own copy of the model instead of
the bytes the trainer host staged). No host builds a model here: each one's is provisioned as a folder
on its own disk (`provision_model`).

So a host that reads a path another host wrote (a model folder, a checkpoint, downloaded weights) gets
"no such file" exactly as on another machine. What the hosts share is what machines on a network share:
the code and its venv (the same grove version) and the 127.0.0.1 ports of the Temporal server and the S3
server (the network namespace is the machine's). The wrapper `exec`s grove, so the process the test
signals is the worker itself, in its own session (killpg reaches its vLLM children).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from infra.worker_process import WorkerProcess
from tests.inference.checkpoints import perturbed_copy

# The host's TMPDIR inside its namespaces: its own `tmp` folder, bound at a short path (vLLM's IPC sockets
# live there, and a socket path may not pass 107 characters).
HOST_TMP = "/tmp/host"
# $1: the host's root; the rest: the command. GROVE_HOST_KEEP: the code's folders (kept visible when they
# are under /tmp); GROVE_HOST_HIDE: paths to cover. One path per line.
WRAPPER = r"""set -e
own="$1"; shift
IFS='
'
mount -t tmpfs -o mode=1777 grove-host-shm /dev/shm
i=0
for keep in "$own" $GROVE_HOST_KEEP; do
  mkdir -p "/dev/shm/.keep/$i"; mount --bind "$keep" "/dev/shm/.keep/$i"; i=$((i + 1))
done
mount -t tmpfs -o mode=1777 grove-host-tmp /tmp
i=0
for keep in "$own" $GROVE_HOST_KEEP; do
  mkdir -p "$keep"; mount --move "/dev/shm/.keep/$i" "$keep"; i=$((i + 1))
done
mkdir "$HOST_TMP"
mount --bind "$own/tmp" "$HOST_TMP"
for hidden in $GROVE_HOST_HIDE; do
  if [ -d "$hidden" ]; then mount -t tmpfs -o ro,size=4k grove-hidden "$hidden"; fi
done
hostname "$GROVE_HOST_NAME"
cd "$own/work"
exec "$@"
"""
# What every host runs: this checkout (its modules first on PYTHONPATH, as in the test) and its venv.
CODE = [Path(__file__).resolve().parents[2], Path(sys.prefix)] + [
    Path(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p
]
UNSHARE = ["unshare", "--user", "--map-root-user", "--mount", "--uts"]


class HostIsolationError(RuntimeError):
    """This machine cannot start a process in namespaces of its own (no unprivileged user namespaces,
    or no `unshare`): the hosts would share every path, so the rehearsal would prove nothing."""


class Host:
    """One host's folders, all under `root`; its host name is `name`."""

    def __init__(self, name: str, root: Path) -> None:
        self.name = name
        self.root = Path(root)
        self.home, self.grove_home, self.models, self.tmp, self.work, self.gates_dir = (
            self.root / sub for sub in ("home", "grove-home", "models", "tmp", "work", "gates")
        )
        for folder in (self.home, self.grove_home, self.models, self.tmp, self.work, self.gates_dir):
            folder.mkdir(parents=True, exist_ok=True)

    def env(self, hide: Iterable[Path]) -> dict[str, str]:
        return {
            "HOME": str(self.home),
            "GROVE_HOME": str(self.grove_home),
            "GROVE_MODELS": str(self.models),
            "XDG_CACHE_HOME": str(self.home / ".cache"),
            "TMPDIR": HOST_TMP,  # = self.tmp (bound there by WRAPPER)
            "HOST_TMP": HOST_TMP,
            "GROVE_HOST_NAME": self.name,
            "GROVE_HOST_KEEP": "\n".join(str(p) for p in CODE if p.is_dir()),
            "GROVE_HOST_HIDE": "\n".join(str(p) for p in hide),
        }

    def command(self, argv: list[str]) -> list[str]:
        return [*UNSHARE, "sh", "-c", WRAPPER, "grove-host", str(self.root), *argv]

    def run(self, argv: list[str], hide: Iterable[Path]) -> str:
        """Run `argv` as a process of this host; its stdout (HostIsolationError if it fails)."""
        done = subprocess.run(
            self.command(argv), env=dict(os.environ, **self.env(hide)), capture_output=True, text=True,
            timeout=120,
        )  # fmt: skip
        if done.returncode != 0:
            raise HostIsolationError(
                f"host {self.name!r}: {argv[0]} in `{' '.join(UNSHARE)}` failed (exit {done.returncode}): "
                f"{done.stderr.strip()[-2000:]}; this test needs unprivileged user and mount namespaces "
                "(e.g. sysctl kernel.unprivileged_userns_clone=1, or a container that allows unshare)"
            )
        return done.stdout

    def visible(self, paths: Iterable[Path], hide: Iterable[Path]) -> dict[Path, bool]:
        """Which of `paths` a process of this host sees."""
        paths = list(paths)
        probe = 'for p; do if [ -e "$p" ]; then echo 1; else echo 0; fi; done'
        out = self.run(["sh", "-c", probe, "probe", *map(str, paths)], hide)
        return dict(zip(paths, [line == "1" for line in out.split()], strict=True))

    def imports_from(self, module: str, hide: Iterable[Path]) -> str:
        """Where this host's Python imports `module` from (the test checks it runs the code under test)."""
        return self.run([sys.executable, "-c", f"import {module}; print({module}.__file__)"], hide).strip()


class HostProcess(WorkerProcess):
    """`grove worker` on a Host: its own folders, host name and namespaces; `hide` covered."""

    def __init__(self, host: Host, queue_names: Iterable[str], *, hide: Iterable[Path], **kwargs) -> None:
        super().__init__(host.name, queue_names, **kwargs)
        self.host = host
        self.hide = list(hide)
        self.cwd = host.work

    def env(self) -> dict[str, str]:
        return {**super().env(), **self.host.env(self.hide)}

    def command(self) -> list[str]:
        return self.host.command(super().command())


def provision_model(host: Host, source: Path, *, perturb_seed: int | None = None) -> Path:
    """A copy of model folder `source` on the host's own disk (in its own model cache, $GROVE_MODELS), as a
    machine that built or downloaded it has; `perturb_seed`: the same architecture with other weights."""
    dest = host.models / source.name
    if perturb_seed is None:
        return Path(shutil.copytree(source, dest))
    return perturbed_copy(source, dest, seed=perturb_seed)
