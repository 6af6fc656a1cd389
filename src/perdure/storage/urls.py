"""Backends by URL (STYLE §8): ``file:DIR``, ``sqlite:PATH``, ``memory:``, ``postgresql://…``,
``redis://…``, ``s3://bucket/prefix``.

The URL is split by perdure's one parser, :func:`perdure._runtime.urls.split_url`, which
:func:`perdure.session.open_store` uses too.
"""

from __future__ import annotations

from perdure._runtime.urls import (
    POSTGRES_STORAGE_OPTIONS,
    REDIS_STORAGE_OPTIONS,
    postgres_url,
    s3_url,
    split_url,
)
from perdure.crypto import Cipher
from perdure.storage.encrypted import EncryptedStorage
from perdure.storage.local_file import LocalFileStorage
from perdure.storage.memory import MemoryStorage
from perdure.storage.protocol import Storage
from perdure.storage.sqlite import SQLiteStorage

__all__ = ["STORAGE_SCHEMES", "open_storage", "split_url"]

STORAGE_SCHEMES = ("file", "sqlite", "memory", "postgresql", "postgres", "redis", "rediss", "s3")


def open_storage(url: str, *, cipher: Cipher | None = None) -> Storage:
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
    ``s3://BUCKET/PFX``   :class:`~perdure.storage.s3.S3Storage` on the
                          bucket, keys under ``PFX``; options
                          ``?endpoint_url=``, ``region=``,
                          ``retry_timeout=``, ``max_retries=``,
                          ``connect_timeout=``, ``timeout=``
                          (credentials: the ``AWS_*`` environment)
    ====================  ==============================================

    With ``cipher`` the storage comes wrapped in :class:`EncryptedStorage`: every
    blob is encrypted before it reaches the backend.

    Raises:
        ValueError: the URL is malformed, its scheme unknown, or an option of a
            ``postgresql://``, ``redis://`` or ``s3://`` URL bad (the message names it).
        ImportError: a ``postgresql://`` URL without ``perdure[postgres]`` installed,
            a ``redis://`` one without ``perdure[redis]``, an ``s3://`` one without
            ``perdure[s3]``.
    """
    storage = _open_storage(url)
    return storage if cipher is None else EncryptedStorage(storage, cipher)


def _open_storage(url: str) -> Storage:
    scheme, path = split_url(url, STORAGE_SCHEMES, "storage")
    if scheme == "s3":
        from perdure.storage.s3 import S3Storage

        bucket, prefix, options = s3_url(url, "storage")
        return S3Storage(bucket, prefix=prefix, **options)  # type: ignore[arg-type]
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
