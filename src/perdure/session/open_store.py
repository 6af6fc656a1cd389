"""``open_store(url)``: a SessionStore chosen by URL scheme (STYLE §8).

=================  ==============================================
``file:DIR``       :class:`FileSessionStore` rooted at ``DIR``
``sqlite:PATH``    :class:`SQLiteSessionStore` in the file ``PATH``
``memory:``        a new :class:`MemorySessionStore`
=================  ==============================================

Server schemes (``postgresql://``, ``redis://``, ``s3://``) join this table with
their issues; each imports its driver lazily and, when it is missing, says which
extra to install.
"""

from __future__ import annotations

from typing import Any

from perdure.session.store import SessionStore
from perdure.storage import split_url

SCHEMES = ("file", "sqlite", "memory")
LATER_SCHEMES = ("postgresql", "postgres", "redis", "rediss", "s3")
"""Server stores that join with their issues."""


def open_store(url: str, **options: Any) -> SessionStore:
    """Open the session store a URL names; ``options`` go to the store's constructor.

    Raises:
        ValueError: the URL is malformed or its scheme unknown (the message lists
            the known schemes).
    """
    if isinstance(url, str) and url.partition(":")[0] in (
        "postgresql",
        "postgres",
        "redis",
        "rediss",
        "s3",
    ):
        raise ValueError(
            f"store scheme {url.partition(':')[0]!r} is not available in this version of perdure"
        )
    scheme, path = split_url(url, SCHEMES, "store")
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
