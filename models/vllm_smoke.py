"""Load a model folder in a real vLLM engine, generate from token ids, and write what came back as JSON.

Run as its own process: `python -m models.vllm_smoke MODEL_DIR REQUEST.json RESULT.json`. A separate
process keeps vLLM's process-wide side effects (its in-process engine replaces `torch.set_num_threads`
with a no-op, and it reads its settings from the environment) out of the caller, e.g. a pytest
session that also builds models deterministically. The engine runs in-process
(VLLM_ENABLE_V1_MULTIPROCESSING=0: the fastest start on CPU) and eager (no torch.compile).

The request is a `SmokeRequest`; the result a `SmokeResult` with per-token sampled logprobs
(`logprobs=0`: exactly the sampled token's logprob per position) and the load time. The same
command works with CUDA vLLM on a GPU host.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

DType = Literal["auto", "half", "float16", "bfloat16", "float", "float32"]  # vLLM's LLM(dtype=...)


class MissingLogprobsError(RuntimeError):
    """vLLM returned a generation without the sampled token's logprob that `logprobs=0` asks for."""


class SmokeGeneration(BaseModel):
    prompt_token_ids: list[int]
    sampling_params: dict[str, Any]  # SamplingParams keyword arguments; logprobs=0 is forced


class SmokeRequest(BaseModel):
    dtype: DType = "float32"
    max_model_len: int = 1024
    kv_cache_memory_bytes: int = 128 * 2**20
    seed: int = 0
    generations: list[SmokeGeneration]


class SmokeOutput(BaseModel):
    token_ids: list[int]
    logprobs: list[float]  # the sampled token's logprob at each generated position
    finish_reason: str | None
    stop_reason: int | str | None


class SmokeResult(BaseModel):
    model_dir: str
    import_seconds: float
    load_seconds: float
    generate_seconds: float
    outputs: list[SmokeOutput]


def _sampling_kwargs(generation: SmokeGeneration) -> dict[str, Any]:
    kwargs = {**generation.sampling_params, "logprobs": 0}
    if "logit_bias" in kwargs:  # JSON object keys are strings; vLLM wants token ids
        kwargs["logit_bias"] = {int(k): float(v) for k, v in kwargs["logit_bias"].items()}
    return kwargs


def _sampled_logprobs(
    token_ids: Sequence[int], steps: Sequence[Mapping[int, Any] | None] | None
) -> list[float]:
    if steps is None:
        raise MissingLogprobsError("vLLM returned no logprobs for a generation that asked logprobs=0")
    values = []
    for i, (tok, step) in enumerate(zip(token_ids, steps, strict=True)):
        if step is None:
            raise MissingLogprobsError(f"vLLM returned no logprob at generated position {i} (token {tok})")
        values.append(step[tok].logprob)
    return values


def run_smoke(model_dir: Path, request: SmokeRequest) -> SmokeResult:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    t0 = time.perf_counter()
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    t1 = time.perf_counter()
    llm = LLM(
        model=str(model_dir),
        dtype=request.dtype,
        seed=request.seed,
        enforce_eager=True,
        max_model_len=request.max_model_len,
        kv_cache_memory_bytes=request.kv_cache_memory_bytes,
    )
    t2 = time.perf_counter()
    prompts = [TokensPrompt(prompt_token_ids=g.prompt_token_ids) for g in request.generations]
    params = [SamplingParams(**_sampling_kwargs(g)) for g in request.generations]
    results = llm.generate(prompts, params, use_tqdm=False)
    t3 = time.perf_counter()
    outputs = []
    for res in results:
        out = res.outputs[0]
        logprobs = _sampled_logprobs(out.token_ids, out.logprobs)
        outputs.append(
            SmokeOutput(
                token_ids=list(out.token_ids),
                logprobs=logprobs,
                finish_reason=out.finish_reason,
                stop_reason=out.stop_reason,
            )
        )
    return SmokeResult(
        model_dir=str(model_dir),
        import_seconds=t1 - t0,
        load_seconds=t2 - t1,
        generate_seconds=t3 - t2,
        outputs=outputs,
    )


class SmokeProcessError(RuntimeError):
    """The vLLM smoke process exited non-zero (engine failed to load or to generate)."""


def run_smoke_subprocess(
    model_dir: Path, request: SmokeRequest, workdir: Path, *, timeout_s: float = 600
) -> SmokeResult:
    """Run `python -m models.vllm_smoke` in a child process (in-process engine, hub offline)."""
    request_path, result_path = workdir / "smoke_request.json", workdir / "smoke_result.json"
    request_path.write_text(request.model_dump_json())
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "models.vllm_smoke", str(model_dir), str(request_path), str(result_path)]
    repo_root = Path(__file__).resolve().parents[1]
    proc = subprocess.run(cmd, cwd=repo_root, env=env, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise SmokeProcessError(
            f"vLLM smoke run on model folder {str(model_dir)!r} exited with {proc.returncode}; "
            f"its stderr ends with:\n{proc.stderr[-4000:]}"
        )
    return SmokeResult.model_validate_json(result_path.read_text())


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python -m models.vllm_smoke MODEL_DIR REQUEST.json RESULT.json", file=sys.stderr)
        return 2
    model_dir, request_path, result_path = (Path(a) for a in argv)
    request = SmokeRequest.model_validate_json(request_path.read_text())
    result_path.write_text(run_smoke(model_dir, request).model_dump_json(indent=1))
    return 0


if __name__ == "__main__":  # vLLM may spawn workers that re-import this module: keep the guard
    sys.exit(main(sys.argv[1:]))
