"""The tiny model builder: byte-identical rebuilds, seed sensitivity, the promised shape, pretraining."""

from __future__ import annotations

import json
import math

import pytest
from pydantic import ValidationError
from safetensors.numpy import load_file

from models.tiny import TinyModelSpec, ToolDrillSpec, build_tiny_model

# A build small enough for a unit test that still runs the whole pipeline, copy drills and pretraining
# included.
SMALL = dict(drill_steps=5, drill_documents=200, pretrain_steps=20, batch_size=4, seq_len=64, warmup_steps=2)
EXPECTED_FILES = {
    "chat_template.jinja",
    "config.json",
    "generation_config.json",
    "grove_model.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
}
# Hand count for hidden 128, 4 layers, 4 heads / 2 KV heads of dim 32, MLP 384, vocab 2048, tied:
# embeddings 2048*128 = 262144; per layer q 128*128 + k 128*64 + v 128*64 + o 128*128 = 49152,
# MLP 3*128*384 = 147456, q/k norms 32+32, two RMSNorms 2*128 -> 196928; 4 layers 787712; final norm 128.
EXPECTED_PARAMS = 262144 + 4 * 196928 + 128


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-builds")
    reports = {
        "a": build_tiny_model(root / "a", seed=3, **SMALL),
        "b": build_tiny_model(root / "b", seed=3, **SMALL),
        "c": build_tiny_model(root / "c", seed=4, **SMALL),
    }
    return root, reports


def test_same_seed_gives_byte_identical_files(builds):
    root, _ = builds
    files_a = {p.name for p in (root / "a").iterdir()}
    assert files_a == EXPECTED_FILES
    for name in sorted(files_a):
        assert (root / "a" / name).read_bytes() == (root / "b" / name).read_bytes(), name


def test_different_seed_gives_different_weights(builds):
    root, _ = builds
    a, c = load_file(root / "a" / "model.safetensors"), load_file(root / "c" / "model.safetensors")
    assert a.keys() == c.keys()
    same = [k for k in a if (a[k] == c[k]).all()]
    assert same == []


def test_shape_and_parameter_count(builds):
    root, reports = builds
    tensors = load_file(root / "a" / "model.safetensors")
    assert sum(t.size for t in tensors.values()) == EXPECTED_PARAMS == reports["a"].num_parameters
    assert all(t.dtype.name == "float32" for t in tensors.values())
    assert "lm_head.weight" not in tensors  # tied to the embeddings
    config = json.loads((root / "a" / "config.json").read_text())
    expected = {
        "architectures": ["Qwen3ForCausalLM"],
        "hidden_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "intermediate_size": 384,
        "vocab_size": 2048,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": True,
        "dtype": "float32",
    }
    assert {k: config[k] for k in expected} == expected


