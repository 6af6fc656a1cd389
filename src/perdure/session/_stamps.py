"""When each session was last used, for the stores that expire on read (SPEC §9).

The file, SQLite and memory stores keep one *use stamp* per session: its last use
(a commit, a ``get``, a ``create``) as seconds since the epoch. The stamp outlives
the session's data when ``perdure gc`` deletes an expired session: it is then the
session's tombstone, until :func:`~perdure.session.expiry.tomb_seconds` after that
last use. :class:`Expiry` applies the rules of :mod:`perdure.session.expiry` over a
keeper of stamps, the same way in the three stores:

- :class:`MemoryStamps`: a dict (the memory store);
- :class:`DirStamps`: one empty file per session in a directory, its modification
  time the stamp (``os.utime``: one system call to renew, none to fsync — a renewal
  lost to a power cut only makes a session expire earlier, never lose data).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol, TypeVar

from perdure.errors import SessionLockedError, SessionNotFoundError
from perdure.session.expiry import (
    IdStatus,
    expires_at,
    id_status,
    is_expired,
    iso_time,
    not_found,
    tomb_seconds,
)
from perdure.session.store import ExpiredSessionInfo, SessionMeta

__all__ = ["DirStamps", "Expiry", "MemoryStamps", "Stamps", "collect_expired", "live_listing"]

_T = TypeVar("_T")
_LIST_PAGE = 500  # session rows a filtered listing fetches at a time


class Stamps(Protocol):
    """Where a store keeps its sessions' last uses."""

    def used_at(self, session_id: str) -> float | None:
        """The session's last use (``None``: no stamp)."""
        ...

    def touch(self, session_id: str, now: float) -> None:
        """Record a use at ``now``."""
        ...

    def forget(self, session_id: str) -> None:
        """Drop the stamp (absent is fine)."""
        ...

    def stamped(self) -> list[str]:
        """Every id with a stamp."""
        ...


class MemoryStamps:
    """Stamps in a dict (thread-safe)."""

    def __init__(self) -> None:
        self._stamps: dict[str, float] = {}
        self._guard = threading.Lock()

    def used_at(self, session_id: str) -> float | None:
        with self._guard:
            return self._stamps.get(session_id)

    def touch(self, session_id: str, now: float) -> None:
        with self._guard:
            self._stamps[session_id] = now

    def forget(self, session_id: str) -> None:
        with self._guard:
            self._stamps.pop(session_id, None)

    def stamped(self) -> list[str]:
        with self._guard:
            return list(self._stamps)


