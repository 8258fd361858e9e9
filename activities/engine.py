"""The policy engine of an inference worker: one vLLM AsyncLLM, exact token capture, weight publication.

One `PolicyEngine` per worker process. `generate` is token-in, token-out: prompt ids in; sampled ids,
one behaviour logprob per sampled token (vLLM `processed_logprobs`, see grove/sampling.py), the
finish reason and the policy version that produced them out. Concurrent calls go straight to the
engine, whose scheduler batches them; the worker never serialises generations.

Process model: vLLM 0.32's AsyncLLM always runs its EngineCore in a child process (AsyncMPClient);
`VLLM_ENABLE_V1_MULTIPROCESSING` only chooses where the model runs. We keep vLLM's default ("1": a
separate model-worker process, the "mp" executor), which on CPU binds the model's OpenMP thread to
its own core. Measured here with the tiny model: "0" (model inside the EngineCore, unbound threads)
starts faster (13-18 s vs 27 s) but generates 4x slower at batch 16 (~670 vs ~2500 tokens/s).
Everything sent to the model worker (`collective_rpc`) is a plain value (a folder path), never a
tensor, so either setting works (pitfall 5 of shared/research/vllm_cpu.md section 4).

Faults (issue 12, section 8):
- Chunked prefill is off on CPU: vLLM rewinds a seeded request's generator after a partial prefill with a
  CUDA-only offset call, so on CPU a group of long prompts that overflow one step's token budget
  killed the engine core. Without chunking each prompt is prefilled in one step (a step schedules
  at most `step_token_budget` >= max_model_len tokens; others wait), seeds and logprobs unchanged.
- The engine's child processes die with the process that owns it, even on SIGKILL
  (activities/vllm_worker_ext.py; this module names the owner in $GROVE_ENGINE_OWNER_PID).
- An engine core that dies (a crash inside a step, its process killed) is final: the call in flight
  and every later one raise `EngineDiedError`, and `wait_died()` returns, on which the worker exits
  (cli/worker.py) so Temporal gives the calls to a live worker (the episode treats the failure as a
  lost attempt).
- A NaN/inf behaviour logprob fails its call with `NonFiniteLogprobError`, never reaching a row.
- Test gates (grove/gates.py, only with $GROVE_TEST_GATES set): a finished generation can be held in
  flight, inside the version gate, until a test releases it.

Publication (`publish`) and the version a call reports:
- A version gate admits each generation under the version current at admission. `publish` closes
  the gate to new generations, waits until every admitted one has finished (the equivalent of
  vLLM's pause mode "wait"; "keep" would let a request straddle two versions and "abort" would
  throw away finished work), then pauses the engine (mode "wait", which then has nothing to wait
  for, and clears the KV/prefix cache), reloads the weights in place, repacks tied embedding heads
  (CPU pitfall 1), resets the prefix cache again (pitfall 4), sets the new version and resumes.
- vLLM labels every output token with the engine's weight version; a call whose tokens do not all
  carry the version it was admitted under raises `VersionStraddleError` instead of lying.
- Versions only move forward: an older version is refused (`StaleVersionError`). Publishing the
  version that is already current is a no-op when the weights are byte-identical (a retried
  publication activity) and a `VersionConflictError` when they are not.
- A failure inside the reload (pitfall 6: layers left on the meta device) triggers a rollback to the
  previous weights folder; if even that fails the engine is marked broken and every later call
  raises `EngineBrokenError` (restart the worker).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import logging
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from safetensors import safe_open

from chat.tool_parsers import HermesParser, ToolCallParser, tool_parser
from grove.contracts import DEFAULT_KV_CACHE_BYTES, DEFAULT_MAX_MODEL_LEN, EngineLimits
from grove.gates import Gates
from grove.sampling import LOGPROBS_MODE, SamplingConfig
from models.limits import EngineLimitsError, check_positions, kv_bytes_per_token, model_positions

log = logging.getLogger(__name__)

WORKER_EXTENSION = "activities.vllm_worker_ext.GroveWorkerExtension"
OWNER_PID_ENV = "GROVE_ENGINE_OWNER_PID"  # read by activities/vllm_worker_ext.py in the engine's processes


class EngineError(Exception):
    """Base of the policy engine's errors."""


