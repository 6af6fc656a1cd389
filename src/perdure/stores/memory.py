"""MemorySessionStore: sessions kept in this process's memory, for tests (SPEC §7).

It keeps the contract of the persistent stores exactly, so a test written against it
holds for them: messages are stored as the same JSON text the SQLite store writes
(``bytes`` encoded) and decoded on every read, so what comes out is a fresh copy
that equals what a persistent store would return — and a message that a persistent
store would refuse (not JSON-serialisable, malformed) is refused here too. Tail
tokens, conflicts, redactions, rewrites and pages behave the same way.

Checkpoints live in :attr:`MemorySessionStore.checkpoints`, a
:class:`~perdure.checkpoints.store.MemoryCheckpointStore`: deleting a session drops
its checkpoints, and a session created anew starts without any (as in the
persistent stores).

Guarantees: a commit is applied entirely or not at all (everything is encoded
before anything changes). Nothing survives the process. Every coroutine may be
awaited from any event loop and any thread (a ``threading`` lock guards the data;
nothing blocks on I/O). Writer locks exclude holders inside this process only.

With ``cipher=`` (a :class:`~perdure.crypto.Cipher`) message bodies, state and
checkpoints are kept encrypted, as in every store (SPEC §9).

With ``ttl=`` (seconds of inactivity) a session expires as in the file and SQLite
stores (:mod:`perdure.session._stamps`): every commit, ``get`` and ``create`` renews
it; past it, reads and commits raise ``session_not_found`` with
``details["reason"] == "expired"``, ``list`` leaves it out, ``create`` starts it
afresh (its checkpoints kept), and :meth:`MemorySessionStore.collect_expired`
(``perdure gc``) drops its messages, keeping a tombstone.
"""

from __future__ import annotations

import builtins
import time
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import datetime
from threading import Lock

import perdure.session.rules as rules
from perdure.checkpoints.store import MemoryCheckpointStore
from perdure.crypto import Cipher
from perdure.errors import SessionConflictError, SessionCorruptedError
from perdure.session._locks import LockTable
from perdure.session._stamps import Expiry, MemoryStamps
from perdure.session.expiry import check_ttl, iso_time
from perdure.session.ids import validate_session_id
from perdure.session.paging import check_page_args, page_of, page_read_range
from perdure.session.rules import check_cipher
from perdure.session.store import (
    CommitResult,
    ExpiredSessionInfo,
    HistoryPage,
    SessionMeta,
    SessionRecord,
    StoreBase,
)
from perdure.types import Message

__all__ = ["MemorySessionStore"]


@dataclass
class _Entry:
    created_at: str
    updated_at: str
    tail: str
    writes: int = 0
    bodies: list[str] = field(default_factory=list)
    redacted: dict[int, str] = field(default_factory=dict)
    state: str = "{}"

    def meta(self, session_id: str) -> SessionMeta:
        return SessionMeta(session_id, self.created_at, self.updated_at, len(self.bodies))


