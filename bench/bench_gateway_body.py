"""Gateway memory on a 100 MB request body: peak RSS of a real uvicorn gateway process before and after
it is sent a 100 MB `POST /close` without a token, then with a valid token, then a 100 MB chat request
with a valid token.

    PYTHONPATH=. python bench/bench_gateway_body.py [--mb 100]

The server runs without its lifespan (no Temporal needed: both requests are answered by auth or by
the body cap before anything reaches Temporal). Peak RSS is the kernel's VmHWM of the server process.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import socket
import time

import httpx

SECRET = "bench-body-secret-0123456789"
EPISODE = "bench/s000001/t0/g0"


def _serve(port: int) -> None:
    import uvicorn

    from gateway.http.app import create_app
    from gateway.http.settings import GatewaySettings

    settings = GatewaySettings(temporal_address="127.0.0.1:1", store="/nonexistent", secret=SECRET)
    uvicorn.run(create_app(settings), host="127.0.0.1", port=port, lifespan="off", log_level="error")


def _peak_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        line = next(x for x in f if x.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def _post(url: str, mb: int, headers: dict[str, str]) -> str:
    def body():
        chunk = b" " * 2**20
        for _ in range(mb):
            yield chunk

    try:
        r = httpx.post(url, content=body(), headers=headers, timeout=120)
        return f"{r.status_code} {r.json()['error']['code']}"
    except httpx.HTTPError as err:  # the server answered and closed before the upload finished
        return f"connection closed by the server ({type(err).__name__})"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=100)
    args = parser.parse_args()
    from gateway.http.auth import issue_token
    from gateway.http.episode_ref import episode_ref

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = mp.get_context("spawn").Process(target=_serve, args=(port,), daemon=True)
    proc.start()
    pid = proc.pid
    if pid is None:  # set by start()
        raise RuntimeError("the gateway process did not start")
    base = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            httpx.get(f"{base}/healthz", timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.1)
    url = f"{base}/episodes/{episode_ref(EPISODE)}/close"
    print(f"idle gateway: peak RSS {_peak_mb(pid):.0f} MB")
    answer = _post(url, args.mb, {})
    print(f"{args.mb} MB close, no token: {answer}; peak RSS {_peak_mb(pid):.0f} MB")
    auth = {"authorization": f"Bearer {issue_token(SECRET, EPISODE)}"}
    answer = _post(url, args.mb, auth)
    print(f"{args.mb} MB close, valid token: {answer}; peak RSS {_peak_mb(pid):.0f} MB")
    answer = _post(f"{base}/episodes/{episode_ref(EPISODE)}/v1/chat/completions", args.mb, auth)
    print(f"{args.mb} MB chat request, valid token: {answer}; peak RSS {_peak_mb(pid):.0f} MB")
    proc.kill()


if __name__ == "__main__":
    main()