class EmptyPromptError(EngineError, ValueError):
    """A generation was asked for with no prompt tokens."""


class PromptTooLongError(EngineError, ValueError):
    """The prompt leaves no room for one generated token within the engine's max_model_len."""


class TokenIdOutOfRangeError(EngineError, ValueError):
    """A prompt token id is outside the model's vocabulary."""


class GenerationAbortedError(EngineError):
    """vLLM aborted the request (engine shutdown or abort); no completion is reported."""


class EngineOutputError(EngineError):
    """vLLM returned an output that breaks the capture contract (e.g. a logprob count mismatch)."""


class VersionStraddleError(EngineError):
    """A call's tokens were not all sampled under the version it was admitted under."""


class StaleVersionError(EngineError, ValueError):
    """A publication of a version older than the engine's current one."""


class VersionConflictError(EngineError, ValueError):
    """A publication of the current version number with different weights."""


class WeightsMismatchError(EngineError, ValueError):
    """A weights folder does not hold exactly the tensors (names, shapes) of the served model."""


class PublishFailedError(EngineError):
    """The weight reload failed and was rolled back: the engine still serves the previous version."""


class EngineBrokenError(EngineError):
    """A failed reload could not be rolled back; the worker must be restarted."""


class EngineDiedError(EngineError):
    """vLLM's engine core died (a crash inside the model step, its process killed). Unrecoverable in
    this process: the call is retryable elsewhere, and the worker exits (cli/worker.py) so Temporal
    sends its calls to a live worker instead of to an engine that answers every call with an error."""


class NonFiniteLogprobError(EngineError):
    """The engine returned a NaN or infinite behaviour logprob (non-finite logits: corrupt or diverged
    weights). The call fails here, at generation, instead of poisoning a training step later."""


class StepBudgetTooSmallError(EngineLimitsError):
    """max_num_batched_tokens < max_model_len on CPU, where prompts are never split over steps."""


class KVCacheTooSmallError(EngineLimitsError):
    """The KV cache cannot hold one context of max_model_len tokens."""


class EngineConfig(BaseModel):
    """How a worker starts its engine."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model_dir: Path
    initial_version: int = Field(default=0, ge=0)
    dtype: str = "float32"
    max_model_len: int = Field(default=DEFAULT_MAX_MODEL_LEN, ge=16)
    kv_cache_bytes: int = Field(default=DEFAULT_KV_CACHE_BYTES, ge=16 * 2**20)
    max_num_batched_tokens: int | None = Field(default=None, ge=16)  # None: step_token_budget's default
    max_num_seqs: int = Field(default=64, ge=1)
    enforce_eager: bool = True  # torch.compile costs ~75 s of startup on CPU for no gain at this size
    enable_prefix_caching: bool = True
    seed: int = 0
    # The model family's tool-call format (chat/tool_parsers.py): grove's "hermes" or the name of a
    # vLLM parser (`--tool-call-parser`), e.g. "qwen3_coder", "llama3_json", "mistral", "pythonic".
    # Checked against the model's tokenizer when the engine starts.
    tool_call_parser: str = "hermes"

    @classmethod
    def from_limits(cls, model_dir: Path, limits: EngineLimits | None, **fields: Any) -> EngineConfig:
        """The config of an engine for `model_dir` under a run's (or a worker's flags') limits."""
        return cls(model_dir=model_dir, **(limits or EngineLimits()).model_dump(), **fields)

    @property
    def step_token_budget(self) -> int:
        """Tokens one engine step may schedule: at least one whole prompt (chunked prefill is off)."""
        return self.max_num_batched_tokens or max(self.max_model_len, 2048)


