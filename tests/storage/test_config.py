"""Store URLs and configs: parsing, typed errors, credentials from the environment, GROVE_STORE."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from storage.config import (
    MissingCredentialsError,
    S3Credentials,
    StoreConfig,
    StoreConfigError,
    open_store,
    s3_credentials_from_env,
    store_from_env,
)
from storage.local import LocalStore
from storage.s3 import S3Store

CRED_VARS = ("GROVE_S3_ACCESS_KEY", "GROVE_S3_SECRET_KEY", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")


@pytest.fixture
def no_creds(monkeypatch):
    for var in CRED_VARS:
        monkeypatch.delenv(var, raising=False)


def test_file_url_and_plain_path_open_a_local_store(tmp_path):
    by_url = open_store(f"file://{tmp_path}/a store")
    by_path = open_store(tmp_path / "plain")
    assert isinstance(by_url, LocalStore) and by_url.root == tmp_path.resolve() / "a store"
    assert isinstance(by_path, LocalStore) and by_path.root == tmp_path.resolve() / "plain"
    by_url.put("k", b"v")
    assert (tmp_path / "a store" / "k").read_bytes() == b"v"


def test_relative_path_is_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert StoreConfig.from_url("./rel/store") == StoreConfig(
        kind="file", path=tmp_path.resolve() / "rel/store"
    )


def test_s3_url_fields():
    url = "s3://grove/runs/r1?endpoint=10.0.0.5:9000&secure=0&region=eu-west-1&create=1"
    assert StoreConfig.from_url(url) == StoreConfig(
        kind="s3",
        bucket="grove",
        prefix="runs/r1",
        endpoint="10.0.0.5:9000",
        secure=False,
        region="eu-west-1",
        create_bucket=True,
    )


def test_s3_url_defaults():
    assert StoreConfig.from_url("s3://grove?endpoint=s3.example.com:443") == StoreConfig(
        kind="s3", bucket="grove", prefix="", endpoint="s3.example.com:443", secure=True, region="us-east-1"
    )


@pytest.mark.parametrize(
    "url",
    [
        "s3://grove/runs/r1?endpoint=h:9000&secure=0&region=us-east-1&create=1",
        "s3://grove?endpoint=h:9000&secure=1&region=eu-west-1&create=0",
        "file:///data/grove%20store",
    ],
)
def test_canonical_urls_round_trip(url):
    assert StoreConfig.from_url(url).url() == url


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("gs://bucket/x", "unknown scheme 'gs'"),
        ("", "empty store URL"),
        ("s3://bucket/x", "no endpoint"),
        ("s3://?endpoint=h:1", "names no bucket"),
        ("s3://b?endpoint=h:1&foo=1", "unknown parameter(s) ['foo']"),
        ("s3://b?endpoint=h:1&endpoint=g:2", "repeats parameter(s) ['endpoint']"),
        ("s3://b?endpoint=", "empty parameter(s) ['endpoint']"),
        ("s3://b?endpoint=h:1&secure=maybe", "secure='maybe' is not a boolean"),
        ("s3://b/a/../c?endpoint=h:1", "bad key prefix 'a/../c'"),
        ("file://host/data", "names host 'host'"),
        ("file:///data?x=1", "takes no query"),
    ],
)
def test_bad_urls_raise_config_errors(url, fragment):
    with pytest.raises(StoreConfigError) as info:
        StoreConfig.from_url(url)
    assert fragment in str(info.value)
    if fragment.startswith(("unknown scheme", "empty store", "no endpoint")):
        assert "file:///abs/path" in str(info.value) and "s3://BUCKET" in str(info.value)


@pytest.mark.parametrize(
    "fields",
    [
        {"kind": "file", "path": Path("relative")},
        {"kind": "file"},
        {"kind": "file", "path": Path("/abs"), "bucket": "b"},
        {"kind": "s3", "bucket": "b"},
        {"kind": "s3", "endpoint": "h:1"},
        {"kind": "s3", "bucket": "b", "endpoint": "h:1", "path": Path("/abs")},
        {"kind": "s3", "bucket": "b", "endpoint": "h:1", "prefix": "a//b"},
        {"kind": "gcs", "bucket": "b", "endpoint": "h:1"},
        {"kind": "s3", "bucket": "b", "endpoint": "h:1", "access_key": "nope"},
    ],
)
def test_invalid_configs_are_rejected(fields):
    with pytest.raises(ValidationError):
        StoreConfig(**fields)


def test_credentials_prefer_grove_vars_and_fall_back_to_aws():
    aws_only = {"AWS_ACCESS_KEY_ID": "aws-ak", "AWS_SECRET_ACCESS_KEY": "aws-sk"}
    assert s3_credentials_from_env(aws_only).access_key == "aws-ak"
    both = aws_only | {"GROVE_S3_ACCESS_KEY": "grove-ak", "GROVE_S3_SECRET_KEY": "grove-sk"}
    creds = s3_credentials_from_env(both)
    assert creds.access_key == "grove-ak"
    assert creds.secret_key.get_secret_value() == "grove-sk"
    assert "grove-sk" not in repr(creds)


def test_missing_credentials_are_named(no_creds):
    with pytest.raises(MissingCredentialsError, match=r"no secret key.*GROVE_S3_SECRET_KEY"):
        s3_credentials_from_env({"GROVE_S3_ACCESS_KEY": "ak"})
    with pytest.raises(MissingCredentialsError, match=r"no access key and no secret key"):
        open_store("s3://grove?endpoint=127.0.0.1:9&secure=0")


def test_s3_url_opens_a_working_store(s3_server, monkeypatch, no_creds):
    monkeypatch.setenv("GROVE_S3_ACCESS_KEY", "any")
    monkeypatch.setenv("GROVE_S3_SECRET_KEY", "thing")
    store = open_store(f"s3://config-test/run-7?endpoint={s3_server.endpoint}&secure=0&create=1")
    assert isinstance(store, S3Store)
    store.put("rows/x", b"payload")
    assert s3_server.store("config-test").get("run-7/rows/x") == b"payload"


def test_explicit_credentials_skip_the_environment(s3_server, no_creds):
    creds = S3Credentials(access_key="ak", secret_key="sk")
    store = open_store(
        f"s3://config-creds?endpoint={s3_server.endpoint}&secure=0&create=1", credentials=creds
    )
    store.put("k", b"v")
    assert store.get("k") == b"v"


def test_store_from_env_defaults_under_grove_home(tmp_path, monkeypatch):
    monkeypatch.delenv("GROVE_STORE", raising=False)
    monkeypatch.setenv("GROVE_HOME", str(tmp_path / "home"))
    store = store_from_env()
    assert isinstance(store, LocalStore)
    assert store.root == tmp_path.resolve() / "home" / "store"
    assert store.root.is_dir()


def test_store_from_env_follows_grove_store(tmp_path, monkeypatch):
    monkeypatch.setenv("GROVE_STORE", f"file://{tmp_path}/elsewhere")
    monkeypatch.setenv("GROVE_HOME", str(tmp_path / "home"))
    store = store_from_env()
    assert isinstance(store, LocalStore) and store.root == tmp_path.resolve() / "elsewhere"
    monkeypatch.setenv("GROVE_STORE", "ftp://nope")
    with pytest.raises(StoreConfigError, match="unknown scheme 'ftp'"):
        store_from_env()
