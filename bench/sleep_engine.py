"""A stand-in policy engine of fixed latency, for benchmarks that measure grove alone (bench/bench_fleet.py).

It is the real PolicyEngine's interface (the generate activity, the engine status, the version gate
and the prompt checks are the real ones) with vLLM replaced by `asyncio.sleep(latency)`: each call
returns `tokens` copies of one token id with log-probability -1, finish "length". The tokenizer is the
model's own (the gateway renders prompts with the same one), so the prompts staged are real. Nothing
trains from it: it answers only to the benchmark's episodes.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np

from activities.engine import Generation, PolicyEngine
from activities.engine_config import EngineConfig
from activities.engine_gate import BatchStats, VersionGate
from chat.tool_parsers import HermesParser
from grove.sampling import SamplingConfig


class SleepEngine(PolicyEngine):
    """PolicyEngine whose generation is a sleep of `latency_s` (no vLLM, no model weights loaded)."""

    def __init__(self, model_dir: Path, max_model_len: int, latency_s: float, tokens: int = 1) -> None:
        from transformers import AutoTokenizer

        self.config = EngineConfig(model_dir=model_dir, max_model_len=max_model_len)
        self._llm = None
        self._tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        self._vocab_size = len(self._tokenizer)
        eos = self._tokenizer.eos_token_id
        self._stop_ids = frozenset([eos] if eos is not None else [])
        self._gate = VersionGate(0)
        self._run = None
        self._broken = None
        self._death = None
        self._died = asyncio.Event()
        self._gates = None
        self._source = Path(model_dir)
        self.batch_stats = BatchStats()
        self.tool_parser = HermesParser()
        self.latency_s = latency_s
        self._token = int(self._tokenizer.encode("a", add_special_tokens=False)[0])
        self._tokens = tokens

    async def generate(
        self, prompt_ids: Any, sampling: SamplingConfig, seed: int, request_id: str
    ) -> Generation:
        prompt = np.asarray(prompt_ids, dtype=np.int64).reshape(-1)
        self._check_prompt(prompt, request_id)
        n = min(self._tokens, sampling.max_tokens)
        async with self._gate.admitted() as version:
            await asyncio.sleep(self.latency_s)
        ids = np.full(n, self._token, dtype=np.int32)
        text = self._tokenizer.decode(ids.tolist())
        logprobs = np.full(n, -1.0, dtype=np.float32)
        return Generation(prompt.astype(np.int32), ids, logprobs, "length", version, text)

    def _raise_if_broken(self) -> None:
        return None

    async def shutdown(self) -> None:
        return None

    async def wait_died(self, check_every: float = 0.5):
        await asyncio.Event().wait()  # a sleep never dies
