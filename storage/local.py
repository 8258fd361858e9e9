"""The embedded object store: one file per key under a root folder, written atomically.

A write goes to a temp file in the key's folder, is fsynced, then `os.replace`d onto the key's path,
and the folder is fsynced: a crash leaves either the old object, the new one, or an invisible temp
file, never a half-written object. Temp files carry a reserved name prefix that keys may not use,
so listings skip them.

Keys map 1:1 to real files: a key whose path goes through a symlink is refused, so no key can
escape the root and `list` (which never follows symlinks) agrees with `get`. A folder cannot also
be an object, so keys 'a' and 'a/b' cannot coexist here (S3 allows it; grove's key layouts never
need it): such a write raises KeyPathConflictError.
"""

from __future__ import annotations

import os
import stat as stat_mode
import uuid
from pathlib import Path

from storage.base import (
    InvalidKeyError,
    ObjectInfo,
    ObjectNotFoundError,
    ObjectStore,
    StorageError,
    validate_key,
    validate_prefix,
)

# Reserved for in-flight writes; a key segment may not start with it.
TEMP_PREFIX = ".grove-tmp-"

# A concurrent `delete` may prune the folder between our mkdir and our temp-file create.
_CREATE_ATTEMPTS = 5


class SymlinkedKeyError(InvalidKeyError):
    """A key whose path goes through a symlink (it could escape the store root)."""


class KeyPathConflictError(StorageError):
    """A key needs a folder where an object is, or an object where a folder is ('a' vs 'a/b')."""


class LocalStore(ObjectStore):
    """Objects as files under `root` (created if missing)."""

    def __init__(self, root: Path | str) -> None:
        root = Path(root).expanduser()
        root.mkdir(parents=True, exist_ok=True)
        # Resolved once, so symlinks *above* the root (e.g. /tmp on some systems) are allowed.
        self.root = root.resolve()

    def __repr__(self) -> str:
        return f"LocalStore({str(self.root)!r})"

    # -- the interface -------------------------------------------------------------------------

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        payload = _as_bytes(key, data)
        tmp = self._write_temp(key, path, payload)
        try:
            os.replace(tmp, path)
        except IsADirectoryError:
            tmp.unlink(missing_ok=True)
            raise self._conflict(key, path, "a folder of other keys already exists at this path") from None
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        _fsync_dir(path.parent)

    def get(self, key: str) -> bytes:
        path = self._path(key)
        try:
            with path.open("rb") as f:
                return f.read()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise ObjectNotFoundError(
                f"no object {key!r} in the local store at {self.root} (looked for file {path}); "
                f"check the key, or that its writer finished"
            ) from None

    def stat(self, key: str) -> ObjectInfo | None:
        path = self._path(key)
        try:
            st = path.stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        return ObjectInfo(key=key, size=st.st_size) if stat_mode.S_ISREG(st.st_mode) else None

    def list(self, prefix: str = "") -> list[str]:
        validate_prefix(prefix)
        folder, _, _ = prefix.rpartition("/")
        base = self._folder(prefix, folder)
        keys: list[str] = []
        # followlinks=False: symlinked folders are never entered, symlinked files are skipped below.
        for dirpath, _dirnames, filenames in os.walk(base):
            rel = Path(dirpath).relative_to(self.root).as_posix()
            for name in filenames:
                if name.startswith(TEMP_PREFIX) or os.path.islink(os.path.join(dirpath, name)):
                    continue
                key = name if rel == "." else f"{rel}/{name}"
                if key.startswith(prefix):
                    keys.append(key)
        return sorted(keys)

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            if not stat_mode.S_ISREG(path.lstat().st_mode):
                return  # a folder is not an object: nothing to delete
            path.unlink()
        except (FileNotFoundError, NotADirectoryError):
            return
        self._prune_empty_folders(path.parent)

    # -- helpers -------------------------------------------------------------------------------

    def _path(self, key: str) -> Path:
        """The file for `key`, after validating the key and refusing temp names and symlinks."""
        validate_key(key)
        parts = key.split("/")
        for part in parts:
            if part.startswith(TEMP_PREFIX):
                raise InvalidKeyError(
                    f"object key {key!r} has a segment starting with {TEMP_PREFIX!r}, which the local "
                    f"store reserves for in-flight writes; rename the key"
                )
        path = self.root.joinpath(*parts)
        self._refuse_symlinks(key, path)
        return path

    def _folder(self, prefix: str, folder: str) -> Path:
        path = self.root.joinpath(*folder.split("/")) if folder else self.root
        self._refuse_symlinks(prefix, path)
        return path

    def _refuse_symlinks(self, key: str, path: Path) -> None:
        resolved = path.resolve()
        if resolved != path:
            where = "inside" if resolved.is_relative_to(self.root) else "OUTSIDE"
            raise SymlinkedKeyError(
                f"object key {key!r} goes through a symlink: {path} resolves to {resolved} ({where} the "
                f"store root {self.root}); the local store refuses symlinks so no key can escape its root. "
                f"Remove the symlink or point the store at the real folder"
            )

    def _write_temp(self, key: str, path: Path, data: bytes) -> Path:
        """Write `data` to a fresh fsynced temp file next to `path`; the caller renames it into place."""
        for _ in range(_CREATE_ATTEMPTS):
            self._make_parent(key, path)
            tmp = path.parent / f"{TEMP_PREFIX}{uuid.uuid4().hex}"
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
            except FileNotFoundError:
                continue  # the folder was pruned by a concurrent delete: recreate it
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            return tmp
        raise StorageError(
            f"could not create a temp file for {key!r} in {path.parent} after {_CREATE_ATTEMPTS} attempts: "
            f"its folder kept disappearing (concurrent deletes?); retry the write"
        )

    def _make_parent(self, key: str, path: Path) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise self._conflict(
                key, path, "an existing object sits where a folder of this key must be"
            ) from None

    def _conflict(self, key: str, path: Path, why: str) -> KeyPathConflictError:
        return KeyPathConflictError(
            f"cannot write object {key!r} at {path}: {why}. The local store maps keys to files, so a key "
            f"cannot be both an object and a folder ('a' and 'a/b'); choose keys that are never prefixes "
            f"of other keys' folders"
        )

    def _prune_empty_folders(self, folder: Path) -> None:
        """Remove folders left empty by a delete, so a later key may reuse the name as an object."""
        while folder != self.root and folder.is_relative_to(self.root):
            try:
                folder.rmdir()
            except OSError:
                return  # not empty (or already gone / raced): stop
            folder = folder.parent


def _as_bytes(key: str, data: bytes) -> bytes:
    if isinstance(data, bytes):
        return data
    if isinstance(data, bytearray | memoryview):
        return bytes(data)
    raise TypeError(f"object {key!r}: data must be bytes, got {type(data).__name__}")


def _fsync_dir(folder: Path) -> None:
    """Make the rename durable: without this a power loss may forget the new directory entry."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


__all__ = ["TEMP_PREFIX", "KeyPathConflictError", "LocalStore", "SymlinkedKeyError"]
