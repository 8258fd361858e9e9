"""The object-store interface every grove component writes through, and its typed errors.

Idempotent writes do not rely on conditional PUTs (minio-py 7.2 cannot send If-None-Match):
`put_if_absent` writes a missing key, or reads the stored bytes back and compares sha256 digests,
failing loudly on a mismatch. Keys are deterministic, so a retried activity finds its own bytes.
Commit markers are written last by the callers (checkpoints, row publication).
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from enum import StrEnum


class StorageError(Exception):
    """Base of all object-store errors."""


class InvalidKeyError(StorageError, ValueError):
    """A key that could escape its namespace or is malformed (.., absolute, empty segment, ...)."""


class ObjectNotFoundError(StorageError, KeyError):
    """`get` of a key that does not exist."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "object not found"


class DigestMismatchError(StorageError):
    """`put_if_absent` found different bytes under the key: a non-deterministic writer or a key clash."""


class StoreUnreachableError(StorageError):
    """The backend cannot be reached (connection refused, DNS, timeout) or refused our credentials."""


class PutOutcome(StrEnum):
    WRITTEN = "written"  # the key was absent and now holds the bytes
    VERIFIED = "verified"  # the key already held exactly these bytes (a retry)


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


_FORBIDDEN_CHARS = set("\\\x00\r\n")


def validate_key(key: str) -> str:
    """Return `key` if it is a safe relative object key, else raise InvalidKeyError naming the problem."""
    if not isinstance(key, str) or not key:
        raise InvalidKeyError(f"object key must be a non-empty string, got {key!r}")
    if key.startswith("/"):
        raise InvalidKeyError(f"object key {key!r} is absolute; use a relative key like 'rows/step-1/x'")
    bad = _FORBIDDEN_CHARS.intersection(key)
    if bad:
        raise InvalidKeyError(f"object key {key!r} contains forbidden characters {sorted(bad)!r}")
    for segment in key.split("/"):
        if segment == "":
            raise InvalidKeyError(f"object key {key!r} has an empty segment ('//' or a trailing '/')")
        if segment in (".", ".."):
            raise InvalidKeyError(f"object key {key!r} has a '{segment}' segment; keys may not traverse")
    return key


def validate_prefix(prefix: str) -> str:
    """A listing prefix: empty, or a valid key optionally ending in '/'."""
    if prefix == "":
        return prefix
    validate_key(prefix[:-1] if prefix.endswith("/") else prefix)
    return prefix


class ObjectStore(ABC):
    """Small blob store: bytes under validated '/'-separated keys."""

    @abstractmethod
    def put(self, key: str, data: bytes) -> None:
        """Write (or overwrite) `key`."""

    @abstractmethod
    def get(self, key: str) -> bytes:
        """Read `key`; ObjectNotFoundError if absent."""

    @abstractmethod
    def stat(self, key: str) -> ObjectInfo | None:
        """Size of `key`, or None if absent."""

    @abstractmethod
    def list(self, prefix: str = "") -> list[str]:
        """All keys starting with `prefix`, sorted."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove `key`; deleting an absent key is not an error (idempotent)."""

    def exists(self, key: str) -> bool:
        return self.stat(key) is not None

    def put_if_absent(self, key: str, data: bytes) -> PutOutcome:
        """Write `key` if absent; if present, verify it holds exactly `data` (sha256) or raise.

        Not a compare-and-swap: two *different* concurrent writers of one key could both see it absent.
        grove never has two writers with different bytes for one deterministic key; a digest
        mismatch on a later retry is exactly the bug this surfaces.
        """
        validate_key(key)
        if self.stat(key) is None:
            self.put(key, data)
            return PutOutcome.WRITTEN
        stored = self.get(key)
        if sha256_hex(stored) != sha256_hex(data):
            raise DigestMismatchError(
                f"object {key!r} already holds different bytes (stored sha256 {sha256_hex(stored)[:16]}…, "
                f"{len(stored)} B; new sha256 {sha256_hex(data)[:16]}…, {len(data)} B). Writers of a "
                "deterministic key must produce identical bytes; inspect the stored object before deleting it"
            )
        return PutOutcome.VERIFIED
