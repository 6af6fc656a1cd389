"""The OpenAI Agents SDK's ``Session`` on any perdure session store (``perdure[openai-agents]``).

::

    from agents import Agent, Runner
    from perdure.adapters.openai_agents import PerdureSession

    session = PerdureSession("user-42", "sqlite:./sessions.db")  # or a store object
    result = await Runner.run(agent, "Hello", session=session)

:class:`PerdureSession` implements the SDK's ``Session`` protocol (``get_items``,
``add_items``, ``pop_item``, ``clear_session`` and ``session_settings``) over a
perdure :class:`~perdure.session.SessionStore` — file, SQLite, memory, PostgreSQL or
Redis, a store object or an :func:`~perdure.session.open_store` URL — and answers as
the SDK's own ``SQLiteSession`` does for any sequence of calls: ``get_items(limit)``
gives the last ``limit`` items in chronological order (``limit=None`` uses
``session_settings.limit``, then everything; ``0`` gives ``[]``; a negative limit
everything, as SQLite's ``LIMIT`` does), ``pop_item`` removes and returns the newest
item (``None`` when empty), ``clear_session`` empties the session, and an unknown
session reads as empty. Items come back equal to those added (a JSON round trip of
them, as ``SQLiteSession`` gives).

**How items are stored.** Each item is kept whole inside one perdure message, in a
``json`` block, ``{"role": …, "content": [{"json": {"openai_agents_item": item}}]}``
(the role tells who produced it; see :mod:`perdure.migrate.openai_agents`). Nothing is
translated, so every item type — messages, function calls and their outputs,
reasoning, hosted-tool calls, items of SDK versions to come — round-trips exactly,
and the session is an ordinary perdure session: hash-chained, checked by ``perdure
verify``, healed by ``perdure repair``, copied by ``perdure copy``, paged by
``perdure sessions show``.

**What perdure adds.** Damaged data raises
:class:`~perdure.errors.SessionCorruptedError` from ``get_items`` (and every other
method) — never an empty or shorter list where ``SQLiteSession`` would skip the rows
it cannot parse. A session that holds something else than items (a perdure
``Agent``'s session under the same id) raises
:class:`~perdure.errors.SessionMismatchError` from every method: items are never
added to such a session, nor is it cleared or popped. A value JSON cannot hold raises
``TypeError``; NaN and infinities, which perdure's stores refuse, ``ValueError``.

**Writers.** Every mutation (``add_items``, ``pop_item``, ``clear_session``) runs under
the session's writer lock and re-reads the stored tail inside it, so writers in other
threads or processes (or other ``PerdureSession`` objects) never lose or interleave
items: they take turns. A writer that finds the lock held retries for up to
``lock_timeout`` seconds (default 5, as ``sqlite3``'s busy timeout that
``SQLiteSession`` relies on) and then raises
:class:`~perdure.errors.SessionLockedError` (``session_locked``) — e.g. while a perdure
``Agent`` runs a turn on the same session. ``add_items`` of many items is one commit:
after a crash all of them are stored or none. A mutation whose caller is cancelled
still runs to its end (as the SDK's sessions do), so its outcome is never half known.

**Costs.** ``add_items`` appends against the tail this object last saw (no read; when
another writer moved on, the store refuses that tail and the tail is read again);
``get_items(limit)`` reads the last ``limit`` items; ``pop_item`` rewrites the history
without its last item (it reads the whole session, as a perdure rewrite does: about
30 ms at 1,000 items on SQLite, against well under 1 ms for ``SQLiteSession``), which
the SDK needs only when it rewinds a turn. ``benchmarks/adapters.py`` measures them
against ``SQLiteSession``.

**Event loops.** Every method may be awaited from any event loop and thread, as every
perdure store's. The SDK's ``Runner.run_sync`` works too; as it keeps its loop across
calls after ``shutdown_asyncgens``, Python emits a ``ResourceWarning`` (hidden by
default) for the store's writer-lock context manager on later calls, which then runs
normally.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Any, TypeVar, cast

from perdure.errors import SessionConflictError, SessionLockedError, SessionNotFoundError
from perdure.migrate.openai_agents import (
    PEEK_OFFSET,
    ItemsAfter,
    item_to_message,
    message_to_item,
    normalize_item,
)
from perdure.session.ids import validate_session_id
from perdure.session.store import SessionRecord, SessionStore
from perdure.session.urls import open_store

try:
    from agents.items import TResponseInputItem
    from agents.memory.session_settings import (
        SessionSettings,
        coerce_session_settings,
        resolve_session_limit,
    )
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "perdure.adapters.openai_agents needs the OpenAI Agents SDK: "
        "pip install 'perdure[openai-agents]'"
    ) from exc

__all__ = ["PerdureSession"]

T = TypeVar("T")

_RETRY_FIRST = 0.002  # seconds before the first retry of a held lock; doubles up to _RETRY_MAX
_RETRY_MAX = 0.05
_GET_TRIES = 4  # reads of the last items retried when the history shrank in between


async def _run_to_end(awaitable: Awaitable[T]) -> T:
    """Await a mutation to its end even when the caller is cancelled, then re-raise that."""
    task = asyncio.ensure_future(awaitable)
    cancelled: asyncio.CancelledError | None = None
    while not task.done():
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError as exc:
            cancelled = cancelled or exc
    if cancelled is not None:
        if not task.cancelled() and task.exception() is not None:
            raise cancelled from task.exception()
        raise cancelled
    return task.result()


class _WriterLock:
    """``store.writer_lock``, retried while another writer holds it, up to ``timeout``.

    A class, not an async generator: the SDK's ``Runner.run_sync`` keeps its event loop
    across calls after ``shutdown_asyncgens``, where a new async generator warns.
    """

    def __init__(self, store: SessionStore, session_id: str, timeout: float) -> None:
        self._store = store
        self._session_id = session_id
        self._timeout = timeout
        self._held: AbstractAsyncContextManager[None] | None = None

    async def __aenter__(self) -> None:
        deadline = time.monotonic() + self._timeout
        delay = _RETRY_FIRST
        while True:
            lock = self._store.writer_lock(self._session_id)
            try:
                await lock.__aenter__()
            except SessionLockedError:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                await asyncio.sleep(min(delay, left))
                delay = min(delay * 2, _RETRY_MAX)
                continue
            self._held = lock
            return

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> bool | None:
        lock, self._held = self._held, None
        assert lock is not None
        return await lock.__aexit__(kind, error, trace)


class PerdureSession:
    """The OpenAI Agents SDK ``Session`` protocol on a perdure session store.

    See the module docstring for the storage format, the writer rule and the costs.

    Args:
        session_id: The conversation's id, a perdure session id (non-empty, at most
            200 UTF-8 bytes, no ``/`` nor backslash, not ``.``/``..``).
        store: A :class:`~perdure.session.SessionStore`, or a store URL
            (``"sqlite:./sessions.db"``, ``"file:./data"``, ``"postgresql://…"``,
            ``"redis://…"``, ``"memory:"``) opened with
            :func:`~perdure.session.open_store`; a store opened from a URL is this
            object's own and :meth:`close` closes it.
        session_settings: The SDK's ``SessionSettings`` (or a dict of them); its
            ``limit`` is the default of :meth:`get_items`.
        lock_timeout: Seconds a mutation retries a writer lock held by another
            writer before raising ``SessionLockedError`` (``0``: at once).

    Raises:
        ValueError: a malformed ``session_id``, URL or ``lock_timeout``.
        TypeError: ``store`` is neither a store nor a string.
    """

    session_settings: SessionSettings | None

    def __init__(
        self,
        session_id: str,
        store: SessionStore | str,
        *,
        session_settings: SessionSettings | dict[str, Any] | None = None,
        lock_timeout: float = 5.0,
    ) -> None:
        validate_session_id(session_id)
        if isinstance(lock_timeout, bool) or not isinstance(lock_timeout, (int, float)):
            raise TypeError(f"lock_timeout must be a number, got {type(lock_timeout).__name__}")
        if not lock_timeout >= 0:
            raise ValueError(f"lock_timeout must be >= 0, got {lock_timeout}")
        if isinstance(store, str):
            self.store = open_store(store)
            self._owns_store = True
        elif isinstance(store, SessionStore):
            self.store = store
            self._owns_store = False
        else:
            raise TypeError(
                f"store must be a SessionStore or a store URL, got {type(store).__name__}"
            )
        self.session_id = session_id
        self.session_settings = (
            coerce_session_settings(session_settings)
            if session_settings is not None
            else SessionSettings()
        )
        self.lock_timeout = float(lock_timeout)
        # (message count, tail) as this object last saw them (a limited read starts
        # from that count).
        self._seen: tuple[int, str] | None = None
        # (message count, tail) of a history this object knows to hold items only, its
        # own commit's: an append commits against them without reading first; the
        # store refuses a stale tail (another writer moved on), and then the session
        # is read again, and checked.
        self._trusted: tuple[int, str] | None = None

    def __repr__(self) -> str:
        return f"PerdureSession({self.session_id!r}, {type(self.store).__name__})"

    # ------------------------------------------------------------------ reading

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The session's items, oldest first; with ``limit``, the last ``limit`` of them.

        ``limit=None`` falls back to ``session_settings.limit``, then to all items;
        ``0`` gives ``[]``; a negative limit gives all items (as ``SQLiteSession``).
        An unknown (or expired) session has no items.

        Raises:
            SessionCorruptedError: the stored session is damaged.
            SessionMismatchError: it holds messages that are not OpenAI Agents items.
            TypeError: ``limit`` is not an int or ``None``.
        """
        effective = resolve_session_limit(limit, self.session_settings)
        if effective is not None and (
            isinstance(effective, bool) or not isinstance(effective, int)
        ):
            raise TypeError(f"limit must be an int or None, got {type(effective).__name__}")
        if effective == 0:
            return []
        if effective is None or effective < 0:
            record = await self._read(0)
            return self._items(record) if record is not None else []
        # A read from ``count - limit`` returns everything from there to the end as
        # stored now: enough when the count known is not above the stored one (then the
        # last ``limit`` are sliced off it). Else, or with no count known, the count
        # is read first.
        count = self._seen[0] if self._seen is not None else None
        for _ in range(_GET_TRIES):
            if count is None:
                peek = await self._read(PEEK_OFFSET)
                if peek is None:
                    return []
                count = peek.message_count
            record = await self._read(max(0, count - effective))
            if record is None:
                return []
            if record.offset == 0 or len(record.messages) >= effective:
                return self._items(record)[-effective:]
            count = None  # the history shrank since the count was seen: read it again
        record = await self._read(0)
        return self._items(record)[-effective:] if record is not None else []

    async def _read(self, offset: int) -> SessionRecord | None:
        try:
            record = await self.store.get(self.session_id, offset=offset)
        except SessionNotFoundError:
            self._seen = None
            return None  # unknown or expired: the SDK's sessions read that as empty
        self._seen = (record.message_count, record.tail)
        return record

    def _items(self, record: SessionRecord) -> list[TResponseInputItem]:
        """The items of a read, which ends at the session's end: once every message
        read is one, an append may go on from that end without reading it again."""
        items = [
            cast("TResponseInputItem", message_to_item(message, self.session_id, index))
            for index, message in enumerate(record.messages, start=record.offset)
        ]
        if items or record.message_count == 0:
            self._trusted = (record.message_count, record.tail)
        return items

    # ---------------------------------------------------------------- mutations

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append ``items`` in one commit (after a crash all of them are stored or none).

        Raises:
            TypeError: ``items`` is not a list of dicts, or an item holds a value JSON
                cannot encode.
            ValueError: an item holds NaN or an infinity, or nests too deep.
            SessionLockedError: another writer kept the lock past ``lock_timeout``.
            SessionCorruptedError: the stored session is damaged.
            SessionMismatchError: the session holds something else than items (a
                perdure ``Agent``'s conversation): nothing is added to it.
        """
        if isinstance(items, (str, bytes, dict)) or not isinstance(items, (list, tuple)):
            raise TypeError(f"items must be a list of items, got {type(items).__name__}")
        messages = [
            item_to_message(normalize_item(item, f"items[{index}]"))
            for index, item in enumerate(items)
        ]
        if messages:
            await _run_to_end(self._append(messages))

    async def _append(self, messages: list[Any]) -> None:
        async with self._writer():
            if self._trusted is not None:
                count, tail = self._trusted
                try:
                    await self._commit(ItemsAfter(count, messages), expected_tail=tail)
                except (SessionConflictError, SessionNotFoundError):
                    pass  # another writer moved on (or deleted it): read, then append
                else:
                    return
            end = await self._read_end()
            if end is None:
                await self.store.create(self.session_id, exist_ok=True)
                end = await self._read_end()
            count, tail = (end.message_count, end.tail) if end is not None else (0, "")
            await self._commit(ItemsAfter(count, messages), expected_tail=tail or None)

    async def _read_end(self) -> SessionRecord | None:
        """The stored session's last message, checked to be an item (under the lock).

        Raises:
            SessionMismatchError: the session holds something else than items (a
                perdure ``Agent``'s conversation under the same id): a mutation would
                mix items into it or wipe it.
        """
        peek = await self._read(PEEK_OFFSET)
        if peek is None or peek.message_count == 0:
            return peek
        last = await self._read(peek.message_count - 1)
        if last is not None and last.messages:
            message_to_item(last.messages[-1], self.session_id, last.message_count - 1)
        return last

    async def _commit(self, messages: Any, **options: Any) -> None:
        self._seen = self._trusted = None  # unknown until the store answers
        result = await self.store.commit(self.session_id, messages, **options)
        self._seen = self._trusted = (result.message_count, result.tail)

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove the newest item and return it (``None`` when the session is empty).

        Raises:
            SessionLockedError: another writer kept the lock past ``lock_timeout``.
            SessionCorruptedError: the stored session is damaged.
            SessionMismatchError: the newest message is not an OpenAI Agents item.
        """
        return await _run_to_end(self._pop())

    async def _pop(self) -> TResponseInputItem | None:
        async with self._writer():
            record = await self._read(0)
            if record is None or not record.messages:
                return None
            last = len(record.messages) - 1
            # Every message checked, not only the one popped: the rest is what stays.
            item = self._items(record)[last]
            await self._commit(
                record.messages[:last], rewritten=True, expected_tail=record.tail or None
            )
            return item

    async def clear_session(self) -> None:
        """Remove every item: the session's history becomes empty, in one commit.

        The perdure session itself stays (with its checkpoints, if any); it reads as
        empty, as a cleared ``SQLiteSession`` does.

        Raises:
            SessionLockedError: another writer kept the lock past ``lock_timeout``.
            SessionMismatchError: the newest message is not an OpenAI Agents item (a
                perdure ``Agent``'s conversation is never wiped).
        """
        await _run_to_end(self._clear())

    async def _clear(self) -> None:
        async with self._writer():
            end = await self._read_end()
            if end is None or end.message_count == 0:
                return
            await self._commit([], rewritten=True, expected_tail=end.tail or None)

    def _writer(self) -> _WriterLock:
        """Hold the session's writer lock, retrying a held one for ``lock_timeout``."""
        return _WriterLock(self.store, self.session_id, self.lock_timeout)

    # ------------------------------------------------------------------- closing

    def close(self) -> None:
        """Close the store if this session opened it from a URL (idempotent)."""
        if self._owns_store:
            close = getattr(self.store, "close", None)
            if callable(close):
                close()
