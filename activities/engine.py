"""The policy engine of an inference worker: one vLLM AsyncLLM, exact token capture, weight publication.

One `PolicyEngine` per worker process. `generate` is token-in, token-out: prompt ids in; sampled ids,
one behaviour logprob per sampled token (vLLM `processed_logprobs`, see grove/sampling.py), the
finish reason and the policy version that produced them out. Concurrent calls go straight to the
engine, whose scheduler batches them; the worker never serialises generations.

Process model: vLLM 0.32's AsyncLLM always runs its EngineCore in a child process (AsyncMPClient);
`VLLM_ENABLE_V1_MULTIPROCESSING` only chooses where the model runs. We keep vLLM's default ("1": a separate
model-worker process, the "mp" executor), which on CPU binds the model's OpenMP thread to its own core ("0",
the model inside the EngineCore, leaves its threads unbound; its speed on CPU is unmeasured here:
docs/results.md section 6). Everything sent to the model worker (`collective_rpc`) is a plain value (a
folder path), never a tensor, so either setting works.

Faults (docs/reliability.md):
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
  (on CPU a reload leaves the head's pre-packed copy stale: activities/vllm_worker_ext.py), resets
  the prefix cache again (no block cached under the old weights is reused), sets the new version and
  resumes.
- vLLM labels every output token with the engine's weight version; a call whose tokens do not all
  carry the version it was admitted under raises `VersionStraddleError` instead of lying.
- Versions only move forward: an older version is refused (`StaleVersionError`). Publishing the
  version that is already current is a no-op when the weights are byte-identical (a retried
  publication activity) and a `VersionConflictError` when they are not.
- A failure inside the reload (layers left on the meta device) triggers a rollback to the
  previous weights folder; if even that fails the engine is marked broken and every later call
  raises `EngineBrokenError` (restart the worker).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from activities.cpu_binding import CpuBinding, bound_env, claim_cores
from activities.engine_config import EngineConfig, check_engine_limits, scheduling_args
from activities.engine_errors import (
    EmptyPromptError,
    EngineBrokenError,
    EngineDiedError,
    EngineOutputError,
    GenerationAbortedError,
    NonFiniteLogprobError,
    PromptTooLongError,
    PublishFailedError,
    StaleVersionError,
    TokenIdOutOfRangeError,
    VersionConflictError,
    VersionStraddleError,
)
from activities.engine_gate import BatchStats, VersionGate, stats_logger_factory
from activities.engine_weights import check_same_tensors, weight_shapes, weights_fingerprint
from chat.tool_parsers import HermesParser, ToolCallParser, tool_parser
from grove.gates import Gates
from grove.sampling import LOGPROBS_MODE, SamplingConfig

log = logging.getLogger(__name__)


WORKER_EXTENSION = "activities.vllm_worker_ext.GroveWorkerExtension"


OWNER_PID_ENV = "GROVE_ENGINE_OWNER_PID"  # read by activities/vllm_worker_ext.py in the engine's processes


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


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


class PolicyEngine:
    """One vLLM AsyncLLM (its engine core in a child process) serving the current policy version."""

    def __init__(self, config: EngineConfig, llm: Any, stats: BatchStats) -> None:
        self.config = config
        self._llm = llm
        self._tokenizer = llm.get_tokenizer()
        self._vocab_size = int(llm.model_config.get_vocab_size())
        self._stop_ids = self._model_stop_ids(llm)
        self._gate = VersionGate(config.initial_version)
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
        self.cpu_binding: CpuBinding | None = None  # start() sets it on CPU: the cores it claimed

    @classmethod
    async def start(cls, config: EngineConfig) -> PolicyEngine:
        """Start the engine (slow on CPU: it spawns vLLM's processes and loads the model; docs/results.md
        section 5) and label its weights with `config.initial_version`.
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
            dtype=config.dtype,  # type: ignore[arg-type]  # one of vLLM's dtype names (EngineConfig)
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
            **scheduling_args(config, on_cpu),
            logprobs_mode=LOGPROBS_MODE,  # type: ignore[arg-type]  # vLLM's "processed_logprobs"
            worker_extension_cls=WORKER_EXTENSION,
            disable_log_stats=True,
        )
        stats = BatchStats()
        # The engine's child processes watch this process and die with it, even on SIGKILL
        # (activities/vllm_worker_ext.py); spawn children inherit the environment.
        os.environ[OWNER_PID_ENV] = str(os.getpid())
        binding = claim_cores() if on_cpu else None  # cores no other engine of the host binds
        if binding is not None:
            log.info("engine for %s: %s", config.model_dir, binding.describe())
        try:
            with bound_env(binding):
                # No local reference to the AsyncLLM outlives this call (see shutdown): only the engine
                # holds it.
                engine = cls(
                    config, AsyncLLM.from_engine_args(args, stat_loggers=[stats_logger_factory(stats)]), stats
                )
        except BaseException:
            if binding is not None:
                binding.release()
            raise
        engine.cpu_binding = binding
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
        if self.cpu_binding is not None:
            self.cpu_binding.release()
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
