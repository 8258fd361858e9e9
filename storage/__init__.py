"""grove's object stores: the interface and errors (base), the local and S3 backends, and `open_store`.

Usage: `store = open_store("s3://grove/run-1?endpoint=127.0.0.1:9000&secure=0")` (or
"file:///data/grove"), or `store_from_env()` to follow $GROVE_STORE.
"""

from storage.base import (
    DigestMismatchError,
    InvalidKeyError,
    ObjectInfo,
    ObjectNotFoundError,
    ObjectStore,
    PutOutcome,
    StorageError,
    StoreUnreachableError,
    sha256_hex,
    validate_key,
    validate_prefix,
)
from storage.config import (
    ACCEPTED_FORMS,
    MissingCredentialsError,
    S3Credentials,
    StoreConfig,
    StoreConfigError,
    default_store_url,
    open_store,
    s3_credentials_from_env,
    store_from_env,
)
from storage.local import KeyPathConflictError, LocalStore, SymlinkedKeyError
from storage.s3 import BucketNotFoundError, S3RequestError, S3Store, StoreAccessDeniedError

__all__ = [
    "ACCEPTED_FORMS",
    "BucketNotFoundError",
    "DigestMismatchError",
    "InvalidKeyError",
    "KeyPathConflictError",
    "LocalStore",
    "MissingCredentialsError",
    "ObjectInfo",
    "ObjectNotFoundError",
    "ObjectStore",
    "PutOutcome",
    "S3Credentials",
    "S3RequestError",
    "S3Store",
    "StorageError",
    "StoreAccessDeniedError",
    "StoreConfig",
    "StoreConfigError",
    "StoreUnreachableError",
    "SymlinkedKeyError",
    "default_store_url",
    "open_store",
    "s3_credentials_from_env",
    "sha256_hex",
    "store_from_env",
    "validate_key",
    "validate_prefix",
]
