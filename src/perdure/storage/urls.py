"""Backends by URL (STYLE §8): ``file:DIR``, ``sqlite:PATH``, ``memory:`` and friends.

The URL is split by perdure's one parser, :func:`perdure._runtime.urls.split_url`, which
:func:`perdure.session.open_store` uses too.
"""

from __future__ import annotations

from perdure._runtime.urls import split_url
from perdure.storage.local_file import LocalFileStorage
from perdure.storage.memory import MemoryStorage
from perdure.storage.protocol import Storage
from perdure.storage.sqlite import SQLiteStorage

__all__ = ["STORAGE_SCHEMES", "open_storage", "split_url"]

STORAGE_SCHEMES = ("file", "sqlite", "memory")


def open_storage(url: str) -> Storage:
    """Open the blob :class:`Storage` a URL names (nothing is created until written).

    ``file:DIR`` → :class:`LocalFileStorage`, ``sqlite:PATH`` → :class:`SQLiteStorage`,
    ``memory:`` → a new :class:`MemoryStorage`.

    Raises:
        ValueError: the URL is malformed, its scheme unknown, or its backend
            (``postgresql://``, ``redis://``, ``s3://``) not in this version.
    """
    scheme, path = split_url(url, STORAGE_SCHEMES, "storage")
    if scheme == "memory":
        return MemoryStorage()
    assert path is not None
    return LocalFileStorage(path) if scheme == "file" else SQLiteStorage(path)