class MemorySessionStore(StoreBase):
    """Sessions in memory with the semantics of the persistent stores (see the module).

    Args:
        ttl: seconds of inactivity after which a session expires (``None``: never).
        max_checkpoints: keep at most this many checkpoints per session in
            :attr:`checkpoints` (the oldest are evicted, whatever their trigger).
        max_checkpoint_age: seconds; older checkpoints of a session are evicted when
            it gets a new one (and by ``perdure gc``).
        cipher: encrypts message bodies, state and checkpoints (SPEC §9).
    """

    def __init__(
        self,
        *,
        ttl: float | None = None,
        max_checkpoints: int | None = None,
        max_checkpoint_age: float | None = None,
        cipher: Cipher | None = None,
    ) -> None:
        self.ttl = check_ttl(ttl)
        self.cipher = check_cipher(cipher)
        self._expiry = Expiry(self.ttl, MemoryStamps(), "the memory store")
        self._sessions: dict[str, _Entry] = {}
        self._guard = Lock()
        self._locks = LockTable()
        self.checkpoints = MemoryCheckpointStore(
            max_checkpoints=max_checkpoints, max_checkpoint_age=max_checkpoint_age, cipher=cipher
        )
        """Checkpoints kept beside the sessions, dropped with their session."""
        self.max_checkpoints = self.checkpoints.max_checkpoints
        self.max_checkpoint_age = self.checkpoints.max_checkpoint_age

    def __repr__(self) -> str:
        return f"MemorySessionStore(<{len(self._sessions)} sessions>)"

    async def create(
        self,
        session_id: str,
        *,
        exist_ok: bool = False,
        created_at: datetime | str | None = None,
    ) -> SessionMeta:
        """Register a new, empty session, created at ``created_at`` (default: now).

        Raises:
            SessionConflictError: it exists already and ``exist_ok`` is false.
            SessionLockedError: another writer holds the session's lock.
            TypeError, ValueError: ``created_at`` is no timezone-aware time (see
                :meth:`SessionStore.create`).
        """
        validate_session_id(session_id)
        created = rules.creation_time(created_at)
        with self._guard:
            entry = self._sessions.get(session_id)
        if entry is None or self._expiry.is_expired(session_id):
            with self._locks.for_write(session_id), self._guard:
                entry = self._sessions.get(session_id)
                expired = self._expiry.is_expired(session_id)
                if entry is None or expired:
                    entry = self._sessions[session_id] = _Entry(created, created, rules.new_tail(0))
                    if not expired:
                        # Leftovers put before the session existed do not belong to
                        # it; an expired session's checkpoints stay (SPEC §7).
                        self.checkpoints.drop_session(session_id)
                    self._expiry.renew(session_id)
                    return self._meta(session_id, entry)
        if not exist_ok:
            raise SessionConflictError(f"session {session_id!r} already exists")
        self._expiry.renew(session_id)
        with self._guard:
            return self._meta(session_id, entry)

    async def get(self, session_id: str, *, offset: int = 0) -> SessionRecord:
        """A fresh copy of a session: metadata, messages from ``offset``, state, tail.

        With ``ttl`` it renews the session.

        Raises:
            SessionNotFoundError: no such session (``details["reason"]``:
                ``"unknown"`` or ``"expired"``).
        """
        rules.check_get_args(session_id, offset)
        with self._guard:
            entry = self._entry(session_id)
            self._expiry.renew(session_id)
            start = min(offset, len(entry.bodies))
            texts = [
                entry.redacted.get(i, entry.bodies[i]) for i in range(start, len(entry.bodies))
            ]
            meta, state, tail = entry.meta(session_id), entry.state, entry.tail
        return SessionRecord(
            meta=meta,
            messages=[self._decode(session_id, start + i, text) for i, text in enumerate(texts)],
            offset=start,
            agent_state=rules.decode_state(state, self.cipher),
            tail=tail,
        )

    async def list(
        self, *, limit: int | None = None, after: str | None = None
    ) -> builtins.list[SessionMeta]:
        """Metadata of live sessions sorted by id, ids greater than ``after``.

        Raises:
            ValueError: a bad ``limit`` or ``after``.
        """
        rules.check_list_args(limit, after)
        with self._guard:
            ids = sorted(
                i
                for i in self._sessions
                if (after is None or i > after) and not self._expiry.is_expired(i)
            )
            ids = ids if limit is None else ids[:limit]
            return [self._meta(i, self._sessions[i]) for i in ids]

    async def collect_expired(self, *, dry_run: bool = True) -> builtins.list[ExpiredSessionInfo]:
        """Drop the messages and state of every expired session (``perdure gc``).

        Each keeps its tombstone (it still reads as expired) and its checkpoints;
        tombstones past their time go. A dry run changes nothing.
        """
        found: builtins.list[ExpiredSessionInfo] = []
        with self._guard:
            for session_id in sorted(self._sessions):
                if self._expiry.is_expired(session_id) and not self._locks.is_held(session_id):
                    used = self._expiry.stamps.used_at(session_id) or time.time()
                    count = len(self._sessions[session_id].bodies)
                    found.append(ExpiredSessionInfo(session_id, iso_time(used), count))
                    if not dry_run:
                        del self._sessions[session_id]
            if not dry_run:
                for session_id in self._expiry.dead_tombstones(set(self._sessions)):
                    self._expiry.forget(session_id)
        return found

    async def _apply_commit(self, request: rules.CommitRequest) -> CommitResult:
        """Store a checked commit, planned by the rules; applied entirely or not at all.

        Everything is encoded before anything changes, so a commit that fails leaves
        the session as it was (as one SQLite transaction would).
        """
        session_id, messages, agent_state = (
            request.session_id,
            request.messages,
            request.agent_state,
        )
        state_text = None if agent_state is None else rules.encode_state(agent_state, self.cipher)
        redaction_texts = rules.encode_redactions(request.redactions, self.cipher)
        with self._locks.for_write(session_id), self._guard:
            entry = self._entry(session_id)
            self._expiry.renew(session_id)
            stored = len(entry.bodies)
            plan = rules.plan_commit(request, stored, entry.tail)
            if plan.compare_last:
                last = [entry.bodies[stored - 1], entry.redacted.get(stored - 1)]
                rules.check_extends(
                    session_id,
                    messages,
                    stored,
                    [self._decode(session_id, stored - 1, t) for t in last if t is not None],
                )
            new = [
                rules.encode_message(messages[i], f"messages[{i}]", self.cipher)
                for i in range(plan.start, len(messages))
            ]
            if not rules.writes_anything(request, plan):
                return CommitResult(entry.tail, stored)
            # Everything is encoded: from here on nothing can fail half-way.
            if request.rewritten:
                entry.bodies = new
                entry.redacted = {}
            else:
                entry.bodies.extend(new)
            entry.redacted.update(redaction_texts)
            if state_text is not None:
                entry.state = state_text
            entry.writes += 1
            entry.tail = rules.new_tail(entry.writes)
            entry.updated_at = rules.utc_now()
            return CommitResult(entry.tail, len(entry.bodies))

    async def delete(self, session_id: str) -> None:
        """Forget a session and its checkpoints; an absent session is fine.

        Raises:
            SessionLockedError: another writer holds the session's lock.
        """
        validate_session_id(session_id)
        with self._locks.for_write(session_id), self._guard:
            self._sessions.pop(session_id, None)
            self._expiry.forget(session_id)
            self.checkpoints.drop_session(session_id)

    def writer_lock(self, session_id: str) -> AbstractAsyncContextManager[None]:
        """Hold the session's writer lock for an ``async with`` block (this process only).

        Raises (on enter):
            SessionLockedError: another holder in this process has it; never waits.
        """
        validate_session_id(session_id)
        return self._locks.hold(session_id)

    async def history_page(self, session_id: str, offset: int, limit: int) -> HistoryPage:
        """One pair-aligned page (see :class:`~perdure.session.store.HistoryPage`).

        Raises:
            SessionNotFoundError: no such session.
        """
        validate_session_id(session_id)
        check_page_args(offset, limit)
        with self._guard:
            entry = self._entry(session_id)
            total = len(entry.bodies)
            lo, hi = page_read_range(total, offset, limit)
            texts = [entry.redacted.get(i, entry.bodies[i]) for i in range(lo, hi)]
        window = [self._decode(session_id, lo + i, text) for i, text in enumerate(texts)]
        return page_of(total, offset, limit, lo, window)

    def _entry(self, session_id: str) -> _Entry:
        """The live session's entry (expired: ``session_not_found``, reason expired)."""
        entry = self._sessions.get(session_id)
        if entry is None:
            raise self._expiry.not_found(session_id)
        if self._expiry.is_expired(session_id):
            raise self._expiry.not_found(session_id, expired=True)
        return entry

    def _meta(self, session_id: str, entry: _Entry) -> SessionMeta:
        meta = entry.meta(session_id)
        if self.ttl is None:
            return meta
        return SessionMeta(
            session_id,
            meta.created_at,
            meta.updated_at,
            meta.message_count,
            expires_at=self._expiry.expires_at(session_id),
        )

    def _decode(self, session_id: str, index: int, text: str) -> Message:
        try:
            return rules.decode_message(text, self.cipher)
        except rules.DecodeError as exc:  # only a bug could store such text; say so loudly
            raise SessionCorruptedError(
                f"session {session_id!r}: message {index}: {exc}",
                details={"session_id": session_id, "kind": "bad_payload", "row": index},
            ) from None
