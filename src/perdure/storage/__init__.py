"""Byte-blob storage: the async :class:`Storage` protocol and its backends (SPEC §6).

A ``Storage`` only moves bytes; the layers above own the key layout and the formats.
Backends: :class:`MemoryStorage` (tests), :class:`LocalFileStorage` (a directory),
:class:`SQLiteStorage` (one database file), :class:`PostgresStorage` (a PostgreSQL
table, ``perdure[postgres]``: importing the name imports psycopg), :class:`RedisStorage`
(Redis, ``perdure[redis]``: importing the name imports redis-py), :class:`S3Storage`
(an S3 bucket, ``perdure[s3]``: importing the name imports obstore). Every backend
passes the same contract suite, and every coroutine may be awaited from any event
loop and thread. :class:`ConditionalStorage` adds versions and compare-and-set
writes, which raise :class:`~perdure.errors.StorageConflictError` when the blob is
not at the version the caller expected (every backend here implements it).
:class:`EncryptedStorage` wraps any of them and encrypts every blob (a
:class:`~perdure.crypto.Cipher`, SPEC §9). The memory and file backends are also
:class:`AppendStorage`: conditional appends and replaces, which raise the same error
when the blob is not as the caller expected.
"""

import typing as _typing

from perdure._runtime.lazy import lazy_exports as _lazy_exports
from perdure.errors import StorageConflictError
from perdure.storage.encrypted import EncryptedStorage
from perdure.storage.keys import validate_key, validate_prefix
from perdure.storage.local_file import LocalFileStorage
from perdure.storage.memory import MemoryStorage
from perdure.storage.protocol import AppendStorage, ConditionalStorage, Storage
from perdure.storage.sqlite import SQLiteStorage
from perdure.storage.urls import STORAGE_SCHEMES, open_storage, split_url

if _typing.TYPE_CHECKING:
    from perdure.storage.postgres import PostgresStorage as PostgresStorage
    from perdure.storage.redis import RedisStorage as RedisStorage
    from perdure.storage.s3 import S3Storage as S3Storage

__all__ = [
    "STORAGE_SCHEMES",
    "AppendStorage",
    "ConditionalStorage",
    "EncryptedStorage",
    "LocalFileStorage",
    "MemoryStorage",
    "PostgresStorage",
    "RedisStorage",
    "S3Storage",
    "SQLiteStorage",
    "Storage",
    "StorageConflictError",
    "open_storage",
    "split_url",
    "validate_key",
    "validate_prefix",
]

# Loaded on first use: the modules import psycopg, redis-py and obstore.
__getattr__, __dir__ = _lazy_exports(
    __name__,
    {
        "PostgresStorage": "perdure.storage.postgres",
        "RedisStorage": "perdure.storage.redis",
        "S3Storage": "perdure.storage.s3",
    },
)
