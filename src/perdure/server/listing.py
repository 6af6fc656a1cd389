"""The session list the page shows: by id straight from the store, or by update time.

``store.list`` walks sessions in id order, a page at a time, so the id order costs one
page per request at any store size. Sorting by update time, or filtering by id,
needs every session's metadata: :class:`SessionIndex` reads it once (pages of
:data:`SCAN_PAGE`), keeps it for :data:`MAX_AGE` seconds, and pages the sorted copy
server-side, so the browser never holds more than one page. A write through the
server marks it stale at once.
"""

from __future__ import annotations

import asyncio
import time

from perdure.session.store import SessionMeta, SessionStore

SCAN_PAGE = 1000
MAX_AGE = 10.0
"""Seconds a full listing is reused before it is read again."""


class SessionIndex:
    """Every session's metadata, sorted by update time, read at most every ``max_age`` s."""

    def __init__(self, store: SessionStore, *, max_age: float = MAX_AGE) -> None:
        self.store = store
        self.max_age = max_age
        self._by_updated: list[SessionMeta] = []
        self._read_at: float | None = None
        self._lock = asyncio.Lock()

    def invalidate(self) -> None:
        """Read the store again on the next request (a session changed here)."""
        self._read_at = None

    async def sessions(self) -> list[SessionMeta]:
        """All sessions, most recently updated first (ties by id)."""
        async with self._lock:
            now = time.monotonic()
            if self._read_at is None or now - self._read_at > self.max_age:
                self._by_updated = await self._scan()
                self._read_at = time.monotonic()
            return self._by_updated

    async def page(
        self, *, order: str, contains: str | None, offset: int, limit: int
    ) -> tuple[list[SessionMeta], int]:
        """One page of the sorted (and filtered) sessions, and how many there are in all."""
        found = await self.sessions()
        if order == "id":
            found = sorted(found, key=lambda m: m.session_id)
        if contains:
            needle = contains.lower()
            found = [m for m in found if needle in m.session_id.lower()]
        return found[offset : offset + limit], len(found)

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
