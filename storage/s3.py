"""The S3 backend: grove's object store on any S3-compatible server, through the `minio` client.

Fails fast: minio's default HTTP pool waits 5 minutes per connect and retries 5 times, so an
unreachable endpoint would hang an activity for ages. We give it a pool with a short connect
timeout and few retries, and translate every client error into the typed errors of storage.base:

- NoSuchKey -> ObjectNotFoundError (names key, bucket, endpoint)
- connection refused, DNS failure, timeouts, broken connections, 5xx after retries, a non-S3 answer
  -> StoreUnreachableError (names the endpoint and what to check)
- AccessDenied and other credential refusals -> StoreAccessDeniedError, a StoreUnreachableError
  (callers that only care "the store is not usable" catch the base class)
- a missing bucket -> BucketNotFoundError, unless the store was asked to create it
- any other S3 error code -> S3RequestError (names the code and the server's message)

The bucket is checked (or created) once, lazily, before the first operation: a HEAD on a key in a
missing bucket answers a bare 404 that minio reports as NoSuchKey, which would make `stat` say
"absent" instead of failing.
"""

from __future__ import annotations

import io
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import certifi
import urllib3
from minio import Minio
from minio.error import InvalidResponseError, S3Error, ServerError

from storage.base import (
    ObjectInfo,
    ObjectNotFoundError,
    ObjectStore,
    StorageError,
    StoreUnreachableError,
    validate_key,
    validate_prefix,
)

DEFAULT_REGION = "us-east-1"  # localbucket (and many S3 clones) need it; minio would otherwise probe
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "NoSuchObject"})
_DENIED_CODES = frozenset(
    {
        "AccessDenied",
        "AllAccessDisabled",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "InvalidToken",
        "AccountProblem",
    }
)
_TRANSIENT_STATUS = (500, 502, 503, 504)


class StoreAccessDeniedError(StoreUnreachableError):
    """The server answered but refused our credentials or permissions."""


class BucketNotFoundError(StorageError):
    """The configured bucket does not exist and the store was not asked to create it."""


class S3RequestError(StorageError):
    """The server rejected a request with an S3 error code grove has no more specific error for."""


def fail_fast_http(connect_timeout: float, read_timeout: float, retries: int) -> urllib3.PoolManager:
    """The HTTP pool minio uses: short connect timeout, few retries, so dead endpoints fail in seconds."""
    return urllib3.PoolManager(
        timeout=urllib3.Timeout(connect=connect_timeout, read=read_timeout),
        maxsize=10,
        cert_reqs="CERT_REQUIRED",
        ca_certs=os.environ.get("SSL_CERT_FILE") or certifi.where(),
        retries=urllib3.Retry(
            total=retries,
            connect=retries,
            read=retries,
            backoff_factor=0.2,
            status_forcelist=_TRANSIENT_STATUS,
        ),
    )


