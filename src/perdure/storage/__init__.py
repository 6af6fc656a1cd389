"""Byte-blob storage: the async :class:`Storage` protocol and its backends (SPEC §6).

A ``Storage`` only moves bytes; the layers above own the key layout and the formats.
Backends: :class:`MemoryStorage` (tests), :class:`LocalFileStorage` (a directory),
:class:`SQLiteStorage` (one database file). Every backend passes the same contract
suite, and every coroutine may be awaited from any event loop and thread. The memory
and file backends are also :class:`AppendStorage`: conditional appends and replaces,
which raise :class:`~perdure.errors.StorageConflictError` when the blob is not as the
caller expected.
"""

from perdure.errors import StorageConflictError
from perdure.storage.keys import validate_key, validate_prefix
from perdure.storage.local_file import LocalFileStorage
from perdure.storage.memory import MemoryStorage
from perdure.storage.protocol import AppendStorage, Storage
from perdure.storage.sqlite import SQLiteStorage
from perdure.storage.urls import STORAGE_SCHEMES, open_storage, split_url

__all__ = [
    "STORAGE_SCHEMES",
    "AppendStorage",
    "LocalFileStorage",
    "MemoryStorage",
    "SQLiteStorage",
    "Storage",
    "StorageConflictError",
    "open_storage",
    "split_url",
    "validate_key",
    "validate_prefix",
]
