"""SQLiteSessionStore: sessions in one SQLite database, a row per message (SPEC §7).

Schema (tables are prefixed so the file can be shared with other data)::

    perdure_sessions(sid INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE,
                     created_at, updated_at,          -- ISO-8601 UTC
                     message_count, head,             -- head: hash of the last row
                     writes, tail,                    -- commits that wrote; tail token
                     state_hash)                      -- hash of the agent state text
    perdure_states(sid INTEGER PRIMARY KEY, body)     -- agent state JSON
    perdure_messages(key INTEGER PRIMARY KEY,         -- sid << 32 | message index
                     body, hash,                      -- message JSON; chain hash
                     redacted, redacted_hash)         -- replacement JSON; its hash
    perdure_checkpoints(session_id, checkpoint_id,    -- PRIMARY KEY (both)
                        trigger, label, message_count, created_at,  -- the meta
                        body BLOB, hash)              -- CheckpointRecord JSON; its hash

A message row's key packs the session and the index, so a session's history is one
contiguous range of the table's own B-tree: an append touches one leaf, a page reads
only its rows, and no secondary index costs space. ``hash = sha256(prev_hash + body)``
truncated to 32 hex digits (row 0 chains to 32 zeros); a redaction is hashed as
``sha256(row_hash + redacted)``; ``head`` anchors the end of the chain.

Checkpoints (:attr:`SQLiteSessionStore.checkpoints`) live in the same database, a
row each, keyed by session id and checkpoint id: ``body`` is
:meth:`~perdure.checkpoints.store.CheckpointRecord.to_json_bytes` and ``hash``
its sha256 (truncated like row hashes), and the meta columns let ``list`` read no
body. A put (with its retention) and a session's ``delete`` (with its checkpoints)
are each one transaction, durable like a commit.

Guarantees:

- **Durable**: with ``durability="commit"`` (the default, ``synchronous=FULL`` in
  WAL mode) a commit returns after the WAL holding it was fsynced: by SQLite, or —
  for an append made on the event loop, see below — by an fdatasync of the WAL
  that the commit awaits. ``"invocation"`` and
  ``"none"`` (``synchronous=NORMAL``) skip that fsync: a power cut may lose the
  latest commits but never corrupts the database (a killed process loses nothing).
  With ``"invocation"``, :meth:`SQLiteSessionStore.flush` — which a ``Session``
  calls when a turn ends — makes them durable; with ``"none"`` it does nothing and
  the WAL is synced only when it is folded into the database. The same three
  levels as the file store's. Every commit is made in one ``BEGIN IMMEDIATE``
  transaction: after a crash it is there entirely or not at all — a rewrite never
  leaves half a history.
- **Group commit**: commits that arrive while a sync is under way go together in
  the next transaction, so one sync makes many sessions' commits durable; none
  returns before that sync, and a commit that fails (a conflict, a lock) fails
  alone. A lone commit runs at once: no timer waits for company. On the event loop
  (see below), the durable commits that come while the WAL's fdatasync for earlier
  ones is in flight wait on the loop, and once it returns are written in one
  transaction there with one fdatasync, with no thread hop; elsewhere, and whenever
  the loop cannot write them, they go to the store's writer thread
  (:class:`~perdure._runtime.group.GroupWriter`), which batches the same way.
- **Integrity**: every read verifies the chain over the rows it returns (a page uses
  the hash of the row before it) and checks each message's JSON and shape. A changed
  body, hash or redaction, a missing or extra row, or a database file SQLite cannot
  read raises :class:`~perdure.errors.SessionCorruptedError` naming the session and
  the row in its message and in ``err.details``. Never a silent empty session: a
  session the lookup misses is looked for again in the ids' index and the table
  (a damaged page can hide a row without an error), and a listing's first page
  checks that the index and the table hold the same ids.
- **One writer**: every write holds the session's writer lock (an ``flock`` on
  ``<path>.locks/<session_id>.lock``), so a write while another process holds it
  raises :class:`~perdure.errors.SessionLockedError` at once; a database locked by
  some other connection beyond ``busy_timeout`` raises it too.
- **Any loop, any thread**: SQLite runs in worker threads (the writer's, and
  ``asyncio.to_thread`` for the rest) on two connections (one for writes, one for
  reads) guarded by ``threading`` locks; nothing is bound to an event loop. A
  coroutine cancelled while its commit runs does not stop the commit (one cancelled
  while it waits for the writer is not made). The one exception is a small append,
  made on the caller's thread because a thread hop would cost more than the append
  — and only when it cannot wait: with the writer connection busy, or the database
  locked by another connection, it goes to the writer thread too. A durable one is
  written with ``synchronous=NORMAL`` and its fdatasync runs in the kernel
  (:func:`~perdure._runtime.fsync.start_fsync`), as a flush's does; until it
  returns, no other write of the store goes into the WAL (a commit on that loop
  queues for the next batch; on the writer thread, a write waits for it), so no
  frame is written behind frames not yet synced. Another connection
  (a second store on the same file, another process) does not wait: a power cut
  while both are in flight may leave a hole in front of its frames, which the WAL
  check below reports as damage although no commit either of them acknowledged is
  missing (an acknowledged commit's fsync covers every frame before it);
  ``perdure repair`` sets those frames aside. The WAL is folded into the database
  (which fsyncs) only on worker threads.
- **Checkpoints**: ``checkpoints.get`` verifies the body against its hash and its
  meta columns and parses it; a damaged checkpoint raises ``SessionCorruptedError``
  naming the session and the checkpoint. Retention (``max_checkpoints``,
  ``max_checkpoint_age``) runs in the put's transaction. A session's checkpoints are
  deleted with it, and a session created anew starts without any (a put for a
  session that does not exist yet is kept until the session is created or deleted,
  as in the file store).
- **The WAL**: SQLite replays a ``-wal`` left by a crash up to its first bad frame
  and silently drops the commits after it. The first connection of a store checks
  the frames SQLite did not accept (:mod:`perdure._runtime.sqlite_wal`): a bad frame
  followed by complete transactions of the same log generation is damage, not a
  torn tail. The log is then set aside as ``<path>.damaged-wal`` (SQLite would fold
  what it kept and delete the rest when its last connection closes) and every
  open raises ``SessionCorruptedError`` (kind ``bad_wal``) until
  :meth:`SQLiteSessionStore.release_damaged_wal` (``perdure repair``) moves it to
  quarantine. Damage in the last transaction of the log cannot be told from a
  crash during it. Only a store with ``durability="commit"`` checks: with
  ``"invocation"`` or ``"none"`` SQLite syncs the WAL rarely, and a power cut may
  leave a hole in front of later frames that is no damage.
- **A new database is made whole**: written aside (tables and perdure's
  ``application_id`` in the header), synced, then linked to the path, so a crash
  while it is made leaves only a temporary file and the next open makes it again.
  The file at the path is therefore never empty: one cut to 0 bytes (with or
  without its ``-wal``) raises ``SessionCorruptedError`` (kind ``bad_database``)
  instead of opening as a new, empty database whose sessions read as not found,
  and so does a database marked as perdure's whose tables are all gone. Another
  application's database gets perdure's tables beside its own.
- **TTL** (``ttl=`` seconds of inactivity): each session's last use (a commit, a
  ``get``, a ``create``) is the modification time of ``<path>.ttl/<session_id>``
  (:mod:`perdure.session._stamps`). Past it, reads and commits raise
  ``session_not_found`` with ``details["reason"] == "expired"`` (an id never seen:
  ``"unknown"``), ``list`` leaves the session out, ``create`` starts it afresh
  (its checkpoints kept), and :meth:`SQLiteSessionStore.collect_expired`
  (``perdure gc``) deletes its rows but its checkpoints; the stamp stays as its
  tombstone for ``max(10 × ttl, 7 days)``. A commit checks and renews the stamp on
  the caller's thread (a ``stat`` and a ``utime``: less than a thread hop).
- **Repair**: :meth:`SQLiteSessionStore.quarantine` keeps a damaged session's
  verifiable prefix of rows and moves the rest to a quarantine file.
- sqlite3 exceptions never leak, sorted by :func:`perdure._runtime.sqlite.translate`
  (one rule for every SQLite user in perdure): busy/locked → ``SessionLockedError``;
  a damaged file, text that is not UTF-8, not a database, or a schema that is not
  ours (checked on connect) → ``SessionCorruptedError``; a statement SQLite refuses
  (a bug in perdure, never damage) → ``SQLiteBugError``; anything else (I/O,
  permissions, a full disk) → ``OSError``.
"""

from __future__ import annotations

import asyncio
import base64
import builtins
import concurrent.futures
import contextlib
import errno
import functools
import json
import logging
import os
import re
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, NamedTuple

from perdure._runtime.fs import atomic_write
from perdure._runtime.fsync import start_fsync
from perdure._runtime.group import GroupWriter
from perdure._runtime.sqlite import (
    DRIVER_ERRORS,
    ConnectionSlot,
    SQLiteErrors,
    sqlite_fault,
    transaction,
    translate,
)
from perdure._runtime.sqlite_wal import wal_damage
from perdure._runtime.threads import PerProcess, StoreThread
from perdure.checkpoints.store import (
    CheckpointMeta,
    CheckpointRecord,
    check_checkpoint_id,
    verified_record,
)
from perdure.crypto import Cipher
from perdure.errors import (
    CheckpointNotFoundError,
    DecryptionError,
    SessionConflictError,
    SessionCorruptedError,
    SessionLockedError,
    SessionNotFoundError,
)
from perdure.session._locks import LockTable
from perdure.session._stamps import DirStamps, Expiry, collect_expired, live_listing
from perdure.session.expiry import check_ttl
from perdure.session.ids import validate_session_id
from perdure.session.paging import check_page_args, page_of, page_read_range
from perdure.session.rules import (
    ZERO_HASH,
    CommitRequest,
    DecodeError,
    blob_hash,
    chain_hash,
    check_cipher,
    check_extends,
    check_get_args,
    check_list_args,
    check_max_checkpoint_age,
    check_max_checkpoints,
    creation_time,
    decode_message,
    decode_state,
    encode_message,
    encode_redactions,
    encode_state,
    evicted_checkpoints,
    new_tail,
    plan_commit,
    text_hash,
    utc_now,
    verify_rows,
)
from perdure.session.store import (
    CommitResult,
    ExpiredSessionInfo,
    HistoryPage,
    SessionMeta,
    SessionRecord,
    StoreBase,
)
from perdure.stores.file.leftovers import StoreLeftovers
from perdure.stores.file.store import SessionRecoveryReport
from perdure.types import Message

__all__ = ["Durability", "SQLiteCheckpointStore", "SQLiteSessionStore"]

Durability = Literal["commit", "invocation", "none"]

_log = logging.getLogger(__name__)


def _environment_error(message: str, *, details: dict[str, Any] | None = None) -> OSError:
    """The store's error for an environment failure: an ``OSError``, as it always was
    (the message names the file and SQLite's error; ``details`` are not kept)."""
    del details
    return OSError(message)


_ERRORS = SQLiteErrors(
    busy=SessionLockedError, damage=SessionCorruptedError, failure=_environment_error
)
"""This store's error for each fault of a driver error."""