class S3Store(ObjectStore):
    """Objects in `bucket` (under an optional key `prefix`) on the S3 server at `endpoint` (host:port)."""

    def __init__(
        self,
        endpoint: str,
        bucket: str,
        *,
        access_key: str | None = None,
        secret_key: str | None = None,
        region: str = DEFAULT_REGION,
        secure: bool = True,
        prefix: str = "",
        create_bucket: bool = False,
        connect_timeout: float = 3.0,
        read_timeout: float = 60.0,
        retries: int = 2,
    ) -> None:
        self.endpoint = endpoint
        self.bucket = bucket
        self.region = region
        self.secure = secure
        self.prefix = _normalize_prefix(prefix)
        self.create_bucket = create_bucket
        self._client = Minio(
            endpoint,
            access_key=access_key,
            secret_key=secret_key,
            secure=secure,
            region=region,
            http_client=fail_fast_http(connect_timeout, read_timeout, retries),
        )
        self._bucket_ready = False
        self._bucket_lock = threading.Lock()

    def __repr__(self) -> str:
        scheme = "https" if self.secure else "http"
        return f"S3Store({scheme}://{self.endpoint}/{self.bucket}/{self.prefix})"

    # -- the interface -------------------------------------------------------------------------

    def put(self, key: str, data: bytes) -> None:
        name = self._name(key)
        payload = bytes(data) if isinstance(data, bytearray | memoryview) else data
        if not isinstance(payload, bytes):
            raise TypeError(f"object {key!r}: data must be bytes, got {type(data).__name__}")
        with self._errors("put", key):
            self._ensure_bucket()
            self._client.put_object(
                self.bucket, name, io.BytesIO(payload), len(payload), content_type="application/octet-stream"
            )

    def get(self, key: str) -> bytes:
        name = self._name(key)
        with self._errors("get", key):
            self._ensure_bucket()
            response = self._client.get_object(self.bucket, name)
            try:
                return response.read()
            finally:
                response.close()
                response.release_conn()

    def stat(self, key: str) -> ObjectInfo | None:
        name = self._name(key)
        try:
            with self._errors("stat", key):
                self._ensure_bucket()
                info = self._client.stat_object(self.bucket, name)
        except ObjectNotFoundError:
            return None
        return ObjectInfo(key=key, size=int(info.size or 0))

    def list(self, prefix: str = "") -> list[str]:
        validate_prefix(prefix)
        keys: list[str] = []
        with self._errors("list", prefix or None):
            self._ensure_bucket()
            # The listing is a lazy paginated iterator: network errors surface while iterating.
            for obj in self._client.list_objects(self.bucket, prefix=self.prefix + prefix, recursive=True):
                name = obj.object_name or ""
                if name.endswith("/"):
                    continue  # a "folder marker" some consoles create: not an object grove can address
                keys.append(name[len(self.prefix) :])
        return sorted(keys)

    def delete(self, key: str) -> None:
        name = self._name(key)
        with self._errors("delete", key):
            self._ensure_bucket()
            self._client.remove_object(self.bucket, name)  # S3 answers 204 for an absent key too

    # -- helpers -------------------------------------------------------------------------------

    def _name(self, key: str) -> str:
        return self.prefix + validate_key(key)

    def _ensure_bucket(self) -> None:
        if self._bucket_ready:
            return
        with self._bucket_lock:
            if self._bucket_ready:
                return
            if not self._client.bucket_exists(self.bucket):
                if not self.create_bucket:
                    raise BucketNotFoundError(
                        f"bucket {self.bucket!r} does not exist at {self._where()}; create it, fix the "
                        f"bucket name, or open the store with create_bucket=True (URL query create=1)"
                    )
                self._make_bucket()
            self._bucket_ready = True

    def _make_bucket(self) -> None:
        try:
            self._client.make_bucket(self.bucket)
        except S3Error as exc:
            if exc.code != "BucketAlreadyOwnedByYou":  # another worker created it first: fine
                raise

    def _where(self) -> str:
        return f"{'https' if self.secure else 'http'}://{self.endpoint}"

    @contextmanager
    def _errors(self, op: str, key: str | None) -> Iterator[None]:
        """Translate minio / urllib3 errors raised inside the block into grove's typed errors."""
        try:
            yield
        except S3Error as exc:
            raise translate_s3_error(exc, op=op, key=key, store=self) from exc
        except (ServerError, InvalidResponseError) as exc:
            raise StoreUnreachableError(
                f"{op} {key!r}: the server at {self._where()} gave a non-S3 or failed answer ({exc}); "
                f"check that the endpoint is an S3 server and that it is healthy"
            ) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise StoreUnreachableError(
                f"{op} {key!r}: cannot reach the S3 endpoint {self._where()} (bucket {self.bucket!r}): "
                f"{_reason(exc)}. Check that the server is running, the host:port and secure flag "
                f"(http vs https) are right, and the network allows the connection"
            ) from exc


def translate_s3_error(exc: S3Error, *, op: str, key: str | None, store: S3Store) -> StorageError:
    """The typed grove error for an S3 error response (pure: no I/O)."""
    code = exc.code or "?"
    where = f"bucket {store.bucket!r} at {store._where()}"
    if code in _NOT_FOUND_CODES:
        return ObjectNotFoundError(
            f"no object {key!r} in {where} (object name {store.prefix + (key or '')!r}); check the key, "
            f"the store's prefix {store.prefix!r}, or that its writer finished"
        )
    if code == "NoSuchBucket":
        return BucketNotFoundError(
            f"{op} {key!r}: bucket {store.bucket!r} does not exist at {store._where()} (deleted while in "
            f"use?); recreate it or fix the bucket name"
        )
    if code in _DENIED_CODES:
        return StoreAccessDeniedError(
            f"{op} {key!r}: the S3 server refused access to {where} ({code}: {exc.message}); check the "
            f"credentials (GROVE_S3_ACCESS_KEY / GROVE_S3_SECRET_KEY), the region {store.region!r} and "
            f"the bucket policy"
        )
    return S3RequestError(f"{op} {key!r} in {where} failed with S3 error {code}: {exc.message}")


def _normalize_prefix(prefix: str) -> str:
    """'' or 'a/b' or 'a/b/' -> '' or 'a/b/': the key prefix inside the bucket always ends in '/'."""
    if prefix == "":
        return ""
    validate_key(prefix.removesuffix("/"))
    return prefix.removesuffix("/") + "/"


def _reason(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None)  # MaxRetryError wraps the last underlying error
    return f"{type(exc).__name__}: {reason if reason is not None else exc}"


__all__ = [
    "DEFAULT_REGION",
    "BucketNotFoundError",
    "S3RequestError",
    "S3Store",
    "StoreAccessDeniedError",
    "fail_fast_http",
    "translate_s3_error",
]
