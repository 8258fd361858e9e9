"""Load time of a second vLLM-CPU engine while a first one generates without pause: the case of two engines
on one host (issue 43: vLLM's default binding put both on core 0). Prints each engine's binding (None on
a checkout without activities/cpu_binding.py) and the second engine's load time.

    PYTHONPATH=<checkout> .venv/bin/python bench/bench_engine_binding.py
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time

from activities.engine import PolicyEngine
from activities.engine_config import EngineConfig
from grove.sampling import SamplingConfig
from models.registry import ensure_model


async def main() -> None:
    os.environ.setdefault("GROVE_CPU_CLAIMS_DIR", tempfile.mkdtemp())  # other sessions' engines not counted
    cfg = EngineConfig(model_dir=ensure_model("tiny"), max_model_len=512, kv_cache_bytes=32 * 2**20)
    first = await PolicyEngine.start(cfg)
    stop = False

    async def busy() -> int:
        n = 0
        while not stop:
            sampling = SamplingConfig(max_tokens=64, temperature=1.0)
            await first.generate(list(range(5, 105)), sampling, seed=n, request_id=f"busy-{n}")
            n += 1
        return n

    task = asyncio.create_task(busy())
    await asyncio.sleep(5)
    started = time.monotonic()
    second = await PolicyEngine.start(cfg)
    load = time.monotonic() - started
    stop = True
    calls = await task
    bindings = [getattr(e, "cpu_binding", None) for e in (first, second)]
    print(
        f"RESULT load_second_engine_s={load:.1f} first_engine_calls={calls} "
        f"bindings={[b.describe() if b else None for b in bindings]}",
        flush=True,
    )
    await second.shutdown()
    await first.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
