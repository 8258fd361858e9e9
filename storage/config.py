"""Which object store a grove process uses: a URL or a `StoreConfig`, opened by `open_store`.

Accepted forms (also listed in every StoreConfigError):

    /abs/path  or  ./rel/path                      local store in that folder (made absolute)
    file:///abs/path                               local store in that folder
    s3://BUCKET[/PREFIX]?endpoint=HOST:PORT[&secure=0|1][&region=R][&create=0|1]
                                                   S3 store; secure defaults to 1 (https),
                                                   region to us-east-1, create to 0

Credentials never appear in a URL or a StoreConfig (configs travel through Temporal history and
logs): `open_store` reads them from GROVE_S3_ACCESS_KEY / GROVE_S3_SECRET_KEY, falling back to
AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY. `store_from_env` reads GROVE_STORE, default a local
store under $GROVE_HOME/store.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal
from urllib.parse import parse_qs, quote, unquote, urlsplit

from pydantic import BaseModel, ConfigDict, SecretStr, model_validator

from grove.paths import grove_home
from storage.base import ObjectStore, StorageError, validate_key
from storage.local import LocalStore
from storage.s3 import DEFAULT_REGION, S3Store

ACCEPTED_FORMS = (
    "a plain path (/abs/path or ./rel/path), file:///abs/path, or "
    "s3://BUCKET[/PREFIX]?endpoint=HOST:PORT[&secure=0|1][&region=us-east-1][&create=0|1]"
)
ACCESS_KEY_VARS = ("GROVE_S3_ACCESS_KEY", "AWS_ACCESS_KEY_ID")
SECRET_KEY_VARS = ("GROVE_S3_SECRET_KEY", "AWS_SECRET_ACCESS_KEY")
_S3_PARAMS = frozenset({"endpoint", "secure", "region", "create"})
_BOOLS = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}


class StoreConfigError(StorageError, ValueError):
    """A store URL or config that grove cannot open (unknown scheme, missing or bad field)."""


class MissingCredentialsError(StoreConfigError):
    """An S3 store was requested but no access/secret key is set in the environment."""


class StoreConfig(BaseModel):
    """Where objects live. `kind='file'` uses `path`; `kind='s3'` uses the bucket fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["file", "s3"]
    path: Path | None = None
    bucket: str | None = None
    prefix: str = ""
    endpoint: str | None = None
    secure: bool = True
    region: str = DEFAULT_REGION
    create_bucket: bool = False

    @model_validator(mode="after")
    def _fields_match_kind(self) -> StoreConfig:
        if self.kind == "file":
            if self.path is None or not self.path.is_absolute():
                raise ValueError(f"a file store needs an absolute path, got {self.path!r}")
            if self.bucket or self.endpoint or self.prefix:
                raise ValueError("a file store takes only `path`; bucket/endpoint/prefix are for kind='s3'")
        else:
            if not self.bucket or not self.endpoint:
                raise ValueError(
                    f"an s3 store needs bucket and endpoint, got {self.bucket!r}, {self.endpoint!r}"
                )
            if self.path is not None:
                raise ValueError("an s3 store takes no `path`; put a key prefix in `prefix`")
            if self.prefix:
                validate_key(self.prefix.removesuffix("/"))
        return self

    @classmethod
    def from_url(cls, url: str | Path) -> StoreConfig:
        """Parse one of the ACCEPTED_FORMS; StoreConfigError names what is wrong."""
        text = str(url).strip()
        if not text:
            raise StoreConfigError(f"empty store URL; expected {ACCEPTED_FORMS}")
        if "://" not in text:
            return cls(kind="file", path=Path(text).expanduser().resolve())
        parts = urlsplit(text)
        if parts.scheme == "file":
            return _file_config(text, parts)
        if parts.scheme == "s3":
            return _s3_config(text, parts)
        raise StoreConfigError(
            f"store URL {text!r} has unknown scheme {parts.scheme!r}; expected {ACCEPTED_FORMS}"
        )

    def url(self) -> str:
        """The canonical URL of this config (no credentials); `from_url(c.url()) == c`."""
        if self.kind == "file":
            return f"file://{quote(str(self.path))}"
        path = f"/{quote(self.prefix.removesuffix('/'))}" if self.prefix else ""
        query = (
            f"endpoint={self.endpoint}&secure={int(self.secure)}&region={self.region}"
            f"&create={int(self.create_bucket)}"
        )
        return f"s3://{self.bucket}{path}?{query}"


class S3Credentials(BaseModel):
    model_config = ConfigDict(frozen=True)

    access_key: str
    secret_key: SecretStr


def s3_credentials_from_env(environ: Mapping[str, str] | None = None) -> S3Credentials:
    """GROVE_S3_ACCESS_KEY/SECRET_KEY, else AWS_ACCESS_KEY_ID/SECRET_ACCESS_KEY; both halves required."""
    env = os.environ if environ is None else environ
    access = next((env[v] for v in ACCESS_KEY_VARS if env.get(v)), None)
    secret = next((env[v] for v in SECRET_KEY_VARS if env.get(v)), None)
    if access is None or secret is None:
        missing = [name for name, val in (("access key", access), ("secret key", secret)) if val is None]
        raise MissingCredentialsError(
            f"S3 store: no {' and no '.join(missing)} in the environment; set {ACCESS_KEY_VARS[0]} "
            f"and {SECRET_KEY_VARS[0]} (or {ACCESS_KEY_VARS[1]} and {SECRET_KEY_VARS[1]})"
        )
    return S3Credentials(access_key=access, secret_key=SecretStr(secret))