_KEY_BITS = 32
_KEY_SPAN = 1 << _KEY_BITS
_MAX_SID = (1 << 31) - 1  # sid << 32 must fit SQLite's signed 64-bit integers
# Fold the WAL into the database every so many pages written (SQLite's own
# autocheckpoint is off: see _count_wal). A fold costs two fsyncs and the writes of
# what it folds: next to a durable append's own fsync that is little, so durable
# stores fold often and keep a small WAL; folding non-durable appends every 128
# pages made them ~15% slower than every 512 (every 1,000 gained nothing more).
# Whichever, the WAL file is overwritten in place when it starts over: a durable
# append that grows the file has its fsync commit the new size too (~20% slower),
# so the file is never cut back below a fold's worth. It is scratch space: the last
# connection to close folds it and deletes it.
_WAL_FOLD_PAGES = {"commit": 128, "invocation": 512, "none": 512}
# Appends made on the event loop leave their folds to a background thread, which
# keeps them off the appends' path; but a fold that runs while appends go on never
# catches up with them, and the WAL only starts over once a fold has. So after this
# many folds' worth of pages the next append goes to a thread, which folds with the
# writer held, after the background fold in flight.
_BACKLOG_FOLDS = 4
_WAL_SIZE_LIMIT = 12 * 1024 * 1024  # > _BACKLOG_FOLDS folds of 512 pages of 4 KiB
# Seconds the writer thread waits for the fsync of an append made on the event loop
# (see _cover_inline_sync) before it fsyncs the WAL itself: the loop that awaits it
# may be busy, cancelled or closed.
_INLINE_SYNC_WAIT = 0.05
# Pages a write transaction adds to the WAL, estimated from the rows it changed: the
# table leaves it touched (~8 rows of ~400-byte messages to a 4 KiB page) and the
# session row's page.
_ROWS_PER_PAGE = 8

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS perdure_sessions (
        sid INTEGER PRIMARY KEY AUTOINCREMENT,
        id TEXT NOT NULL UNIQUE,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        message_count INTEGER NOT NULL,
        head TEXT NOT NULL,
        writes INTEGER NOT NULL,
        tail TEXT NOT NULL,
        state_hash TEXT
    )""",
    """CREATE TABLE IF NOT EXISTS perdure_states (
        sid INTEGER PRIMARY KEY,
        body TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS perdure_messages (
        key INTEGER PRIMARY KEY,
        body TEXT NOT NULL,
        hash TEXT NOT NULL,
        redacted TEXT,
        redacted_hash TEXT
    )""",
    # A rowid table (not WITHOUT ROWID): bodies are large, and list reads only the
    # meta columns through the primary-key index.
    """CREATE TABLE IF NOT EXISTS perdure_checkpoints (
        session_id TEXT NOT NULL,
        checkpoint_id TEXT NOT NULL,
        trigger TEXT NOT NULL,
        label TEXT,
        message_count INTEGER NOT NULL,
        created_at TEXT NOT NULL,
        body BLOB NOT NULL,
        hash TEXT NOT NULL,
        PRIMARY KEY (session_id, checkpoint_id)
    )""",
)
# The database header's application_id ("prdr") marks a file perdure made or took:
# perdure's tables missing from such a file are damage, not a new database.
_APPLICATION_ID = 0x70726472
# A new database made aside (see _create_database), with SQLite's side files.
_NEW_DATABASE = re.compile(r"\.(.+)\.new-([0-9]+)-[0-9a-f]{8}(?:-journal|-wal|-shm)?")
# A new database older than this (seconds) is a leftover even if its maker's pid
# names a live process (a pid used again): making one takes milliseconds.
_LEFTOVER_AGE = 600.0
# What os.link raises on a file system without hard links.
_NO_LINKS = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS, errno.EXDEV})
# A database made before checkpoints existed lacks the last table: the schema
# statements (all IF NOT EXISTS) then add it on first connect.
_TABLES = frozenset(
    {"perdure_sessions", "perdure_states", "perdure_messages", "perdure_checkpoints"}
)

_SELECT_SESSION = (
    "SELECT sid, created_at, updated_at, message_count, head, writes, tail, state_hash "
    "FROM perdure_sessions WHERE id = ?"
)
_SELECT_ROWS = (
    "SELECT key, body, hash, redacted, redacted_hash FROM perdure_messages "
    "WHERE key >= ? AND key < ? ORDER BY key"
)
# The rows a read decodes, their texts as UTF-8 bytes: hashed and parsed as they come
# (one JSON parse for all of them), with no str made of each and encoded again.
_SELECT_ROW_BYTES = (
    "SELECT key, CAST(body AS BLOB), hash, CAST(redacted AS BLOB), redacted_hash "
    "FROM perdure_messages WHERE key >= ? AND key < ? ORDER BY key"
)
_INSERT_ROW = "INSERT INTO perdure_messages (key, body, hash) VALUES (?, ?, ?)"
_META_COLUMNS = "checkpoint_id, trigger, label, message_count, created_at"
_DELETE_CHECKPOINTS = "DELETE FROM perdure_checkpoints WHERE session_id = ?"

# The columns of each table, checked on connect: a schema that is not ours (or a
# damaged one SQLite still parses) is damage there, so a statement SQLite refuses
# later is a bug in this module, never reported as damage.
_COLUMNS = {
    "perdure_sessions": (
        "sid", "created_at", "head", "id", "message_count", "state_hash", "tail",
        "updated_at", "writes",
    ),
    "perdure_states": ("body", "sid"),
    "perdure_messages": ("body", "hash", "key", "redacted", "redacted_hash"),
    "perdure_checkpoints": (
        "body", "checkpoint_id", "created_at", "hash", "label", "message_count",
        "session_id", "trigger",
    ),
}  # fmt: skip


class _Head(NamedTuple):
    """A row of ``perdure_sessions`` (a tuple: one is made per append)."""

    sid: int
    created_at: str
    updated_at: str
    total: int  # messages
    head: str
    writes: int
    tail: str
    state_hash: str | None

    @property
    def base(self) -> int:
        return self.sid << _KEY_BITS

    def meta(self, session_id: str) -> SessionMeta:
        return SessionMeta(session_id, self.created_at, self.updated_at, self.total)


class _Commit(NamedTuple):
    """A checked commit with its state and redactions encoded (as text)."""

    request: CommitRequest
    state_text: str | None
    redaction_texts: dict[int, str]


class _Chain:
    """Encodes messages into chained rows, lazily (inside the write transaction)."""

    def __init__(self, base: int, head: str, cipher: Cipher | None) -> None:
        self.base = base
        self.head = head
        self.cipher = cipher

    def rows(self, messages: Sequence[Message], start: int) -> Iterator[tuple[int, str, str]]:
        for index in range(start, len(messages)):
            yield self.row(messages, index)

    def row(self, messages: Sequence[Message], index: int) -> tuple[int, str, str]:
        body = encode_message(messages[index], f"messages[{index}]", self.cipher)
        self.head = chain_hash(self.head, body)
        return self.base + index, body, self.head


def _process_alive(pid: int) -> bool:
    """Whether a process with this id exists (one of another user counts as alive).

    Off POSIX (where signal 0 is no probe) every process counts as alive, so only age
    makes a leftover there.
    """
    if os.name != "posix":
        return True
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OverflowError:
        return False
    return True


def _fsync_path(path: Path, *, directory: bool = False) -> None:
    flags = os.O_RDONLY | (os.O_DIRECTORY if directory else 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _stored_text(value: Any) -> str | None:
    """A TEXT column read as bytes, decoded; None when it is not UTF-8 text."""
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return value if isinstance(value, str) else None


def _row_damage(
    at: int,
    index: int,
    prev: str,
    body: str | None,
    stored: str | None,
    redacted: str | None,
    redacted_hash: str | None,
) -> str | None:
    """What is wrong with message row ``index`` (at ``at``) chained from ``prev``; None: ok."""
    if at != index:
        return "bad_sequence"
    if body is None or stored is None:
        return "bad_payload"
    if chain_hash(prev, body) != stored:
        return "bad_hash"
    if redacted is not None and redacted_hash != chain_hash(stored, redacted):
        return "bad_hash"
    try:
        decode_message(body if redacted is None else redacted)
    except DecodeError:
        return "bad_payload"
    except DecryptionError:
        pass  # encrypted: the hash vouches for it, the content needs the key
    return None


class _RepairPlan:
    """The rows of one session :meth:`SQLiteSessionStore.quarantine` keeps and moves."""

    def __init__(self, head: _Head, rows: builtins.list[tuple[Any, ...]]) -> None:
        self.head = head
        self.rows = rows
        self.keep = 0
        self.last_hash = ZERO_HASH
        self.first_kind = "bad_sequence"
        # (position, count): ``count`` rows the session row counts are gone just
        # before row ``position`` (the first row after them, or the recorded end)
        self.gaps: builtins.list[tuple[int, int]] = []
        self.state_bad = False
        self.state_raw: Any = None

    def moved(self) -> builtins.list[tuple[int, str]]:
        """(position, kind) of each row moved: the first bad one, then those after it."""
        out = []
        for offset, row in enumerate(self.rows[self.keep :]):
            position = row[0] - self.head.base
            out.append((position, self.first_kind if offset == 0 else "after_damage"))
        return out

    @property
    def moves_anything(self) -> bool:
        """Whether a row or the state goes to quarantine (else no file is written)."""
        return len(self.rows) > self.keep or (self.state_bad and self.state_raw is not None)

    def report(self, session_id: str, quarantine_path: str | None) -> SessionRecoveryReport:
        """Positions are row indexes; -1 stands for the session row or the state.

        Rows already gone are no moved record: they are ``gaps``, each at the row
        index just after it (the recorded end, for rows gone from the end).
        """
        moved = self.moved()
        positions = [p for p, _ in moved]
        kinds = [k for _, k in moved]
        if (
            not positions
            and not self.gaps
            and (self.keep, self.last_hash) != (self.head.total, self.head.head)
        ):
            kinds.append("bad_meta")  # every row verifies: the session row was wrong
            positions.append(-1)
        if self.state_bad:
            kinds.append("bad_state")
            positions.append(-1)
        return SessionRecoveryReport(
            session_id,
            len(moved) + (1 if self.state_bad and self.state_raw is not None else 0),
            tuple(positions),
            tuple(kinds),
            quarantine_path if self.moves_anything else None,
            tuple(self.gaps),
        )

    def quarantined_lines(self) -> bytes:
        """One JSON object per moved row (and the state), its columns as stored."""

        def column(value: Any) -> Any:
            if isinstance(value, bytes):
                text = _stored_text(value)
                return text if text is not None else {"base64": base64.b64encode(value).decode()}
            return value

        lines = []
        for (position, kind), row in zip(self.moved(), self.rows[self.keep :], strict=True):
            names = ("body", "hash", "redacted", "redacted_hash")
            record = {"row": position, "kind": kind}
            record.update({n: column(v) for n, v in zip(names, row[1:], strict=True)})
            lines.append(json.dumps(record, ensure_ascii=False))
        if self.state_bad and self.state_raw is not None:
            lines.append(json.dumps({"state": column(self.state_raw)}, ensure_ascii=False))
        return "".join(line + "\n" for line in lines).encode("utf-8", "surrogatepass")


class SQLiteSessionStore(StoreBase):
    """Sessions in one SQLite database file (see the module docstring).

    Args:
        path: the database file (created with its parent directories on first use).
            ``":memory:"`` is refused: use
            :class:`~perdure.stores.memory.MemorySessionStore`.
        durability: ``"commit"`` (fsync every commit), ``"invocation"`` (no fsync
            per commit; :meth:`flush`, at the end of a ``Session``'s turn, makes
            earlier commits durable) or ``"none"`` (no fsync by the store's
            commits or flushes; only a WAL fold syncs).
        busy_timeout: seconds a statement waits for a database locked by another
            connection before raising ``SessionLockedError``.
        max_checkpoints: keep at most this many checkpoints per session in
            :attr:`checkpoints` (the oldest are evicted, whatever their trigger).
        max_checkpoint_age: seconds; older checkpoints of a session are evicted when
            it gets a new one (and by ``perdure gc``).
        ttl: seconds of inactivity after which a session expires (``None``: never).
        cipher: a :class:`~perdure.crypto.Cipher`: message bodies, the state and
            checkpoints are stored encrypted; row hashes cover the ciphertext
            (SPEC §9).

    The store opens its connections on first use; :meth:`close` closes them (the
    store stays usable and reopens on the next call).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durability: Durability = "commit",
        busy_timeout: float = 5.0,
        max_checkpoints: int | None = None,
        max_checkpoint_age: float | None = None,
        ttl: float | None = None,
        cipher: Cipher | None = None,
    ) -> None:
        self.cipher = check_cipher(cipher)
        if not isinstance(path, str | os.PathLike):
            raise TypeError(f"path must be a str or a path, got {type(path).__name__}")
        if str(path) in ("", ":memory:"):
            raise ValueError(
                f"path must name a database file, got {str(path)!r}; "
                "use MemorySessionStore for sessions kept in memory"
            )
        if durability not in ("commit", "invocation", "none"):
            raise ValueError(
                f"durability must be 'commit', 'invocation' or 'none', got {durability!r}"
            )
        if (
            isinstance(busy_timeout, bool)
            or not isinstance(busy_timeout, int | float)
            or not busy_timeout >= 0
        ):
            raise ValueError(f"busy_timeout must be a number of seconds >= 0, got {busy_timeout!r}")
        self.path = Path(path)
        self.durability: Durability = durability
        self.busy_timeout = float(busy_timeout)
        self.max_checkpoints = check_max_checkpoints(max_checkpoints)
        self.max_checkpoint_age = check_max_checkpoint_age(max_checkpoint_age)
        self.ttl = check_ttl(ttl)
        self._expiry = Expiry(self.ttl, DirStamps(Path(str(path) + ".ttl")), str(self.path))
        self._locks = LockTable(Path(str(path) + ".locks"))
        self._writer = ConnectionSlot()
        # The writer connection under which the WAL's directory entry was last fsynced.
        self._wal_named_under: sqlite3.Connection | None = None
        # The WAL opened for fsyncs started on the event loop, with the writer
        # connection it was opened under (guarded by the writer slot).
        self._wal_fd: tuple[sqlite3.Connection, int] | None = None
        # Set while no durable append made on an event loop waits for its fsync: no
        # write of this process goes into the WAL behind frames not yet synced (see
        # _append_here). The number of the last such append, under _sync_guard.
        self._inline_synced = threading.Event()
        self._inline_synced.set()
        self._inline_number = 0
        self._sync_guard = threading.Lock()
        # The last fsync started on an event loop for durable appends, and the
        # durable commits that came while one was in flight on that loop: they wait
        # there, and go in one transaction once it returns (see _queue_behind_sync).
        self._loop_sync: asyncio.Future[None] | None = None
        self._queued: builtins.list[tuple[_Commit, asyncio.Future[CommitResult | None]]] = []
        self._queued_on: asyncio.Future[None] | None = None  # whose callback writes them
        self._queue_timer: asyncio.TimerHandle | None = None  # gives them to the thread
        self._reader = ConnectionSlot()
        # WAL pages written since the last fold began, and since the writer last
        # folded (both guarded by the writer slot); see _count_wal.
        self._wal_pages = 0
        self._wal_backlog = 0
        self._fold_pages = _WAL_FOLD_PAGES[durability]
        # The background fold this process last started (a child made by fork()
        # inherits its parent's, which runs there only: it would wait for ever).
        self._folding: PerProcess[concurrent.futures.Future[None] | None] = PerProcess(lambda: None)
        self._folder = StoreThread("perdure-sqlite-fold")
        # Commits (and flushes) go to one writer thread, which makes those that
        # arrive while it syncs durable together (see _write_batch).
        self._group: GroupWriter[_Commit | None, CommitResult | None] = GroupWriter(
            "perdure-sqlite-write", self._write_batch
        )
        # The session row as this store last wrote it, by session id, with the number
        # of the writer-lock hold it was written under (guarded by the writer slot):
        # while that hold lasts nobody else can change the row, so an append needs
        # not read it again.
        self._heads: dict[str, tuple[int, _Head]] = {}
        self.checkpoints = SQLiteCheckpointStore(self)
        """Checkpoints in this database, deleted with their session."""

    def __repr__(self) -> str:
        return f"SQLiteSessionStore({str(self.path)!r}, durability={self.durability!r})"

    # ------------------------------------------------------------------ protocol

    async def create(
        self,
        session_id: str,
        *,
        exist_ok: bool = False,
        created_at: datetime | str | None = None,
    ) -> SessionMeta:
        """Register a new, empty session, created at ``created_at`` (default: now).

        After return the session exists (durably with ``durability="commit"``).

        Raises:
            SessionConflictError: it exists already and ``exist_ok`` is false.
            SessionLockedError: another writer holds the session's lock.
            TypeError, ValueError: ``created_at`` is no timezone-aware time (see
                :meth:`SessionStore.create`).
        """
        validate_session_id(session_id)
        created = creation_time(created_at)
        return await asyncio.to_thread(self._create, session_id, exist_ok, created)

    async def get(self, session_id: str, *, offset: int = 0) -> SessionRecord:
        """Read and verify a session: metadata, messages from ``offset``, state, tail.

        Messages come with redactions applied; an ``offset`` past the end gives no
        messages and ``record.offset == message_count``.

        Raises:
            SessionNotFoundError: no such session.
            SessionCorruptedError: a row read is damaged (the error names it).
        """
        check_get_args(session_id, offset)
        return await asyncio.to_thread(
            self._expiry.use, session_id, lambda: self._get(session_id, offset)
        )

    async def list(
        self, *, limit: int | None = None, after: str | None = None
    ) -> builtins.list[SessionMeta]:
        """Metadata of sessions sorted by id, ids greater than ``after``; reads no content.

        With ``ttl``, an expired session is left out and the others carry ``expires_at``.

        Raises:
            ValueError: ``limit`` is not ``None`` or an int >= 0, or ``after`` is not
                a valid session id.
        """
        check_list_args(limit, after)
        return await asyncio.to_thread(live_listing, self._expiry, self._list, limit, after)

    async def collect_expired(self, *, dry_run: bool = True) -> builtins.list[ExpiredSessionInfo]:
        """Delete the rows of every expired session but its checkpoints (``perdure gc``).

        Each keeps its tombstone (it still reads as expired); tombstones past their
        time go. A session a writer holds is left for the next time. A dry run
        deletes nothing.
        """
        return await asyncio.to_thread(self._collect_expired, dry_run)

    def _collect_expired(self, dry_run: bool) -> builtins.list[ExpiredSessionInfo]:
        with self._use(self._reader) as conn, transaction(conn, "BEGIN"):
            rows = conn.execute(
                "SELECT id, message_count FROM perdure_sessions ORDER BY id"
            ).fetchall()
        return collect_expired(self._expiry, rows, self._purge, dry_run)

    def _purge(self, session_id: str) -> None:
        """Delete an expired session's rows, keeping its checkpoints and tombstone."""
        with self._locks.for_write(session_id):
            if self._expiry.is_expired(session_id):
                self._delete(session_id, keep_checkpoints=True)

    async def _apply_commit(self, request: CommitRequest) -> CommitResult:
        """Persist a checked commit: append what is new, or rewrite the history.

        The rules plan it (:func:`~perdure.session.rules.plan_commit`): the stored
        prefix is not compared; without ``expected_tail`` the last stored message
        must equal ``messages[message_count - 1]``. A rewrite replaces the whole
        history (and drops its redactions); ``agent_state`` replaces the stored
        state; redactions are kept beside the originals. All of it is one
        transaction: after return it is stored (durably with
        ``durability="commit"``); after a crash or an error it is stored entirely or
        not at all. The tail token changes when anything was written; a commit with
        nothing to write returns the current one.
        """
        agent_state = request.agent_state
        state_text = None if agent_state is None else encode_state(agent_state, self.cipher)
        redactions = encode_redactions(request.redactions, self.cipher)
        commit = _Commit(request, state_text, redactions)
        session_id = request.session_id
        # With a ttl, the session's stamp is checked and renewed here: a stat and a
        # utime, done on the caller's thread as the inline append below is (both
        # cost less than a thread hop).
        renewed = self._expiry.check(session_id)
        try:
            result = await self._apply(commit)
        except SessionNotFoundError:
            raise self._expiry.not_found(session_id) from None
        if not renewed:
            self._expiry.renew(session_id)
        return result

    async def _apply(self, commit: _Commit) -> CommitResult:
        if not commit.request.rewritten:
            queued = self._queue_behind_sync(commit)
            if queued is None:
                done = self._append_here(commit)
                if done is not None:
                    result, synced = done
                    if synced is not None:
                        await synced
                    return result
            if queued is not None:
                try:
                    written = await queued
                except asyncio.CancelledError:
                    self._withdraw(queued)
                    raise
                if written is not None:
                    return written
                # It could not be written on the loop after all (the writer thread has
                # the connection, say): the thread writes it.
        outcome = await self._group.submit(commit)
        assert outcome is not None  # a commit's outcome; only a flush has none
        return outcome

    async def delete(self, session_id: str) -> None:
        """Delete a session with its messages and state; an absent session is fine.

        Raises:
            SessionLockedError: another writer holds the session's lock.
        """
        validate_session_id(session_id)
        await asyncio.to_thread(self._delete_forgotten, session_id)

    def _delete_forgotten(self, session_id: str) -> None:
        """Delete a session and its tombstone: the id is unknown afterwards."""
        self._delete(session_id)
        self._expiry.forget(session_id)

    def writer_lock(self, session_id: str) -> AbstractAsyncContextManager[None]:
        """Hold the session's writer lock for an ``async with`` block.

        Commits of this store inside the block reuse the lock; other processes and
        other store instances get ``SessionLockedError`` at once. A crashed holder's
        lock is released by the kernel.

        Raises (on enter):
            SessionLockedError: another writer holds it; never waits.
        """
        validate_session_id(session_id)
        return self._locks.hold(session_id)

    async def history_page(self, session_id: str, offset: int, limit: int) -> HistoryPage:
        """One pair-aligned page, reading and verifying only the rows it needs.

        Raises:
            SessionNotFoundError: no such session.
            SessionCorruptedError: a row read is damaged.
        """
        validate_session_id(session_id)
        check_page_args(offset, limit)
        return await asyncio.to_thread(
            self._expiry.use,
            session_id,
            lambda: self._history_page(session_id, offset, limit),
            renew=False,
        )

    async def flush(self, session_id: str) -> None:
        """Make every commit so far durable.

        With ``durability="invocation"`` it fsyncs the database's WAL and its
        directory (the database file is synced by every fold of the WAL into it), so
        every commit that returned before the call survives a power cut. A no-op
        with ``"commit"`` (every commit is durable already) and with ``"none"``.
        """
        validate_session_id(session_id)
        if self.durability == "invocation":
            synced = self._start_flush_here()
            if synced is not None:
                await synced  # the commits that returned are in the WAL that it syncs
                return
            await self._group.submit(None)

    def close(self) -> None:
        """Close the database connections (the store reopens them if used again).

        Blocks while a running operation finishes; call it outside the event loop
        or at shutdown.
        """
        self._group.shutdown()  # the batches under way finish first
        self._folder.shutdown()  # and a background fold in flight
        for slot in (self._writer, self._reader):
            with slot.lock:
                if slot is self._writer:
                    self._close_wal_descriptor()
                conn, slot.conn = slot.conn, None
                if conn is not None:
                    with contextlib.suppress(sqlite3.Error):
                        conn.close()

    # ------------------------------------------------------------------ connections

    @contextlib.contextmanager
    def _use(self, slot: ConnectionSlot) -> Iterator[sqlite3.Connection]:
        with slot.lock, self._translate():
            if slot.conn is None:
                other = self._reader if slot is self._writer else self._writer
                first = other.conn is None
                if first:
                    self._check_set_aside()
                conn = self._connect(writer=slot is self._writer)
                if first and self.durability == "commit":
                    # The first connection of ours: see what SQLite dropped from the WAL.
                    # Only a store that syncs every commit can tell damage from a power
                    # cut: with synchronous=NORMAL the kernel may write later frames
                    # before earlier ones, and a hole in front of them is no damage.
                    try:
                        self._check_wal(conn)
                    except BaseException:
                        conn.close()
                        raise
                slot.conn = conn
            yield slot.conn

    def _connect(self, *, writer: bool) -> sqlite3.Connection:
        durable = self.durability == "commit"
        created = [d for d in (self.path.parent, *self.path.parent.parents) if not d.exists()]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for directory in reversed(created) if durable else ():
            _fsync_path(directory.parent, directory=True)
        self._check_file(durable)
        # mode=rw: SQLite never creates the file in place (it would be empty until
        # its first commit); a new database is made whole by _create_database.
        conn = sqlite3.connect(
            f"{self.path.absolute().as_uri()}?mode=rw",
            uri=True,
            timeout=self.busy_timeout,
            isolation_level=None,
            check_same_thread=False,
        )
        try:
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise OSError(
                    f"SQLite session store {self.path}: WAL mode is not available "
                    f"(journal_mode is {mode!r})"
                )
            sync = "FULL" if durable else "NORMAL"
            conn.execute(f"PRAGMA synchronous = {sync}")
            conn.execute(f"PRAGMA journal_size_limit = {_WAL_SIZE_LIMIT}")
            conn.execute("PRAGMA wal_autocheckpoint = 0")  # see _count_wal
            names = {
                row[0]
                for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            }
            self._check_schema(conn, names)
            claimed = conn.execute("PRAGMA application_id").fetchone()[0]
            if claimed == _APPLICATION_ID and not _TABLES & names:
                raise self._bad_database("perdure's tables are gone from its own database")
            # Another application's database gets perdure's tables beside its own (and
            # perdure's mark if it has none); one made before the mark existed gets it
            # from its first writer.
            if not _TABLES.issubset(names) or (writer and claimed == 0):
                with transaction(conn, "BEGIN IMMEDIATE"):
                    for statement in _SCHEMA:
                        conn.execute(statement)
                    if claimed == 0:
                        conn.execute(f"PRAGMA application_id = {_APPLICATION_ID}")
            if writer:
                # The writer never sleeps in SQLite's busy handler: _begin_write waits
                # in a thread, and an append on the event loop goes to one instead.
                conn.execute("PRAGMA busy_timeout = 0")
        except BaseException:
            conn.close()
            raise
        return conn

    def _check_file(self, durable: bool) -> None:
        """Create a missing database; refuse one cut to nothing.

        A new database is written aside, whole (tables and perdure's
        ``application_id``), synced, then linked into place: the file at the path is
        never a half-made database, and a crash while it is made leaves only a
        temporary file beside it, which the next open ignores. So an empty file at
        the path (SQLite would take it for a new, empty database, and every session
        it held would read as not found) is damage.
        """
        try:
            found = self.path.stat()
        except FileNotFoundError:
            self._create_database(durable)
            return
        if stat.S_ISREG(found.st_mode) and found.st_size == 0:
            raise self._bad_database(
                "the file is empty (0 bytes), but perdure never leaves its database "
                "empty: it was cut, and the sessions it held are lost; restore it from a "
                "backup, or move it aside to start a new, empty database"
            )

    def _create_database(self, durable: bool) -> None:
        """Make a new database aside and link it to the path (see :meth:`_check_file`).

        ``os.link`` never replaces a file: when another process made the database
        first, its file is kept and this one dropped.
        """
        temp = self.path.with_name(f".{self.path.name}.new-{os.getpid()}-{os.urandom(4).hex()}")
        try:
            conn = sqlite3.connect(temp, isolation_level=None)
            try:
                with transaction(conn, "BEGIN IMMEDIATE"):
                    for statement in _SCHEMA:
                        conn.execute(statement)
                    conn.execute(f"PRAGMA application_id = {_APPLICATION_ID}")
                conn.execute("PRAGMA journal_mode = WAL")
            finally:
                conn.close()
            _fsync_path(temp)
            try:
                os.link(temp, self.path)
            except FileExistsError:
                return
            except OSError as exc:
                if exc.errno not in _NO_LINKS:
                    raise
                # A file system without hard links: a rename, which would replace a
                # database another process made in between (a narrow window).
                if self.path.exists():
                    return
                os.replace(temp, self.path)
            if durable:
                _fsync_path(self.path.parent, directory=True)
        finally:
            for leftover in ("", "-journal", "-wal", "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    Path(f"{temp}{leftover}").unlink()

    async def collect_leftovers(self, *, dry_run: bool = True) -> StoreLeftovers:
        """Find (and unless ``dry_run`` remove) new databases a killed process left.

        A new database is made aside as ``.<name>.new-<pid>-<hex>`` (with its
        ``-journal``, ``-wal`` and ``-shm``) and linked into place whole; a process
        killed in between leaves the file behind. One whose process is gone, or that
        is older than :data:`_LEFTOVER_AGE` seconds whoever made it, is a leftover;
        one a live process may still be making is left alone. ``perdure gc``
        collects them.
        """
        return await asyncio.to_thread(self._collect_leftovers, dry_run)

    def _collect_leftovers(self, dry_run: bool) -> StoreLeftovers:
        found: builtins.list[str] = []
        directory = self.path.parent
        try:
            names = sorted(os.listdir(directory))
        except FileNotFoundError:
            return StoreLeftovers((), (), ())
        now = time.time()
        for name in names:
            match = _NEW_DATABASE.fullmatch(name)
            if match is None or match.group(1) != self.path.name:
                continue
            path = directory / name
            try:
                age = now - path.lstat().st_mtime
            except FileNotFoundError:
                continue
            if _process_alive(int(match.group(2))) and age < _LEFTOVER_AGE:
                continue
            found.append(str(path))
            if not dry_run:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
        return StoreLeftovers(tuple(found), (), ())

    def _check_wal(self, conn: sqlite3.Connection) -> None:
        """Refuse a ``-wal`` whose damage SQLite took for its end (see ``_sqlite_wal``).

        SQLite replays a WAL up to its first bad frame and silently drops the rest;
        a complete transaction of the same generation after that frame proves the
        frame was damaged, not torn, and that the commits after it were
        acknowledged. ``PRAGMA wal_checkpoint`` says how many frames SQLite accepted
        (and folds them, as the store does after writes), so only the frames after
        those are read closely. A writer in another process may be appending while
        the file is read: damage counts only when a second read finds the same.
        """
        wal = self._wal_path
        try:
            if wal.stat().st_size < 32:
                return
        except FileNotFoundError:
            return
        try:
            accepted = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[1]
        except sqlite3.Error as exc:
            if sqlite_fault(exc) == "damage":
                raise
            # (A read-only database, say: nothing can be folded, nor dropped.)
            _log.warning("SQLite session store %s: cannot check the WAL: %s", self.path, exc)
            return
        if not isinstance(accepted, int) or accepted < 0:
            return  # the checkpoint could not look at the WAL
        found = None
        for attempt in range(2):
            try:
                data = wal.read_bytes()
            except FileNotFoundError:
                return
            seen = wal_damage(data, accepted)
            if seen is None or (found is not None and seen != found):
                return
            found = seen
            if attempt == 0:
                time.sleep(0.01)
        assert found is not None
        # SQLite drops what it did not accept when its last connection closes: set
        # the log aside first, so the damage is reported again until repaired.
        atomic_write(self.damaged_wal_path, data, durable=True)
        raise SessionCorruptedError(
            f"SQLite session store {self.path} is damaged: {found.detail}; the log "
            f"is kept as {self.damaged_wal_path} (perdure repair moves it to quarantine)",
            details={
                "file": str(self.damaged_wal_path),
                "kind": "bad_wal",
                "offset": found.offset,
                "frame": found.frame,
            },
        )

    @property
    def _wal_path(self) -> Path:
        """SQLite's write-ahead log beside the database."""
        return Path(f"{self.path}-wal")

    @property
    def damaged_wal_path(self) -> Path:
        """Where a damaged WAL is set aside when found (see the module docstring)."""
        return Path(f"{self.path}.damaged-wal")

    def _check_set_aside(self) -> None:
        """Refuse the database while a damaged WAL set aside earlier is not repaired."""
        try:
            data = self.damaged_wal_path.read_bytes()
        except FileNotFoundError:
            return
        found = wal_damage(data)  # where, again (a scan of a log that is rarely here)
        frame, offset = (found.frame, found.offset) if found is not None else (-1, 0)
        raise SessionCorruptedError(
            f"SQLite session store {self.path} is damaged: its WAL was found damaged "
            f"and set aside as {self.damaged_wal_path}; commits after the damage are "
            "missing from the database (perdure repair keeps what is left)",
            details={
                "file": str(self.damaged_wal_path),
                "kind": "bad_wal",
                "offset": offset,
                "frame": frame,
            },
        )

    def _check_schema(self, conn: sqlite3.Connection, names: set[str]) -> None:
        """Refuse a database whose perdure tables are not (all) ours.

        A new database has none of them, one made before checkpoints existed lacks
        only ``perdure_checkpoints``: those get the missing tables. Anything else (a
        table gone from a damaged schema, a foreign table by one of our names) is
        damage, reported before any statement could create a table over it.
        """
        present = _TABLES & names
        if present and not (_TABLES - {"perdure_checkpoints"}) <= present:
            missing = ", ".join(sorted(_TABLES - present))
            raise self._bad_database(f"tables missing: {missing}")
        for table in sorted(present):
            columns = tuple(sorted(row[1] for row in conn.execute(f"PRAGMA table_info({table})")))
            if columns != tuple(sorted(_COLUMNS[table])):
                raise self._bad_database(f"table {table} has columns {', '.join(columns)}")

    @contextlib.contextmanager
    def _translate(self) -> Iterator[None]:
        """Translate sqlite3 exceptions at the boundary: they never leak."""
        try:
            yield
        except DRIVER_ERRORS as exc:
            raise self._translated(exc) from exc

    def _translated(self, exc: sqlite3.Error | UnicodeDecodeError) -> Exception:
        return translate(
            exc, _ERRORS, what="SQLite session store", path=self.path, timeout=self.busy_timeout
        )

    def _outcome(self, exc: Exception) -> Exception:
        """What a caller gets for ``exc`` raised in a batch: translated, caused by it."""
        if not isinstance(exc, DRIVER_ERRORS):
            return exc
        translated = self._translated(exc)
        translated.__cause__ = exc
        return translated

    def _bad_database(self, detail: str, **details: Any) -> SessionCorruptedError:
        """The whole database is damaged, or is not a perdure session database."""
        return SessionCorruptedError(
            f"SQLite session store {self.path} is damaged or is not a perdure session "
            f"database: {detail}",
            details={"file": str(self.path), "kind": "bad_database", **details},
        )

    def _damage(self, session_id: str, row: int, kind: str, detail: str) -> SessionCorruptedError:
        return SessionCorruptedError(
            f"session {session_id!r} in {self.path} is damaged: message row {row}: {detail}",
            details={"session_id": session_id, "file": str(self.path), "kind": kind, "row": row},
        )

    # ------------------------------------------------------------------ reading

    def _head(self, conn: sqlite3.Connection, session_id: str) -> _Head:
        row = conn.execute(_SELECT_SESSION, (session_id,)).fetchone()
        if row is None:
            self._check_absent(conn, session_id)
            raise self._expiry.not_found(session_id, expired=False)
        return self._checked_head(session_id, row)

    def _check_index(self, conn: sqlite3.Connection) -> None:
        """The ids' index holds every session row (a listing walks the index).

        Run on a listing's first page: a scan of the session rows, which are small.
        """
        scanned = conn.execute("SELECT id FROM perdure_sessions NOT INDEXED").fetchall()
        indexed = conn.execute(
            "SELECT id FROM perdure_sessions INDEXED BY sqlite_autoindex_perdure_sessions_1 "
            "WHERE id > ''"
        ).fetchall()
        if len(scanned) != len(indexed) or set(scanned) != set(indexed):
            raise self._bad_database(
                f"the index of session ids lists {len(indexed)} sessions, the table holds "
                f"{len(scanned)}, not the same"
            )

    def _check_absent(self, conn: sqlite3.Connection, session_id: str) -> None:
        """Make sure a session the lookup did not find is absent, not unreadable.

        A damaged table page can make SQLite miss a row without an error; the id's
        index (read alone) and a scan of the table (without the index) must agree
        that there is none. Only on this path: a scan of the session rows, which
        are small.
        """
        for how in ("", " NOT INDEXED"):
            found = conn.execute(
                f"SELECT sid FROM perdure_sessions{how} WHERE id = ?", (session_id,)
            ).fetchone()
            if found is not None:
                raise SessionCorruptedError(
                    f"session {session_id!r} in {self.path} is damaged: its session row is "
                    "listed but cannot be read",
                    details={"session_id": session_id, "file": str(self.path), "kind": "bad_meta"},
                )

    def _checked_head(self, session_id: str, row: Sequence[Any]) -> _Head:
        """The session row, its values checked for the types this store writes."""
        head = _Head(*row)
        if not (
            all(isinstance(v, int) for v in (head.sid, head.total, head.writes))
            and all(isinstance(v, str) for v in (head.created_at, head.updated_at))
            and all(isinstance(v, str) for v in (head.head, head.tail))
            and isinstance(head.state_hash, str | None)
            and 0 <= head.total < _KEY_SPAN
        ):
            raise SessionCorruptedError(
                f"session {session_id!r} in {self.path} is damaged: its session row "
                "holds values of the wrong type",
                details={"session_id": session_id, "file": str(self.path), "kind": "bad_meta"},
            )
        return head

    def _prev_hash(self, conn: sqlite3.Connection, session_id: str, head: _Head, at: int) -> str:
        """The hash row ``at`` chains to."""
        if at == 0:
            return ZERO_HASH
        row = conn.execute(
            "SELECT hash FROM perdure_messages WHERE key = ?", (head.base + at - 1,)
        ).fetchone()
        if row is None:
            raise self._damage(session_id, at - 1, "bad_sequence", "the row is missing")
        return str(row[0])

    def _verify(
        self,
        session_id: str,
        head: _Head,
        rows: builtins.list[tuple[int, bytes, str, bytes | None, str | None]],
        first: int,
        prev: str,
        end: int,
    ) -> builtins.list[Message]:
        """Check that ``rows`` (``_SELECT_ROW_BYTES``) are messages ``first..end-1``,
        chained from ``prev``; decode them (:func:`~perdure.session.rules.verify_rows`)."""
        return verify_rows(
            rows,
            first,
            prev,
            end,
            head.head if end == head.total else None,
            lambda at, kind, detail: self._damage(session_id, at, kind, detail),
            base=head.base,
            cipher=self.cipher,
        )

    def _get(self, session_id: str, offset: int) -> SessionRecord:
        with self._use(self._reader) as conn, transaction(conn, "BEGIN"):
            head = self._head(conn, session_id)
            start = min(offset, head.total)
            prev = self._prev_hash(conn, session_id, head, start)
            rows = conn.execute(
                _SELECT_ROW_BYTES, (head.base + start, head.base + _KEY_SPAN)
            ).fetchall()
            state_row = conn.execute(
                "SELECT body FROM perdure_states WHERE sid = ?", (head.sid,)
            ).fetchone()
        try:
            messages = self._verify(session_id, head, rows, start, prev, head.total)
        except DecryptionError:
            self._state(session_id, head, state_row)  # its hash too, before the key stops us
            raise
        return SessionRecord(
            meta=head.meta(session_id),
            messages=messages,
            offset=start,
            agent_state=self._state(session_id, head, state_row),
            tail=head.tail,
        )

    def _state(self, session_id: str, head: _Head, row: tuple[str] | None) -> dict[str, Any]:
        def damaged(detail: str) -> SessionCorruptedError:
            return SessionCorruptedError(
                f"session {session_id!r} in {self.path} is damaged: agent state: {detail}",
                details={"session_id": session_id, "file": str(self.path), "kind": "bad_state"},
            )

        if row is None:
            if head.state_hash is not None:
                raise damaged("the state row is missing")
            return {}
        if not isinstance(row[0], str):
            raise damaged("the state is not text")
        if head.state_hash != text_hash(row[0]):
            raise damaged("the state does not match its hash")
        try:
            return decode_state(row[0], self.cipher)
        except DecodeError as exc:
            raise damaged(str(exc)) from None

    def _history_page(self, session_id: str, offset: int, limit: int) -> HistoryPage:
        with self._use(self._reader) as conn, transaction(conn, "BEGIN"):
            head = self._head(conn, session_id)
            lo, hi = page_read_range(head.total, offset, limit)
            prev = self._prev_hash(conn, session_id, head, lo)
            rows = conn.execute(_SELECT_ROW_BYTES, (head.base + lo, head.base + hi)).fetchall()
        window = self._verify(session_id, head, rows, lo, prev, hi)
        return page_of(head.total, offset, limit, lo, window)

    def _list(self, limit: int | None, after: str | None) -> builtins.list[SessionMeta]:
        bounds = ("" if after is None else after, -1 if limit is None else limit)
        with self._use(self._reader) as conn, transaction(conn, "BEGIN"):
            rows = conn.execute(
                "SELECT id, created_at, updated_at, message_count FROM perdure_sessions "
                "WHERE id > ? ORDER BY id LIMIT ?",
                bounds,
            ).fetchall()
            # The ids alone come from their index: a row the table cannot give back
            # (a damaged page, which SQLite may skip without an error) shows here.
            ids = conn.execute(
                "SELECT id FROM perdure_sessions WHERE id > ? ORDER BY id LIMIT ?", bounds
            ).fetchall()
            if after is None:
                self._check_index(conn)
        if len(ids) != len(rows):
            listed = {row[0] for row in rows}
            lost = next((i[0] for i in ids if i[0] not in listed), None)
            named = lost if isinstance(lost, str) else None
            raise SessionCorruptedError(
                f"session {named!r} in {self.path} is damaged: its session row is listed "
                "but cannot be read",
                details={"session_id": named, "file": str(self.path), "kind": "bad_meta"},
            )
        metas: builtins.list[SessionMeta] = []
        for row in rows:
            if not (all(isinstance(v, str) for v in row[:3]) and isinstance(row[3], int)):
                named = row[0] if isinstance(row[0], str) else None
                raise SessionCorruptedError(
                    f"session {named!r} in {self.path} is damaged: its session row holds "
                    "values of the wrong type",
                    details={"session_id": named, "file": str(self.path), "kind": "bad_meta"},
                )
            metas.append(SessionMeta(*row))
        return metas

    # ------------------------------------------------------------------ writing

    def _create(self, session_id: str, exist_ok: bool, created: str) -> SessionMeta:
        meta = self._create_row(session_id, exist_ok, created)
        self._expiry.renew(session_id)
        return meta

    def _create_row(self, session_id: str, exist_ok: bool, created: str) -> SessionMeta:
        expired = self._expiry.is_expired(session_id)
        if expired:  # starts afresh, its checkpoints kept (SPEC §7)
            self._delete(session_id, keep_checkpoints=True)
        with self._use(self._reader) as conn:
            existing = conn.execute(_SELECT_SESSION, (session_id,)).fetchone()
        if existing is None:
            with (
                self._locks.for_write(session_id),
                self._use(self._writer) as conn,
                self._write_transaction(conn),
            ):
                self._heads.pop(session_id, None)
                existing = conn.execute(_SELECT_SESSION, (session_id,)).fetchone()
                if existing is None:
                    cursor = conn.execute(
                        "INSERT INTO perdure_sessions (id, created_at, updated_at, "
                        "message_count, head, writes, tail) VALUES (?, ?, ?, 0, ?, 0, ?)",
                        (session_id, created, created, ZERO_HASH, new_tail(0)),
                    )
                    if cursor.lastrowid is None or cursor.lastrowid > _MAX_SID:
                        raise OSError(f"SQLite session store {self.path} has run out of ids")
                    # A new session starts without checkpoints, even ones put before
                    # it existed (the file store wipes such leftovers the same way);
                    # an expired one keeps its own.
                    if not expired:
                        conn.execute(_DELETE_CHECKPOINTS, (session_id,))
                    return SessionMeta(session_id, created, created, 0)
        if not exist_ok:
            raise SessionConflictError(f"session {session_id!r} already exists in {self.path}")
        return self._checked_head(session_id, existing).meta(session_id)

    def _write_batch(
        self, items: Sequence[_Commit | None]
    ) -> builtins.list[CommitResult | BaseException | None]:
        """Commits and flushes gathered by :attr:`_group`, on its writer thread.

        Every commit of the batch goes into one write transaction
        (:meth:`_commit_together`): a commit that fails (a conflict, a damaged row, a
        lock another process holds) is rolled back alone and raises to its caller, while
        the others are made durable by the transaction's one sync
        (``synchronous=FULL``) before any of them returns. A flush (``None``) syncs
        the WAL once the commits are in, for every flush of the batch.
        """
        outcomes: builtins.list[CommitResult | BaseException | None] = [None] * len(items)
        commits = [(at, item) for at, item in enumerate(items) if item is not None]
        with self._use(self._writer) as conn:
            if commits:
                self._commit_together(conn, commits, outcomes)
                if self.durability == "commit" and self._wal_named_under is not conn:
                    try:  # then the next append can be made on the loop
                        self._name_wal(conn)
                    except OSError as exc:
                        _log.warning(
                            "SQLite session store %s: cannot sync %s: %s",
                            self.path,
                            self.path.parent,
                            exc,
                        )
            if len(commits) < len(items):
                try:
                    with self._write_transaction(conn):
                        self._sync_wal(conn)
                except Exception as exc:  # the flushes' own: the commits stand
                    failed = self._outcome(exc)
                    for at, item in enumerate(items):
                        if item is None:
                            outcomes[at] = failed
        return outcomes

    def _commit_together(
        self,
        conn: sqlite3.Connection,
        commits: Sequence[tuple[int, _Commit]],
        outcomes: builtins.list[CommitResult | BaseException | None],
    ) -> None:
        """The commits' statements in one transaction; each outcome at its index.

        A batch first goes without a savepoint per commit: two statements fewer a
        commit, each a release and retake of the GIL that the event loop's thread
        is waiting for. Should one of its commits fail (a conflict, a damaged row, a
        lock held elsewhere: rare under a Session's writer lock), the transaction is
        rolled back whole and the batch runs again with a savepoint around each, so
        that commit fails alone.
        """
        if len(commits) > 1 and self._try_together(conn, commits, outcomes, isolated=False):
            return
        self._try_together(conn, commits, outcomes, isolated=len(commits) > 1)

    def _try_together(
        self,
        conn: sqlite3.Connection,
        commits: Sequence[tuple[int, _Commit]],
        outcomes: builtins.list[CommitResult | BaseException | None],
        *,
        isolated: bool,
        within: Callable[[], contextlib.AbstractContextManager[None]] | None = None,
    ) -> bool:
        """:meth:`_commit_together` once: a commit that fails is rolled back alone
        (``isolated``: each in a savepoint) or, without, rolls the whole transaction
        back and gives False (nothing stands, no outcome is set). ``within``: the
        write transaction (default: the writer thread's, :meth:`_write_transaction`)."""
        written: builtins.list[tuple[int, str, _Head, CommitResult]] = []
        with contextlib.ExitStack() as holds:
            try:
                with self._write_transaction(conn) if within is None else within():
                    for at, commit in commits:
                        session_id = commit.request.session_id
                        if isolated:
                            conn.execute("SAVEPOINT perdure_commit")
                        try:
                            holds.enter_context(self._locks.for_write(session_id))
                            remembered = self._heads.pop(session_id, None)
                            result, head = self._write_messages(conn, commit, remembered)
                        except Exception as exc:
                            if len(commits) == 1:
                                raise  # a lone commit's failure is its own outcome
                            if not isolated:
                                raise _OneFailed from exc
                            conn.execute("ROLLBACK TO perdure_commit")
                            conn.execute("RELEASE perdure_commit")
                            outcomes[at] = self._outcome(exc)
                            continue
                        if isolated:
                            conn.execute("RELEASE perdure_commit")
                        self._remember(session_id, head)  # the next commit of it reads it
                        written.append((at, session_id, head, result))
            except BaseException as exc:
                # Nothing of the transaction stands: no commit of it returns, and the
                # rows this store remembered for them are not what is stored.
                for _, session_id, _, _ in written:
                    self._heads.pop(session_id, None)
                if isinstance(exc, _OneFailed):
                    return False
                if not isinstance(exc, Exception):
                    raise
                failed = self._outcome(exc)
                for at, _ in commits:
                    if outcomes[at] is None:
                        outcomes[at] = failed
                return True
        for at, _, _, result in written:
            outcomes[at] = result
        return True

    def _append_here(
        self, commit: _Commit
    ) -> tuple[CommitResult, asyncio.Future[None] | None] | None:
        """An append on the caller's thread, with the fsync it awaits; None: use a thread.

        A small append costs less than a hop to a worker thread and back (2-3x the
        throughput without a sync). With ``durability="commit"`` it is written with
        ``synchronous=NORMAL`` and its WAL fsync is started at once with no thread
        hop (:func:`~perdure._runtime.fsync.start_fsync`, as the file store's
        appends): the caller awaits it before the commit returns, so it is as
        durable as SQLite's own sync would make it. Until that fsync returns, no
        other write of this process goes into the WAL (the next goes to the writer
        thread, which waits for it: :meth:`_cover_inline_sync`), so a power cut
        never leaves a hole in front of later frames, which the WAL check would
        take for damage.

        It never blocks the event loop: when the writer connection is busy in a
        thread or not open yet, or another connection holds the database's write
        lock, it returns None and the commit goes to a thread, which may wait. Nor
        does it fold the WAL into the database (that fsyncs): once a fold is due it
        starts one in the background, and past ``_BACKLOG_FOLDS`` folds' worth the
        next commit goes to a thread and folds after it.
        """
        slot = self._writer
        if not slot.lock.acquire(blocking=False):
            return None
        try:
            durable = self.durability == "commit"
            conn = self._writable_here(durable)
            if conn is None:
                return None
            session_id = commit.request.session_id
            number = None
            with self._locks.for_write(session_id):
                try:
                    if durable:
                        conn.execute("PRAGMA synchronous = NORMAL")
                    try:
                        if not self._begin_write(conn, wait=False):
                            return None
                        changes = conn.total_changes
                        remembered = self._heads.pop(session_id, None)
                        with transaction(conn, None):
                            result, head = self._write_messages(conn, commit, remembered)
                            if durable:  # its frames go into the WAL as it commits
                                number = self._begin_inline_sync()
                    finally:
                        if durable:
                            conn.execute("PRAGMA synchronous = FULL")
                except DRIVER_ERRORS as exc:  # as _translate does, without its generator
                    raise self._translated(exc) from exc
                self._remember(session_id, head)
                return result, self._after_write_here(conn, changes, number)
        finally:
            slot.lock.release()

    def _writable_here(self, durable: bool) -> sqlite3.Connection | None:
        """The writer connection (its slot held by the caller), when a write may go on
        the caller's thread now: it is open, the WAL has no fold backlog and, for a
        durable write, no fsync of ours is in flight and the WAL's name is synced."""
        conn = self._writer.conn
        if conn is None or self._wal_backlog >= _BACKLOG_FOLDS * self._fold_pages:
            return None
        if durable and (not self._inline_synced.is_set() or self._wal_named_under is not conn):
            return None
        return conn

    def _after_write_here(
        self, conn: sqlite3.Connection, changes: int, number: int | None, *, offload: bool = False
    ) -> asyncio.Future[None] | None:
        """After a transaction committed on the caller's thread: its WAL fdatasync
        started (when durable, ``number`` its mark), its pages counted, and a fold
        started in the background once due. Nothing here may fail the commit."""
        synced = None if number is None else self._start_loop_sync(conn, number, offload)
        self._count_wal(conn.total_changes - changes)
        if self._wal_pages >= self._fold_pages and self._fold_in_flight() is None:
            self._wal_pages = 0
            with contextlib.suppress(RuntimeError):  # close() shut the folder down
                self._folding.value = self._folder.executor().submit(self._fold_behind)
        return synced

    def _start_loop_sync(
        self, conn: sqlite3.Connection, number: int, offload: bool = False
    ) -> asyncio.Future[None]:
        """Start the WAL fdatasync that makes durable appends ``number`` and before
        (made on the loop) durable; commits that come meanwhile queue behind it."""
        synced = start_fsync(self._wal_descriptor(conn), datasync=True, offload=offload)
        synced.add_done_callback(functools.partial(self._inline_sync_done, number))
        self._loop_sync = synced
        return synced

    def _queue_behind_sync(self, commit: _Commit) -> asyncio.Future[CommitResult | None] | None:
        """Group commit on the event loop: queue a durable commit behind the fsync in flight.

        While an fsync started on this loop for earlier appends is in flight, no write
        may go into the WAL (see :meth:`_append_here`), so a commit that comes then
        waits on the loop, and every commit queued by the time that fsync returns goes
        into one transaction, made durable by one fsync (:meth:`_write_queued`): many
        sessions' commits share one sync, with no thread hop. A commit also queues
        while others are queued, so that none jumps ahead of them. Returns the future
        the commit's caller awaits (its result; None: the writer thread is to write
        it), or None when nothing is in flight or queued on this loop.
        """
        if self.durability != "commit":
            return None
        syncing, queued_on = self._loop_sync, self._queued_on
        loop = asyncio.get_running_loop()
        if syncing is None or syncing.get_loop() is not loop:
            return None  # the queue, like the fsync it waits for, is one loop's
        if queued_on is not None and queued_on.get_loop() is not loop:
            return None
        if queued_on is None:
            if syncing.done():
                return None
            self._queued_on = syncing
            syncing.add_done_callback(self._write_queued)
            # An fsync that neither returns nor is cancelled holds them up no longer
            # than it would the writer thread (see _cover_inline_sync).
            self._queue_timer = loop.call_later(_INLINE_SYNC_WAIT, self._queue_to_thread, syncing)
        waiter: asyncio.Future[CommitResult | None] = loop.create_future()
        self._queued.append((commit, waiter))
        return waiter

    def _withdraw(self, waiter: asyncio.Future[CommitResult | None]) -> None:
        """A cancelled caller's commit is not written, unless its batch has taken it."""
        self._queued = [(commit, other) for commit, other in self._queued if other is not waiter]

    def _write_queued(self, synced: asyncio.Future[None]) -> None:
        """The fsync the queued commits waited for returned: write them all, sync once.

        On the loop, as that fsync's callback. Those that cannot be written on the
        loop (the writer thread has the connection, the fsync failed, another loop's
        append is being synced) are handed back with None, for the writer thread.
        """
        batch = self._take_queue(synced)
        if not batch:
            return
        try:
            # The loop is busy with the sessions that queued: this batch's fsync
            # takes nothing from its CPU (start_fsync's offload).
            written = self._write_here([commit for commit, _ in batch], offload=True)
        except BaseException as exc:  # no caller is left waiting for ever
            for _, waiter in batch:
                if not waiter.done():
                    waiter.set_exception(exc)
            if isinstance(exc, Exception):
                return
            raise
        if written is None:
            for _, waiter in batch:
                waiter.set_result(None)
            return
        outcomes, fsync = written
        standing = []
        for (_, waiter), outcome in zip(batch, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                waiter.set_exception(outcome)  # nothing of it stands: no sync to wait for
            else:
                standing.append((waiter, outcome))
        if standing:
            settled = functools.partial(_settle_batch, standing)
            if fsync is None:
                settled(None)
            else:
                fsync.add_done_callback(settled)

    def _queue_to_thread(self, synced: asyncio.Future[None]) -> None:
        """The fsync the queued commits wait for has not returned in
        ``_INLINE_SYNC_WAIT``: the writer thread writes them (and syncs the WAL first)."""
        for _, waiter in self._take_queue(synced):
            waiter.set_result(None)

    def _take_queue(
        self, synced: asyncio.Future[None]
    ) -> builtins.list[tuple[_Commit, asyncio.Future[CommitResult | None]]]:
        """The commits queued behind ``synced`` whose callers still wait (none when the
        queue was taken already), the queue emptied."""
        if synced is not self._queued_on:
            return []
        timer, self._queue_timer, self._queued_on = self._queue_timer, None, None
        if timer is not None:
            timer.cancel()
        batch, self._queued = self._queued, []
        return [(commit, waiter) for commit, waiter in batch if not waiter.done()]

    def _write_here(self, commits: Sequence[_Commit], *, offload: bool = False) -> _Written | None:
        """Durable commits in one transaction on the caller's thread, and the fsync
        started for them (None when the transaction failed whole); None: use the writer
        thread.

        As :meth:`_append_here` for one commit. A commit that fails is rolled back
        alone, and its outcome is the error it raises: as in :meth:`_commit_together`,
        the batch goes first without savepoints, and only after a failure again with
        one around each commit.
        """
        slot = self._writer
        if not slot.lock.acquire(blocking=False):
            return None
        try:
            conn = self._writable_here(durable=True)
            if conn is None:
                return None
            outcomes: builtins.list[CommitResult | BaseException | None] = [None] * len(commits)
            number: int | None = None

            @contextlib.contextmanager
            def on_the_loop() -> Iterator[None]:
                nonlocal number
                with transaction(conn, None):
                    yield
                    number = self._begin_inline_sync()  # its frames go in as it commits

            try:
                conn.execute("PRAGMA synchronous = NORMAL")
                try:
                    if not self._begin_write(conn, wait=False):
                        return None
                    changes = conn.total_changes
                    numbered = list(enumerate(commits))
                    # As _commit_together: no savepoints, unless one commit fails; then
                    # all of it was rolled back, and it runs again, each in a savepoint.
                    if not self._try_together(
                        conn, numbered, outcomes, isolated=False, within=on_the_loop
                    ):
                        if not self._begin_write(conn, wait=False):
                            return None  # the writer thread writes them all
                        self._try_together(
                            conn, numbered, outcomes, isolated=True, within=on_the_loop
                        )
                finally:
                    conn.execute("PRAGMA synchronous = FULL")
            except DRIVER_ERRORS as exc:  # as _translate does, without its generator
                failed = self._translated(exc)
                return [failed] * len(commits), None
            # Synced even when none of them stands: the transaction committed, and its
            # mark (number) is cleared until an fsync after it returns.
            return outcomes, self._after_write_here(conn, changes, number, offload=offload)
        finally:
            slot.lock.release()

    def _begin_inline_sync(self) -> int:
        """Mark a durable append made on the loop as not yet synced; its number."""
        with self._sync_guard:
            self._inline_number += 1
            self._inline_synced.clear()
            return self._inline_number

    def _inline_sync_done(self, number: int, synced: asyncio.Future[None]) -> None:
        """The fsync of append ``number`` ended: the WAL is synced, if it succeeded.

        A failed or cancelled one leaves the mark: the writer thread syncs the WAL
        itself before it writes again (:meth:`_cover_inline_sync`).
        """
        if synced.cancelled() or synced.exception() is not None:
            return  # (the exception is the awaiting commit's to raise)
        with self._sync_guard:
            if number == self._inline_number:
                self._inline_synced.set()

    def _cover_inline_sync(self, conn: sqlite3.Connection) -> None:
        """Before the writer thread writes: an append made on the loop is synced first.

        Its fsync is in flight (or failed, or its loop closed): wait for it a
        moment, then fsync the WAL here, which covers it as well.
        """
        if self._inline_synced.is_set() or self._inline_synced.wait(_INLINE_SYNC_WAIT):
            return
        _fsync_path(self._wal_path)
        self._inline_synced.set()  # no append on the loop meanwhile: we hold the writer

    def _wal_descriptor(self, conn: sqlite3.Connection) -> int:
        """The WAL, open for fsyncs while the writer connection ``conn`` lasts.

        Held under the writer slot. While a connection of ours is open, SQLite never
        deletes the WAL (see :meth:`_sync_wal`), so one descriptor serves them all.
        """
        held = self._wal_fd
        if held is not None and held[0] is conn:
            return held[1]
        fd = os.open(self._wal_path, os.O_RDONLY | os.O_CLOEXEC)
        self._close_wal_descriptor()
        self._wal_fd = (conn, fd)
        return fd

    def _close_wal_descriptor(self) -> None:
        held, self._wal_fd = self._wal_fd, None
        if held is not None:
            with contextlib.suppress(OSError):
                os.close(held[1])

    def _start_flush_here(self) -> asyncio.Future[None] | None:
        """A flush's WAL fsync started on the caller's thread; None: use the writer."""
        slot = self._writer
        if not slot.lock.acquire(blocking=False):
            return None
        try:
            conn = slot.conn
            if conn is None or self._wal_named_under is not conn:
                return None
            try:
                return start_fsync(self._wal_descriptor(conn), datasync=True)
            except OSError:
                return None  # the writer's flush raises it, translated
        finally:
            slot.lock.release()

    @contextlib.contextmanager
    def _write_transaction(self, conn: sqlite3.Connection) -> Iterator[None]:
        """One write transaction on the writer connection, on a worker thread.

        Waits up to ``busy_timeout`` for the database's write lock, commits (or
        rolls back), then folds the WAL when it has grown enough.
        """
        self._cover_inline_sync(conn)
        self._begin_write(conn, wait=True)
        changes = conn.total_changes
        with transaction(conn, None):
            yield
        self._count_wal(conn.total_changes - changes)
        if (
            self._wal_pages >= self._fold_pages
            or self._wal_backlog >= _BACKLOG_FOLDS * self._fold_pages
        ):
            self._fold(conn)

    def _begin_write(self, conn: sqlite3.Connection, *, wait: bool) -> bool:
        """``BEGIN IMMEDIATE``; False when another connection writes and not ``wait``.

        With ``wait``, retries with growing sleeps (as SQLite's busy handler would)
        until ``busy_timeout``, then raises the busy error.
        """
        deadline: float | None = None
        delay = 0.001
        while True:
            try:
                conn.execute("BEGIN IMMEDIATE")
                return True
            except sqlite3.OperationalError as exc:
                if sqlite_fault(exc) != "busy":
                    raise
                if not wait:
                    return False
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self.busy_timeout
                if now >= deadline:
                    raise
                time.sleep(min(delay, deadline - now))
                delay = min(delay * 2, 0.05)

    def _count_wal(self, rows_changed: int) -> None:
        """Count the pages a committed write added to the WAL (under the writer slot).

        SQLite's autocheckpoint would fold the WAL inside the commit that crosses
        its limit, fsyncing on the committing thread — the event loop's, for an
        append made there. The store counts and folds it itself, always off the
        loop: in the background after appends made there (:meth:`_append_here`),
        and in the writing thread after a write made on one
        (:meth:`_write_transaction`).
        """
        if rows_changed > 0:
            pages = 1 + -(-rows_changed // _ROWS_PER_PAGE)
            self._wal_pages += pages
            self._wal_backlog += pages

    def _fold(self, conn: sqlite3.Connection) -> None:
        """Copy the WAL into the database (``PASSIVE``: readers and writers go on).

        Done by the writer after its commit (on a worker thread, holding the writer
        connection), once a background fold in flight has finished: no other write
        of this store comes in between, so it usually copies the whole WAL and the
        next write starts it over. A fold that fails loses nothing (the commits are
        in the WAL) and is retried later, so the write before it still succeeds.
        """
        self._wal_pages = self._wal_backlog = 0
        folding = self._fold_in_flight()
        if folding is not None:
            concurrent.futures.wait([folding])
        self._checkpoint_wal(conn)

    def _fold_in_flight(self) -> concurrent.futures.Future[None] | None:
        """The background fold still running in this process, if any."""
        folding = self._folding.value
        if folding is None or folding.done():
            return None
        return folding

    def _fold_behind(self) -> None:
        """A fold on the reader connection, in the background, while appends go on."""
        try:
            with self._use(self._reader) as conn:
                self._checkpoint_wal(conn)
        except Exception as exc:  # opening the reader failed: the writer folds later
            _log.warning("SQLite session store %s: folding the WAL failed: %s", self.path, exc)

    def _checkpoint_wal(self, conn: sqlite3.Connection) -> None:
        try:
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except DRIVER_ERRORS as exc:
            _log.warning("SQLite session store %s: folding the WAL failed: %s", self.path, exc)

    def _write_messages(
        self, conn: sqlite3.Connection, commit: _Commit, remembered: tuple[int, _Head] | None
    ) -> tuple[CommitResult, _Head]:
        """The commit's statements, inside a write transaction the caller began.

        Returns the session row as it stands after the commit. ``remembered`` is the
        row this store last wrote, used instead of reading it when it was written
        under the writer-lock hold still in force.
        """
        request, state_text, redaction_texts = commit
        session_id, messages, rewritten = request.session_id, request.messages, request.rewritten
        if remembered is not None and remembered[0] == self._locks.hold_id(session_id):
            head = remembered[1]
        else:
            head = self._head(conn, session_id)
        plan = plan_commit(request, head.total, head.tail)
        if plan.compare_last:
            stored_last = self._last_stored(conn, session_id, head)
            check_extends(session_id, messages, head.total, stored_last)
        wrote = False
        count, last = head.total, head.head
        if rewritten:
            conn.execute(
                "DELETE FROM perdure_messages WHERE key >= ? AND key < ?",
                (head.base, head.base + _KEY_SPAN),
            )
        if rewritten or len(messages) > plan.start:
            chain = _Chain(head.base, ZERO_HASH if rewritten else head.head, self.cipher)
            try:
                if len(messages) == plan.start + 1 and not rewritten:
                    # One row (a turn's append): no generator, no executemany set-up.
                    conn.execute(_INSERT_ROW, chain.row(messages, plan.start))
                else:
                    conn.executemany(_INSERT_ROW, chain.rows(messages, plan.start))
            except sqlite3.IntegrityError:
                # A row already stands where the session's recorded count says the
                # next one goes: the count is damaged, not perdure's SQL.
                raise self._damage(
                    session_id, head.total, "bad_sequence", "a row exists past the recorded end"
                ) from None
            count, last, wrote = len(messages), chain.head, True
        for index, text in sorted(redaction_texts.items()):
            row = conn.execute(
                "SELECT hash FROM perdure_messages WHERE key = ?", (head.base + index,)
            ).fetchone()
            if row is None:
                raise self._damage(session_id, index, "bad_sequence", "the row is missing")
            conn.execute(
                "UPDATE perdure_messages SET redacted = ?, redacted_hash = ? WHERE key = ?",
                (text, chain_hash(row[0], text), head.base + index),
            )
            wrote = True
        state_hash = head.state_hash
        if state_text is not None:
            conn.execute(
                "INSERT OR REPLACE INTO perdure_states (sid, body) VALUES (?, ?)",
                (head.sid, state_text),
            )
            state_hash, wrote = text_hash(state_text), True
        if not wrote:
            return CommitResult(head.tail, head.total), head
        writes, tail, now = head.writes + 1, new_tail(head.writes + 1), utc_now()
        conn.execute(
            "UPDATE perdure_sessions SET updated_at = ?, message_count = ?, head = ?, "
            "writes = ?, tail = ?, state_hash = ? WHERE sid = ?",
            (now, count, last, writes, tail, state_hash, head.sid),
        )
        after = _Head(head.sid, head.created_at, now, count, last, writes, tail, state_hash)
        return CommitResult(tail, count), after

    def _last_stored(
        self, conn: sqlite3.Connection, session_id: str, head: _Head
    ) -> builtins.list[Message]:
        """The last stored message, as written and (if redacted) as redacted, decoded."""
        at = head.total - 1
        row = conn.execute(
            "SELECT body, redacted FROM perdure_messages WHERE key = ?", (head.base + at,)
        ).fetchone()
        if row is None:
            raise self._damage(session_id, at, "bad_sequence", "the row is missing")
        try:
            return [decode_message(text, self.cipher) for text in row if text is not None]
        except DecodeError as exc:
            raise self._damage(session_id, at, "bad_payload", str(exc)) from None

    def _remember(self, session_id: str, head: _Head) -> None:
        """Keep the committed session row for the rest of this writer-lock hold."""
        hold = self._locks.hold_id(session_id)
        if hold is not None:
            self._heads[session_id] = (hold, head)

    def _delete(self, session_id: str, *, keep_checkpoints: bool = False) -> None:
        with (
            self._locks.for_write(session_id),
            self._use(self._writer) as conn,
            self._write_transaction(conn),
        ):
            self._heads.pop(session_id, None)
            if not keep_checkpoints:
                conn.execute(_DELETE_CHECKPOINTS, (session_id,))
            row = conn.execute(
                "SELECT sid FROM perdure_sessions WHERE id = ?", (session_id,)
            ).fetchone()
            if row is None:
                return
            base = row[0] << _KEY_BITS
            conn.execute(
                "DELETE FROM perdure_messages WHERE key >= ? AND key < ?", (base, base + _KEY_SPAN)
            )
            conn.execute("DELETE FROM perdure_states WHERE sid = ?", (row[0],))
            conn.execute("DELETE FROM perdure_sessions WHERE sid = ?", (row[0],))

    # ------------------------------------------------------------------ checkpoints

    def _checkpoint_put(self, meta: CheckpointMeta, record: CheckpointRecord) -> None:
        body = record.to_json_bytes(self.cipher)  # here, not on the loop: a history can be large
        with self._use(self._writer) as conn, self._write_transaction(conn):
            conn.execute(
                "INSERT OR REPLACE INTO perdure_checkpoints (session_id, checkpoint_id, "
                "trigger, label, message_count, created_at, body, hash) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    meta.session_id,
                    meta.checkpoint_id,
                    meta.trigger,
                    meta.label,
                    meta.message_count,
                    meta.created_at,
                    body,
                    blob_hash(body),
                ),
            )
            if self.max_checkpoints is not None or self.max_checkpoint_age is not None:
                ids = [
                    row[0]
                    for row in conn.execute(
                        "SELECT checkpoint_id FROM perdure_checkpoints "
                        "WHERE session_id = ? AND typeof(checkpoint_id) = 'text'",
                        (meta.session_id,),
                    )
                ]
                conn.executemany(
                    "DELETE FROM perdure_checkpoints WHERE session_id = ? AND checkpoint_id = ?",
                    [
                        (meta.session_id, stale)
                        for stale in evicted_checkpoints(
                            ids, self.max_checkpoints, self.max_checkpoint_age
                        )
                    ],
                )

    def _checkpoint_get(self, session_id: str, checkpoint_id: str) -> CheckpointRecord:
        with self._use(self._reader) as conn:
            row = conn.execute(
                f"SELECT {_META_COLUMNS}, body, hash FROM perdure_checkpoints "
                "WHERE session_id = ? AND checkpoint_id = ?",
                (session_id, checkpoint_id),
            ).fetchone()
        if row is None:
            raise CheckpointNotFoundError(
                f"checkpoint {checkpoint_id} of session {session_id!r} not found in {self.path}"
            )
        meta = self._checkpoint_meta(session_id, checkpoint_id, row[:5])
        body, stored_hash = row[5], row[6]
        damaged = functools.partial(self._checkpoint_damage, session_id, checkpoint_id)
        if not isinstance(body, bytes):
            raise damaged("the body does not match its hash")
        # The hash column checks the body, also one written by perdure 0.1 (unsealed).
        return verified_record(
            body, stored_hash, meta, damaged, unsealed_ok=True, cipher=self.cipher
        )

    def _checkpoint_list(self, session_id: str) -> builtins.list[CheckpointMeta]:
        with self._use(self._reader) as conn:
            rows = conn.execute(
                f"SELECT {_META_COLUMNS} FROM perdure_checkpoints "
                "WHERE session_id = ? ORDER BY checkpoint_id",
                (session_id,),
            ).fetchall()
        return [self._checkpoint_meta(session_id, row[0], row) for row in rows]

    def _checkpoint_ids(self, session_id: str) -> builtins.list[str]:
        with self._use(self._reader) as conn:
            rows = conn.execute(
                "SELECT checkpoint_id FROM perdure_checkpoints "
                "WHERE session_id = ? ORDER BY checkpoint_id",
                (session_id,),
            ).fetchall()
        return [str(row[0]) for row in rows]

    def _checkpoint_delete(self, session_id: str, checkpoint_id: str) -> None:
        with self._use(self._writer) as conn, self._write_transaction(conn):
            conn.execute(
                "DELETE FROM perdure_checkpoints WHERE session_id = ? AND checkpoint_id = ?",
                (session_id, checkpoint_id),
            )

    def _checkpoint_meta(
        self, session_id: str, checkpoint_id: Any, columns: Sequence[Any]
    ) -> CheckpointMeta:
        """The meta stored in a row's columns (``checkpoint_id`` first), checked."""
        fields = ("checkpoint_id", "trigger", "label", "message_count", "created_at")
        try:
            return CheckpointMeta.from_dict(
                {"session_id": session_id, **dict(zip(fields, columns, strict=True))}
            )
        except (TypeError, ValueError) as exc:
            raise self._checkpoint_damage(session_id, str(checkpoint_id), str(exc)) from None

    def _checkpoint_damage(
        self, session_id: str, checkpoint_id: str, detail: str
    ) -> SessionCorruptedError:
        return SessionCorruptedError(
            f"session {session_id!r} in {self.path} is damaged: checkpoint {checkpoint_id}: "
            f"{detail}",
            details={
                "session_id": session_id,
                "file": str(self.path),
                "kind": "bad_checkpoint",
                "checkpoint_id": checkpoint_id,
            },
        )

    # ------------------------------------------------------------------ repair

    async def quarantine(
        self,
        session_id: str,
        quarantine_dir: str | os.PathLike[str],
        *,
        dry_run: bool = True,
    ) -> SessionRecoveryReport | None:
        """Move a damaged session's unverifiable rows out; keep its verifiable prefix.

        The rows are walked in order from the first; at the first that does not
        verify (a changed body or hash, a missing row, a bad payload) it and every
        row after it (they chain from it) are moved to
        ``<quarantine_dir>/<session_id>/<time>.jsonl``, and the session row is set
        to the rows kept: the session then reads cleanly. Rows past the recorded end,
        a recorded end past the last row, and a damaged agent state (moved, then
        reset to empty) are repaired likewise. Rows already gone are reported as
        ``gaps`` (``(row after them, count)``; the recorded end for rows gone from the
        end), never as moved records; the intact row after such a gap moves as
        ``unverifiable`` (only the lost row's hash vouched for its body). No file is
        written when nothing moves (``quarantine_path`` is then None). Under the
        writer lock, in one write transaction, after the quarantine file is durable:
        a crash leaves the session as it was (with a copy in quarantine) or repaired.

        Returns None when nothing here is attributable to rows (the damage is in a
        checkpoint, say). With ``dry_run`` nothing is written and the report says
        what would move (its ``quarantine_path`` is empty).

        Raises:
            SessionNotFoundError: no such session.
            SessionCorruptedError: the session row itself, or the database, is too
                damaged to repair here.
            SessionLockedError: another writer holds the session's lock.
        """
        validate_session_id(session_id)
        target = Path(quarantine_dir)
        return await asyncio.to_thread(self._quarantine, session_id, target, dry_run)

    def _quarantine(
        self, session_id: str, target: Path, dry_run: bool
    ) -> SessionRecoveryReport | None:
        if dry_run:
            with self._use(self._reader) as conn, transaction(conn, "BEGIN"):
                plan = self._repair_plan(conn, session_id)
            return None if plan is None else plan.report(session_id, "")
        with (
            self._locks.for_write(session_id),
            self._use(self._writer) as conn,
            self._write_transaction(conn),
        ):
            self._heads.pop(session_id, None)
            plan = self._repair_plan(conn, session_id)
            if plan is None:
                return None
            qpath: Path | None = None
            if plan.moves_anything:  # rows gone already leave nothing to keep a copy of
                where = target / session_id
                where.mkdir(parents=True, exist_ok=True)
                qpath = where / f"{utc_now().replace(':', '-')}-{os.urandom(4).hex()}.jsonl"
                atomic_write(qpath, plan.quarantined_lines())
            head = plan.head
            if plan.state_bad:
                conn.execute("DELETE FROM perdure_states WHERE sid = ?", (head.sid,))
            conn.execute(
                "DELETE FROM perdure_messages WHERE key >= ? AND key < ?",
                (head.base + plan.keep, head.base + _KEY_SPAN),
            )
            writes = head.writes + 1
            conn.execute(
                "UPDATE perdure_sessions SET updated_at = ?, message_count = ?, head = ?, "
                "writes = ?, tail = ?, state_hash = ? WHERE sid = ?",
                (
                    utc_now(),
                    plan.keep,
                    plan.last_hash,
                    writes,
                    new_tail(writes),
                    None if plan.state_bad else head.state_hash,
                    head.sid,
                ),
            )
            return plan.report(session_id, None if qpath is None else str(qpath))

    def release_damaged_wal(self, quarantine_dir: str | os.PathLike[str]) -> Path | None:
        """Move a damaged WAL set aside (see :attr:`damaged_wal_path`) into quarantine.

        The database then opens with what SQLite kept of the log: the commits before
        the damage. Returns where the log went, or None when none was set aside.
        Durable: the move and both directories are synced.
        """
        source = self.damaged_wal_path
        if not source.exists():
            return None
        target_dir = Path(quarantine_dir)
        target_dir.mkdir(parents=True, exist_ok=True)
        target = target_dir / f"{self.path.name}-{utc_now().replace(':', '-')}.wal"
        atomic_write(target, source.read_bytes(), durable=True)
        source.unlink()
        _fsync_path(source.parent, directory=True)
        return target

    def _repair_plan(self, conn: sqlite3.Connection, session_id: str) -> _RepairPlan | None:
        """What :meth:`quarantine` moves (None: nothing attributable to rows)."""
        head = self._head(conn, session_id)
        conn.text_factory = bytes  # damaged text must be read, not refused
        try:
            rows = conn.execute(_SELECT_ROWS, (head.base, head.base + _KEY_SPAN)).fetchall()
            state_row = conn.execute(
                "SELECT body FROM perdure_states WHERE sid = ?", (head.sid,)
            ).fetchone()
        finally:
            conn.text_factory = str
        plan = _RepairPlan(head, rows)
        prev, kind = ZERO_HASH, None
        for index, (key, body, stored, redacted, redacted_hash) in enumerate(rows):
            texts = [_stored_text(v) for v in (body, stored, redacted, redacted_hash)]
            kind = _row_damage(key - head.base, index, prev, *texts)
            if kind == "bad_sequence" and index < key - head.base:
                # Rows index.. are gone (keys are unique and sorted: never fewer).
                # The row after them is intact as far as anyone can tell, but only
                # the hash of the row before it could vouch for its body: it moves
                # as unverifiable, and those after it with it (they chain from it).
                # A row past the recorded end moves as bad_sequence, as it would
                # without the gap.
                end = min(key - head.base, head.total)
                if end > index:
                    plan.gaps.append((end, end - index))
                if key - head.base < head.total:
                    kind = "unverifiable"
            if kind is not None:
                break
            prev = str(texts[1])
            plan.keep, plan.last_hash = index + 1, prev
        if kind is None and plan.keep > head.total:
            # Rows past the recorded end: moved when the recorded head is the hash of
            # the row at that end (else the session row is what is damaged).
            at_end = ZERO_HASH if head.total == 0 else _stored_text(rows[head.total - 1][2])
            if at_end == head.head:
                plan.keep, plan.last_hash, kind = head.total, head.head, "bad_sequence"
        plan.first_kind = kind or "bad_sequence"
        if kind is None and head.total > len(rows):  # every row verifies, the last gone
            plan.gaps.append((head.total, head.total - len(rows)))
        state_text = None if state_row is None else _stored_text(state_row[0])
        if state_row is None:
            plan.state_bad = head.state_hash is not None
        else:
            plan.state_bad = state_text is None or head.state_hash != text_hash(state_text)
            if not plan.state_bad:
                try:
                    decode_state(str(state_text))
                except DecodeError:
                    plan.state_bad = True
                except DecryptionError:
                    pass  # encrypted: its hash vouches for it
            plan.state_raw = state_row[0]
        clean = plan.keep == len(rows) == head.total and plan.last_hash == head.head
        return None if clean and not plan.state_bad else plan

    def _sync_wal(self, conn: sqlite3.Connection) -> None:
        """fsync the WAL, and its directory entry once per writer connection.

        Called inside a write transaction by the writer's flush; the flush started
        on the loop (:meth:`_start_flush_here`) holds none: a commit or a fold that
        runs beside the fsync does not undo it (the WAL starts over only once a
        fold has synced the database).
        """
        # Never open (and close) the database file itself: closing any descriptor of
        # it drops every POSIX lock this process holds on it, SQLite's included, and
        # another process's last connection would then fold and delete the WAL under
        # our feet. Its pages need no sync here: a fold syncs the database itself.
        # The WAL's directory entry needs one fsync, not one per flush: while this
        # connection is open the WAL is never deleted (only the last connection to
        # close deletes it, and SQLite's checkpoints truncate it in place), so the
        # entry synced once under it stays the WAL's. A new connection (after close,
        # in a forked child) syncs it again.
        _fsync_path(self._wal_path)
        self._name_wal(conn)

    def _name_wal(self, conn: sqlite3.Connection) -> None:
        """fsync the WAL's directory entry, once per writer connection (see _sync_wal).

        Until it is, appends are not made on the event loop: the entry of a WAL that
        SQLite created with ``synchronous=NORMAL`` may not be durable.
        """
        if self._wal_named_under is not conn:
            _fsync_path(self.path.parent, directory=True)
            if self._wal_path.exists():
                self._wal_named_under = conn


_Written = tuple[
    "builtins.list[CommitResult | BaseException | None]", "asyncio.Future[None] | None"
]


def _settle_batch(
    standing: Sequence[tuple[asyncio.Future[CommitResult | None], CommitResult | None]],
    synced: asyncio.Future[None] | None,
) -> None:
    """The commits of a loop-written batch that stand, to their callers, once its fsync
    returned: each its result, or the fsync's error."""
    error: BaseException | None = None
    if synced is not None:
        if synced.cancelled():
            error = OSError(errno.EIO, "the WAL's fsync was cancelled: the commit may be lost")
        else:
            error = synced.exception()
    for waiter, outcome in standing:
        if waiter.done():
            continue
        if error is not None:
            waiter.set_exception(error)
        else:
            waiter.set_result(outcome)


class _OneFailed(Exception):
    """A commit of a batch run without savepoints failed (its error is the cause)."""


class SQLiteCheckpointStore:
    """The checkpoints of a :class:`SQLiteSessionStore`, kept in its database.

    Obtained as ``store.checkpoints``; implements
    :class:`~perdure.checkpoints.store.CheckpointStore`. After ``put`` returns the
    checkpoint is stored with the durability of a commit of the store, and at most
    ``max_checkpoints`` of its session remain; after a crash the put and its
    evictions happened entirely or not at all. SQLite runs in worker threads, so
    every coroutine may be awaited from any loop and thread.
    """

    def __init__(self, sessions: SQLiteSessionStore) -> None:
        self._sessions = sessions

    def __repr__(self) -> str:
        return f"SQLiteCheckpointStore({str(self._sessions.path)!r})"

    @property
    def max_checkpoints(self) -> int | None:
        """The store's retention limit per session (``None``: no limit)."""
        return self._sessions.max_checkpoints

    @property
    def max_checkpoint_age(self) -> float | None:
        """The store's checkpoint age limit in seconds (``None``: no limit)."""
        return self._sessions.max_checkpoint_age

    async def put(self, record: CheckpointRecord) -> None:
        """Store ``record`` (replacing one with its id), then apply retention; one transaction.

        Raises:
            TypeError, ValueError: ``record`` is not a well-formed checkpoint record.
            SessionLockedError: the database stayed locked past ``busy_timeout``.
        """
        if not isinstance(record, CheckpointRecord):
            raise TypeError(f"record must be a CheckpointRecord, got {type(record).__name__}")
        meta = CheckpointMeta.from_dict(record.meta.to_dict())
        await asyncio.to_thread(self._sessions._checkpoint_put, meta, record)

    async def get(self, session_id: str, checkpoint_id: str) -> CheckpointRecord:
        """Read and verify one checkpoint.

        Raises:
            ValueError: ``checkpoint_id`` is not a ULID, or ``session_id`` is invalid.
            CheckpointNotFoundError: no such checkpoint in that session.
            SessionCorruptedError: its row is damaged.
        """
        validate_session_id(session_id)
        check_checkpoint_id(checkpoint_id)
        return await asyncio.to_thread(self._sessions._checkpoint_get, session_id, checkpoint_id)

    async def list(self, session_id: str) -> builtins.list[CheckpointMeta]:
        """The session's checkpoints, oldest first (reads no body).

        Raises:
            SessionCorruptedError: a row's meta columns are damaged.
        """
        validate_session_id(session_id)
        return await asyncio.to_thread(self._sessions._checkpoint_list, session_id)

    async def checkpoint_ids(self, session_id: str) -> builtins.list[str]:
        """Every checkpoint id of the session, oldest first, damaged or not (reads no body)."""
        validate_session_id(session_id)
        return await asyncio.to_thread(self._sessions._checkpoint_ids, session_id)

    async def delete(self, session_id: str, checkpoint_id: str) -> None:
        """Delete one checkpoint (absent is fine), damaged or not; durable like a commit.

        Raises:
            ValueError: ``checkpoint_id`` is not a ULID, or ``session_id`` is invalid.
        """
        validate_session_id(session_id)
        check_checkpoint_id(checkpoint_id)
        await asyncio.to_thread(self._sessions._checkpoint_delete, session_id, checkpoint_id)
