"""transformers loads the tiny model folder offline; a training step reaches every parameter."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

from tests.bounds import PROCESS_WAIT

OFFLINE_LOAD = r"""
import json, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
model = AutoModelForCausalLM.from_pretrained(sys.argv[1])
ids = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}], add_generation_prompt=True,
                              return_dict=False)
with torch.no_grad():
    logits = model(torch.tensor([ids])).logits
print(json.dumps({"class": type(model).__name__, "dtype": str(model.dtype), "vocab": len(tok),
                  "shape": list(logits.shape), "finite": bool(torch.isfinite(logits).all())}))
"""


def test_loads_with_the_hub_offline(tiny_model_dir, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HOME": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-c", OFFLINE_LOAD, str(tiny_model_dir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=PROCESS_WAIT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    # prompt "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n" has > 10 tokens
    assert result["class"] == "Qwen3ForCausalLM" and result["dtype"] == "torch.float32"
    assert result["vocab"] == 2048 and result["shape"][0] == 1 and result["shape"][2] == 2048
    assert result["shape"][1] > 10 and result["finite"]


def test_forward_backward_gives_finite_loss_and_grads_everywhere(tiny_model_dir, tiny_tokenizer):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    model.train()
    text = "<|im_start|>user\nWhat is 12 + 7?<|im_end|>\n<|im_start|>assistant\n12 + 7 = 19<|im_end|>\n"
    ids = torch.tensor([tiny_tokenizer.encode(text, add_special_tokens=False)])
    logits = model(input_ids=ids).logits
    loss = torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:])
    loss.backward()
    assert torch.isfinite(loss)
    without_grad = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert without_grad == []
    assert sum(p.numel() for p in model.parameters()) == 1_049_984  # tied lm_head counted once