def check_engine_limits(config: EngineConfig, *, chunked_prefill: bool = False) -> None:
    """Refuse limits the model or the engine cannot honour, with what to change (before vLLM starts)."""
    where = f"engine for model {str(config.model_dir)!r}"
    check_positions(config.max_model_len, model_positions(config.model_dir), where)
    if not chunked_prefill and config.step_token_budget < config.max_model_len:
        raise StepBudgetTooSmallError(
            f"{where}: max_num_batched_tokens={config.step_token_budget} < max_model_len="
            f"{config.max_model_len}; without chunked prefill (CPU) a prompt is scheduled whole, so a long "
            "one would never run: raise --max-num-batched-tokens / engine.max_num_batched_tokens or leave "
            "it unset"
        )
    need = kv_bytes_per_token(config.model_dir, config.dtype) * config.max_model_len
    if config.kv_cache_bytes < need:
        raise KVCacheTooSmallError(
            f"{where}: kv_cache_bytes={config.kv_cache_bytes} cannot hold one context of max_model_len="
            f"{config.max_model_len} tokens ({need} bytes at {config.dtype}); raise --kv-cache-bytes / "
            f"engine.kv_cache_bytes to at least {need} or lower max_model_len"
        )


@dataclass(frozen=True)
class Generation:
    """What the engine did for one call."""

    prompt_ids: np.ndarray  # int32 [P], exactly as sent
    completion_ids: np.ndarray  # int32 [C]
    logprobs: np.ndarray  # float32 [C], processed logprob of each sampled token
    finish_reason: str  # "stop" | "length"
    policy_version: int
    text: str  # decoded completion (special tokens kept, a final stop token dropped)


@dataclass(frozen=True)
class PublishReport:
    version: int
    previous_version: int
    seconds: float  # gate closed -> engine resumed
    drain_seconds: float  # of which: waiting for admitted calls to finish
    reload_seconds: float  # of which: in-place reload + repack
    repacked: tuple[str, ...]  # modules whose packed weights were rebuilt
    already_current: bool = False


@dataclass
class BatchStats:
    """What vLLM's scheduler reported: proof that concurrent calls were batched, and prefix-cache use."""

    steps: int = 0  # engine steps with at least one running request
    max_running: int = 0
    running_hist: dict[int, int] = field(default_factory=dict)
    prefix_cache_hits: int = 0  # prompt tokens served from the prefix cache

    def record(self, running: int, cache_hits: int) -> None:
        self.prefix_cache_hits += cache_hits
        if running > 0:
            self.steps += 1
            self.max_running = max(self.max_running, running)
            self.running_hist[running] = self.running_hist.get(running, 0) + 1

    def reset(self) -> None:
        self.steps, self.max_running, self.running_hist, self.prefix_cache_hits = 0, 0, {}, 0


def weight_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape over all *.safetensors files of an HF model folder."""
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise WeightsMismatchError(
            f"weights folder {folder} holds no *.safetensors file; expected an HF model folder "
            "written with save_pretrained(safe_serialization=True)"
        )
    shapes: dict[str, tuple[int, ...]] = {}
    for path in files:
        try:
            with safe_open(str(path), framework="np") as f:
                for name in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                    shapes[name] = tuple(f.get_slice(name).get_shape())
        except Exception as exc:  # safetensors raises its own error type on a corrupt header
            raise WeightsMismatchError(
                f"weights file {path} is not a readable safetensors file: {exc}"
            ) from exc
    return shapes


def weights_fingerprint(folder: Path) -> str:
    """sha256 over (file name, file sha256) of the folder's *.safetensors files, in name order."""
    h = hashlib.sha256()
    for path in sorted(Path(folder).glob("*.safetensors")):
        h.update(path.name.encode())
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


Shapes = dict[str, tuple[int, ...]]


