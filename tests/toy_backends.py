"""A third party's backends: a session store and a blob storage over a plain dict.

Written only against perdure's public protocols and rules, as a package outside
perdure would write them; tests/test_third_party_backend.py runs perdure's
conformance suites on them (docs/testing.md shows both files).
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from perdure.errors import SessionConflictError, SessionLockedError, SessionNotFoundError
from perdure.session import (
    CommitResult,
    SessionMeta,
    SessionRecord,
    StoreBase,
    validate_session_id,
)
from perdure.session.rules import (
    CommitRequest,
    check_extends,
    check_list_args,
    check_offset,
    creation_time,
    decode_message,
    decode_state,
    encode_message,
    encode_redactions,
    encode_state,
    new_tail,
    plan_commit,
    utc_now,
    writes_anything,
)
from perdure.storage.keys import check_data, validate_key, validate_list_args


@dataclass
class _Session:
    created_at: str
    updated_at: str
    tail: str
    writes: int = 0
    bodies: list[str] = field(default_factory=list)  # messages as stored JSON text
    redacted: dict[int, str] = field(default_factory=dict)
    state: str = "{}"


class DictSessionStore(StoreBase):
    """Sessions in ``data``, a dict shared by every instance opened over it.

    Writer locks live in ``data`` too, so two instances exclude each other as two
    processes would; the instance holding a session's lock commits freely.
    """

    def __init__(self, data: dict[str, Any]) -> None:
        self._sessions: dict[str, _Session] = data.setdefault("sessions", {})
        self._holders: dict[str, object] = data.setdefault("holders", {})
        self._guard: threading.Lock = data.setdefault("guard", threading.Lock())

    async def create(
        self,
        session_id: str,
        *,
        exist_ok: bool = False,
        created_at: datetime | str | None = None,
    ) -> SessionMeta:
        validate_session_id(session_id)
        created = creation_time(created_at)  # checked (and now) by the rules
        with self._guard:
            self._check_lock(session_id)
            if session_id in self._sessions:
                if not exist_ok:
                    raise SessionConflictError(f"session {session_id!r} already exists")
            else:
                self._sessions[session_id] = _Session(created, created, new_tail(0))
            return self._meta(session_id)

    async def get(self, session_id: str, *, offset: int = 0) -> SessionRecord:
        validate_session_id(session_id)
        check_offset(offset)
        with self._guard:
            entry = self._entry(session_id)
            start = min(offset, len(entry.bodies))
            texts = [
                entry.redacted.get(i, entry.bodies[i]) for i in range(start, len(entry.bodies))
            ]
            return SessionRecord(
                meta=self._meta(session_id),
                messages=[decode_message(text) for text in texts],
                offset=start,
                agent_state=decode_state(entry.state),
                tail=entry.tail,
            )

    async def list(
        self, *, limit: int | None = None, after: str | None = None
    ) -> list[SessionMeta]:
        check_list_args(limit, after)
        with self._guard:
            ids = sorted(i for i in self._sessions if after is None or i > after)
            return [self._meta(i) for i in ids[:limit]]

    async def _apply_commit(self, request: CommitRequest) -> CommitResult:
        # StoreBase.commit checked the arguments; the rules decide, the dict stores.
        state = None if request.agent_state is None else encode_state(request.agent_state)
        redacted = encode_redactions(request.redactions)
        with self._guard:
            self._check_lock(request.session_id)
            entry = self._entry(request.session_id)
            stored = len(entry.bodies)
            plan = plan_commit(request, stored, entry.tail)
            if plan.compare_last:
                last = [entry.bodies[-1], entry.redacted.get(stored - 1)]
                check_extends(
                    request.session_id,
                    request.messages,
                    stored,
                    [decode_message(t) for t in last if t],
                )
            new = [
                encode_message(request.messages[i], f"messages[{i}]")
                for i in range(plan.start, len(request.messages))
            ]
            if not writes_anything(request, plan):
                return CommitResult(entry.tail, stored)  # nothing new: the tail stays
            if request.rewritten:
                entry.bodies, entry.redacted = new, {}
            else:
                entry.bodies.extend(new)
            entry.redacted.update(redacted)
            entry.state = entry.state if state is None else state
            entry.writes += 1
            entry.tail, entry.updated_at = new_tail(entry.writes), utc_now()
            return CommitResult(entry.tail, len(entry.bodies))

    async def delete(self, session_id: str) -> None:
        validate_session_id(session_id)
        with self._guard:
            self._check_lock(session_id)
            self._sessions.pop(session_id, None)

    @asynccontextmanager
    async def writer_lock(self, session_id: str) -> AsyncIterator[None]:
        validate_session_id(session_id)
        with self._guard:
            if session_id in self._holders:
                raise SessionLockedError(f"session {session_id!r} is locked by another writer")
            self._holders[session_id] = self
        try:
            yield
        finally:
            with self._guard:
                del self._holders[session_id]

    def _check_lock(self, session_id: str) -> None:
        if self._holders.get(session_id, self) is not self:
            raise SessionLockedError(f"session {session_id!r} is locked by another writer")

    def _entry(self, session_id: str) -> _Session:
        if session_id not in self._sessions:
            raise SessionNotFoundError(f"session {session_id!r} not found")
        return self._sessions[session_id]

    def _meta(self, session_id: str) -> SessionMeta:
        entry = self._sessions[session_id]
        return SessionMeta(session_id, entry.created_at, entry.updated_at, len(entry.bodies))


class DictStorage:
    """Blobs in ``blobs``, a dict shared by every instance opened over it."""

    def __init__(self, blobs: dict[str, bytes]) -> None:
        self._blobs = blobs
        self._guard = threading.Lock()

    async def write(self, key: str, data: bytes) -> None:
        validate_key(key)
        blob = check_data(data)
        with self._guard:
            self._blobs[key] = blob

    async def read(self, key: str) -> bytes | None:
        validate_key(key)
        with self._guard:
            return self._blobs.get(key)

    async def delete(self, key: str) -> None:
        validate_key(key)
        with self._guard:
            self._blobs.pop(key, None)

    async def list(
        self, prefix: str, *, limit: int | None = None, start_after: str | None = None
    ) -> list[str]:
        validate_list_args(prefix, limit, start_after)
        with self._guard:
            keys = sorted(
                k
                for k in self._blobs
                if k.startswith(prefix) and (start_after is None or k > start_after)
            )
        return keys[:limit]
