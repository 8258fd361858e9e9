"""A local S3-compatible server for tests and single-machine runs: `localbucket` (PyPI), file-backed.

`localbucket --host H --port P DATA_DIR` stores each bucket as a folder of plain files under
DATA_DIR, so objects survive a restart on the same folder. It does not check credentials (any
access/secret key works) and minio must be told region="us-east-1" (it cannot answer the
bucket-location probe). It supports path-style URLs only, which is what minio uses for an IP
endpoint. The server's log goes to `DATA_DIR/.grove-localbucket.log` (not a bucket name, so
localbucket ignores it).

    with LocalBucketServer(data_dir) as server:
        store = server.store("grove", create_bucket=True)

From a shell: `python -m infra.s3server DATA_DIR [--port P]` runs one until Ctrl-C / SIGTERM.
"""

from __future__ import annotations

import argparse
import http.client
import signal
import subprocess
import sys
import threading
from pathlib import Path

from infra.procs import ServiceStartError, free_port, log_tail, stop_pid, wait_ready
from storage.s3 import DEFAULT_REGION, S3Store

# localbucket ignores credentials, but minio signs requests and needs *some* pair.
ACCESS_KEY = "grove"
SECRET_KEY = "grove-secret-key"
LOG_NAME = ".grove-localbucket.log"
# With an auto-chosen port another process may grab it between our probe and the server's bind.
_BIND_ATTEMPTS = 3


class LocalBucketServer:
    """One `localbucket` process that we own (stopped by PID)."""

    def __init__(self, data_dir: Path | str, port: int | None = None, *, host: str = "127.0.0.1") -> None:
        self.data_dir = Path(data_dir)
        self.host = host
        self._fixed_port = port
        self.port = port or 0
        self.log_path = self.data_dir / LOG_NAME
        self.proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        """host:port, as minio and S3Store take it."""
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.endpoint}"

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "localbucket",
            "--host",
            self.host,
            "--port",
            str(self.port),
            str(self.data_dir),
        ]

    def start(self, timeout: float = 15.0) -> LocalBucketServer:
        if self.proc is not None and self.proc.poll() is None:
            return self
        self.data_dir.mkdir(parents=True, exist_ok=True)
        for attempt in range(1, _BIND_ATTEMPTS + 1):
            self.port = self._fixed_port or free_port(self.host)
            try:
                self._launch(timeout)
            except ServiceStartError:
                self.stop()
                lost_race = "Address already in use" in log_tail(self.log_path, 5)
                if self._fixed_port or not lost_race or attempt == _BIND_ATTEMPTS:
                    raise
            else:
                break
        return self

    def _launch(self, timeout: float) -> None:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C in a test run must not kill it before the fixture stops it
            )
        wait_ready(
            f"localbucket S3 server on {self.endpoint}", self.proc, self.healthy, timeout, self.log_path
        )

    def healthy(self) -> bool:
        """ListBuckets answers 200: the HTTP server is up and serving the data folder."""
        # http.client, not urllib.request: the latter would route 127.0.0.1 through $HTTP_PROXY.
        conn = http.client.HTTPConnection(self.host, self.port, timeout=1.0)
        try:
            conn.request("GET", "/")
            response = conn.getresponse()
            return response.status == 200 and b"ListAllMyBucketsResult" in response.read()
        except OSError:
            return False
        finally:
            conn.close()

    def store(self, bucket: str, *, prefix: str = "", create_bucket: bool = False) -> S3Store:
        """An S3Store on this server (fast-failing timeouts suited to a local server)."""
        return S3Store(
            self.endpoint,
            bucket,
            access_key=ACCESS_KEY,
            secret_key=SECRET_KEY,
            region=DEFAULT_REGION,
            secure=False,
            prefix=prefix,
            create_bucket=create_bucket,
            connect_timeout=2.0,
            read_timeout=30.0,
            retries=1,
        )

    def stop(self) -> None:
        """SIGTERM by PID, SIGKILL if it lingers. Objects stay in data_dir for a restart."""
        if self.proc is not None and self.proc.poll() is None:
            stop_pid(self.proc.pid, timeout=5.0)
            self.proc.wait(timeout=5)
        self.proc = None

    def __enter__(self) -> LocalBucketServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def run_forever(data_dir: Path | str, port: int | None = None, host: str = "127.0.0.1") -> None:
    """Run a server until SIGINT/SIGTERM, printing the endpoint and the settings a client needs."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with LocalBucketServer(data_dir, port, host=host) as server:
        print(
            f"localbucket S3 server: endpoint {server.endpoint} (http), data {server.data_dir}, "
            f"log {server.log_path}\n"
            f"  GROVE_STORE='s3://BUCKET?endpoint={server.endpoint}&secure=0&region={DEFAULT_REGION}"
            f"&create=1' (any access/secret key works)",
            flush=True,
        )
        while not stop.wait(1.0):
            if server.proc is None or server.proc.poll() is not None:
                raise ServiceStartError(
                    f"localbucket exited. Log {server.log_path}:\n{log_tail(server.log_path)}"
                )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m infra.s3server", description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", type=Path, help="folder holding the buckets (created if missing)")
    parser.add_argument("--port", type=int, default=None, help="port (default: a free one)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    args = parser.parse_args(argv)
    run_forever(args.data_dir, args.port, args.host)


if __name__ == "__main__":
    main()