def check_same_tensors(expected: Shapes, got: Shapes, folder: Path) -> None:
    """Fail unless `got` has exactly the names and shapes of `expected` (vLLM would silently keep
    the old values of a missing tensor, so a partial checkpoint must never reach it)."""
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    if missing or extra:
        raise WeightsMismatchError(
            f"weights folder {folder} does not match the served model: missing {missing[:5]} "
            f"({len(missing)}), unexpected {extra[:5]} ({len(extra)}); publish a checkpoint of the same "
            "architecture"
        )
    for name, shape in expected.items():
        if got[name] != shape:
            raise WeightsMismatchError(
                f"weights folder {folder}: tensor {name} has shape {got[name]}, the served model has "
                f"{shape}; publish a checkpoint of the same architecture"
            )


class _VersionGate:
    """Admits generations under one version; a publication closes it and waits for admitted ones."""

    def __init__(self, version: int) -> None:
        self.version = version
        self.admitted_total = 0  # generations admitted since start
        self._busy_s = 0.0  # seconds with at least one generation admitted (engine utilisation)
        self._busy_since: float | None = None
        self._active = 0
        self._open = asyncio.Event()
        self._open.set()
        self._idle = asyncio.Event()
        self._idle.set()

    @asynccontextmanager
    async def admitted(self) -> AsyncIterator[int]:
        while not self._open.is_set():
            await self._open.wait()
        self._active += 1
        self.admitted_total += 1
        if self._active == 1:
            self._busy_since = time.monotonic()
        self._idle.clear()
        try:
            yield self.version
        finally:
            self._active -= 1
            if self._active == 0:
                self._busy_s += time.monotonic() - (self._busy_since or time.monotonic())
                self._busy_since = None
                self._idle.set()

    @property
    def busy_seconds(self) -> float:
        """Seconds during which at least one generation was admitted (so far, including now)."""
        open_s = time.monotonic() - self._busy_since if self._busy_since is not None else 0.0
        return self._busy_s + open_s

    @property
    def active(self) -> int:
        return self._active

    @property
    def is_open(self) -> bool:
        return self._open.is_set()

    async def close_and_drain(self) -> None:
        self._open.clear()
        await self._idle.wait()

    def reopen(self, version: int) -> None:
        self.version = version
        self._open.set()