def open_store(target: str | Path | StoreConfig, *, credentials: S3Credentials | None = None) -> ObjectStore:
    """The store a URL, path or StoreConfig names; S3 credentials from `credentials` or the environment."""
    config = target if isinstance(target, StoreConfig) else StoreConfig.from_url(target)
    if config.kind == "file":
        assert config.path is not None  # guaranteed by StoreConfig's validator
        return LocalStore(config.path)
    creds = credentials or s3_credentials_from_env()
    assert config.endpoint is not None and config.bucket is not None
    return S3Store(
        config.endpoint,
        config.bucket,
        access_key=creds.access_key,
        secret_key=creds.secret_key.get_secret_value(),
        region=config.region,
        secure=config.secure,
        prefix=config.prefix,
        create_bucket=config.create_bucket,
    )


def default_store_url() -> str:
    return f"file://{quote(str(grove_home().resolve() / 'store'))}"


def store_from_env() -> ObjectStore:
    """The store named by $GROVE_STORE, default a local store under $GROVE_HOME/store."""
    return open_store(os.environ.get("GROVE_STORE") or default_store_url())


# -- URL parsing ---------------------------------------------------------------------------------


def _file_config(text: str, parts) -> StoreConfig:
    if parts.netloc not in ("", "localhost"):
        raise StoreConfigError(
            f"store URL {text!r} names host {parts.netloc!r}; a file URL needs an absolute path with three "
            f"slashes, like file:///abs/path. Expected {ACCEPTED_FORMS}"
        )
    if parts.query or parts.fragment:
        raise StoreConfigError(
            f"store URL {text!r}: a file URL takes no query or fragment; expected {ACCEPTED_FORMS}"
        )
    path = unquote(parts.path)
    if not path.startswith("/"):
        raise StoreConfigError(
            f"store URL {text!r}: path {path!r} is not absolute; expected {ACCEPTED_FORMS}"
        )
    return StoreConfig(kind="file", path=Path(path))


def _s3_config(text: str, parts) -> StoreConfig:
    if not parts.netloc:
        raise StoreConfigError(f"store URL {text!r} names no bucket; expected {ACCEPTED_FORMS}")
    if parts.fragment:
        raise StoreConfigError(f"store URL {text!r}: an s3 URL takes no fragment; expected {ACCEPTED_FORMS}")
    params = _query(text, parts.query)
    if "endpoint" not in params:
        raise StoreConfigError(
            f"store URL {text!r} has no endpoint=HOST:PORT; grove does not guess an S3 endpoint. "
            f"Expected {ACCEPTED_FORMS}"
        )
    prefix = unquote(parts.path).strip("/")
    if prefix:
        try:
            validate_key(prefix)
        except ValueError as exc:
            raise StoreConfigError(f"store URL {text!r}: bad key prefix {prefix!r}: {exc}") from None
    return StoreConfig(
        kind="s3",
        bucket=parts.netloc,
        prefix=prefix,
        endpoint=params["endpoint"],
        secure=_bool(text, "secure", params.get("secure", "1")),
        region=params.get("region", DEFAULT_REGION),
        create_bucket=_bool(text, "create", params.get("create", "0")),
    )


def _query(text: str, query: str) -> dict[str, str]:
    parsed = parse_qs(query, keep_blank_values=True, strict_parsing=False)
    unknown = sorted(set(parsed) - _S3_PARAMS)
    if unknown:
        raise StoreConfigError(
            f"store URL {text!r} has unknown parameter(s) {unknown}; known: {sorted(_S3_PARAMS)}. "
            f"Expected {ACCEPTED_FORMS}"
        )
    repeated = sorted(k for k, v in parsed.items() if len(v) > 1)
    if repeated:
        raise StoreConfigError(f"store URL {text!r} repeats parameter(s) {repeated}; give each once")
    empty = sorted(k for k, v in parsed.items() if not v[0])
    if empty:
        raise StoreConfigError(
            f"store URL {text!r} has empty parameter(s) {empty}; expected {ACCEPTED_FORMS}"
        )
    return {k: v[0] for k, v in parsed.items()}


def _bool(text: str, name: str, value: str) -> bool:
    try:
        return _BOOLS[value.lower()]
    except KeyError:
        raise StoreConfigError(
            f"store URL {text!r}: {name}={value!r} is not a boolean; use {name}=1 or {name}=0"
        ) from None


__all__ = [
    "ACCEPTED_FORMS",
    "MissingCredentialsError",
    "S3Credentials",
    "StoreConfig",
    "StoreConfigError",
    "default_store_url",
    "open_store",
    "s3_credentials_from_env",
    "store_from_env",
]
