"""The SessionStore protocol: where message-log sessions live (SPEC §7).

A store keeps, per session, an append-only message history, the agent's persisted
state, and metadata. Stores only move bytes; the rules (what to repair, how pages
align, when to sync state) live in pure modules shared by every store.

Guarantees every store gives:

- ``commit`` appends only what is new: given the whole history, it appends the
  messages past the stored count. With ``rewritten=True`` it replaces the whole
  history atomically (compaction and restore rewrite the prefix).
- ``expected_tail`` makes commits safe against a second writer: when the stored
  tail is not the one the caller last saw, the commit raises
  :class:`~perdure.errors.SessionConflictError` and writes nothing.
- Damaged data raises :class:`~perdure.errors.SessionCorruptedError`; a missing
  session :class:`~perdure.errors.SessionNotFoundError`. Never a silent empty session.
- Every coroutine may be awaited from any event loop and any thread.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from perdure.session.rules import CommitRequest, commit_request
from perdure.types import Message


@dataclass(frozen=True)
class SessionMeta:
    """What ``list`` returns: metadata only, never content.

    Attributes:
        session_id: the session's id.
        created_at: when it was created (ISO-8601 UTC); ``""`` when unreadable.
        updated_at: when it last changed (ISO-8601 UTC); ``""`` when unreadable.
        message_count: messages in its history; ``0`` when unreadable.
        damaged: ``None`` for a session whose metadata reads cleanly. A listing
            never fails nor hides a session because one is damaged: it lists it with
            ``damaged`` set to what is wrong (the message of the
            :class:`~perdure.errors.SessionCorruptedError` that reading it raises,
            code ``session_store_corrupted``), and the fields it could not read
            empty. ``get`` on it raises that error.
        expires_at: in a store with a ``ttl``, when the session expires unless it is
            used before (ISO-8601 UTC); ``None`` without a ttl. A listing shows
            live sessions only: an expired one is left out in every store.
    """

    session_id: str
    created_at: str
    updated_at: str
    message_count: int
    damaged: str | None = None
    expires_at: str | None = None


@dataclass
class SessionRecord:
    """A session as ``get`` returns it.

    Attributes:
        meta: the session's metadata.
        messages: the history from ``offset`` on, redactions applied.
        offset: index of ``messages[0]`` in the whole history.
        agent_state: the last persisted agent state (``{}`` if none yet): the
            ``state``, ``internal_state`` and ``conversation_manager_state`` of the
            session's agent, as :class:`~perdure.session.Session` writes them.
        tail: an opaque token naming the stored tail; pass it back as
            ``expected_tail`` to detect a second writer.
    """

    meta: SessionMeta
    messages: list[Message]
    offset: int = 0
    agent_state: dict[str, Any] = field(default_factory=dict)
    tail: str = ""

    @property
    def message_count(self) -> int:
        """The number of messages in the whole history."""
        return self.meta.message_count


@dataclass(frozen=True)
class CommitResult:
    """What a commit left behind: the new tail token and message count."""

    tail: str
    message_count: int


@dataclass(frozen=True)
class HistoryPage:
    """One page of a history; never splits a tool pair.

    ``offset`` may be earlier than asked (the start moved back to include a
    ``toolUse`` whose result opens the page); the end may move forward. Advance with
    ``next_offset``, never with ``offset + len(messages)``.
    """

    messages: list[Message]
    offset: int
    next_offset: int
    total: int


@runtime_checkable
class SessionStore(Protocol):
    """Where message-log sessions are stored (see the module docstring)."""

    async def create(
        self,
        session_id: str,
        *,
        exist_ok: bool = False,
        created_at: datetime | str | None = None,
    ) -> SessionMeta:
        """Register a new, empty session.

        ``created_at`` is the creation time it keeps (a session moved from another
        store or framework keeps its own): a timezone-aware datetime or ISO-8601 text
        with an offset, stored as UTC (:func:`~perdure.session.rules.creation_time`);
        ``None`` is now. An existing session returned with ``exist_ok`` keeps its own.

        Raises:
            SessionConflictError: it exists already and ``exist_ok`` is false.
            TypeError, ValueError: ``created_at`` is not such a time (a naive one
                names no instant).
        """
        ...

    async def get(self, session_id: str, *, offset: int = 0) -> SessionRecord:
        """Read a session: metadata, messages from ``offset``, agent state, tail.

        Only the messages from ``offset`` are read (with what verifying them needs),
        so ``get(offset=n)`` costs what they, the state and the tail cost, however
        long the history: a :class:`~perdure.session.Session` resumes that way. An
        offset past the end gives no messages and ``record.offset ==
        message_count``. ``offset=0`` reads and verifies the whole session.

        Raises:
            SessionNotFoundError: no such session.
            SessionCorruptedError: the stored data is damaged.
        """
        ...

    async def list(
        self, *, limit: int | None = None, after: str | None = None
    ) -> list[SessionMeta]:
        """Metadata of sessions sorted by id, starting after the id ``after``.

        One damaged session neither fails the listing nor is hidden from it: it is
        listed with :attr:`SessionMeta.damaged` set.
        """
        ...

    async def commit(
        self,
        session_id: str,
        messages: Sequence[Message],
        *,
        agent_state: Mapping[str, Any] | None = None,
        rewritten: bool = False,
        expected_tail: str | None = None,
        redactions: Mapping[int, Message] | None = None,
    ) -> CommitResult:
        """Persist the history ``messages`` (the whole of it) and optionally state.

        Appends ``messages[stored_count:]``; with ``rewritten=True`` replaces the
        whole history atomically. ``redactions`` maps message indexes to
        replacements that reads return from now on (the originals are kept).
        Without ``expected_tail`` the commit must extend the stored history: the
        last stored message (as written or as redacted) must equal
        ``messages[stored_count - 1]``, one comparison that catches a writer who
        diverged from a shared starting point; ``expected_tail`` checks it all.

        Raises:
            SessionNotFoundError: no such session.
            SessionConflictError: ``expected_tail`` is not the stored tail, the
                history is shorter than the stored one without ``rewritten``, or,
                without ``expected_tail``, it diverges from the stored one.
            SessionLockedError: another writer holds the session's lock.
        """
        ...

    async def delete(self, session_id: str) -> None:
        """Delete a session and everything stored with it; absent sessions are fine."""
        ...

    def writer_lock(self, session_id: str) -> AbstractAsyncContextManager[None]:
        """Hold the session's writer lock for the ``async with`` block.

        Raises (on enter):
            SessionLockedError: another writer holds it; never waits.
        """
        ...


class StoreBase:
    """What perdure's stores share: ``commit``'s arguments checked once, by the rules.

    ``commit`` checks its arguments with :func:`~perdure.session.rules.commit_request`
    (the same ``TypeError``/``ValueError`` in every store) and hands them to
    :meth:`_apply_commit`, which a store implements: it plans the commit against
    what it stores (:func:`~perdure.session.rules.plan_commit`) and moves the bytes.
    """

    async def commit(
        self,
        session_id: str,
        messages: Sequence[Message],
        *,
        agent_state: Mapping[str, Any] | None = None,
        rewritten: bool = False,
        expected_tail: str | None = None,
        redactions: Mapping[int, Message] | None = None,
    ) -> CommitResult:
        """Persist the history ``messages``, as :meth:`SessionStore.commit` says.

        Raises:
            TypeError, ValueError: a malformed argument or message, one that cannot
                be stored, or a redaction index that names no message.
            SessionNotFoundError, SessionConflictError, SessionLockedError: as
                :meth:`SessionStore.commit` says.
        """
        request = commit_request(
            session_id, messages, agent_state, rewritten, expected_tail, redactions
        )
        return await self._apply_commit(request)

    async def _apply_commit(self, request: CommitRequest) -> CommitResult:
        """Store a checked commit (see :meth:`commit`)."""
        raise NotImplementedError


@dataclass(frozen=True)
class ExpiredSessionInfo:
    """A session whose ttl ran out, as :meth:`SupportsExpiry.collect_expired` found it.

    Attributes:
        session_id: its id.
        used_at: its last use (ISO-8601 UTC).
        message_count: messages its history held (``0`` when not read).
    """

    session_id: str
    used_at: str
    message_count: int


@runtime_checkable
class SupportsExpiry(Protocol):
    """A store with a ``ttl`` that expires on read and deletes what expired on demand."""

    ttl: float | None

    async def collect_expired(self, *, dry_run: bool = True) -> list[ExpiredSessionInfo]:
        """Delete the messages and state of every expired session (``perdure gc``).

        Each keeps its tombstone (so it still reads as expired) and its checkpoints;
        tombstones past their time are deleted. A dry run deletes nothing.
        """
        ...


@runtime_checkable
class SupportsHistoryPage(Protocol):
    """A store that can read one page without reading the whole history."""

    async def history_page(self, session_id: str, offset: int, limit: int) -> HistoryPage:
        """One pair-aligned page (see :class:`HistoryPage`)."""
        ...


@runtime_checkable
class SupportsFlush(Protocol):
    """A store whose commits may be buffered until ``flush``."""

    async def flush(self, session_id: str) -> None:
        """Make every commit of ``session_id`` durable."""
        ...