def test_generation_stops_at_im_end(builds):
    root, _ = builds
    generation = json.loads((root / "a" / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [2, 0]  # <|im_end|>, <|endoftext|>
    assert generation["top_k"] == 0 and generation["top_p"] == 1.0 and generation["temperature"] == 1.0


def test_pretraining_lowers_the_loss_from_uniform(builds):
    _, reports = builds
    losses = reports["a"].losses
    assert len(losses) == SMALL["drill_steps"] + SMALL["pretrain_steps"]
    # Random init with std 0.02 gives near-zero logits: the first loss is about ln(vocab).
    assert abs(losses[0] - math.log(2048)) < 0.1
    assert max(losses[-5:]) < losses[0] - 1.5


def test_fingerprint_names_every_knob():
    base = TinyModelSpec()
    assert TinyModelSpec().fingerprint() == base.fingerprint()
    assert len(base.fingerprint()) == 16
    variants = [
        TinyModelSpec(seed=1),
        TinyModelSpec(pretrain_steps=1),
        TinyModelSpec(learning_rate=1e-3),
        TinyModelSpec(drill_steps=1),
    ]
    assert len({base.fingerprint(), *(v.fingerprint() for v in variants)}) == 5
    with_tools = [TinyModelSpec(tools=ToolDrillSpec()), TinyModelSpec(tools=ToolDrillSpec(long_steps=1))]
    assert len({base.fingerprint(), *(v.fingerprint() for v in with_tools)}) == 3
    # a spec without tool phases serialises as it did before the field existed: cached entries stay valid
    assert "tools" not in json.loads(TinyModelSpec().model_dump_json(exclude={"tools"}))
    assert TinyModelSpec(tools=None).fingerprint() == base.fingerprint()


# The whole tool pipeline at toy size: tokenizer on drills + OpenCode's text, copy drills, corpus,
# short and long tool phases with weighted losses.
TOOLS_SMALL = dict(
    SMALL,
    pretrain_steps=2,
    max_position_embeddings=32768,
    tools=ToolDrillSpec(
        short_documents=40,
        short_steps=3,
        short_seq_len=256,
        short_batch_size=2,
        long_documents=12,
        long_steps=2,
        long_seq_len=1024,
        long_batch_size=1,
        tokenizer_documents=30,
    ),
)


def test_tool_build_is_deterministic_and_holds_long_contexts(tmp_path):
    a = build_tiny_model(tmp_path / "a", **TOOLS_SMALL)
    b = build_tiny_model(tmp_path / "b", **TOOLS_SMALL)
    for name in sorted(p.name for p in (tmp_path / "a").iterdir()):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert len(a.losses) == 5 + 2 + 3 + 2 and all(math.isfinite(x) for x in a.losses) and a.losses == b.losses
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    assert config["max_position_embeddings"] == 32768
    tokenizer = json.loads((tmp_path / "a" / "tokenizer_config.json").read_text())
    assert tokenizer["model_max_length"] == 32768


def test_tool_windows_must_fit_the_positions():
    with pytest.raises(ValidationError, match="tools.long_seq_len=2048 exceeds max_position_embeddings=1024"):
        TinyModelSpec(max_position_embeddings=1024, seq_len=128, tools=ToolDrillSpec())


def test_inconsistent_spec_is_rejected():
    with pytest.raises(ValidationError, match="multiple of num_kv_heads"):
        TinyModelSpec(num_heads=4, num_kv_heads=3)
    with pytest.raises(ValidationError, match="head_dim"):
        TinyModelSpec(head_dim=48)  # vLLM's CPU attention has no kernel for it
    with pytest.raises(ValidationError, match="extra"):
        TinyModelSpec(hidden=64)


def test_an_untrained_twin_has_the_builds_tokenizer_shape_and_positions_not_its_weights(tmp_path):
    spec = TinyModelSpec(**TOOLS_SMALL)
    twin = spec.untrained()
    assert twin.total_steps == 0 and twin.fingerprint() != spec.fingerprint()
    assert twin.model_dump(exclude={"drill_steps", "pretrain_steps", "tools"}) == spec.model_dump(
        exclude={"drill_steps", "pretrain_steps", "tools"}
    )
    trained, untrained = build_tiny_model(tmp_path / "a", spec), build_tiny_model(tmp_path / "b", twin)
    assert len(trained.losses) == spec.total_steps and untrained.losses == []
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "config.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    a, b = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert any(not (a[k] == b[k]).all() for k in a)


@pytest.mark.long  # builds tiny-tools and tiny-copy (~16 min on 2 cores: docs/results.md section 2.1)
def test_the_tests_tools_twin_has_tiny_copys_tokenizer_and_positions():
    """The default suite counts tiny-copy's tokens and reads its positions on tiny-tools' untrained twin
    (tests/fixtures/models.py `tools_twin_dir`): what it stands for must match the real builds."""
    from models.registry import ensure_model
    from tests.fixtures.models import build_tools_twin

    twin = build_tools_twin()
    for name in ("tiny-tools", "tiny-copy"):
        real = ensure_model(name)
        for file in ("tokenizer.json", "chat_template.jinja"):
            assert (twin / file).read_bytes() == (real / file).read_bytes(), (name, file)
        positions = [
            json.loads((d / "config.json").read_text())["max_position_embeddings"] for d in (twin, real)
        ]
        assert positions[0] == positions[1] == 32768, name
