"""The ObjectStore contract, run against both backends (local files and a real localbucket S3 server),
then each backend's own failure modes."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from minio.error import S3Error

from infra.procs import free_port
from storage.base import (
    DigestMismatchError,
    InvalidKeyError,
    ObjectInfo,
    ObjectNotFoundError,
    PutOutcome,
    StoreUnreachableError,
)
from storage.local import TEMP_PREFIX, KeyPathConflictError, LocalStore, SymlinkedKeyError
from storage.s3 import (
    BucketNotFoundError,
    S3RequestError,
    S3Store,
    StoreAccessDeniedError,
    translate_s3_error,
)
from tests.bounds import PROCESS_WAIT

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    if request.param == "local":
        return LocalStore(tmp_path / "store")
    return request.getfixturevalue("s3_store")


def unreachable_s3(port: int, **kw) -> S3Store:
    return S3Store(f"127.0.0.1:{port}", "grove", access_key="a", secret_key="b", secure=False, **kw)


# -- the shared contract --------------------------------------------------------------------------


def test_put_get_stat_list_delete(store):
    store.put("rows/step-1/a.parquet", b"hello")
    store.put("rows/step-1/b.parquet", b"world!")
    store.put("rows/step-10/c", b"")
    store.put("staging/ep 1/ünï.bin", b"\x00\x01")

    assert store.get("rows/step-1/a.parquet") == b"hello"
    assert store.stat("rows/step-1/b.parquet") == ObjectInfo(key="rows/step-1/b.parquet", size=6)
    assert store.stat("rows/step-10/c") == ObjectInfo(key="rows/step-10/c", size=0)
    assert store.get("rows/step-10/c") == b""
    assert store.exists("staging/ep 1/ünï.bin")
    assert store.get("staging/ep 1/ünï.bin") == b"\x00\x01"

    assert store.list("rows/step-1/") == ["rows/step-1/a.parquet", "rows/step-1/b.parquet"]
    assert store.list("rows/step-1") == ["rows/step-1/a.parquet", "rows/step-1/b.parquet", "rows/step-10/c"]
    assert store.list("rows/step-1/b") == ["rows/step-1/b.parquet"]
    assert store.list("") == [
        "rows/step-1/a.parquet",
        "rows/step-1/b.parquet",
        "rows/step-10/c",
        "staging/ep 1/ünï.bin",
    ]
    assert store.list("nothing/") == []
    assert store.list("rows/step-2") == []

    store.put("rows/step-1/a.parquet", b"overwritten")
    assert store.get("rows/step-1/a.parquet") == b"overwritten"

    store.delete("rows/step-1/a.parquet")
    assert not store.exists("rows/step-1/a.parquet")
    assert store.stat("rows/step-1/a.parquet") is None
    with pytest.raises(ObjectNotFoundError):
        store.get("rows/step-1/a.parquet")
    store.delete("rows/step-1/a.parquet")  # idempotent
    store.delete("never/written")
    assert store.list("rows/") == ["rows/step-1/b.parquet", "rows/step-10/c"]


def test_put_if_absent_writes_then_verifies(store):
    assert store.put_if_absent("staging/e1/c0.npz", b"tokens") is PutOutcome.WRITTEN
    assert store.put_if_absent("staging/e1/c0.npz", b"tokens") is PutOutcome.VERIFIED
    assert store.get("staging/e1/c0.npz") == b"tokens"
    assert store.list("staging/") == ["staging/e1/c0.npz"]


def test_digest_mismatch_raises_and_keeps_stored_bytes(store):
    store.put_if_absent("ckpt/step-3/COMMIT", b"first writer")
    with pytest.raises(DigestMismatchError, match=r"ckpt/step-3/COMMIT"):
        store.put_if_absent("ckpt/step-3/COMMIT", b"different writer")
    assert store.get("ckpt/step-3/COMMIT") == b"first writer"


def test_binary_round_trip(store):
    data = bytes(range(256)) * 4 + b"\r\n\x00\xff" + "π".encode()
    store.put("bin/all-bytes", data)
    assert store.get("bin/all-bytes") == data
    assert store.stat("bin/all-bytes").size == 256 * 4 + 4 + 2


def test_large_object(store):
    # 6 MiB + 7: above minio's 5 MiB part size, so the S3 backend does a multipart upload.
    data = random.Random(7).randbytes(6 * 1024 * 1024 + 7)
    store.put("big/blob", data)
    assert store.stat("big/blob").size == 6_291_463
    assert store.get("big/blob") == data


def test_missing_key_raises_not_found(store):
    with pytest.raises(ObjectNotFoundError, match=r"'no/such/key'") as info:
        store.get("no/such/key")
    assert isinstance(info.value, KeyError)  # callers may treat a store like a mapping
    assert store.stat("no/such/key") is None
    assert not store.exists("no/such/key")


BAD_KEYS = ["../x", "a/../b", "/abs", "a//b", "a/", ""]
KEY_METHODS = {
    "put": lambda s, k: s.put(k, b"x"),
    "get": lambda s, k: s.get(k),
    "stat": lambda s, k: s.stat(k),
    "exists": lambda s, k: s.exists(k),
    "delete": lambda s, k: s.delete(k),
    "put_if_absent": lambda s, k: s.put_if_absent(k, b"x"),
}


@pytest.mark.parametrize("key", BAD_KEYS)
def test_bad_keys_raise_invalid_key_on_every_method(store, key):
    for name, call in KEY_METHODS.items():
        with pytest.raises(InvalidKeyError) as info:
            call(store, key)
        assert repr(key) in str(info.value), f"{name}({key!r}): message does not name the key"
    if key not in ("a/", ""):  # both are valid *prefixes* (a folder, everything)
        with pytest.raises(InvalidKeyError):
            store.list(key)
    assert store.list("") == []


# -- S3 backend -----------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["get", "put", "stat", "list", "delete"])
def test_s3_closed_port_is_unreachable_fast(op):
    port = free_port()  # bound then released: nothing listens there
    store = unreachable_s3(port)
    calls = {
        "get": lambda: store.get("k"),
        "put": lambda: store.put("k", b"x"),
        "stat": lambda: store.stat("k"),
        "list": lambda: store.list(""),
        "delete": lambda: store.delete("k"),
    }
    start = time.monotonic()
    with pytest.raises(StoreUnreachableError, match=rf"127\.0\.0\.1:{port}") as info:
        calls[op]()
    assert time.monotonic() - start < 5.0
    assert "Connection refused" in str(info.value)


def test_s3_unknown_host_is_unreachable_fast():
    store = S3Store("no-such-host.invalid:9000", "grove", access_key="a", secret_key="b", secure=False)
    start = time.monotonic()
    with pytest.raises(StoreUnreachableError, match=r"no-such-host\.invalid:9000"):
        store.get("k")
    assert time.monotonic() - start < 10.0


def test_s3_hung_server_times_out():
    # A socket that accepts TCP but never answers: the read timeout must fire, not hang for minutes.
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(16)
        store = unreachable_s3(hung.getsockname()[1], read_timeout=0.5, retries=1)
        start = time.monotonic()
        with pytest.raises(StoreUnreachableError, match=r"timed out"):
            store.stat("k")
        assert time.monotonic() - start < 5.0


def test_s3_validates_keys_before_any_request():
    store = unreachable_s3(free_port())
    with pytest.raises(InvalidKeyError):
        store.get("../x")


def test_s3_missing_bucket_is_named(s3_server):
    store = s3_server.store("never-created-bucket")
    with pytest.raises(BucketNotFoundError, match=r"'never-created-bucket'.*create_bucket=True"):
        store.stat("k")  # a bare HEAD 404 must not read as "absent"
    with pytest.raises(BucketNotFoundError):
        store.list("")


def test_s3_prefix_isolates_and_maps_keys(s3_server):
    bucket = "prefix-test"
    run_a = s3_server.store(bucket, prefix="runs/a", create_bucket=True)
    run_b = s3_server.store(bucket, prefix="runs/b/", create_bucket=True)
    whole = s3_server.store(bucket)
    run_a.put("rows/x", b"a")
    run_b.put("rows/x", b"b")
    assert run_a.list("") == ["rows/x"]
    assert run_a.get("rows/x") == b"a"
    assert run_b.get("rows/x") == b"b"
    assert whole.list("") == ["runs/a/rows/x", "runs/b/rows/x"]
    with pytest.raises(ObjectNotFoundError, match=r"'runs/a/nope'"):
        run_a.get("nope")


def _s3_error(code: str) -> S3Error:
    return S3Error(None, code, f"{code} message", "/grove/k", "req-1", "host-1")


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("NoSuchKey", ObjectNotFoundError),
        ("NoSuchBucket", BucketNotFoundError),
        ("AccessDenied", StoreAccessDeniedError),
        ("InvalidAccessKeyId", StoreAccessDeniedError),
        ("SignatureDoesNotMatch", StoreAccessDeniedError),
        ("InvalidArgument", S3RequestError),
    ],
)
def test_s3_error_codes_map_to_typed_errors(code, expected):
    # localbucket never refuses credentials, so the access-denied mapping is checked on the pure function.
    store = unreachable_s3(9)
    err = translate_s3_error(_s3_error(code), op="get", key="k", store=store)
    assert type(err) is expected
    assert "'grove'" in str(err)
    if expected is StoreAccessDeniedError:
        assert isinstance(err, StoreUnreachableError)
        assert "GROVE_S3_ACCESS_KEY" in str(err)


# -- local backend --------------------------------------------------------------------------------

_CRASH_CHILD = """
import os, sys
from storage.local import LocalStore
os.replace = lambda *a, **k: os._exit(17)  # die between writing the temp file and renaming it
LocalStore(sys.argv[1]).put(sys.argv[2], b"new bytes that never commit")
"""


@pytest.mark.parametrize("key", ["fresh/key", "old/key"])
def test_local_crash_mid_write_leaves_no_visible_object(tmp_path, key):
    store = LocalStore(tmp_path / "store")
    store.put("old/key", b"old bytes")
    done = subprocess.run(
        [sys.executable, "-c", _CRASH_CHILD, str(tmp_path / "store"), key],
        cwd=REPO_ROOT,
        timeout=PROCESS_WAIT,
    )
    assert done.returncode == 17  # it really died mid-write
    leftovers = list((tmp_path / "store" / key.split("/")[0]).glob(f"{TEMP_PREFIX}*"))
    assert len(leftovers) == 1 and leftovers[0].read_bytes() == b"new bytes that never commit"

    assert store.list("") == ["old/key"]
    assert store.get("old/key") == b"old bytes"
    assert not store.exists("fresh/key")
    store.put(key, b"after restart")
    assert store.get(key) == b"after restart"


def test_local_symlink_escape_is_refused(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"not yours")
    store = LocalStore(tmp_path / "store")
    (tmp_path / "store" / "link").symlink_to(outside, target_is_directory=True)
    (tmp_path / "store" / "file-link").symlink_to(outside / "secret")

    for call in (lambda: store.get("link/secret"), lambda: store.put("link/new", b"x")):
        with pytest.raises(SymlinkedKeyError, match=r"OUTSIDE the store root"):
            call()
    with pytest.raises(SymlinkedKeyError):
        store.get("file-link")
    with pytest.raises(SymlinkedKeyError):
        store.list("link/")
    assert store.list("") == []
    assert not (outside / "new").exists()
    assert (outside / "secret").read_bytes() == b"not yours"


def test_local_temp_prefix_is_reserved(tmp_path):
    store = LocalStore(tmp_path)
    with pytest.raises(InvalidKeyError, match=TEMP_PREFIX):
        store.put(f"a/{TEMP_PREFIX}x", b"x")


def test_local_object_and_folder_cannot_share_a_name(tmp_path):
    store = LocalStore(tmp_path)
    store.put("a", b"object")
    with pytest.raises(KeyPathConflictError, match=r"'a/b'"):
        store.put("a/b", b"x")
    store.put("c/d", b"x")
    with pytest.raises(KeyPathConflictError, match=r"'c'"):
        store.put("c", b"x")
    assert store.stat("c") is None  # a folder is not an object
    with pytest.raises(ObjectNotFoundError):
        store.get("c")
    store.delete("c")  # a no-op: must not remove the folder's objects
    assert store.get("c/d") == b"x"
    store.delete("c/d")  # prunes the emptied folder, so the name is free again
    store.put("c", b"now an object")
    assert store.list("") == ["a", "c"]
    assert sorted(os.listdir(tmp_path)) == ["a", "c"]