class DirStamps:
    """Stamps as the modification times of empty files ``<dir>/<session_id>``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def used_at(self, session_id: str) -> float | None:
        try:
            return os.stat(self.directory / session_id).st_mtime
        except FileNotFoundError:
            return None

    def touch(self, session_id: str, now: float) -> None:
        path = self.directory / session_id
        try:
            os.utime(path, (now, now))
        except FileNotFoundError:
            self.directory.mkdir(parents=True, exist_ok=True)
            path.touch()
            os.utime(path, (now, now))

    def forget(self, session_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.directory / session_id)

    def stamped(self) -> list[str]:
        try:
            return [name for name in os.listdir(self.directory) if not name.startswith(".")]
        except FileNotFoundError:
            return []


class Expiry:
    """A store's TTL bookkeeping: the rules of :mod:`perdure.session.expiry` over stamps.

    Args:
        ttl: the store's ttl (``None``: sessions never expire; nothing is stamped).
        stamps: where the last uses are kept.
        where: the store, as its errors name it.
    """

    def __init__(self, ttl: float | None, stamps: Stamps, where: str) -> None:
        self.ttl = ttl
        self.stamps = stamps
        self.where = where

    def check(self, session_id: str) -> bool:
        """Before a use: raise if the session expired, else renew it.

        Returns whether it was renewed (a session without a stamp — absent, or made
        before the store had a ttl — is renewed by :meth:`renew` once the use
        succeeded).

        Raises:
            SessionNotFoundError: expired (``details["reason"] == "expired"``).
        """
        if self.ttl is None:
            return True
        used = self.stamps.used_at(session_id)
        if used is None:
            return False
        now = time.time()
        if is_expired(used, self.ttl, now):
            raise self.not_found(session_id, expired=True)
        self.stamps.touch(session_id, now)
        return True

    def use(self, session_id: str, work: Callable[[], _T], *, renew: bool = True) -> _T:
        """Run a store's own read or write of the session under the ttl rules.

        Expired: ``session_not_found`` (reason ``expired``) before ``work`` runs. A
        ``session_not_found`` from ``work`` is raised again with its reason (an
        expired session's tombstone, or ``unknown``). With ``renew`` (a commit, a
        ``get``) the use renews the session.
        """
        if renew:
            renewed = self.check(session_id)
        else:
            if self.is_expired(session_id):
                raise self.not_found(session_id, expired=True)
            renewed = True
        try:
            result = work()
        except SessionNotFoundError:
            raise self.not_found(session_id) from None
        if not renewed:
            self.renew(session_id)
        return result

    def renew(self, session_id: str) -> None:
        """Record a use now (with a ttl)."""
        if self.ttl is not None:
            self.stamps.touch(session_id, time.time())

    def status(self, session_id: str, exists: bool) -> IdStatus:
        """The id's status (see :func:`~perdure.session.expiry.id_status`)."""
        if self.ttl is None:
            return "live" if exists else "unknown"
        return id_status(exists, self.stamps.used_at(session_id), self.ttl, time.time())

    def is_expired(self, session_id: str) -> bool:
        """Whether the session's stamp says it expired (its data may still be there)."""
        if self.ttl is None:
            return False
        used = self.stamps.used_at(session_id)
        return used is not None and is_expired(used, self.ttl, time.time())

    def has_tombstone(self, session_id: str) -> bool:
        """Whether the id is an expired session's (data there or not, tombstone alive)."""
        return self.status(session_id, exists=False) == "expired"

    def not_found(self, session_id: str, *, expired: bool | None = None) -> SessionNotFoundError:
        """The store's ``session_not_found``; ``expired=None``: as the stamp says."""
        if expired is None:
            expired = self.has_tombstone(session_id)
        error: SessionNotFoundError = not_found(
            session_id, self.where, expired=expired, ttl=self.ttl
        )
        return error

    def expires_at(self, session_id: str) -> str | None:
        """When the session expires, ISO-8601 UTC (``None``: no ttl or no stamp)."""
        if self.ttl is None:
            return None
        return expires_at(self.stamps.used_at(session_id), self.ttl)

    def forget(self, session_id: str) -> None:
        """Drop the session's stamp (its ``delete``: the id is unknown afterwards)."""
        self.stamps.forget(session_id)

    def dead_tombstones(self, live: set[str]) -> list[str]:
        """Stamped ids, not in ``live``, whose tombstone's time is over."""
        if self.ttl is None:
            return []
        now, keep = time.time(), tomb_seconds(self.ttl)
        dead = []
        for session_id in self.stamps.stamped():
            used = self.stamps.used_at(session_id)
            if session_id not in live and used is not None and now - used > keep:
                dead.append(session_id)
        return dead


def live_listing(
    expiry: Expiry,
    fetch: Callable[[int | None, str | None], list[SessionMeta]],
    limit: int | None,
    after: str | None,
) -> list[SessionMeta]:
    """A store's listing without its expired sessions, with ``expires_at`` set.

    ``fetch(limit, after)`` is the store's own listing; it is called page after
    page until ``limit`` live sessions are found. A damaged session is never hidden,
    unless its stamp says it expired (what a gc a crash stopped leaves).
    """
    if expiry.ttl is None:
        return fetch(limit, after)
    found: list[SessionMeta] = []
    while limit is None or len(found) < limit:
        page = fetch(_LIST_PAGE, after)
        for meta in page:
            if expiry.is_expired(meta.session_id):
                continue  # even a damaged one: a gc stopped half-way leaves that
            if meta.damaged is not None:
                found.append(meta)
            else:
                expires = expiry.expires_at(meta.session_id)
                found.append(dataclasses.replace(meta, expires_at=expires))
        if len(page) < _LIST_PAGE:
            break
        after = page[-1].session_id
    return found if limit is None else found[:limit]


def collect_expired(
    expiry: Expiry,
    sessions: Iterable[tuple[str, int]],
    purge: Callable[[str], None],
    dry_run: bool,
) -> list[ExpiredSessionInfo]:
    """Find (and unless ``dry_run`` purge) the expired sessions among ``sessions``.

    Args:
        expiry: the store's ttl bookkeeping.
        sessions: every stored session, as ``(session_id, message_count)``.
        purge: deletes a session's messages and state, keeping its checkpoints
            (the stamp stays: the tombstone); raises ``SessionLockedError`` while a
            writer holds the session, which is then left for the next gc.
        dry_run: change nothing.

    Tombstones past their time (stamps of ids without data) are forgotten too.
    """
    if expiry.ttl is None:
        return []
    found: list[ExpiredSessionInfo] = []
    present: set[str] = set()
    for session_id, count in sessions:
        present.add(session_id)
        if not expiry.is_expired(session_id):
            continue
        used = expiry.stamps.used_at(session_id)
        info = ExpiredSessionInfo(session_id, iso_time(used or time.time()), count)
        if not dry_run:
            try:
                purge(session_id)
            except SessionLockedError:
                continue  # in use right now: not expired for long
        found.append(info)
    if not dry_run:
        for session_id in expiry.dead_tombstones(present):
            expiry.forget(session_id)
    return found
