"""The session list: every session's metadata, read once, paged by id or by update time.

Sorting by update time or filtering by id needs every session's metadata, and even
the id order costs a store more than one page at 100k sessions (a file store lists
its directory for each page; SQLite checks its whole id index on the first). So
:class:`SessionIndex` reads every session's metadata in one ``store.list()`` and
pages sorted copies server-side (by id, from a cursor, or by update time, from an
offset): a page costs a slice, and the browser never holds more than one page.

The first read starts with the server (:meth:`SessionIndex.warm`). The copy is read
again when it is older than :data:`MAX_AGE` seconds (or ten times what the last full
read took, if more), or at once after a write through the server. A store that
lists quickly (the last full read took under :data:`FRESH_SCAN` seconds) is read
again before answering, so the answer is current; a big one (a file store of 100k
sessions takes seconds) answers from the copy it has while a new one is read in the
background. Every answer says when its copy was read (``as_of``).
"""

from __future__ import annotations

import asyncio
import bisect
import time

from perdure.session.store import SessionMeta, SessionStore

MAX_AGE = 10.0
"""Seconds a full listing is reused before it is read again."""
FRESH_SCAN = 0.5
"""A full listing faster than this (seconds) is waited for; a slower one is not."""


class SessionIndex:
    """Every session's metadata, sorted by update time (see the module docstring)."""

    def __init__(self, store: SessionStore, *, max_age: float = MAX_AGE) -> None:
        self.store = store
        self.max_age = max_age
        self._by_updated: list[SessionMeta] = []
        self._by_id: list[SessionMeta] = []
        self._ids: list[str] = []
        self._read_at: float | None = None  # time.time() the copy was read at
        self._stale = True
        self._scan_seconds = 0.0
        self._lock = asyncio.Lock()
        self._refresh: asyncio.Task[None] | None = None
        self._reads = 0  # full reads finished

    def invalidate(self) -> None:
        """A session changed here: read the store again before the next answer (or
        in the background, for a store that lists slowly)."""
        self._stale = True

    def warm(self) -> None:
        """Start the first full read in the background (the server is starting)."""
        if self._refresh is None:
            self._refresh = asyncio.get_running_loop().create_task(self._read())

    async def sessions(self) -> float:
        """Make sure a copy is there (read again as the module docstring says); when it
        was read (``time.time()``)."""
        reading = self._refresh is not None and not self._refresh.done()
        if self._read_at is None and reading:
            assert self._refresh is not None
            await asyncio.shield(self._refresh)  # the first read, under way
        age = max(self.max_age, 10 * self._scan_seconds)
        old = self._read_at is None or time.time() - self._read_at > age
        if self._read_at is None or ((self._stale or old) and self._scan_seconds < FRESH_SCAN):
            await self._read()
        elif (self._stale or old) and not reading:
            self._refresh = asyncio.get_running_loop().create_task(self._read())
        assert self._read_at is not None
        return self._read_at

    async def page(
        self,
        *,
        order: str,
        contains: str | None = None,
        after: str | None = None,
        offset: int = 0,
        limit: int,
    ) -> tuple[list[SessionMeta], int, int, float]:
        """One page of the sorted (and filtered) sessions: from ``offset``, or (id order
        only) after the id ``after``. Also where the page starts, how many there are in
        all, and when the listing was read.

        Raises:
            ValueError: ``after`` with another order than ``id``, or with ``contains``.
        """
        read_at = await self.sessions()
        found = self._by_id if order == "id" else self._by_updated
        if contains:
            needle = contains.lower()
            found = [m for m in found if needle in m.session_id.lower()]
        if after is not None:
            if order != "id" or contains:
                raise ValueError("after pages the id order only; use offset with order or q")
            offset = bisect.bisect_right(self._ids, after)
        return found[offset : offset + limit], offset, len(found), read_at

    async def close(self) -> None:
        """Stop a background read (the server is stopping)."""
        if self._refresh is not None:
            self._refresh.cancel()
            await asyncio.gather(self._refresh, return_exceptions=True)

    async def _read(self) -> None:
        asked = self._reads
        async with self._lock:  # one full read at a time
            if self._reads > asked and not self._stale:
                return  # a read that started after this was asked for just finished
            self._stale = False
            started, at = time.monotonic(), time.time()
            by_id = sorted(await self.store.list(), key=lambda m: m.session_id)
            # ISO-8601 UTC strings sort as times; a damaged session ("") sorts last.
            self._by_updated = sorted(by_id, key=lambda m: m.updated_at, reverse=True)
            self._by_id, self._ids = by_id, [m.session_id for m in by_id]
            self._read_at = at
            self._scan_seconds = time.monotonic() - started
            self._reads += 1
