"""``open_store(url)``: a SessionStore chosen by URL scheme (STYLE §8).

(The module is ``urls``, as :mod:`perdure.storage.urls` beside it, so that importing
it never shadows the function ``perdure.session.open_store`` with a module.)

====================  ==============================================
``file:DIR``          :class:`FileSessionStore` rooted at ``DIR``
``sqlite:PATH``       :class:`SQLiteSessionStore` in the file ``PATH``
``memory:``           a new :class:`MemorySessionStore`;
                      these three take ``?ttl=``, ``max_checkpoints=``
                      (and ``durability=`` but memory)
``postgresql://…``    :class:`PostgresSessionStore` (``postgres://`` too);
                      ``?schema=``, ``ttl=``, ``lease=``, ``max_checkpoints=``,
                      ``max_checkpoint_age=``, ``durability=`` are its
                      options, the rest goes to libpq
``redis://…``         :class:`RedisSessionStore` (``rediss://`` too);
                      ``?prefix=``, ``ttl=``, ``lease=``,
                      ``max_checkpoints=``, ``max_checkpoint_age=`` are its
                      options, the rest goes to redis-py
====================  ==============================================

``s3://`` is blob storage (:func:`perdure.storage.open_storage`, for snapshots and
checkpoints), not a session store: a URL naming it is refused, and the message says
where S3 is offered.
The URL is split by perdure's one parser, :func:`perdure._runtime.urls.split_url`,
which :func:`perdure.storage.open_storage` uses too.
"""

from __future__ import annotations

from typing import Any

from perdure._runtime.urls import REDIS_OPTIONS, local_options, postgres_url, split_url
from perdure.session.store import SessionStore

__all__ = ["SCHEMES", "open_store"]

SCHEMES = ("file", "sqlite", "memory", "postgresql", "postgres", "redis", "rediss")


def open_store(url: str, **options: Any) -> SessionStore:
    """Open the session store a URL names; ``options`` go to the store's constructor.

    Raises:
        ValueError: the URL is malformed, its scheme unknown (the message lists the
            known schemes), or ``s3://`` (blob storage only: the message says so);
            an option given both in the URL and as a keyword.
        ImportError: a ``postgresql://`` URL without ``perdure[postgres]`` installed,
            a ``redis://`` one without ``perdure[redis]``.
    """
    scheme, path = split_url(url, SCHEMES, "store")
    if scheme in ("redis", "rediss"):
        from perdure.stores.redis.sessions import RedisSessionStore

        target, found = postgres_url(url, REDIS_OPTIONS)
        twice = sorted(set(found) & set(options))
        if twice:
            raise ValueError(f"store URL {url!r} and the keywords both give {', '.join(twice)}")
        return RedisSessionStore(target, **found, **options)  # type: ignore[arg-type]
    if scheme in ("postgresql", "postgres"):
        from perdure.stores.postgres.sessions import PostgresSessionStore

        dsn, found = postgres_url(url)
        twice = sorted(set(found) & set(options))
        if twice:
            raise ValueError(f"store URL {url!r} and the keywords both give {', '.join(twice)}")
        return PostgresSessionStore(dsn, **found, **options)  # type: ignore[arg-type]
    bare, found = local_options(url, scheme)
    twice = sorted(set(found) & set(options))
    if twice:
        raise ValueError(f"store URL {url!r} and the keywords both give {', '.join(twice)}")
    options = {**found, **options}
    if found:
        scheme, path = split_url(bare, SCHEMES, "store")
    if scheme == "file":
        from perdure.stores.file.store import FileSessionStore

        assert path is not None
        return FileSessionStore(path, **options)
    if scheme == "sqlite":
        from perdure.stores.sqlite import SQLiteSessionStore

        assert path is not None
        return SQLiteSessionStore(path, **options)
    from perdure.stores.memory import MemorySessionStore

    return MemorySessionStore(**options)
