"""The session list the page shows: by id straight from the store, or by update time.

``store.list`` walks sessions in id order, a page at a time, so the id order costs one
page per request at any store size. Sorting by update time, or filtering by id,
needs every session's metadata: :class:`SessionIndex` reads it (pages of
:data:`SCAN_PAGE`) and pages the sorted copy server-side, so the browser never holds
more than one page.

The copy is read again when it is older than :data:`MAX_AGE` seconds, or at once
after a write through the server. A store that lists quickly (the last full read
took under :data:`FRESH_SCAN` seconds) is read again before answering, so the answer
is current; a big one (a file store of 100k sessions takes seconds) answers from
the copy it has while a new one is read in the background, and says how old its
copy is (``as_of``).
"""

from __future__ import annotations

import asyncio
import time

from perdure.session.store import SessionMeta, SessionStore

SCAN_PAGE = 1000
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
        self._read_at: float | None = None  # time.time() the copy was read at
        self._stale = True
        self._scan_seconds = 0.0
        self._lock = asyncio.Lock()
        self._refresh: asyncio.Task[None] | None = None

    def invalidate(self) -> None:
        """A session changed here: read the store again before the next answer (or
        in the background, for a store that lists slowly)."""
        self._stale = True

    async def sessions(self) -> tuple[list[SessionMeta], float]:
        """All sessions, most recently updated first (ties by id), and when they were read."""
        old = self._read_at is None or time.time() - self._read_at > self.max_age
        if self._read_at is None or ((self._stale or old) and self._scan_seconds < FRESH_SCAN):
            await self._read()
        elif (self._stale or old) and (self._refresh is None or self._refresh.done()):
            self._refresh = asyncio.get_running_loop().create_task(self._read())
        assert self._read_at is not None
        return self._by_updated, self._read_at

    async def page(
        self, *, order: str, contains: str | None, offset: int, limit: int
    ) -> tuple[list[SessionMeta], int, float]:
        """One page of the sorted (and filtered) sessions, how many there are in all,
        and when the listing was read."""
        found, read_at = await self.sessions()
        if order == "id":
            found = sorted(found, key=lambda m: m.session_id)
        if contains:
            needle = contains.lower()
            found = [m for m in found if needle in m.session_id.lower()]
        return found[offset : offset + limit], len(found), read_at

    async def close(self) -> None:
        """Stop a background read (the server is stopping)."""
        if self._refresh is not None:
            self._refresh.cancel()
            await asyncio.gather(self._refresh, return_exceptions=True)

    async def _read(self) -> None:
        async with self._lock:  # one full read at a time
            self._stale = False
            started, at = time.monotonic(), time.time()
            self._by_updated = await self._scan()
            self._read_at = at
            self._scan_seconds = time.monotonic() - started

    async def _scan(self) -> list[SessionMeta]:
        metas: list[SessionMeta] = []
        after: str | None = None
        while True:
            batch = await self.store.list(limit=SCAN_PAGE, after=after)
            metas.extend(batch)
            if len(batch) < SCAN_PAGE:
                break
            after = batch[-1].session_id
        # ISO-8601 UTC strings sort as times; a damaged session ("") sorts last.
        metas.sort(key=lambda m: m.session_id)
        metas.sort(key=lambda m: m.updated_at, reverse=True)
        return metas
