"""Backends by URL (STYLE §8): ``file:DIR``, ``sqlite:PATH``, ``memory:``, ``postgresql://…``,
``redis://…``.

The URL is split by perdure's one parser, :func:`perdure._runtime.urls.split_url`, which
:func:`perdure.session.open_store` uses too.
"""

from __future__ import annotations

from perdure._runtime.urls import (
    POSTGRES_STORAGE_OPTIONS,
    REDIS_STORAGE_OPTIONS,
    postgres_url,
    split_url,
)
from perdure.storage.local_file import LocalFileStorage
from perdure.storage.memory import MemoryStorage
from perdure.storage.protocol import Storage
from perdure.storage.sqlite import SQLiteStorage

__all__ = ["STORAGE_SCHEMES", "open_storage", "split_url"]

STORAGE_SCHEMES = ("file", "sqlite", "memory", "postgresql", "postgres", "redis", "rediss")


def open_storage(url: str) -> Storage:
    """Open the blob :class:`Storage` a URL names (nothing is created until written).

    ====================  ==============================================
    ``file:DIR``          :class:`LocalFileStorage` rooted at ``DIR``
    ``sqlite:PATH``       :class:`SQLiteStorage` in the file ``PATH``
    ``memory:``           a new :class:`MemoryStorage`
    ``postgresql://…``    :class:`~perdure.storage.postgres.PostgresStorage`
                          (``postgres://`` too); ``?schema=`` and ``table=``
                          are its options, the rest goes to libpq
    ``redis://…``         :class:`~perdure.storage.redis.RedisStorage`
                          (``rediss://`` too); ``?prefix=`` is its option,
                          the rest goes to redis-py
    ====================  ==============================================

    Raises:
        ValueError: the URL is malformed, its scheme unknown, its backend
            (``s3://``) not in this version, or an option of a ``postgresql://``
            or ``redis://`` URL bad (the message names it).
        ImportError: a ``postgresql://`` URL without ``perdure[postgres]`` installed,
            a ``redis://`` one without ``perdure[redis]``.
    """
    scheme, path = split_url(url, STORAGE_SCHEMES, "storage")
    if scheme in ("redis", "rediss"):
        from perdure.storage.redis import RedisStorage

        target, found = postgres_url(url, REDIS_STORAGE_OPTIONS, "storage")
        return RedisStorage(target, **found)  # type: ignore[arg-type]
    if scheme in ("postgresql", "postgres"):
        from perdure.storage.postgres import PostgresStorage

        dsn, options = postgres_url(url, POSTGRES_STORAGE_OPTIONS, "storage")
        return PostgresStorage(dsn, **options)  # type: ignore[arg-type]
    if scheme == "memory":
        return MemoryStorage()
    assert path is not None
    return LocalFileStorage(path) if scheme == "file" else SQLiteStorage(path)