def _stats_logger_factory(stats: BatchStats):
    from vllm.v1.metrics.loggers import StatLoggerBase

    class _SchedulerStatsRecorder(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            pass

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
            if scheduler_stats is not None:
                cache = scheduler_stats.prefix_cache_stats
                stats.record(scheduler_stats.num_running_reqs, cache.hits if cache is not None else 0)

        def log_engine_initialized(self) -> None:
            pass

    return _SchedulerStatsRecorder


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def _scheduling(config: EngineConfig, on_cpu: bool) -> dict[str, Any]:
    if on_cpu:
        return {"enable_chunked_prefill": False, "max_num_batched_tokens": config.step_token_budget}
    # GPUs keep chunked prefill; an explicit budget still applies
    return (
        {}
        if config.max_num_batched_tokens is None
        else {"max_num_batched_tokens": config.max_num_batched_tokens}
    )


class PolicyEngine:
    """One vLLM AsyncLLM (its engine core in a child process) serving the current policy version."""

    def __init__(self, config: EngineConfig, llm: Any, stats: BatchStats) -> None:
        self.config = config
        self._llm = llm
        self._tokenizer = llm.get_tokenizer()
        self._vocab_size = int(llm.model_config.get_vocab_size())
        self._stop_ids = self._model_stop_ids(llm)
        self._gate = _VersionGate(config.initial_version)
        self._publish_lock = asyncio.Lock()
        self._shapes = weight_shapes(config.model_dir)
        self._source = Path(config.model_dir)
        self._fingerprint = weights_fingerprint(config.model_dir)
        self._run: str | None = None  # the run whose policy lineage is served; None: the start-up weights
        self._broken: str | None = None
        self._died = asyncio.Event()
        self._death: str | None = None
        self._gates = Gates.from_env()  # test gates: None unless $GROVE_TEST_GATES is set
        self.batch_stats = stats
        self.tool_parser: ToolCallParser = HermesParser()  # start() sets the configured one

    @classmethod
    async def start(cls, config: EngineConfig) -> PolicyEngine:
        """Start the engine (10-30 s on CPU) and label its weights with `config.initial_version`.
        Raises an EngineLimitsError (before vLLM starts) for limits the model cannot honour."""
        from transformers import AutoTokenizer
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        on_cpu = _on_cpu()
        check_engine_limits(config, chunked_prefill=not on_cpu)
        # A parser the model's tokenizer cannot serve fails here, before any engine process starts.
        parser = tool_parser(config.tool_call_parser, AutoTokenizer.from_pretrained(str(config.model_dir)))
        args = AsyncEngineArgs(
            model=str(config.model_dir),
            dtype=config.dtype,
            seed=config.seed,
            enforce_eager=config.enforce_eager,
            max_model_len=config.max_model_len,
            kv_cache_memory_bytes=config.kv_cache_bytes,
            max_num_seqs=config.max_num_seqs,
            enable_prefix_caching=config.enable_prefix_caching,
            # On CPU, never split a prompt over engine steps. vLLM discards the token sampled after a
            # partial prefill and rewinds the request's seeded generator by `gen.set_offset(
            # gen.get_offset() - 4)` (gpu_model_runner.py, a CUDA Philox offset); a CPU torch.Generator
            # has no offset, so the first seeded prompt that gets chunked (a GRPO group of long prompts
            # sharing a step) raises "CPU Generator does not use offset" and kills the engine core.
            # Without chunking a prompt that does not fit the step's remaining token budget waits for
            # the next step, every seeded request is sampled from an untouched generator (per-call
            # determinism holds) and logprobs are unchanged. CUDA generators have offsets: GPUs keep
            # vLLM's default (chunked prefill, its own token budget).
            **_scheduling(config, on_cpu),
            logprobs_mode=LOGPROBS_MODE,
            worker_extension_cls=WORKER_EXTENSION,
            disable_log_stats=True,
        )
        stats = BatchStats()
        # The engine's child processes watch this process and die with it, even on SIGKILL
        # (activities/vllm_worker_ext.py); spawn children inherit the environment.
        os.environ[OWNER_PID_ENV] = str(os.getpid())
        # No local reference to the AsyncLLM outlives this call (see shutdown): only the engine holds it.
        engine = cls(
            config, AsyncLLM.from_engine_args(args, stat_loggers=[_stats_logger_factory(stats)]), stats
        )
        engine.tool_parser = parser
        await engine._llm.update_weight_version(str(config.initial_version))
        return engine

    @staticmethod
    def _model_stop_ids(llm: Any) -> frozenset[int]:
        eos = llm.get_tokenizer().eos_token_id
        gen_cfg = llm.model_config.try_get_generation_config() or {}
        extra = gen_cfg.get("eos_token_id", [])
        extra = [extra] if isinstance(extra, int) else list(extra or [])
        return frozenset([*([eos] if eos is not None else []), *extra])

    @property
    def version(self) -> int:
        return self._gate.version

    @property
    def in_flight(self) -> int:
        """Generations admitted and not yet finished."""
        return self._gate.active

    @property
    def busy_seconds(self) -> float:
        """Seconds with at least one generation in flight since the engine started."""
        return self._gate.busy_seconds

    @property
    def calls_admitted(self) -> int:
        return self._gate.admitted_total

    @property
    def publishing(self) -> bool:
        """A publication has closed the version gate: new generations wait until it is done."""
        return not self._gate.is_open

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def source_dir(self) -> Path:
        """The folder the current weights were loaded from (kept for a rollback)."""
        return self._source

    async def shutdown(self) -> None:
        """Stop the engine core process. Idempotent."""
        llm, self._llm = self._llm, None
        if llm is None:
            return
        llm.shutdown()
        await asyncio.sleep(0)  # let the cancelled output handler finish
        # Collect it now: AsyncLLM.__del__ calls shutdown() again, which fails noisily if it only runs
        # at interpreter exit, after the modules it uses are torn down.
        del llm
        gc.collect()

    async def weights_digest(self) -> str:
        """sha256 of the weights the model worker holds right now (tests: did a publish land?)."""
        (digest,) = await self._llm.collective_rpc("grove_weights_digest")
        return digest

    # ---- generation -------------------------------------------------------------------------

    def _check_prompt(self, prompt_ids: np.ndarray, request_id: str) -> None:
        if prompt_ids.size == 0:
            raise EmptyPromptError(f"request {request_id}: the prompt has no tokens; send at least one id")
        if prompt_ids.size >= self.config.max_model_len:
            raise PromptTooLongError(
                f"request {request_id}: prompt has {prompt_ids.size} tokens, the engine's max_model_len is "
                f"{self.config.max_model_len} (prompt + at least 1 generated token must fit); shorten or "
                "compact the context"
            )
        bad = np.flatnonzero((prompt_ids < 0) | (prompt_ids >= self._vocab_size))
        if bad.size:
            i = int(bad[0])
            raise TokenIdOutOfRangeError(
                f"request {request_id}: prompt token {i} is id {int(prompt_ids[i])}, outside the vocabulary "
                f"[0, {self._vocab_size}); the prompt was tokenized for a different model"
            )

    def sampling_params(self, sampling: SamplingConfig, seed: int) -> Any:
        """vLLM SamplingParams for `sampling`: exactly one logprob (the sampled token's) per position."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        return SamplingParams(
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=0,  # disabled: the learner does not mirror top-k
            max_tokens=sampling.max_tokens,
            stop_token_ids=list(sampling.stop_token_ids),
            ignore_eos=sampling.ignore_eos,
            seed=seed,
            logprobs=0,
            detokenize=False,  # text is decoded once below, identically for first runs and retries
            output_kind=RequestOutputKind.FINAL_ONLY,
        )

    async def generate(
        self, prompt_ids: Any, sampling: SamplingConfig, seed: int, request_id: str
    ) -> Generation:
        """Sample one completion for `prompt_ids` and record exactly what was sampled."""
        self._raise_if_broken()
        prompt = np.asarray(prompt_ids, dtype=np.int64).reshape(-1)
        self._check_prompt(prompt, request_id)
        params = self.sampling_params(sampling, seed)
        async with self._gate.admitted() as version:
            self._raise_if_broken()
            final = await self._final_output(prompt, params, request_id)
            generation = self._to_generation(final, prompt, version, request_id, sampling)
            if self._gates is not None:  # tests only: hold a finished call in flight (grove/gates.py)
                await self._gates.hold("generate", request_id)
        return generation

    async def _final_output(self, prompt: np.ndarray, params: Any, request_id: str) -> Any:
        final = None
        try:
            async for out in self._llm.generate(
                {"prompt_token_ids": prompt.tolist()}, params, request_id=request_id
            ):
                final = out
        except Exception as exc:
            if self._llm is not None and self._llm.errored:
                raise self._mark_died(f"request {request_id}: {type(exc).__name__}: {exc}") from exc
            raise
        return final

    # ---- engine death -----------------------------------------------------------------------

    def _mark_died(self, cause: str) -> EngineDiedError:
        if self._death is None:
            self._death = (
                f"the vLLM engine core of this worker died ({cause}); the call is retried on another "
                "worker and this worker exits; see the engine's traceback in this worker's log"
            )
            log.error("%s", self._death)
        self._died.set()
        return EngineDiedError(self._death)

    async def wait_died(self, check_every: float = 0.5) -> EngineDiedError:
        """Return (never raise) the error once the engine core is dead: noticed by a failed call at
        once, or by vLLM's own liveness monitor (a killed engine process) within `check_every` s."""
        while not self._died.is_set():
            if self._llm is not None and self._llm.errored:
                self._mark_died("vLLM reports the engine core dead")
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._died.wait(), check_every)
        return EngineDiedError(self._death)

    def _to_generation(
        self, final: Any, prompt: np.ndarray, version: int, request_id: str, sampling: SamplingConfig
    ) -> Generation:
        if final is None or not final.finished:
            raise GenerationAbortedError(f"request {request_id}: the engine returned no final output")
        out = final.outputs[0]
        if out.finish_reason not in ("stop", "length"):
            raise GenerationAbortedError(
                f"request {request_id}: finished with {out.finish_reason!r}; retry the call"
            )
        ids = np.asarray(out.token_ids, dtype=np.int32)
        logprobs = self._sampled_logprobs(out, ids, request_id)
        self._check_versions(out, version, ids.size, request_id)
        return Generation(
            prompt_ids=prompt.astype(np.int32),
            completion_ids=ids,
            logprobs=logprobs,
            finish_reason=out.finish_reason,
            policy_version=version,
            text=self.decode_completion(ids, sampling),
        )

    @staticmethod
    def _sampled_logprobs(out: Any, ids: np.ndarray, request_id: str) -> np.ndarray:
        entries = out.logprobs or []
        if len(entries) != ids.size:
            raise EngineOutputError(
                f"request {request_id}: {ids.size} sampled tokens but {len(entries)} logprob entries; "
                "the engine must return exactly one logprob per sampled token"
            )
        values = np.empty(ids.size, dtype=np.float32)
        for i, (tok, entry) in enumerate(zip(ids.tolist(), entries, strict=True)):
            if tok not in entry:
                raise EngineOutputError(
                    f"request {request_id}: no logprob for sampled token {tok} at position {i}"
                )
            values[i] = entry[tok].logprob
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            i = int(bad[0])
            raise NonFiniteLogprobError(
                f"request {request_id}: the behaviour logprob of sampled token {int(ids[i])} at position "
                f"{i} is {values[i]} ({bad.size} of {ids.size} positions non-finite); the served weights "
                "produce non-finite logits: check the published checkpoint (NaN/inf weights, a diverged "
                "step) before training on anything it samples"
            )
        return values

    @staticmethod
    def _check_versions(out: Any, version: int, n: int, request_id: str) -> None:
        spans = out.weight_versions or []
        labels = {s.version for s in spans}
        covered = sum(s.end - s.start for s in spans)
        if n and (labels != {str(version)} or covered != n):
            raise VersionStraddleError(
                f"request {request_id}: admitted under policy version {version} but the engine labelled its "
                f"{n} tokens {[(s.version, s.start, s.end) for s in spans]}; a weight update ran during the "
                "call, discard it and retry"
            )

    def stop_ids(self, sampling: SamplingConfig | None = None) -> frozenset[int]:
        """Token ids that end a generation: the model's EOS ids plus the call's own stop tokens."""
        return self._stop_ids | frozenset(sampling.stop_token_ids if sampling else ())

    def decode_completion(self, ids: np.ndarray, sampling: SamplingConfig) -> str:
        """Completion text with special tokens kept (some templates make tool-call tags special),
        minus a final stop token, whatever the finish reason: under `ignore_eos` a sampled EOS or
        <|im_end|> can be the last token of a completion cut at max_tokens ("length"), and it still
        ends the turn. The same rule as the continuation check's (chat/render.py `response_of`) and the
        splice's, so the text a harness echoes back is the response the next call is checked against,
        and renders to the tokens the model saw (a stop token in the middle stays in the text)."""
        stops = self.stop_ids(sampling)
        body = ids[:-1] if (ids.size and int(ids[-1]) in stops) else ids
        return self._tokenizer.decode(body.tolist(), skip_special_tokens=False)

    # ---- publication ------------------------------------------------------------------------

    def _raise_if_broken(self) -> None:
        if self._death is not None:
            raise EngineDiedError(self._death)
        if self._broken is not None:
            raise EngineBrokenError(self._broken)
        if self._llm is None:
            raise EngineBrokenError("the engine was shut down; start a new PolicyEngine")

    @property
    def run_id(self) -> str | None:
        return self._run

    async def publish(self, folder: Path, version: int, run_id: str | None = None) -> PublishReport:
        """Load the HF model folder `folder` as policy `version` without restarting the engine.

        Versions are ordered within one run's lineage. `run_id` naming another run than the one served
        switches lineage (one engine serving runs one after another, or a run resuming on an engine
        that served another): any version is accepted then, and it is loaded unless the engine already
        holds byte-identical weights under that version number. `run_id=None` stays in the lineage.
        """
        folder = Path(folder)
        async with self._publish_lock:
            self._raise_if_broken()
            current = self._gate.version
            if run_id is not None and run_id != self._run:
                fingerprint = weights_fingerprint(folder)
                if version == current and fingerprint == self._fingerprint:
                    self._run = run_id
                    return PublishReport(version, current, 0.0, 0.0, 0.0, (), already_current=True)
                check_same_tensors(self._shapes, weight_shapes(folder), folder)
                report = await self._swap(folder, version, fingerprint)
                self._run = run_id
                return report
            if version < current:
                raise StaleVersionError(
                    f"publication of policy version {version} from {folder} refused: the engine already "
                    f"serves version {current}; versions only move forward"
                )
            fingerprint = weights_fingerprint(folder)
            if version == current:
                return self._republish(folder, version, fingerprint)
            check_same_tensors(self._shapes, weight_shapes(folder), folder)
            return await self._swap(folder, version, fingerprint)

    def _republish(self, folder: Path, version: int, fingerprint: str) -> PublishReport:
        if fingerprint != self._fingerprint:
            raise VersionConflictError(
                f"policy version {version} is already served from {self._source} (weights sha256 "
                f"{self._fingerprint[:12]}), but {folder} holds different weights ({fingerprint[:12]}); "
                "a version number must always name the same weights"
            )
        return PublishReport(version, version, 0.0, 0.0, 0.0, (), already_current=True)

    async def _swap(self, folder: Path, version: int, fingerprint: str) -> PublishReport:
        previous = self._gate.version
        serving = previous
        t0 = time.perf_counter()
        await self._gate.close_and_drain()
        t_drained = time.perf_counter()
        try:
            await self._llm.pause_generation(mode="wait", clear_cache=True)
            repacked, reload_s = await self._reload_or_roll_back(folder, version)
            await self._llm.reset_prefix_cache()
            await self._llm.update_weight_version(str(version))
            self._source, self._fingerprint, serving = folder, fingerprint, version
        finally:
            if self._broken is None:
                await self._llm.resume_generation()
            self._gate.reopen(serving)
        return PublishReport(
            version=version,
            previous_version=previous,
            seconds=time.perf_counter() - t0,
            drain_seconds=t_drained - t0,
            reload_seconds=reload_s,
            repacked=tuple(repacked),
        )

    async def _reload_or_roll_back(self, folder: Path, version: int) -> tuple[list[str], float]:
        t = time.perf_counter()
        try:
            (repacked,) = await self._llm.collective_rpc(
                "grove_reload_weights", kwargs={"weights_path": str(folder)}
            )
            return repacked, time.perf_counter() - t
        except Exception as exc:
            log.error("loading %s as version %d failed: %s; rolling back", folder, version, exc)
            await self._roll_back(folder, version, exc)
            raise PublishFailedError(
                f"loading {folder} as policy version {version} failed ({type(exc).__name__}: {exc}); the "
                f"engine was rolled back to version {self._gate.version} from {self._source} and serves it"
            ) from exc

    async def _roll_back(self, folder: Path, version: int, cause: Exception) -> None:
        try:
            await self._llm.collective_rpc("grove_reload_weights", kwargs={"weights_path": str(self._source)})
            await self._llm.reset_prefix_cache()
        except Exception as exc:
            self._broken = (
                f"the engine is unusable: loading {folder} as version {version} failed ({cause}) and rolling "
                f"back to {self._source} failed too ({type(exc).__name__}: {exc}); restart the inference "
                "worker"
            )
            raise EngineBrokenError(self._broken) from exc
