"""The memory view: one user's (namespace's) memories, listed, searched, deleted.

``--memory URL`` names the store: ``sqlite:PATH`` (a :class:`LocalMemoryStore`
file) or ``postgresql://…[?schema=NAME]`` (a :class:`PostgresMemoryStore`), opened by
:func:`~perdure.memory.urls.open_memory_store` with the server's keys, if any. A memory
store object serves one namespace, so the browser keeps one per namespace asked
for, the :data:`MAX_OPEN` most recent open.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from perdure._runtime.urls import split_url
from perdure.crypto import Cipher
from perdure.memory import MemoryEntry
from perdure.memory.rules import check_namespace
from perdure.memory.urls import MEMORY_SCHEMES, open_memory_store

MAX_OPEN = 16


def entry_dict(entry: MemoryEntry) -> dict[str, Any]:
    """A memory as JSON: its id, text, time, score and the rest of its metadata."""
    meta = dict(entry.metadata or {})
    return {
        "memory_id": meta.pop("memory_id", None),
        "created_at": meta.pop("created_at", None),
        "content": entry.content,
        "score": entry.score,
        "metadata": meta,
    }


class MemoryBrowser:
    """Opens the ``--memory`` store once per namespace and closes them all at the end.

    Raises:
        ValueError: ``url`` is not ``sqlite:PATH`` or a PostgreSQL URL (on construction).
    """

    def __init__(self, url: str, *, cipher: Cipher | None = None) -> None:
        split_url(url, MEMORY_SCHEMES, "memory store")  # a bad URL: refused at once
        self.url = url
        self.cipher = cipher
        self._open: OrderedDict[str, Any] = OrderedDict()

    def store(self, namespace: str) -> Any:
        """The memory store of ``namespace`` (opened on first use)."""
        check_namespace(namespace)
        found = self._open.pop(namespace, None)
        if found is None:
            found = open_memory_store(self.url, namespace=namespace, cipher=self.cipher)
        self._open[namespace] = found
        while len(self._open) > MAX_OPEN:
            _, oldest = self._open.popitem(last=False)
            oldest.close()
        return found

    async def entries(
        self, namespace: str, *, query: str | None, offset: int, limit: int
    ) -> dict[str, Any]:
        """A page of the namespace's memories, oldest first, or (with ``query``) the best
        ``limit`` matches."""
        store = self.store(namespace)
        total: int = await store.count()
        if query:
            found = await store.search(query, limit=limit)
            next_offset = None
        else:
            found = await store.list(limit=limit, offset=offset)
            next_offset = offset + len(found) if offset + len(found) < total else None
        return {
            "namespace": namespace,
            "total": total,
            "offset": 0 if query else offset,
            "next_offset": next_offset,
            "entries": [entry_dict(e) for e in found],
        }

    async def delete(self, namespace: str, memory_id: int) -> int:
        """Delete one memory of the namespace; how many were deleted (0 or 1)."""
        deleted: int = await self.store(namespace).delete(memory_id)
        return deleted

    def close(self) -> None:
        """Close every store opened."""
        while self._open:
            _, store = self._open.popitem()
            store.close()
