"""``open_memory_store(url, namespace=...)``: a memory store chosen by URL scheme.

====================  ==============================================
``sqlite:PATH``       :class:`~perdure.memory.LocalMemoryStore` in the file ``PATH``
``postgresql://…``    :class:`~perdure.memory.PostgresMemoryStore` (``postgres://``
                      too); ``?schema=`` is its option, the rest goes to libpq
====================  ==============================================

The one rule the command line (``perdure memory``, ``perdure rotate-keys --memory``)
and the inspector (``perdure serve --memory``) open memory stores by. The URL is
split by perdure's one parser, :func:`perdure._runtime.urls.split_url`.
"""

from __future__ import annotations

from typing import Any

from perdure._runtime.urls import postgres_url, split_url
from perdure.crypto import Cipher
from perdure.memory.local_store import LocalMemoryStore

__all__ = ["MEMORY_SCHEMES", "open_memory_store"]

MEMORY_SCHEMES = ("sqlite", "postgresql", "postgres")


def open_memory_store(url: str, *, namespace: str, cipher: Cipher | None = None) -> Any:
    """Open the memory store ``url`` names, for ``namespace`` (nothing is created yet).

    With a ``cipher`` the store reads and writes encrypted memories; a SQLite file is
    then searched by scanning its decrypted memories (``searchable=False``), which
    finds what its index would and also what was stored without one.

    Raises:
        ValueError: an unknown scheme, or a ``sqlite:`` URL without a path (the
            message names the URL and the schemes).
    """
    scheme, path = split_url(url, MEMORY_SCHEMES, "memory store")
    if scheme == "sqlite":
        if path is None:
            raise ValueError(f"memory store URL {url!r} names no file (sqlite:PATH)")
        return LocalMemoryStore(path, namespace=namespace, cipher=cipher, searchable=cipher is None)
    from perdure.memory.postgres_store import PostgresMemoryStore

    dsn, options = postgres_url(url, {"schema": str}, "memory store")
    schema = str(options.get("schema", "perdure"))
    return PostgresMemoryStore(dsn, namespace=namespace, schema=schema, cipher=cipher)
