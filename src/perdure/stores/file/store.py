"""FileSessionStore: sessions as hash-chained journals on a local disk (SPEC §7.1).

Layout, under ``<dir>/sessions/<session_id>/``::

    meta.json          created once: {"format", "session_id", "created_at", "head"}
    journal.jsonl      the active segment: one hash-chained record per line
    head               where the journal durably ends (two checksummed slots)
    manifest.json      sealed segments, in order (only once a segment was sealed)
    segments/000001.jsonl …
    attachments/<sha256>   large binaries referenced from the journal (a rewrite that
                           drops the last reference deletes the file)
    checkpoints/       (session checkpoints, beside the session)

Each process's commit log is ``<dir>/.wal/<random>.log`` (see
:mod:`perdure.stores.file.wal`). Writer locks live in
``<dir>/.locks/<session_id>.lock`` (``flock``), so deleting a
session directory never deletes a held lock. A deleted session is renamed into
``<dir>/.trash/`` first, so a listing never meets half of one.

Guarantees:

- **Durable**: with ``durability="commit"`` (the default) a commit returns after its
  records are appended and fsynced; ``"invocation"`` defers the fsync to
  :meth:`flush` (the ``Session`` calls it after each invocation); ``"none"`` never
  fsyncs (fast, for tests and caches).
- **Off the loop, without a hop**: the appends of a turn (writer lock held, tail
  cached) write their few hundred bytes into the page cache on the caller's thread
  and hand the fsync to the kernel (Linux native AIO, see ``perdure._runtime.fsync``),
  so the loop keeps running and no worker thread wakes; elsewhere the fsync runs on
  the store's writer thread. Everything heavier — reading a tail from disk,
  rewrites, sealing, attachments — runs on the writer thread.
- **One sync for many sessions**: with ``durability="commit"`` such an append is
  also copied into this process's commit log (:mod:`perdure.stores.file.wal`), and
  it is an ``fdatasync`` of the log, not of the journal, that the commit waits for:
  appends of many sessions that arrive while one sync is in flight share the next.
  A store made after a process died replays its log first, so what an OS crash took
  from the journals' page cache is back before anything reads them.
- **Crash-healing**: a torn last line (an append interrupted by a crash) is not
  corruption: readers ignore it and the next writer truncates it. A last record
  that verifies but lost its newline (or whose newline became another byte) is no
  torn append: it is kept, and the next writer puts the newline back. A bad line
  in the middle, a broken chain or a bad payload raises ``SessionCorruptedError``
  with the file, byte offset and kind of damage in ``err.details``; with
  ``recovery="quarantine"`` provably bad records are moved to a quarantine directory
  outside the session and the rest is kept, and ``on_recovery`` gets a report.
- **Segments**: the active journal is sealed into ``segments/`` at ``max_records``
  records or ``max_bytes`` bytes; a history page reads only the segments it covers.
- **Reads follow what they return**: a page, or ``get(offset=n)`` (how a Session
  resumes its conversation manager's window), reads backwards from the end only the
  bytes holding those messages and the latest agent state, and verifies what it
  read; ``get()`` reads and verifies everything (``verify_store`` uses it).
- **Atomic rewrites**: ``commit(..., rewritten=True)`` writes the new history to
  ``rewrite.jsonl.tmp``, fsyncs, and renames it to ``rewrite.jsonl`` — the commit
  point. Readers treat an existing ``rewrite.jsonl`` as the whole history; the next
  writer finishes the switch. A crash before the rename rolls back, after it rolls
  forward: never half a volume; rewritten-away messages never come back.
- **The end is recorded outside the log**: when a turn ends (the writer lock's
  block, or a commit made without one), the ``head`` file records the last record
  the journal durably holds — its number, hash and message count — written only
  after the journal's fsync returned, plus one fsync of its own: one per turn, none
  per message. Every read and the next writer check the journal against it, so a
  journal cut at a line boundary or deleted, losing acknowledged records, is
  ``SessionCorruptedError`` (kind ``truncated``), never a shorter session; a crash
  can only leave the head behind the journal, which is not damage. Rewrites name
  both volumes' ends around their commit point. With ``durability="none"`` nothing
  is synced, the head included: it records what was written, so after an OS crash
  or power cut that lost written records the session reports them missing rather
  than silently shorter (``perdure repair`` accepts the loss).
- **A session is its directory**: one whose ``meta.json`` is missing or unreadable
  but that holds data is damaged (``SessionCorruptedError`` from every read and
  write, listed with ``SessionMeta.damaged`` set), never "not found"; no create or
  open path deletes it. Only what an interrupted ``create`` leaves (no ``meta.json``,
  at most the empty genesis journal, temp files and checkpoints put under an id no
  session had) reads as no session and is cleared by the next ``create``.
  :meth:`FileSessionStore.rebuild_meta` writes ``meta.json`` again from the
  journal's first record (``perdure repair --apply``).
- **TTL** (``ttl=`` seconds of inactivity): each session's last use (a commit, a
  ``get``, a ``create``) is the modification time of ``<dir>/.ttl/<session_id>``
  (:mod:`perdure.session._stamps`). Past it, reads and commits raise
  ``session_not_found`` with ``details["reason"] == "expired"`` (an id never seen:
  ``"unknown"``), ``list`` leaves the session out, ``create`` starts it afresh (its
  checkpoints kept), and :meth:`FileSessionStore.collect_expired` (``perdure gc``)
  deletes its files but ``checkpoints/``, ``meta.json`` first; the stamp stays as
  its tombstone for ``max(10 × ttl, 7 days)``, and a directory without
  ``meta.json`` whose stamp says expired is what such a gc left, not damage. A
  commit checks and renews the stamp on the caller's thread, as it appends.
- **Readers never lock**: ``get``, ``list`` and pages read while another process or
  thread appends, seals or rewrites. A read that a seal or rewrite moved files under
  (a file gone, a chain that no longer meets) is retried on the new volume; only
  damage that stays while the volume is still is reported as corruption.
"""

from __future__ import annotations

import asyncio
import builtins
import concurrent.futures
import contextlib
import datetime as _dt
import functools
import hashlib
import json
import logging
import os
import re
import shutil
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar, cast

from perdure._runtime.checks import check_path
from perdure._runtime.fs import append_all, atomic_write, fsync_dir
from perdure._runtime.fsync import start_fsync
from perdure._runtime.threads import ProcessLock, StoreThread
from perdure.checkpoints.store import FileCheckpointStore
from perdure.crypto import Cipher, is_sealed_text
from perdure.errors import (
    SessionConflictError,
    SessionCorruptedError,
    SessionLockedError,
    SessionNotFoundError,
)
from perdure.session._locks import LockTable
from perdure.session._stamps import DirStamps, Expiry, collect_expired, live_listing
from perdure.session.attachments import (
    ATTACHMENT_MARKER,
    decode_with_attachments,
    extract_attachments,
    is_valid_digest,
)
from perdure.session.expiry import check_ttl
from perdure.session.ids import validate_session_id
from perdure.session.paging import check_page_args, page_of, page_read_range
from perdure.session.rules import (
    CommitPlan,
    CommitRequest,
    check_cipher,
    check_extends,
    check_get_args,
    check_list_args,
    check_max_checkpoint_age,
    check_max_checkpoints,
    creation_time,
    decode_messages,
    looks_like_message,
    plan_commit,
    seal,
    unseal,
    unseal_all,
    utc_now,
)
from perdure.session.store import (
    CommitResult,
    ExpiredSessionInfo,
    HistoryPage,
    SessionMeta,
    SessionRecord,
    StoreBase,
)
from perdure.stores.file import journal
from perdure.stores.file.journal import GENESIS, End, JournalDamage, Record
from perdure.stores.file.layout import (
    ATTACHMENTS,
    HEAD,
    JOURNAL,
    MANIFEST,
    META,
    REWRITE,
    REWRITE_TMP,
    SEGMENTS,
    TRASH,
    check_meta,
    head_ends,
    is_transient,
    meta_bytes,
    open_regular,
    read_regular,
)
from perdure.stores.file.leftovers import (
    LEGACY_TRASH,
    create_leftovers,
    invalid_id,
    is_provisional_orphan,
    is_renamed_session,
    is_session_name,
    temp_files,
)
from perdure.stores.file.leftovers import (
    StoreLeftovers as StoreLeftovers,
)
from perdure.stores.file.listing import ListingCache
from perdure.stores.file.quarantine import SessionRecoveryReport as SessionRecoveryReport
from perdure.stores.file.quarantine import triage
from perdure.stores.file.tail import Encoded, Tail, encode_records, end_of, last_line, read_tail
from perdure.stores.file.wal import CommitLog, Entry, recover
from perdure.types import (
    Message,
    decode_bytes_values,
    is_text_only,
    validate_message,
    validate_storable,
)
from perdure.types.json import compact_json, may_hold_encoded

Durability = Literal["commit", "invocation", "none"]
Recovery = Literal["strict", "quarantine"]

# How a journal line names an attachment (compact JSON): text that merely contains
# these words has its quotes escaped and never matches.
_ATTACHMENT_REF = re.compile(b'"' + ATTACHMENT_MARKER.encode() + b'":"([0-9a-f]{64})"')
_MANIFEST_FORMAT = "perdure-manifest/1"
_SEGMENT_NAME = re.compile(r"\d{6}\.jsonl")
_MIN_WINDOW = 8 * 1024
_MARK_EVERY = 256  # records between two marks of a sealed segment
_INLINE_MAX = 256 * 1024  # bytes an append may copy into the page cache on the loop
# A lock-free read that a concurrent seal or rewrite disturbed is retried this many
# times (backing off up to ~10 ms), so a reader never reports a writer's move as damage.
_READ_ATTEMPTS = 40

_T = TypeVar("_T")
_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Segmentation:
    """When the active journal is sealed into a segment."""

    enabled: bool = True
    max_bytes: int = 16 * 1024 * 1024
    max_records: int = 5000

    def __post_init__(self) -> None:
        if self.max_bytes < 1 or self.max_records < 1:
            raise ValueError("segmentation max_bytes and max_records must be >= 1")


@dataclass
class _Segment:
    file: str
    first_seq: int
    last_seq: int
    first_count: int
    count: int
    prev_hash: str
    last_hash: str
    redactions: dict[str, Any] = field(default_factory=dict)
    sha256: str | None = None
    """Digest of the segment file as sealed (absent in manifests written before it)."""
    marks: list[list[Any]] | None = None
    """Every ``_MARK_EVERY``-th record's ``[seq, byte offset, hash before it, messages
    before it]``, recorded at the seal (absent in manifests written before them). A
    page read verifies the chain between two marks, as it would to the segment's end:
    a page deep inside a segment that one bulk commit wrote (a copy, an import, a
    migration: 100k records) reads a few hundred records, not the rest of the segment."""

    def to_json(self) -> dict[str, Any]:
        return {key: value for key, value in self.__dict__.items() if value is not None}


@dataclass
class _Volume:
    """Where a session's records are, as read from disk (no writes)."""

    segments: list[_Segment]
    segment_paths: list[Path]
    journal: Path | None
    prev_hash: str
    first_seq: int
    first_count: int
    rewrite_pending: bool = False
    seal_pending: bool = False


@dataclass(frozen=True)
class _Share:
    """How many of a file's messages a read wants, to size its first window."""

    wanted: int
    """Messages from the first one wanted to the end of the file."""
    messages: int
    """Messages the file holds."""

    def bytes_of(self, size: int) -> int:
        """A window likely to hold the wanted messages: their share of the file, +25%
        and a line's worth (records are not all alike; a short window just grows)."""
        if self.messages <= 0 or self.wanted >= self.messages:
            return size
        return min(size, size * self.wanted * 5 // (self.messages * 4) + _MIN_WINDOW)


class FileSessionStore(StoreBase):
    """Sessions stored as hash-chained journals under ``dir`` (see the module docstring).

    Args:
        dir: the root directory (created on demand).
        durability: ``"commit"`` (fsync every commit), ``"invocation"`` (fsync on
            :meth:`flush`) or ``"none"``.
        segmentation: a :class:`Segmentation`, ``None`` for the defaults (16 MiB /
            5000 records) or ``False`` to keep one journal forever.
        recovery: ``"strict"`` (damage raises) or ``"quarantine"``.
        on_recovery: called with a :class:`SessionRecoveryReport` after a quarantine;
            if it raises, the read fails.
        quarantine_dir: where quarantined records go (default
            ``<dir>/.session-recovery-quarantine``).
        max_checkpoints: checkpoint retention (for session checkpoints).
        max_checkpoint_age: seconds; older checkpoints of a session are evicted when
            it gets a new one (and by ``perdure gc``).
        attachment_threshold: ``bytes`` values at least this long are stored as
            attachments.
        ttl: seconds of inactivity after which a session expires (``None``: never).
        cipher: a :class:`~perdure.crypto.Cipher` (SPEC §9): each record's message
            or state, and each checkpoint's content, is stored encrypted (a journal
            line keeps its hash, sequence and count in clear; the chain covers the
            ciphertext, so ``perdure verify`` needs no key). Binaries then stay
            inside their encrypted record: no attachment files are written.
    """

    def __init__(
        self,
        dir: str | os.PathLike[str],
        *,
        durability: Durability = "commit",
        segmentation: Segmentation | Literal[False] | None = None,
        recovery: Recovery = "strict",
        on_recovery: Callable[[SessionRecoveryReport], None] | None = None,
        quarantine_dir: str | os.PathLike[str] | None = None,
        max_checkpoints: int | None = None,
        attachment_threshold: int = 1024,
        max_checkpoint_age: float | None = None,
        ttl: float | None = None,
        cipher: Cipher | None = None,
    ) -> None:
        self.cipher = check_cipher(cipher)
        if durability not in ("commit", "invocation", "none"):
            raise ValueError(
                f"durability must be 'commit', 'invocation' or 'none', got {durability!r}"
            )
        if recovery not in ("strict", "quarantine"):
            raise ValueError(f"recovery must be 'strict' or 'quarantine', got {recovery!r}")
        if segmentation is False:
            segmentation = Segmentation(enabled=False)
        elif segmentation is None:
            segmentation = Segmentation()
        elif not isinstance(segmentation, Segmentation):
            raise TypeError(
                f"segmentation must be a Segmentation, None or False, got {segmentation!r}"
            )
        check_max_checkpoints(max_checkpoints)
        max_checkpoint_age = check_max_checkpoint_age(max_checkpoint_age)
        if (
            isinstance(attachment_threshold, bool)
            or not isinstance(attachment_threshold, int)
            or attachment_threshold < 1
        ):
            raise ValueError(
                f"attachment_threshold must be an int >= 1, got {attachment_threshold!r}"
            )
        self.root = check_path("dir", dir)
        self.ttl = check_ttl(ttl)
        self._expiry = Expiry(self.ttl, DirStamps(self.root / ".ttl"), str(self.root))
        self.durability: Durability = durability
        self.segmentation = segmentation
        self.recovery: Recovery = recovery
        self.on_recovery = on_recovery
        self.quarantine_dir = (
            Path(quarantine_dir)
            if quarantine_dir is not None
            else self.root / ".session-recovery-quarantine"
        )
        self.max_checkpoints = max_checkpoints
        self.max_checkpoint_age = max_checkpoint_age
        self.checkpoints = FileCheckpointStore(
            self.root,
            max_checkpoints=max_checkpoints,
            max_checkpoint_age=max_checkpoint_age,
            cipher=cipher,
            _layout=lambda session_id: self.session_dir(session_id) / "checkpoints",
            _sessions_root=self.root / "sessions",
        )
        """Checkpoints beside each session (``<session dir>/checkpoints/``), deleted with it."""
        self.attachment_threshold = attachment_threshold
        self._locks = LockTable(self.root / ".locks")
        self._listing = ListingCache(self.root)  # list rows while their files stand still
        self._tails: dict[str, Tail] = {}
        # The writer-lock hold (LockTable.hold_id) under which each cached tail was
        # last written or checked: while it lasts nobody else can change the journal.
        self._tail_holds: dict[str, int | None] = {}
        self._fds: dict[str, tuple[int, int]] = {}  # session id -> (inode, open journal fd)
        # session id -> (journal, rewrite marker, meta.json)
        self._paths: dict[str, tuple[str, str, str]] = {}
        self._dirs: dict[str, Path] = {}  # see session_dir
        # The newest tail known durable (fsynced, or written under durability="none")
        # in a turn that holds the writer lock: its head is written when the turn ends.
        self._durable: dict[str, Tail] = {}
        # session dir -> (the head file's bytes as this store last wrote them, their
        # generation): an unchanged head file is not decoded again.
        self._heads: dict[str, tuple[bytes, int]] = {}
        self._writer = StoreThread("perdure-file-store")
        # A process that died left its commit log: put back what its appends lost
        # before anything reads a journal (see perdure.stores.file.wal).
        try:
            recover(self.root)
        except OSError as exc:  # read-only, say: reads check journals against heads
            _log.warning("%s: the commit logs could not be replayed: %s", self.root, exc)
        # Durable appends made on the loop share one fdatasync of this log.
        self._commit_log = (
            CommitLog(self.root, self._write_executor) if durability == "commit" else None
        )
        # Held while the journal cache (_tails, _fds) or a session's files change
        # (free in a child made by fork(), whatever the parent's threads held).
        self._guard = ProcessLock(reentrant=True)

    def __repr__(self) -> str:
        return f"FileSessionStore({str(self.root)!r}, durability={self.durability!r})"

    # ------------------------------------------------------------------ protocol

    async def create(
        self,
        session_id: str,
        *,
        exist_ok: bool = False,
        created_at: _dt.datetime | str | None = None,
    ) -> SessionMeta:
        """Create an empty session (durably), created at ``created_at`` (default: now).

        See :meth:`SessionStore.create`.
        """
        validate_session_id(session_id)
        created = creation_time(created_at)
        return await asyncio.to_thread(self._create, session_id, exist_ok, created)

    async def get(self, session_id: str, *, offset: int = 0) -> SessionRecord:
        """Read and verify a session from ``offset``. See :class:`SessionStore`.

        With ``offset=0`` every file is read and verified. Past ``0`` only the end is
        read, backwards: the records from message ``offset`` on and back to the latest
        agent state, chain-verified over everything read (a sealed segment up to the
        hash its manifest records). Damage in what is not read is not seen here;
        :func:`~perdure.session.verify_store` reads everything.
        """
        check_get_args(session_id, offset)
        return await asyncio.to_thread(
            self._expiry.use, session_id, lambda: self._get(session_id, offset)
        )

    async def list(
        self, *, limit: int | None = None, after: str | None = None
    ) -> builtins.list[SessionMeta]:
        """Session metadata sorted by id (reads no message content).

        With ``ttl``, an expired session is left out and the others carry ``expires_at``.

        A session whose ``meta.json`` or head is unreadable or lost, or whose journal
        falls short of its head, is listed with ``damaged`` set, never skipped.
        """
        check_list_args(limit, after)
        return await asyncio.to_thread(live_listing, self._expiry, self._list, limit, after)

    async def collect_expired(self, *, dry_run: bool = True) -> builtins.list[ExpiredSessionInfo]:
        """Delete the files of every expired session but its checkpoints (``perdure gc``).

        Each keeps its tombstone (it still reads as expired); tombstones past their
        time go. A session a writer holds is left for the next time. A dry run
        deletes nothing.
        """
        return await asyncio.to_thread(self._collect_expired, dry_run)

    def _collect_expired(self, dry_run: bool) -> builtins.list[ExpiredSessionInfo]:
        base = self.root / "sessions"
        found: builtins.list[tuple[str, int]] = []
        names = sorted(p.name for p in base.iterdir()) if base.is_dir() else []
        for name in names:
            if not is_session_name(name) or not self._expiry.is_expired(name):
                continue
            sdir = base / name
            if not (sdir / META).exists() and create_leftovers(sdir):
                continue  # purged already: only its checkpoints are left
            try:
                count = self._meta(name).message_count
            except (SessionNotFoundError, SessionCorruptedError):
                count = 0  # half purged by a gc a crash stopped: finished now
            found.append((name, count))
        return collect_expired(self._expiry, found, self._purge, dry_run)

    def _purge(self, session_id: str) -> None:
        """Delete an expired session's files but its checkpoints (``meta.json`` first:
        from then on it is no session; the stamp says it expired)."""
        sdir = self.session_dir(session_id)
        with self._guard, self._locks.for_write(session_id):
            if not self._expiry.is_expired(session_id):
                return
            durable = self.durability != "none"
            with contextlib.suppress(FileNotFoundError):
                (sdir / META).unlink()
                if durable:
                    fsync_dir(sdir)
            for entry in os.listdir(sdir) if sdir.is_dir() else []:
                if entry == "checkpoints":
                    continue
                path = sdir / entry
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()
            if sdir.is_dir() and not os.listdir(sdir):
                sdir.rmdir()  # no checkpoints: the stamp alone is the tombstone
            elif durable and sdir.is_dir():
                fsync_dir(sdir)
            self._forget(session_id)
            self._durable.pop(session_id, None)

    async def _apply_commit(self, request: CommitRequest) -> CommitResult:
        """Append what is new (or rewrite everything). See :class:`SessionStore`."""
        # With a ttl, the session's stamp is checked and renewed here: a stat and a
        # utime, done on the caller's thread as the inline append writes its few
        # hundred bytes (both cost less than a thread hop).
        session_id = request.session_id
        renewed = self._expiry.check(session_id)
        try:
            result = await self._apply(request)
        except SessionNotFoundError:
            raise self._expiry.not_found(session_id) from None
        if not renewed:
            self._expiry.renew(session_id)
        return result

    async def _apply(self, request: CommitRequest) -> CommitResult:
        loop = asyncio.get_running_loop()
        if not request.rewritten:
            inline = self._append_inline(request)
            if inline is not None:
                result, synced, seal_due, written = inline
                session_id = request.session_id
                if synced is not None:
                    await self._synced(session_id, synced)
                if written is not None and self.durability != "invocation":
                    self._durable[session_id] = written  # the turn's end records it
                if seal_due:
                    await loop.run_in_executor(
                        self._write_executor(), self._seal_if_due, session_id
                    )
                return result
        return await loop.run_in_executor(self._write_executor(), self._commit, request)

    async def delete(self, session_id: str) -> None:
        """Delete the session directory (idempotent; refuses while another writer holds it)."""
        validate_session_id(session_id)
        await asyncio.to_thread(self._delete_forgotten, session_id)

    def _delete_forgotten(self, session_id: str) -> None:
        """Delete a session and its tombstone: the id is unknown afterwards."""
        self._delete(session_id)
        self._expiry.forget(session_id)

    def writer_lock(self, session_id: str) -> AbstractAsyncContextManager[None]:
        """Hold the session's writer lock (``SessionLockedError`` at once if held).

        When the block ends, before the lock is released, the session's head file
        records where the journal now durably ends (one small write and one fsync per
        turn, none per message): see :meth:`_record_head`.
        """
        validate_session_id(session_id)
        return self._turn(session_id)

    @contextlib.asynccontextmanager
    async def _turn(self, session_id: str) -> AsyncIterator[None]:
        async with self._locks.hold(session_id):
            self._durable.pop(session_id, None)  # only this hold's appends count
            try:
                yield
            except BaseException:
                # The block's error is the one to report; a head left behind only
                # checks less, never claims what is not there.
                with contextlib.suppress(OSError):
                    await self._record_head(session_id)
                raise
            await self._record_head(session_id)

    async def _record_head(self, session_id: str) -> None:
        """Write the end of the journal that the turn made durable into the head file.

        Only a tail whose journal fsync has returned is recorded (under
        ``durability="none"``, nothing is ever synced: the tail as written, and the head
        is not synced either), so after any crash the head never claims a record the
        journal may have lost — a crash can only leave the head behind the journal,
        which is never damage.

        The head's own fsync is started here and not waited for: the turn's messages
        are durable in the journal already, and a head that a power loss leaves one
        turn behind is what a crash during the turn leaves anyway. The turn ends one
        fsync sooner. (Two head fsyncs in flight are harmless: each covers the slots
        written before it.)
        """
        tail = self._durable.pop(session_id, None)
        if tail is None:
            return
        fd = self._write_head_slot(self.session_dir(session_id), [end_of(tail)])
        if fd is None:
            return
        try:
            # With the commit log, a checkpoint syncs the head with the journal.
            if self.durability != "none" and self._commit_log is None:
                synced = start_fsync(fd, self._write_executor())
                synced.add_done_callback(functools.partial(_head_synced, session_id))
        finally:
            os.close(fd)  # the fsync holds its own reference to the file

    async def history_page(self, session_id: str, offset: int, limit: int) -> HistoryPage:
        """One pair-aligned page, reading only the segments it covers."""
        validate_session_id(session_id)
        check_page_args(offset, limit)
        return await asyncio.to_thread(
            self._expiry.use,
            session_id,
            lambda: self._history_page(session_id, offset, limit),
            renew=False,
        )

    async def _synced(self, session_id: str, synced: asyncio.Future[None]) -> None:
        """Wait for a journal fsync started by an append or a flush.

        Raises:
            OSError: the fsync failed; the cached tail is dropped first, so the next
                commit reads the journal's end from disk again.
        """
        try:
            await synced
        except OSError:
            with self._guard:
                self._forget(session_id)
            raise

    async def flush(self, session_id: str) -> None:
        """Make buffered commits durable (``durability="invocation"``; else a no-op)."""
        validate_session_id(session_id)
        if self.durability != "invocation":
            return
        started = self._start_flush_inline(session_id)
        if started is not None:
            synced, written = started
            await self._synced(session_id, synced)
            if self._locks.is_held(session_id):
                self._durable[session_id] = written  # the turn's end records it
                return
        await asyncio.to_thread(self._flush, session_id)

    def _start_flush_inline(self, session_id: str) -> tuple[asyncio.Future[None], Tail] | None:
        """Start the fsync of a turn's journal on the caller's thread; None: use the writer.

        The common flush, at the end of a turn that appended under the writer lock it
        still holds: the journal is open and its tail cached under this hold, so the
        fsync is started on the open descriptor
        (:func:`~perdure._runtime.fsync.start_fsync`) with no hop to a thread, as a
        commit's is with ``durability="commit"``. The tail is taken before the fsync
        starts, so the fsync covers it.
        """
        hold = self._locks.hold_id(session_id)
        if hold is None or not self._guard.acquire(blocking=False):
            return None
        try:
            written = self._tails.get(session_id)
            open_journal = self._fds.get(session_id)
            if (
                written is None
                or self._tail_holds.get(session_id) != hold
                or open_journal is None
                or open_journal[0] != written.ino
            ):
                return None
            return start_fsync(open_journal[1], self._write_executor()), written
        finally:
            self._guard.release()

    def session_dir(self, session_id: str) -> Path:
        """The directory holding ``session_id``."""
        found = self._dirs.get(session_id)
        if found is None:  # a Path join costs ~10 µs; a turn asks several times
            found = self.root / "sessions" / validate_session_id(session_id)
            if len(self._dirs) >= 4096:
                self._dirs.clear()
            self._dirs[session_id] = found
        return found

    # ------------------------------------------------------------------ create / list / delete

    def _create(self, session_id: str, exist_ok: bool, created: str) -> SessionMeta:
        expired = self._expiry.is_expired(session_id)
        if expired:  # starts afresh, its checkpoints kept (SPEC §7)
            self._purge(session_id)
        meta = self._create_files(session_id, exist_ok, expired, created)
        self._expiry.renew(session_id)
        return meta

    def _create_files(
        self, session_id: str, exist_ok: bool, expired: bool, created: str
    ) -> SessionMeta:
        sdir = self.session_dir(session_id)
        # A create made while the caller holds the writer lock is one step of a larger
        # operation (Session.fork: create, then commit the history, under one hold).
        # Its genesis record says so: until a commit follows, it is provisional, and a
        # provisional session nobody holds is what a killed operation left (gc).
        provisional = self._locks.is_held(session_id)
        with self._guard, self._locks.for_write(session_id):
            if (sdir / META).exists():
                if exist_ok:
                    return self._meta(session_id)
                raise SessionConflictError(f"session {session_id!r} already exists")
            if sdir.exists():
                if not create_leftovers(sdir):
                    raise self._meta_missing(session_id, sdir)
                # What an interrupted create of ours left (no meta.json: it was never
                # created, nothing of it was acknowledged): start clean. An expired
                # session's checkpoints stay with its id.
                if expired:
                    for entry in os.listdir(sdir):
                        if entry != "checkpoints":
                            (sdir / entry).unlink()
                else:
                    shutil.rmtree(sdir)
            sdir.mkdir(parents=True, exist_ok=True)
            genesis: dict[str, Any] = {
                "n": 0,
                "c": 0,
                "t": "s",
                "s": {},
                "created": created,
                "id": uuid.uuid4().hex,
            }
            if provisional:
                genesis["provisional"] = 1
            line, first = journal.encode_record(GENESIS, genesis)
            durable = self.durability != "none"
            atomic_write(sdir / JOURNAL, line, durable=durable)
            fd = self._write_head_slot(sdir, [(0, first, 0)])
            if fd is not None:
                try:
                    if durable:
                        os.fsync(fd)
                finally:
                    os.close(fd)
            if durable:  # the head's entry before meta.json's, which says it exists
                fsync_dir(sdir)
            # meta.json last: it makes the session exist.
            atomic_write(sdir / META, meta_bytes(session_id, created), durable=durable)
            if durable:
                fsync_dir(sdir.parent)
            self._forget(session_id)
        return SessionMeta(session_id, created, created, 0)

    def _list(self, limit: int | None, after: str | None) -> builtins.list[SessionMeta]:
        base = self.root / "sessions"
        if not base.is_dir():
            return []
        # A directory without meta.json is a session too when it holds data (its
        # meta.json was lost): it is listed, marked damaged, never hidden.
        # (Strings, not Paths, in this loop over every session: a third of its time.)
        sessions = str(base)
        ids = sorted(
            name
            for name in os.listdir(sessions)
            if (is_session_name(name) or is_renamed_session(base / name))
            and (
                os.path.isfile(f"{sessions}{os.sep}{name}{os.sep}{META}")
                or (
                    os.path.isdir(f"{sessions}{os.sep}{name}") and not create_leftovers(base / name)
                )
            )
        )
        everything = after is None and limit is None
        if after is not None:
            ids = [i for i in ids if i > after]
        reaches_end = limit is None or len(ids) <= limit
        if limit is not None:
            ids = ids[:limit]
        metas: builtins.list[SessionMeta] = []
        for sid in ids:
            if not is_session_name(sid):
                # Stored by a version that allowed this id: listed, never hidden,
                # though no read can name it until its directory is renamed.
                metas.append(SessionMeta(sid, "", "", 0, damaged=invalid_id(sid)))
                continue
            try:
                sdir = f"{sessions}{os.sep}{sid}"
                metas.append(self._listing.row(sid, sdir, functools.partial(self._meta, sid)))
            except SessionNotFoundError:
                continue  # deleted while listing
            except SessionCorruptedError as exc:
                metas.append(SessionMeta(sid, "", "", 0, damaged=exc.message))
        if everything:
            self._listing.keep_only(set(ids))
        if reaches_end:
            self._listing.save()  # once per walk of the store, when it changed
        return metas

    def _meta(self, session_id: str) -> SessionMeta:
        sdir = self.session_dir(session_id)
        return self._lock_free(
            session_id, sdir, functools.partial(self._read_meta_of, session_id, sdir)
        )

    def _read_meta_of(self, session_id: str, sdir: Path) -> SessionMeta:
        created = self._read_meta(session_id, sdir)
        ends = self._read_ends(session_id, sdir)
        volume = self._volume(session_id, sdir)
        count, updated = self._peek_count(session_id, sdir, volume, ends)
        # The journal's mtime comes from a coarse kernel clock and may read a few
        # milliseconds before the creation time we stamped; never report that.
        return SessionMeta(session_id, created, max(updated or created, created), count)

    def _read_meta(self, session_id: str, sdir: Path) -> str:
        """The session's creation time from ``meta.json``.

        Raises:
            SessionNotFoundError: no session directory, or one holding only what an
                interrupted create leaves (that create never returned).
            SessionCorruptedError: ``meta.json`` is unreadable, or missing from a
                directory that holds data.
        """
        try:
            raw = self._read_file(session_id, sdir / META)
        except FileNotFoundError:
            if sdir.is_dir() and not create_leftovers(sdir):
                raise self._meta_missing(session_id, sdir) from None
            raise self._expiry.not_found(session_id, expired=False) from None
        try:
            created = check_meta(json.loads(raw), session_id)
        except ValueError as exc:
            raise self._corrupted(
                session_id, sdir / META, "bad_payload", 0, f"meta.json is unreadable: {exc}"
            ) from None
        return created

    def _read_ends(self, session_id: str, sdir: Path) -> builtins.list[End] | None:
        """The ends the head file allows the journal (``None``: a session from before
        head files, not checked until a writer gives it one).

        Raises:
            SessionCorruptedError: the head file is unreadable, or missing from a
                session created with one (``meta.json`` says so).
        """
        path = sdir / HEAD
        try:
            data = self._read_file(session_id, path)
        except FileNotFoundError:
            if self._head_required(sdir):
                raise self._corrupted(
                    session_id, path, "truncated", 0, "the head file is missing"
                ) from None
            return None
        head = journal.decode_head(data)
        if head is None:
            if not self._head_required(sdir):
                # A session from before head files got its first one, and a crash
                # left it half-written: as if it were not there yet.
                return None
            raise self._corrupted(session_id, path, "bad_payload", 0, "the head file is unreadable")
        return head[1]

    def _head_required(self, sdir: Path) -> bool:
        try:
            return bool(json.loads(read_regular(sdir / META)).get("head"))
        except (OSError, ValueError, AttributeError):
            return False  # _read_meta reports a bad meta.json

    def _check_ends(
        self,
        session_id: str,
        sdir: Path,
        ends: builtins.list[End] | None,
        last_seq: int,
        hash_at: Callable[[int], str | None],
    ) -> None:
        """Raise when the journal ends before the end its head file records."""
        if not ends:
            return
        missing = journal.missing_end(ends, last_seq, hash_at)
        if missing is not None:
            seq, _, count = missing
            try:  # the offset names where the journal now ends (0: it is gone)
                size = (sdir / JOURNAL).stat().st_size
            except OSError:
                size = 0
            raise self._corrupted(
                session_id,
                sdir / JOURNAL,
                "truncated",
                size,
                f"the journal ends at record {last_seq} but record {seq} ({count} messages) "
                "was durably written, as its head file records: acknowledged records are missing",
            )

    def _write_head_slot(self, sdir: Path, ends: Sequence[End]) -> int | None:
        """Write the next slot of ``sdir``'s head file (no fsync); return its open fd.

        Called under the writer lock, so no one else writes the head meanwhile.
        Returns ``None`` when the session directory is gone (deleted meanwhile).
        """
        key = os.fspath(sdir)
        try:
            fd = os.open(os.path.join(key, HEAD), os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:
            return None
        try:
            data = os.pread(fd, 2 * journal.HEAD_SLOT, 0)
            known = self._heads.get(key)
            if known is not None and known[0] == data:
                generation = known[1] + 1
            else:
                current = journal.decode_head(data)
                generation = current[0] + 1 if current is not None else 1
            slot = journal.encode_head_slot(generation, ends)
            at = (generation % 2) * journal.HEAD_SLOT
            os.pwrite(fd, slot, at)
        except BaseException:
            self._heads.pop(key, None)
            os.close(fd)
            raise
        if len(data) == 2 * journal.HEAD_SLOT:
            self._heads[key] = (data[:at] + slot + data[at + journal.HEAD_SLOT :], generation)
        return fd

    def _write_head(self, sdir: Path, ends: Sequence[End]) -> None:
        """Write the head now (fsynced unless ``durability="none"``): outside a turn."""
        fd = self._write_head_slot(sdir, ends)
        if fd is not None:
            try:
                if self.durability != "none":
                    os.fsync(fd)
            finally:
                os.close(fd)

    async def accept_journal_end(self, session_id: str) -> tuple[int | None, int] | None:
        """Make the head file name where the journal now ends, accepting lost records.

        For a session whose journal ends before its head (``truncated`` damage), or
        whose head file is missing or unreadable, and is otherwise intact: after
        this, it reads as the history its journal holds.
        The loss is not undone, only acknowledged: ``perdure repair --apply`` does
        this and reports it. Takes the writer lock; durable on return.

        Returns:
            ``(messages the head recorded, messages the journal holds)`` when the
            head was reset (the first is ``None`` when the head was missing or
            unreadable), ``None`` when the journal already reached it.

        Raises:
            SessionNotFoundError: no such session.
            SessionCorruptedError: other damage (a bad record, a bad meta.json).
            SessionLockedError: another writer holds the session.
        """
        validate_session_id(session_id)
        return await asyncio.to_thread(self._accept_journal_end, session_id)

    def _accept_journal_end(self, session_id: str) -> tuple[int | None, int] | None:
        sdir = self.session_dir(session_id)
        with self._guard, self._locks.for_write(session_id):
            self._finish_pending(session_id, sdir)
            try:
                self._read_all(session_id, sdir, 0)
                return None
            except SessionCorruptedError as exc:
                head_damage = Path(str(exc.details.get("file"))).name == HEAD
                unreadable = exc.details.get("kind") == "unreadable"
                if unreadable or (exc.details.get("kind") != "truncated" and not head_damage):
                    raise  # a head the OS will not read is left alone, never replaced
            recorded = head_ends(sdir)
            self._read_all(session_id, sdir, 0, check_head=False)  # nothing else is wrong
            self._forget(session_id)
            tail = self._writable_tail(session_id, sdir, check_head=False)
            self._write_head(sdir, [end_of(tail)])
            self._forget(session_id)
            return (recorded[-1][2] if recorded else None), tail.count

    async def collect_leftovers(self, *, dry_run: bool = True) -> StoreLeftovers:
        """Find (and unless ``dry_run`` remove) what killed writers left behind.

        Two kinds, both removed under the session's writer lock, so nothing a live
        writer is doing is touched (a session whose lock is held is reported in
        ``locked`` and left alone):

        - temp files of interrupted atomic replacements (``.manifest.json.<hex>.tmp``
          from a seal, ``.meta.json.…``, ``.journal.jsonl.…``, attachments'), an
          uncommitted ``rewrite.jsonl.tmp`` (its rewrite rolls back, as the next
          writer would do), and ``sessions/.deleted-<id>-<hex>`` directories an
          older version's interrupted delete left;
        - provisional sessions: created under a writer lock by an operation that was
          to commit their history under the same hold (``Session.fork``) and died
          first — a genesis record marked provisional and nothing else.
        """
        return await asyncio.to_thread(self._collect_leftovers, dry_run)

    def _collect_leftovers(self, dry_run: bool) -> StoreLeftovers:
        base = self.root / "sessions"
        temps: builtins.list[str] = []
        orphans: builtins.list[str] = []
        locked: builtins.list[str] = []
        if not base.is_dir():
            return StoreLeftovers((), (), ())
        for sdir in sorted(base.iterdir()):
            sid = sdir.name
            if LEGACY_TRASH.fullmatch(sid) and sdir.is_dir():
                temps.append(str(sdir))  # a deleted session's remains: nobody writes there
                if not dry_run:
                    shutil.rmtree(sdir, ignore_errors=True)
                continue
            if not is_session_name(sid) or not sdir.is_dir():
                continue
            if not temp_files(sdir) and not is_provisional_orphan(sdir):
                continue
            try:
                self._locks.acquire(sid)  # never reuses a hold: a turn may be running here
            except SessionLockedError:
                locked.append(sid)
                continue
            try:
                with self._guard:
                    found, orphan = temp_files(sdir), is_provisional_orphan(sdir)
                    temps.extend(str(path) for path in found)
                    if orphan:
                        orphans.append(sid)
                    if dry_run:
                        continue
                    for path in found:
                        path.unlink(missing_ok=True)
                    if orphan:
                        self._delete(sid)
                    elif found:
                        self._sync_dirs(sdir)
            finally:
                self._locks.release(sid)
        return StoreLeftovers(tuple(temps), tuple(orphans), tuple(locked))

    def _meta_missing(self, session_id: str, sdir: Path) -> SessionCorruptedError:
        return self._corrupted(
            session_id,
            sdir / META,
            "bad_payload",
            0,
            "meta.json is missing but the session directory holds data "
            "(`perdure repair --apply` rebuilds it from the journal)",
        )

    async def rebuild_meta(self, session_id: str) -> bool:
        """Write a missing or unreadable ``meta.json`` again from the session's journal.

        The creation time comes from the journal's first record, verified against the
        chain: the record ``create`` wrote, or after a rewrite the rewrite's own time
        (the earliest the journal still knows). Takes the writer lock; durable on return.

        Returns:
            True when ``meta.json`` was written, False when it was readable already.

        Raises:
            SessionNotFoundError: no such session.
            SessionCorruptedError: the journal's first record is damaged or missing
                too, so there is nothing trustworthy to rebuild from.
            SessionLockedError: another writer holds the session.
        """
        validate_session_id(session_id)
        return await asyncio.to_thread(self._rebuild_meta, session_id)

    def _rebuild_meta(self, session_id: str) -> bool:
        sdir = self.session_dir(session_id)
        with self._guard, self._locks.for_write(session_id):
            try:
                self._read_meta(session_id, sdir)
                return False
            except SessionCorruptedError as exc:
                if exc.details.get("kind") == "unreadable":
                    raise  # a file the OS will not read is left alone, never replaced
            volume = self._volume(session_id, sdir)
            first = volume.segment_paths[0] if volume.segment_paths else volume.journal
            if first is None or not first.exists():
                raise self._corrupted(
                    session_id, sdir / JOURNAL, "bad_line", 0, "no journal to rebuild meta.json"
                )
            try:
                with open_regular(first) as handle:
                    line = handle.readline()
            except OSError as exc:
                if is_transient(exc):
                    raise
                raise self._os_damage(session_id, first, exc) from None
            records = self._scan_bytes(session_id, first, line, GENESIS, 0, 0).records
            body = records[0].body if records else {}
            created = body.get("created") if body.get("t") == "s" else body.get("at")
            if not isinstance(created, str):
                raise self._corrupted(
                    session_id, first, "bad_payload", 0, "the first record holds no creation time"
                )
            atomic_write(
                sdir / META,
                meta_bytes(session_id, created, head=(sdir / HEAD).exists()),
                durable=self.durability != "none",
            )
            self._forget(session_id)
            return True

    def _peek_count(
        self, session_id: str, sdir: Path, volume: _Volume, ends: builtins.list[End] | None
    ) -> tuple[int, str | None]:
        """Message count and last-write time from the last record, without reading content.

        Checks that the journal reaches the end its head file records (by the last
        record's number, and its hash when that is the recorded one).
        """
        path = volume.journal
        count, updated, last_seq, last_hash = volume.first_count, None, volume.first_seq - 1, None
        if path is not None and _present(path):
            data = read_tail(path)
            line = last_line(data, volume.prev_hash)
            if line is not None:
                try:
                    body = journal.peek_body(line)
                    count, last_seq = int(body["c"]), int(body["n"])
                    last_hash = journal.peek_hash(line)
                except (ValueError, KeyError, TypeError):
                    count = volume.first_count
                mtime = _dt.datetime.fromtimestamp(path.stat().st_mtime, _dt.UTC)
                updated = mtime.isoformat(timespec="microseconds").replace("+00:00", "Z")
        elif volume.segments:
            last_hash = volume.prev_hash
        self._check_ends(
            session_id, sdir, ends, last_seq, lambda seq: last_hash if seq == last_seq else None
        )
        return count, updated

    def _delete(self, session_id: str) -> None:
        sdir = self.session_dir(session_id)
        with self._guard, self._locks.for_write(session_id):
            if not sdir.exists():
                return
            # Out of sessions/ in one rename, so a list() never meets a half-deleted
            # directory; what a crash leaves in the trash is emptied by the next delete.
            trash = self.root / TRASH
            trash.mkdir(exist_ok=True)
            os.replace(sdir, trash / uuid.uuid4().hex)
            if self.durability != "none":
                fsync_dir(sdir.parent)
            for leftover in trash.iterdir():
                shutil.rmtree(leftover, ignore_errors=True)
            self._forget(session_id)
            self._durable.pop(session_id, None)

    # ------------------------------------------------------------------ reading

    def _volume(self, session_id: str, sdir: Path) -> _Volume:
        """Locate a session's files, honouring an unfinished rewrite or seal."""
        if (sdir / REWRITE).exists():
            return _Volume([], [], sdir / REWRITE, GENESIS, 0, 0, rewrite_pending=True)
        segments: builtins.list[_Segment] = []
        manifest_path = sdir / MANIFEST
        if _present(manifest_path):
            try:
                manifest = json.loads(self._read_file(session_id, manifest_path))
                if manifest.get("format") != _MANIFEST_FORMAT:
                    raise ValueError(f"unknown manifest format {manifest.get('format')!r}")
                segments = [_Segment(**entry) for entry in manifest["segments"]]
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise self._corrupted(
                    session_id, manifest_path, "bad_payload", 0, f"manifest is unreadable: {exc}"
                ) from None
        elif on_disk := _segment_files(sdir):
            # A seal writes the manifest before the segment, and a rewrite deletes the
            # manifest before the segments: segments without one mean it was lost.
            raise self._manifest_missing(session_id, sdir, on_disk)
        segment_dir = sdir / SEGMENTS
        paths = [segment_dir / seg.file for seg in segments]
        journal_path: Path | None = sdir / JOURNAL
        seal_pending = False
        if segments and not paths[-1].exists():
            # Sealed in the manifest but not yet renamed: the journal is that segment.
            paths[-1] = sdir / JOURNAL
            journal_path = None
            seal_pending = True
        if not segments:
            return _Volume([], [], journal_path, GENESIS, 0, 0)
        last = segments[-1]
        return _Volume(
            segments,
            paths,
            journal_path,
            last.last_hash,
            last.last_seq + 1,
            last.count,
            seal_pending=seal_pending,
        )

    def _get(self, session_id: str, offset: int) -> SessionRecord:
        sdir = self.session_dir(session_id)
        reader = self._read_all if offset == 0 else self._read_end
        read = functools.partial(reader, session_id, sdir, offset)
        try:
            return self._lock_free(session_id, sdir, read)
        except SessionCorruptedError:
            if self.recovery != "quarantine":
                raise
        self._quarantine(session_id, sdir)
        return self._lock_free(session_id, sdir, read)

    def _lock_free(self, session_id: str, sdir: Path, read: Callable[[], _T]) -> _T:
        """Run ``read`` (which takes no lock) until no writer moved the volume under it.

        A seal renames the journal and replaces the manifest; a rewrite deletes the
        segments. A reader caught in between finds a file gone or a chain that does
        not meet, which would be corruption in a volume at rest. A file the OS will
        not read (permission denied, a directory or a FIFO in its place) is
        corruption too, naming the file and the error; a passing shortage (EINTR,
        EAGAIN, ENOMEM, out of file descriptors) is raised as it is. So the error counts
        only when the volume's files are the same before and after the attempt;
        otherwise the read starts again on the new volume. The first attempt does
        not watch (four stats would cost a listing of many sessions 40%): an error
        there only means the read is tried again, watching.
        """
        try:
            return read()
        except SessionCorruptedError:
            pass
        except OSError as exc:
            if is_transient(exc):
                raise
        for attempt in range(1, _READ_ATTEMPTS + 1):
            before = _volume_identity(sdir)
            try:
                return read()
            except (SessionCorruptedError, OSError) as exc:
                if isinstance(exc, OSError) and is_transient(exc):
                    raise
                if attempt == _READ_ATTEMPTS or _volume_identity(sdir) == before:
                    if isinstance(exc, OSError):
                        path = Path(exc.filename) if exc.filename else sdir
                        raise self._os_damage(session_id, path, exc) from None
                    raise
            time.sleep(min(0.0005 * attempt, 0.01))
        raise AssertionError("unreachable")  # pragma: no cover

    def _read_all(
        self, session_id: str, sdir: Path, offset: int, *, check_head: bool = True
    ) -> SessionRecord:
        created = self._read_meta(session_id, sdir)
        # Before the volume: the journal only grows past what the head names.
        ends = self._read_ends(session_id, sdir) if check_head else None
        volume = self._volume(session_id, sdir)
        records: builtins.list[Record] = []
        prev, seq = GENESIS, 0
        for seg, path in zip(volume.segments, volume.segment_paths, strict=True):
            scanned = self._scan_file(session_id, path, prev, seq, sealed=True, digest=seg.sha256)
            if (
                seg.prev_hash != prev
                or scanned.last_hash != seg.last_hash
                or not scanned.records
                or scanned.records[-1].seq != seg.last_seq
                or not _marks_fit(seg, scanned.records)
            ):
                raise self._corrupted(
                    session_id, path, "broken_chain", 0, "segment does not match the manifest"
                )
            records.extend(scanned.records)
            prev, seq = scanned.last_hash, seg.last_seq + 1
        updated = created
        if volume.journal is not None and _present(volume.journal):
            scanned = self._scan_file(session_id, volume.journal, prev, seq, sealed=False)
            records.extend(scanned.records)
            prev = scanned.last_hash
            updated = (
                _dt.datetime.fromtimestamp(volume.journal.stat().st_mtime, _dt.UTC)
                .isoformat(timespec="microseconds")
                .replace("+00:00", "Z")
            )
        self._check_ends(
            session_id,
            sdir,
            ends,
            records[-1].seq if records else -1,
            lambda seq: records[seq].hash if 0 <= seq < len(records) else None,
        )
        messages, state, redacted = self._replay(session_id, sdir, records)
        for index, replacement in redacted.items():
            messages[index] = replacement
        meta = SessionMeta(session_id, created, max(updated, created), len(messages))
        return SessionRecord(
            meta=meta,
            messages=messages[offset:],
            offset=min(offset, len(messages)),
            agent_state=state,
            tail=prev,
        )

    def _scan_file(
        self,
        session_id: str,
        path: Path,
        prev: str,
        seq: int,
        *,
        sealed: bool,
        digest: str | None = None,
    ) -> journal.Scan:
        """Read and verify one file of the volume.

        A sealed segment whose bytes still have the ``digest`` recorded when it was
        sealed (and chain-verified) is verified by that one sha256 over the file
        instead of a hash per line: ~1.5 ms instead of ~15 ms for 5,000 records.
        Any other bytes get the line-by-line check, which names the damage.
        """
        try:
            data = self._read_file(session_id, path)
        except FileNotFoundError:
            raise self._corrupted(session_id, path, "bad_line", 0, "file is missing") from None
        as_sealed = digest is not None and hashlib.sha256(data).hexdigest() == digest
        try:
            scanned = journal.scan(data, prev_hash=prev, first_seq=seq, verify=not as_sealed)
        except JournalDamage as damage:
            raise self._corrupted(
                session_id, path, damage.kind, damage.offset, damage.detail
            ) from None
        if sealed and (scanned.torn or scanned.end != len(data)):
            raise self._corrupted(
                session_id, path, "bad_line", scanned.end, "sealed segment ends mid-record"
            )
        if digest is not None and not as_sealed:
            # Every line verifies, yet these are not the bytes that were sealed.
            raise self._corrupted(
                session_id, path, "broken_chain", 0, "segment does not match its manifest digest"
            )
        return scanned

    def _replay(
        self, session_id: str, sdir: Path, records: Sequence[Record]
    ) -> tuple[builtins.list[Message], dict[str, Any], dict[int, Message]]:
        messages: builtins.list[Message] = []
        state: dict[str, Any] = {}
        redacted: dict[int, Message] = {}
        # Encrypted messages are opened together after the walk (one pass, like a
        # plain journal's one parse), and of the encrypted states only the last.
        sealed: builtins.list[tuple[int, Record]] = []
        last_state: Record | None = None
        for record in records:
            count = len(messages)
            if record.type == "m":
                raw: Any = record.body.get("m")
                if type(raw) is str:
                    sealed.append((count, record))
                elif record.encoded or not looks_like_message(raw):
                    raw = self._message(session_id, sdir, record)
                messages.append(raw)
            elif record.type == "r":
                index = record.body.get("i")
                if not isinstance(index, int) or not 0 <= index < count:
                    raise self._record_damage(
                        session_id, sdir, record, "redaction names no message"
                    )
                redacted[index] = self._message(session_id, sdir, record)
            elif record.type == "s":
                if type(record.body.get("s")) is str:
                    last_state = record
                else:
                    state, last_state = self._state(session_id, sdir, record), None
            if record.total != len(messages):
                raise self._record_damage(
                    session_id, sdir, record, f"message count {record.total} != {len(messages)}"
                )
        if last_state is not None:
            state = self._state(session_id, sdir, last_state)
        if sealed:
            texts = [record.body["m"] for _, record in sealed]
            opened = decode_messages(unseal_all(self.cipher, texts))
            if opened is None:  # one of them does not open or parse: name it
                opened = [self._message(session_id, sdir, record) for _, record in sealed]
            for (at, _), message in zip(sealed, opened, strict=True):
                messages[at] = message
        return messages, state, redacted

    def _state(self, session_id: str, sdir: Path, record: Record) -> dict[str, Any]:
        """The agent state a ``"s"`` record holds."""
        value = record.body.get("s")
        if type(value) is str:
            try:
                value = self._opened(value)
            except ValueError as exc:
                raise self._record_damage(session_id, sdir, record, f"bad state: {exc}") from None
            if not isinstance(value, dict):
                raise self._record_damage(session_id, sdir, record, "state is not an object")
            return value
        if not isinstance(value, dict):
            raise self._record_damage(session_id, sdir, record, "state is not an object")
        return decode_bytes_values(value) if record.encoded else value

    def _read_end(self, session_id: str, sdir: Path, offset: int) -> SessionRecord:
        """``get`` from ``offset`` > 0, reading only the end of the volume.

        Files are read newest first, each backwards from its end (see
        :meth:`_journal_window`), until the records hold message ``offset`` and an agent
        state: a Session writes its state with every turn, so that is the last few
        kilobytes; a state written long before the window costs the read back to it.
        An older file is read only when every newer one was read whole, so the
        records read are one unbroken run up to the tail.
        """
        created = self._read_meta(session_id, sdir)
        # Before the volume: the journal only grows past what the head names.
        ends = self._read_ends(session_id, sdir)
        volume = self._volume(session_id, sdir)
        # Sizes the first window, and checks the journal reaches the head's end.
        total, updated = self._peek_count(session_id, sdir, volume, ends)
        # Newest file first: its records, and the sequence number and message count
        # it starts at (checked when it was read from its start).
        runs: builtins.list[tuple[builtins.list[Record], int, int]] = []
        has_state = False
        if volume.journal is not None and _present(volume.journal):
            share = _Share(
                max(0, total - max(offset, volume.first_count)), total - volume.first_count
            )
            records = self._journal_window(
                session_id,
                volume.journal,
                volume.prev_hash,
                volume.first_seq,
                offset,
                share,
                want_state=True,
            )
            runs.append((records, volume.first_seq, volume.first_count))
            has_state = any(record.type == "s" for record in records)
        for seg, path in zip(
            reversed(volume.segments), reversed(volume.segment_paths), strict=True
        ):
            if has_state and seg.count <= offset:
                break
            wanted = max(0, seg.count - max(offset, seg.first_count))
            records = self._journal_window(
                session_id,
                path,
                seg.prev_hash,
                seg.first_seq,
                offset,
                _Share(wanted, seg.count - seg.first_count),
                anchor=seg.last_hash,
                want_state=not has_state,
            )
            if not records or records[-1].total != seg.count:
                raise self._corrupted(
                    session_id, path, "bad_sequence", 0, "segment does not match the manifest"
                )
            runs.append((records, seg.first_seq, seg.first_count))
            has_state = has_state or any(record.type == "s" for record in records)
        records = []
        state: dict[str, Any] = {}
        last_state: Record | None = None
        expected: int | None = None  # the message count the next record starts from
        for run, first_seq, first_count in reversed(runs):
            if run and run[0].seq == first_seq:  # read from the file's start
                if expected not in (None, first_count):
                    raise self._corrupted(
                        session_id, sdir, "bad_sequence", 0, "segments do not meet"
                    )
                expected = first_count
            for record in run:
                before = record.total - 1 if record.type == "m" else record.total
                if expected is not None and before != expected:
                    raise self._record_damage(
                        session_id, sdir, record, f"message count {record.total} after {expected}"
                    )
                expected = record.total
                if record.type == "s":
                    if type(record.body.get("s")) is str:  # encrypted: open only the last
                        last_state = record
                    else:
                        state, last_state = self._state(session_id, sdir, record), None
                elif record.type == "r":
                    index = record.body.get("i")
                    if not isinstance(index, int) or not 0 <= index < record.total:
                        raise self._record_damage(
                            session_id, sdir, record, "redaction names no message"
                        )
            records.extend(run)
        if last_state is not None:
            state = self._state(session_id, sdir, last_state)
        count = volume.first_count if not records else records[-1].total
        found: dict[int, Message] = {}
        redactions: dict[int, Message] = {}
        self._collect(session_id, sdir, records, offset, count, found, redactions)
        found.update({i: m for i, m in redactions.items() if i in found})
        missing = [i for i in range(offset, count) if i not in found]
        if missing:
            raise self._corrupted(
                session_id, sdir, "bad_sequence", 0, f"messages {missing[:5]} are missing"
            )
        meta = SessionMeta(session_id, created, max(updated or created, created), count)
        return SessionRecord(
            meta=meta,
            messages=[found[i] for i in range(offset, count)],
            offset=min(offset, count),
            agent_state=state,
            tail=records[-1].hash if records else volume.prev_hash,
        )

    def _opened_stored(self, value: Any) -> Any:
        """A cached stored value (:attr:`Tail.last`) in its plain stored form."""
        if type(value) is not str:
            return value
        return json.loads(unseal(self.cipher, value))

    def _opened(self, sealed: str) -> Any:
        """The stored form of an encrypted record's value, opened and its bytes decoded.

        Raises:
            DecryptionError: no cipher, or one that cannot open it.
            ValueError: not sealed text, or its plaintext is no JSON.
        """
        if not is_sealed_text(sealed):
            raise ValueError("a text where an object belongs")
        text = unseal(self.cipher, sealed)
        value = json.loads(text)
        return decode_bytes_values(value) if may_hold_encoded(text) else value

    def _message(self, session_id: str, sdir: Path, record: Record) -> Message:
        raw = record.body.get("m")
        try:
            if type(raw) is str:  # encrypted (SPEC §9): the chain vouched for the ciphertext
                raw = self._opened(raw)
                if looks_like_message(raw):
                    return cast(Message, raw)
                return validate_message(raw, f"record {record.seq}")
            if record.encoded:
                raw = decode_with_attachments(
                    raw, lambda digest, size: self._load_attachment(session_id, sdir, digest, size)
                )
            if not record.encoded and looks_like_message(raw):
                # The chain vouches for these bytes, and they were validated on write.
                return cast(Message, raw)
            return validate_message(raw, f"record {record.seq}")
        except (TypeError, ValueError) as exc:
            if isinstance(exc, SessionCorruptedError):
                raise
            raise self._record_damage(session_id, sdir, record, f"bad message: {exc}") from None

    def _load_attachment(self, session_id: str, sdir: Path, digest: str, size: int) -> bytes:
        path = sdir / ATTACHMENTS / digest
        if not is_valid_digest(digest):
            raise self._corrupted(
                session_id, path, "bad_payload", 0, "attachment reference is malformed"
            )
        try:
            data = self._read_file(session_id, path)
        except FileNotFoundError:
            raise self._corrupted(
                session_id, path, "bad_payload", 0, "attachment is missing"
            ) from None
        if len(data) != size or hashlib.sha256(data).hexdigest() != digest:
            raise self._corrupted(
                session_id, path, "bad_payload", 0, "attachment does not match its sha256"
            )
        return data

    def _history_page(self, session_id: str, offset: int, limit: int) -> HistoryPage:
        sdir = self.session_dir(session_id)
        read = functools.partial(self._read_page, session_id, sdir, offset, limit)
        return self._lock_free(session_id, sdir, read)

    def _read_page(self, session_id: str, sdir: Path, offset: int, limit: int) -> HistoryPage:
        self._read_meta(session_id, sdir)
        ends = self._read_ends(session_id, sdir)
        volume = self._volume(session_id, sdir)
        total, _ = self._peek_count(session_id, sdir, volume, ends)
        lo, hi = page_read_range(total, offset, limit)
        window: dict[int, Message] = {}
        if hi > lo:
            window = self._read_range(session_id, sdir, volume, lo, hi, total)
        return page_of(total, offset, limit, lo, [window[i] for i in range(lo, hi)])

    def _read_range(
        self,
        session_id: str,
        sdir: Path,
        volume: _Volume,
        lo: int,
        hi: int,
        total: int,
        originals: dict[int, Message] | None = None,
    ) -> dict[int, Message]:
        """Messages ``lo..hi-1`` (redactions applied), reading only the files covering them.

        ``originals``, when given, receives the messages as written (no redaction).
        """
        found: dict[int, Message] = {}
        redactions: dict[int, Message] = {}
        prev, seq = GENESIS, 0
        for seg, path in zip(volume.segments, volume.segment_paths, strict=True):
            if seg.count > lo and seg.first_count < hi:
                if seg.marks:
                    records = self._marked_window(session_id, path, seg, lo, hi)
                    self._manifest_redactions(seg, lo, hi, redactions)  # some lie past it
                else:
                    records = self._journal_window(
                        session_id,
                        path,
                        seg.prev_hash,
                        seg.first_seq,
                        lo,
                        _Share(seg.count - max(lo, seg.first_count), seg.count - seg.first_count),
                        anchor=seg.last_hash,
                    )
                self._collect(session_id, sdir, records, lo, hi, found, redactions)
            elif seg.first_count >= hi:
                self._manifest_redactions(seg, lo, hi, redactions)
            prev, seq = seg.last_hash, seg.last_seq + 1
        if volume.journal is not None and _present(volume.journal):
            share = _Share(total - max(lo, volume.first_count), total - volume.first_count)
            records = self._journal_window(session_id, volume.journal, prev, seq, lo, share)
            self._collect(session_id, sdir, records, lo, hi, found, redactions)
        if originals is not None:
            originals.update(found)
        found.update({i: m for i, m in redactions.items() if i in found})
        missing = [i for i in range(lo, hi) if i not in found]
        if missing:
            raise self._corrupted(
                session_id, sdir, "bad_sequence", 0, f"messages {missing[:5]} are missing"
            )
        return found

    def _manifest_redactions(
        self, seg: _Segment, lo: int, hi: int, redactions: dict[int, Message]
    ) -> None:
        """The redactions of messages ``lo..hi-1`` that the seal of ``seg`` recorded."""
        for index, raw in seg.redactions.items():
            if lo <= int(index) < hi:
                value = self._opened(raw) if type(raw) is str else decode_bytes_values(raw)
                redactions[int(index)] = validate_message(value, "manifest redaction")

    def _marked_window(
        self, session_id: str, path: Path, seg: _Segment, lo: int, hi: int
    ) -> builtins.list[Record]:
        """The records of a marked segment between the marks around messages ``lo..hi-1``.

        The chain is verified from the first mark's hash to the second's (or to the
        segment's end, the manifest's ``last_hash``), so nothing read can have been
        altered without the manifest, as with :meth:`_journal_window`'s anchor.
        """
        marks = seg.marks or []
        if not all(_well_formed(mark) for mark in marks):
            raise self._corrupted(session_id, path, "broken_chain", 0, "bad marks in the manifest")
        start: list[Any] = [seg.first_seq, 0, seg.prev_hash, seg.first_count]
        stop: list[Any] | None = None
        for mark in marks:
            if mark[3] <= lo:
                start = mark
            elif mark[3] >= hi:
                stop = mark
                break
        try:
            with open_regular(path) as handle:
                handle.seek(start[1])
                data = handle.read(-1 if stop is None else stop[1] - start[1])
        except FileNotFoundError:
            raise self._corrupted(session_id, path, "bad_line", 0, "file is missing") from None
        scanned = self._scan_bytes(session_id, path, data, start[2], start[0], start[1])
        end_hash = seg.last_hash if stop is None else stop[2]
        if scanned.torn or scanned.end != len(data) or scanned.last_hash != end_hash:
            raise self._corrupted(
                session_id, path, "broken_chain", scanned.end, "segment does not match the manifest"
            )
        return scanned.records

    def _collect(
        self,
        session_id: str,
        sdir: Path,
        records: Sequence[Record],
        lo: int,
        hi: int,
        found: dict[int, Message],
        redactions: dict[int, Message],
    ) -> None:
        for record in records:
            if record.type == "m" and lo <= record.total - 1 < hi:
                found[record.total - 1] = self._message(session_id, sdir, record)
            elif record.type == "r":
                index = record.body.get("i")
                if isinstance(index, int) and lo <= index < hi:
                    redactions[index] = self._message(session_id, sdir, record)

    def _journal_window(
        self,
        session_id: str,
        path: Path,
        prev: str,
        seq: int,
        lo: int,
        share: _Share,
        *,
        anchor: str | None = None,
        want_state: bool = False,
    ) -> builtins.list[Record]:
        """A file's records from the one holding message ``lo`` to the end.

        Reads backwards from the end in growing chunks, so a page near the tail costs
        what the page costs, not what the file costs. The chain is verified over
        everything read (the first line read only vouches for the next); for a
        sealed segment it must also end at the manifest's ``anchor`` hash, so nothing
        in the window can have been altered. With ``want_state`` the window also
        reaches back to the file's latest agent state record, if it has one.
        """
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise self._corrupted(session_id, path, "bad_line", 0, "file is missing") from None
        chunk = share.bytes_of(size)
        with open_regular(path) as handle:
            while True:
                start = max(0, size - chunk)
                handle.seek(start)
                data = handle.read(size - start)
                if start == 0:
                    scanned = self._scan_bytes(session_id, path, data, prev, seq, 0)
                    break
                # The chunk starts mid-line: skip to the first whole line, the anchor.
                skip = data.find(b"\n") + 1
                cut = data.find(b"\n", skip)
                if skip == 0 or cut < 0:
                    chunk *= 4
                    continue
                first_line, rest = data[skip:cut], data[cut + 1 :]
                claimed = journal.peek_hash(first_line)
                try:
                    body = journal.peek_body(first_line) if claimed else None
                except ValueError:
                    body = None
                if claimed is None or body is None:
                    raise self._corrupted(
                        session_id, path, "bad_line", start + skip, "not a journal record"
                    )
                scanned = self._scan_bytes(
                    session_id, path, rest, claimed, int(body["n"]) + 1, start + cut + 1
                )
                if int(body["c"]) <= lo and (
                    not want_state or any(record.type == "s" for record in scanned.records)
                ):
                    break
                chunk *= 4
        if anchor is not None and (scanned.torn or scanned.last_hash != anchor):
            raise self._corrupted(
                session_id, path, "broken_chain", scanned.end, "segment does not match the manifest"
            )
        return scanned.records

    def _scan_bytes(
        self, session_id: str, path: Path, data: bytes, prev: str, seq: int, base: int
    ) -> journal.Scan:
        try:
            return journal.scan(data, prev_hash=prev, first_seq=seq, base_offset=base)
        except JournalDamage as damage:
            raise self._corrupted(
                session_id, path, damage.kind, damage.offset, damage.detail
            ) from None

    # ------------------------------------------------------------------ writing

    def _commit(self, request: CommitRequest) -> CommitResult:
        session_id = request.session_id
        sdir = self.session_dir(session_id)
        turn = self._locks.is_held(session_id)  # else this commit takes the lock alone
        with self._guard, self._locks.for_write(session_id):
            tail = self._writable_tail(session_id, sdir)
            plan = plan_commit(request, tail.count, tail.hash)
            if request.rewritten:
                return self._rewrite(
                    session_id,
                    sdir,
                    request.messages,
                    request.agent_state,
                    request.redactions,
                    old_end=end_of(tail),
                )
            if plan.compare_last:
                self._check_extends(session_id, sdir, request.messages, tail)
            found: dict[str, bytes] = {}
            bodies = self._bodies(request, plan, found)
            if not bodies:
                return CommitResult(tail.hash, tail.count)
            self._write_attachments(sdir, found)
            fd, new_tail, new_file = self._write_records(session_id, sdir, tail, bodies)
            if self.durability == "commit" and turn:
                # Synced below, without the guard: meanwhile the loop's appends to
                # other sessions go on (they skip the inline path while it is held).
                # The writer lock stays held by the turn (for_write reused it).
                synced = os.dup(fd)
            else:
                if self.durability == "commit":
                    try:
                        os.fsync(fd)
                    except BaseException:
                        self._forget(session_id)
                        raise
                    if new_file:
                        fsync_dir(sdir)
                self._after_append(session_id, sdir, new_tail, turn)
                return CommitResult(new_tail.hash, new_tail.count)
        try:
            os.fsync(synced)
        except BaseException:
            with self._guard:
                self._forget(session_id)
            raise
        finally:
            os.close(synced)
        if new_file:
            fsync_dir(sdir)
        with self._guard:
            self._after_append(session_id, sdir, new_tail, turn)
        return CommitResult(new_tail.hash, new_tail.count)

    def _after_append(self, session_id: str, sdir: Path, new_tail: Tail, turn: bool) -> None:
        """Once an append on the writer thread is durable: its head, and a due seal."""
        if self.durability != "invocation":  # "invocation" records its head at flush
            if turn:
                self._durable[session_id] = new_tail  # the turn's end records it
            else:
                self._write_head(sdir, [end_of(new_tail)])  # a turn of its own
        if self._seal_due(new_tail):
            self._seal(session_id, sdir, new_tail)

    def _append_inline(
        self, request: CommitRequest
    ) -> tuple[CommitResult, asyncio.Future[None] | None, bool, Tail | None] | None:
        """The common append, done on the caller's thread; None when it needs the writer.

        A turn's appends go to an open journal whose tail is cached and verified, under
        a writer lock already held: the work left is to encode the records and write
        them into the page cache (microseconds), then fsync. The fsync is started here
        (:func:`~perdure._runtime.fsync.start_fsync`: in the kernel, or on the writer
        thread) and awaited by the caller. Anything heavier — a first commit that reads
        the tail from disk, attachments, records over ``_INLINE_MAX`` bytes, a lock to
        take, a writer busy with this store — returns None and goes to the writer
        thread whole.
        """
        session_id = request.session_id
        if not self._locks.is_held(session_id) or not self._guard.acquire(blocking=False):
            return None
        try:
            tail = self._cached_tail(session_id)
            open_journal = self._fds.get(session_id)
            if tail is None or open_journal is None or open_journal[0] != tail.ino:
                return None
            plan = plan_commit(request, tail.count, tail.hash)
            if plan.compare_last:
                if not tail.last:
                    return None  # the last stored message must be read from disk
                self._check_extends(session_id, None, request.messages, tail)
            found: dict[str, bytes] = {}
            bodies = self._bodies(request, plan, found)
            if found:
                return None
            if not bodies:
                return CommitResult(tail.hash, tail.count), None, False, None
            encoded = encode_records(tail, bodies)
            if len(encoded[0]) > _INLINE_MAX:
                return None  # a page-cache copy of this size belongs off the loop
            fd, new_tail, _ = self._write_records(session_id, None, tail, bodies, encoded)
            synced = None
            if self.durability == "commit":
                try:
                    if self._commit_log is not None and tail.size:
                        entry = Entry(session_id, tail.size, tail.ino, tail.hash, encoded[0])
                        synced = self._commit_log.add(entry)
                    if synced is None:
                        synced = start_fsync(fd, self._write_executor())
                except BaseException:
                    self._forget(session_id)
                    raise
            result = CommitResult(new_tail.hash, new_tail.count)
            return result, synced, self._seal_due(new_tail), new_tail
        finally:
            self._guard.release()

    def _check_extends(
        self, session_id: str, sdir: Path | None, messages: Sequence[Message], tail: Tail
    ) -> None:
        """A commit without ``expected_tail`` must extend the history (``check_extends``).

        The last message this store wrote is cached with the tail, in its stored
        form; otherwise (``sdir`` given) it is read from disk and compared decoded.
        """
        count = tail.count
        if tail.last:
            where = f"messages[{count - 1}]"
            last = [self._opened_stored(value) for value in tail.last]
            check_extends(
                session_id,
                messages,
                count,
                last,
                encode=lambda message: self._encode_message(message, {}, where),
            )
            return
        assert sdir is not None
        originals: dict[int, Message] = {}
        volume = self._volume(session_id, sdir)
        seen = self._read_range(session_id, sdir, volume, count - 1, count, count, originals)
        check_extends(session_id, messages, count, [seen[count - 1], originals[count - 1]])

    def _bodies(
        self, request: CommitRequest, plan: CommitPlan, found: dict[str, bytes]
    ) -> builtins.list[dict[str, Any]]:
        """The record bodies an append writes (attachments it needs land in ``found``)."""
        bodies: builtins.list[dict[str, Any]] = []
        count = plan.start
        for message in request.messages[plan.start :]:
            encoded = self._encode_message(message, found, f"messages[{count}]")
            count += 1
            bodies.append({"c": count, "t": "m", "m": self._sealed(encoded)})
        for index, replacement in request.redactions:
            encoded = self._encode_message(replacement, found, f"redactions[{index}]")
            bodies.append({"c": count, "t": "r", "i": index, "m": self._sealed(encoded)})
        if request.agent_state is not None:
            state = self._sealed(self._encode_state(request.agent_state))
            bodies.append({"c": count, "t": "s", "s": state})
        return bodies

    def _sealed(self, stored: Any) -> Any:
        """A record's value as written: ``stored`` itself, or with a cipher its
        compact JSON encrypted (:func:`~perdure.session.rules.seal`)."""
        if self.cipher is None:
            return stored
        return seal(self.cipher, compact_json(stored))

    def _encode_message(self, message: Message, found: dict[str, bytes], where: str) -> Any:
        validate_message(message, where)
        if is_text_only(message):
            return message  # no bytes to extract, no user dict to escape
        validate_storable(message, where)
        # Encrypted, binaries stay in their record: an attachment file would be clear.
        threshold = self.attachment_threshold if self.cipher is None else 1 << 62
        return extract_attachments(message, threshold, found)

    def _encode_state(self, agent_state: Mapping[str, Any]) -> Any:
        if not isinstance(agent_state, Mapping):
            raise TypeError(f"agent_state must be a mapping, got {type(agent_state).__name__}")
        try:
            encoded = extract_attachments(dict(agent_state), 1 << 62, {})
            json.dumps(encoded, allow_nan=False)
        except (TypeError, ValueError, RecursionError) as exc:
            raise ValueError(f"agent_state is not JSON-serializable: {exc}") from None
        return encoded

    def _write_attachments(self, sdir: Path, found: dict[str, bytes]) -> None:
        if not found:
            return
        directory = sdir / ATTACHMENTS
        directory.mkdir(exist_ok=True)
        for digest, data in found.items():
            path = directory / digest
            if not path.exists():
                atomic_write(path, data, durable=self.durability != "none")

    def _write_records(
        self,
        session_id: str,
        sdir: Path | None,
        tail: Tail,
        bodies: builtins.list[dict[str, Any]],
        encoded: Encoded | None = None,
    ) -> tuple[int, Tail, bool]:
        """Append records to the active journal (no fsync): its fd, new tail, new file?"""
        data, prev, seq = encoded or encode_records(tail, bodies)
        cached = self._fds.get(session_id)
        if cached is not None and tail.size and cached[0] == tail.ino:
            ino, fd = cached
            new_file = False
        else:
            self._forget(session_id)
            path = (sdir or self.session_dir(session_id)) / JOURNAL
            new_file = tail.size == 0 and not path.exists()
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            ino = os.fstat(fd).st_ino
            self._fds[session_id] = (ino, fd)
        try:
            append_all(fd, data)
        except BaseException:
            self._forget(session_id)  # the next commit re-reads the tail from disk
            raise
        new_tail = tail.after(ino, len(data), prev, seq, bodies)
        self._tails[session_id] = new_tail
        self._tail_holds[session_id] = self._locks.hold_id(session_id)
        return fd, new_tail, new_file

    def _seal_due(self, tail: Tail) -> bool:
        seg = self.segmentation
        return seg.enabled and (tail.records >= seg.max_records or tail.size >= seg.max_bytes)

    def _seal_if_due(self, session_id: str) -> None:
        """Seal the active journal if it is full (after an append made on the loop)."""
        sdir = self.session_dir(session_id)
        with self._guard, self._locks.for_write(session_id):
            tail = self._writable_tail(session_id, sdir)
            if self._seal_due(tail):
                self._seal(session_id, sdir, tail)

    def _forget(self, session_id: str) -> None:
        """Drop the cached tail and journal descriptor of a session."""
        self._tails.pop(session_id, None)
        self._tail_holds.pop(session_id, None)
        self._heads.pop(str(self.session_dir(session_id)), None)
        self._paths.pop(session_id, None)
        cached = self._fds.pop(session_id, None)
        if cached is not None:
            with contextlib.suppress(OSError):
                os.close(cached[1])

    def _write_executor(self) -> concurrent.futures.ThreadPoolExecutor:
        """The store's one writer thread (commits queue there, off the event loop)."""
        return self._writer.executor()

    def close(self) -> None:
        """Close cached descriptors and the writer thread (the store reopens them on use)."""
        with self._guard:
            for session_id in builtins.list(self._fds):
                self._forget(session_id)
        self._writer.shutdown()
        if self._commit_log is not None:
            self._commit_log.close()  # its appends synced in their journals, its file deleted

    def _writable_tail(self, session_id: str, sdir: Path, *, check_head: bool = True) -> Tail:
        """The verified end of the active journal; finishes interrupted work first.

        Called with the writer lock held, so it may repair: finish a pending
        rewrite or seal, and truncate a torn last line — never before checking that
        the journal reaches the end its head file records (else nothing is touched).
        """
        cached = self._cached_tail(session_id)
        if cached is not None:
            return cached
        path = sdir / JOURNAL
        self._read_meta(session_id, sdir)
        self._finish_pending(session_id, sdir)
        ends = self._read_ends(session_id, sdir) if check_head else None
        try:
            st = path.stat()
        except FileNotFoundError:
            st = None
        except OSError as exc:
            if is_transient(exc):
                raise
            raise self._os_damage(session_id, path, exc) from None
        volume = self._volume(session_id, sdir)
        if st is None:
            self._check_ends(
                session_id,
                sdir,
                ends,
                volume.first_seq - 1,
                lambda seq: (
                    volume.prev_hash if volume.segments and seq == volume.first_seq - 1 else None
                ),
            )
            tail = Tail(0, 0, volume.prev_hash, volume.first_seq, volume.first_count, 0)
        else:
            data = self._read_file(session_id, path)
            scanned = self._scan_bytes(
                session_id, path, data, volume.prev_hash, volume.first_seq, 0
            )
            found = scanned.records
            self._check_ends(
                session_id,
                sdir,
                ends,
                found[-1].seq if found else volume.first_seq - 1,
                lambda seq: (
                    found[seq - volume.first_seq].hash
                    if 0 <= seq - volume.first_seq < len(found)
                    else None
                ),
            )
            if scanned.end < len(data):  # a torn append, or a newline turned into a byte
                os.truncate(path, scanned.end)
            if scanned.end and data[scanned.end - 1] != 0x0A:
                with path.open("ab") as handle:  # a valid last record that lost its newline
                    handle.write(b"\n")
            records = scanned.records
            last = records[-1] if records else None
            size = path.stat().st_size
            tail = Tail(
                st.st_ino,
                size,
                scanned.last_hash,
                last.seq + 1 if last else volume.first_seq,
                last.total if last else volume.first_count,
                len(records),
            )
        self._tails[session_id] = tail
        self._tail_holds[session_id] = self._locks.hold_id(session_id)
        return tail

    def _cached_tail(self, session_id: str) -> Tail | None:
        """The cached tail while the journal on disk is still the one it describes.

        Under the writer-lock hold it was cached or checked in, it is (every change
        this store makes updates or drops it, and no other writer can get the lock);
        otherwise the journal's inode and size must still match, with no rewrite
        pending and ``meta.json`` still there (once per turn: the first append of a
        hold). That check costs three system calls, ~15 µs of a durable append.
        """
        cached = self._tails.get(session_id)
        if cached is None:
            return None
        hold = self._locks.hold_id(session_id)
        if hold is not None and self._tail_holds.get(session_id) == hold:
            return cached
        paths = self._paths.get(session_id)
        if paths is None:
            sdir = self.session_dir(session_id)
            paths = self._paths[session_id] = (
                str(sdir / JOURNAL),
                str(sdir / REWRITE),
                str(sdir / META),
            )
        journal_path, rewrite_path, meta_path = paths
        try:
            st = os.stat(journal_path)
        except FileNotFoundError:
            return None
        if (
            (cached.ino, cached.size) != (st.st_ino, st.st_size)
            or os.path.exists(rewrite_path)
            or not os.path.exists(meta_path)
        ):
            return None
        self._tail_holds[session_id] = hold
        return cached

    def _finish_pending(self, session_id: str, sdir: Path) -> None:
        (sdir / REWRITE_TMP).unlink(missing_ok=True)  # an uncommitted rewrite: roll back
        if (sdir / REWRITE).exists():
            self._complete_rewrite(sdir)
            self._forget(session_id)
            return
        volume = self._volume(session_id, sdir)
        if volume.seal_pending:
            seg = volume.segments[-1]
            (sdir / SEGMENTS).mkdir(exist_ok=True)
            os.replace(sdir / JOURNAL, sdir / SEGMENTS / seg.file)
            self._sync_dirs(sdir, sdir / SEGMENTS)
            self._forget(session_id)

    def _seal(self, session_id: str, sdir: Path, tail: Tail) -> None:
        """Turn the active journal into the next sealed segment (manifest first)."""
        volume = self._volume(session_id, sdir)
        path = sdir / JOURNAL
        if self.durability != "commit" or self._commit_log is not None:  # the log may hold it
            _fsync_file(path)
        data = self._read_file(session_id, path)
        scanned = self._scan_bytes(session_id, path, data, volume.prev_hash, volume.first_seq, 0)
        records = scanned.records
        redactions = {str(r.body["i"]): r.body["m"] for r in records if r.type == "r"}
        number = len(volume.segments) + 1
        entry = _Segment(
            file=f"{number:06d}.jsonl",
            first_seq=volume.first_seq,
            last_seq=records[-1].seq,
            first_count=volume.first_count,
            count=tail.count,
            prev_hash=volume.prev_hash,
            last_hash=scanned.last_hash,
            redactions=redactions,
            sha256=hashlib.sha256(data).hexdigest(),
            marks=[
                [records[k].seq, records[k].offset, records[k - 1].hash, records[k - 1].total]
                for k in range(_MARK_EVERY, len(records), _MARK_EVERY)
            ]
            or None,
        )
        manifest = {
            "format": _MANIFEST_FORMAT,
            "segments": [s.to_json() for s in [*volume.segments, entry]],
        }
        atomic_write(
            sdir / MANIFEST, json.dumps(manifest).encode(), durable=self.durability != "none"
        )
        (sdir / SEGMENTS).mkdir(exist_ok=True)
        os.replace(path, sdir / SEGMENTS / entry.file)
        self._sync_dirs(sdir, sdir / SEGMENTS)
        self._forget(session_id)

    def _rewrite(
        self,
        session_id: str,
        sdir: Path,
        messages: Sequence[Message],
        agent_state: Mapping[str, Any] | None,
        redactions: Iterable[tuple[int, Message]],
        previous_state: dict[str, Any] | None = None,
        *,
        collect: bool = True,
        old_end: End | None = None,
    ) -> CommitResult:
        """Replace the whole history atomically (see the module docstring).

        The head file names both the old volume's end (``old_end`` and what it
        recorded) and the new one's before the commit point, and only the new one's
        after: whichever volume a crash leaves, the head agrees with it.
        With ``collect``, attachments only the old history named are deleted after.
        """
        found: dict[str, bytes] = {}
        bodies: builtins.list[dict[str, Any]] = [
            {"c": 0, "t": "w", "at": utc_now(), "id": uuid.uuid4().hex}
        ]
        count = 0
        for message in messages:
            encoded = self._encode_message(message, found, f"messages[{count}]")
            count += 1
            bodies.append({"c": count, "t": "m", "m": self._sealed(encoded)})
        for index, replacement in redactions:  # checked: each names one of the messages
            encoded = self._encode_message(replacement, found, f"redactions[{index}]")
            bodies.append({"c": count, "t": "r", "i": index, "m": self._sealed(encoded)})
        if agent_state is None:
            agent_state = (
                previous_state
                if previous_state is not None
                else self._read_all(session_id, sdir, 0).agent_state
            )
        bodies.append({"c": count, "t": "s", "s": self._sealed(self._encode_state(agent_state))})
        self._write_attachments(sdir, found)
        prev = GENESIS
        lines: builtins.list[bytes] = []
        for seq, body in enumerate(bodies):
            line, prev = journal.encode_record(prev, {"n": seq, **body})
            lines.append(line)
        volume = b"".join(lines)
        durable = self.durability != "none"
        tmp = sdir / REWRITE_TMP
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            append_all(fd, volume)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        new_end: End = (len(bodies) - 1, prev, count)
        self._durable.pop(session_id, None)  # an end of the old volume
        if old_end is not None:
            # The old volume's exact end, durable before the head names it (only the
            # active journal may hold unsynced records: sealed segments were synced).
            if durable:
                _fsync_file(sdir / JOURNAL)
            before = [old_end]
        else:
            before = head_ends(sdir)[-2:]  # quarantine: the old volume is damaged anyway
        self._write_head(sdir, [*before, new_end])
        os.replace(tmp, sdir / REWRITE)  # the commit point
        if durable:
            fsync_dir(sdir)
        self._complete_rewrite(sdir)
        self._write_head(sdir, [new_end])
        self._forget(session_id)
        if collect:
            self._collect_attachments(sdir, volume)
        return CommitResult(prev, count)

    def _collect_attachments(self, sdir: Path, volume: bytes) -> None:
        """Delete the attachments that ``volume`` (the whole new history) no longer names.

        Runs after a rewrite, under the writer lock, so no commit adds one meanwhile.
        A reader still on the old volume that misses one retries on the new volume
        (see :meth:`_lock_free`). Files that are not digests are left alone.
        """
        directory = sdir / ATTACHMENTS
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return
        keep = {digest.decode("ascii") for digest in _ATTACHMENT_REF.findall(volume)}
        removed = False
        for name in names:
            if name not in keep and is_valid_digest(name):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(directory / name)
                    removed = True
        if removed:
            self._sync_dirs(directory)

    def _complete_rewrite(self, sdir: Path) -> None:
        (sdir / MANIFEST).unlink(missing_ok=True)
        shutil.rmtree(sdir / SEGMENTS, ignore_errors=True)
        os.replace(sdir / REWRITE, sdir / JOURNAL)
        self._sync_dirs(sdir)

    def _flush(self, session_id: str) -> None:
        # Only "invocation" defers its fsyncs to here: "commit" already synced every
        # commit, and "none" never syncs.
        sdir = self.session_dir(session_id)
        path = sdir / JOURNAL
        if self.durability == "invocation" and path.exists():
            # Before the fsync, so the fsync covers it; and only a tail the journal on
            # disk still matches (another process may have rewritten it meanwhile).
            with self._guard:
                written = self._cached_tail(session_id)
            _fsync_file(path)
            if written is None:
                return
            if self._locks.is_held(session_id):
                self._durable[session_id] = written  # the turn's end records it
                return
            with (
                contextlib.suppress(SessionLockedError),
                self._guard,
                self._locks.for_write(session_id),
            ):
                if self._cached_tail(session_id) is written:
                    self._write_head(sdir, [end_of(written)])

    def _sync_dirs(self, *dirs: Path) -> None:
        if self.durability != "none":
            for directory in dirs:
                if directory.exists():
                    fsync_dir(directory)

    # ------------------------------------------------------------------ damage

    def _corrupted(
        self, session_id: str, path: Path, kind: str, offset: int, detail: str
    ) -> SessionCorruptedError:
        return SessionCorruptedError(
            f"session {session_id!r} is damaged: {path.name}: {kind} at byte {offset}: {detail}",
            details={"session_id": session_id, "file": str(path), "kind": kind, "offset": offset},
        )

    def _read_file(self, session_id: str, path: Path) -> bytes:
        """The bytes of one of the session's files, a regular file.

        Raises:
            FileNotFoundError: it is missing (what that means is the caller's call).
            SessionCorruptedError: the OS will not read it (kind ``unreadable``).
            OSError: a passing shortage (see :func:`~perdure.stores.file.layout.is_transient`).
        """
        try:
            return read_regular(path)
        except FileNotFoundError:
            raise
        except OSError as exc:
            if is_transient(exc):
                raise
            raise self._os_damage(session_id, path, exc) from None

    def _os_damage(self, session_id: str, path: Path, exc: OSError) -> SessionCorruptedError:
        """``exc``, met reading ``path``, as damage: kind ``unreadable`` with the error
        and its errno in ``details`` (a missing file: ``file is missing``). Callers
        raise a passing shortage (:func:`~perdure.stores.file.layout.is_transient`)
        as it is instead."""
        if isinstance(exc, FileNotFoundError):
            return self._corrupted(session_id, path, "bad_line", 0, "file is missing")
        error = exc.strerror or str(exc)
        damage = self._corrupted(session_id, path, "unreadable", 0, f"cannot be read: {error}")
        damage.details["errno"] = exc.errno
        damage.details["error"] = error
        return damage

    def _manifest_missing(
        self, session_id: str, sdir: Path, on_disk: Sequence[str]
    ) -> SessionCorruptedError:
        return self._corrupted(
            session_id,
            sdir / MANIFEST,
            "bad_payload",
            0,
            f"manifest.json is missing but segments/ holds {len(on_disk)} sealed segment "
            "file(s) (`perdure repair --apply` rebuilds it when they verify)",
        )

    def _record_damage(
        self, session_id: str, sdir: Path, record: Record, detail: str
    ) -> SessionCorruptedError:
        return self._corrupted(
            session_id, sdir, "bad_payload", record.offset, f"record {record.seq}: {detail}"
        )

    def _quarantine(self, session_id: str, sdir: Path) -> None:
        """Move provably bad records out, rewrite the rest, and report (counts, positions).

        Rewrites only a volume it read whole: a lost ``manifest.json`` is first written
        again from the sealed segments on disk when they verify as one chain that the
        journal continues (reported in ``SessionRecoveryReport.rebuilt``); a segment the
        manifest names that is missing, a file the OS will not read, or a file in
        ``segments/`` the volume does not name raises ``SessionCorruptedError`` and
        nothing is written.
        """
        with self._guard, self._locks.for_write(session_id):
            rebuilt: tuple[str, ...] = ()
            if (
                not (sdir / REWRITE).exists()
                and not (sdir / MANIFEST).exists()
                and (names := _segment_files(sdir))
            ):
                self._rebuild_manifest(session_id, sdir, names)
                self._forget(session_id)
                rebuilt = (MANIFEST,)
            volume = self._volume(session_id, sdir)
            if not volume.rewrite_pending:  # else the old segments are to go anyway
                named = {path.name for path in volume.segment_paths}
                try:
                    unnamed = sorted(set(os.listdir(sdir / SEGMENTS)) - named)
                except (FileNotFoundError, NotADirectoryError):
                    unnamed = []
                if unnamed:
                    raise self._corrupted(
                        session_id,
                        sdir / SEGMENTS / unnamed[0],
                        "bad_payload",
                        0,
                        f"segments/ holds {len(unnamed)} file(s) the manifest does not name: "
                        "a rewrite would delete what quarantine did not read; left alone",
                    )
            paths = [*volume.segment_paths]
            if volume.journal is not None and _present(volume.journal):
                paths.append(volume.journal)
            lines: builtins.list[bytes] = []
            for path in paths:
                try:
                    data = self._read_file(session_id, path)
                except FileNotFoundError:
                    raise self._corrupted(
                        session_id,
                        path,
                        "bad_line",
                        0,
                        "file is missing: the records it held cannot be brought back, and "
                        "quarantine rewrites only a volume it read whole; left alone",
                    ) from None
                parts = data.split(b"\n")
                if parts and parts[-1] == b"":
                    parts.pop()
                lines.extend(parts)
            good, bad, missing = triage(lines)
            if not bad and not missing:
                if rebuilt:
                    self._report_recovery(
                        SessionRecoveryReport(session_id, 0, (), (), None, rebuilt=rebuilt)
                    )
                return  # else damage not attributable to single records: stay strict
            qpath: Path | None = None
            if bad:
                qdir = self.quarantine_dir / session_id
                qdir.mkdir(parents=True, exist_ok=True)
                qpath = qdir / f"{utc_now().replace(':', '-')}-{uuid.uuid4().hex[:8]}.jsonl"
                atomic_write(qpath, b"".join(lines[i - 1] + b"\n" for i, _ in bad))
            report = SessionRecoveryReport(
                session_id,
                len(bad),
                tuple(i for i, _ in bad),
                tuple(k for _, k in bad),
                None if qpath is None else str(qpath),
                gaps=tuple(missing),
                rebuilt=rebuilt,
            )
            messages, state, redacted = self._replay_loose(session_id, sdir, good)
            # Quarantined records may name attachments: keep them for whoever inspects.
            self._rewrite(
                session_id,
                sdir,
                messages,
                state,
                sorted(redacted.items()),
                previous_state=state,
                collect=False,
            )
            self._report_recovery(report)

    def _report_recovery(self, report: SessionRecoveryReport) -> None:
        if self.on_recovery is not None:
            self.on_recovery(report)
        else:  # a gap leaves no file behind: without a callback, this is its only trace
            _log.warning(
                "session %r healed by quarantine: %d record(s) moved to %s, %d record(s) "
                "missing at lines %s, rebuilt %s",
                report.session_id,
                report.quarantined,
                report.quarantine_path,
                sum(count for _, count in report.gaps),
                [line for line, _ in report.gaps],
                list(report.rebuilt) or "nothing",
            )

    def _rebuild_manifest(self, session_id: str, sdir: Path, names: Sequence[str]) -> None:
        """Write a lost ``manifest.json`` again from the sealed segments on disk.

        Only when they are the numbered run seals leave (``000001.jsonl`` …), each
        verifies whole as the chain's next part, and the active journal, if it holds
        a record, continues that chain: the manifest then says exactly what a seal
        would have. Durable on return.

        Raises:
            SessionCorruptedError: any of that does not hold; nothing is written.
        """
        expected = [f"{number:06d}.jsonl" for number in range(1, len(names) + 1)]
        if list(names) != expected:
            raise self._corrupted(
                session_id,
                sdir / MANIFEST,
                "bad_payload",
                0,
                f"manifest.json is missing and segments/ holds {', '.join(names)}, not the "
                "numbered run seals leave: it cannot be rebuilt; left alone",
            )
        entries: builtins.list[_Segment] = []
        prev, seq, count = GENESIS, 0, 0
        for name in names:
            path = sdir / SEGMENTS / name
            try:
                data = self._read_file(session_id, path)
            except FileNotFoundError:
                raise self._corrupted(session_id, path, "bad_line", 0, "file is missing") from None
            try:
                scanned = self._scan_bytes(session_id, path, data, prev, seq, 0)
            except SessionCorruptedError as exc:
                raise SessionCorruptedError(
                    f"{exc.message}; manifest.json is missing and cannot be rebuilt from "
                    "segments that do not verify: left alone",
                    details=exc.details,
                ) from None
            records = scanned.records
            if scanned.torn or scanned.end != len(data) or not records:
                raise self._corrupted(
                    session_id,
                    path,
                    "bad_line",
                    scanned.end,
                    "manifest.json is missing and this sealed segment does not verify whole: "
                    "the manifest cannot be rebuilt; left alone",
                )
            entries.append(
                _Segment(
                    file=name,
                    first_seq=seq,
                    last_seq=records[-1].seq,
                    first_count=count,
                    count=records[-1].total,
                    prev_hash=prev,
                    last_hash=scanned.last_hash,
                    redactions={str(r.body["i"]): r.body["m"] for r in records if r.type == "r"},
                    sha256=hashlib.sha256(data).hexdigest(),
                    marks=[
                        [
                            records[k].seq,
                            records[k].offset,
                            records[k - 1].hash,
                            records[k - 1].total,
                        ]
                        for k in range(_MARK_EVERY, len(records), _MARK_EVERY)
                    ]
                    or None,
                )
            )
            prev, seq, count = scanned.last_hash, records[-1].seq + 1, records[-1].total
        path = sdir / JOURNAL
        try:
            data = self._read_file(session_id, path)
        except FileNotFoundError:
            data = b""
        if data:
            # Its first record must chain from the last segment: segments a failed
            # rewrite left beside a new journal would not.
            first = data[: data.find(b"\n") + 1] if b"\n" in data else data
            scanned = self._scan_bytes(session_id, path, first, prev, seq, 0)
            if scanned.torn or not scanned.records:
                raise self._corrupted(
                    session_id,
                    path,
                    "broken_chain",
                    0,
                    "manifest.json is missing and the journal does not continue the sealed "
                    "segments' chain: the manifest cannot be rebuilt; left alone",
                )
        manifest = {"format": _MANIFEST_FORMAT, "segments": [e.to_json() for e in entries]}
        atomic_write(
            sdir / MANIFEST, json.dumps(manifest).encode(), durable=self.durability != "none"
        )

    def _replay_loose(
        self, session_id: str, sdir: Path, bodies: Sequence[dict[str, Any]]
    ) -> tuple[builtins.list[Message], dict[str, Any], dict[int, Message]]:
        """Rebuild a history from surviving record bodies, renumbering message indexes."""
        messages: builtins.list[Message] = []
        state: dict[str, Any] = {}
        redacted: dict[int, Message] = {}
        index_of: dict[int, int] = {}  # old message index -> new
        for body in bodies:
            kind = body.get("t")
            try:
                if kind == "m":
                    index_of[int(body["c"]) - 1] = len(messages)
                    messages.append(self._decode_loose(session_id, sdir, body["m"]))
                elif kind == "r" and int(body["i"]) in index_of:
                    redacted[index_of[int(body["i"])]] = self._decode_loose(
                        session_id, sdir, body["m"]
                    )
                elif kind == "s" and isinstance(body.get("s"), dict):
                    state = decode_bytes_values(body["s"])
                elif kind == "s" and isinstance(body.get("s"), str):
                    opened = self._opened(body["s"])
                    state = opened if isinstance(opened, dict) else state
            except (KeyError, TypeError, ValueError):
                continue
        return messages, state, redacted

    def _decode_loose(self, session_id: str, sdir: Path, raw: Any) -> Message:
        if type(raw) is str:
            return validate_message(self._opened(raw), "message")
        decoded = decode_with_attachments(
            raw, lambda digest, size: self._load_attachment(session_id, sdir, digest, size)
        )
        return validate_message(decoded, "message")


def _head_synced(session_id: str, synced: asyncio.Future[None]) -> None:
    """Log a head fsync that failed (nobody awaits it: see ``_record_head``).

    The head may then be behind the journal after a power loss, which is never
    damage; the journal's own fsyncs report their failures to the commit.
    """
    if not synced.cancelled() and (error := synced.exception()) is not None:
        _log.warning("session %r: the fsync of its head file failed: %s", session_id, error)


def _present(path: Path) -> bool:
    """Whether ``path`` is there to be read: only a missing file is not (a symlink
    loop or a file the OS hides is, so that reading it reports what is wrong)."""
    try:
        os.stat(path)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    return True


def _segment_files(sdir: Path) -> list[str]:
    """The sealed segment files (``000001.jsonl`` …) in ``sdir/segments``, in order."""
    try:
        names = os.listdir(sdir / SEGMENTS)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(name for name in names if _SEGMENT_NAME.fullmatch(name))


def _volume_identity(sdir: Path) -> tuple[tuple[int, int, int] | None, ...]:
    """What a seal or rewrite changes: each volume file's inode, size and mtime."""
    identity: list[tuple[int, int, int] | None] = []
    for name in (MANIFEST, JOURNAL, REWRITE, SEGMENTS):
        try:
            st = os.stat(sdir / name)
        except FileNotFoundError:
            identity.append(None)
        except OSError as exc:  # a symlink loop, say: the same every time it stays
            identity.append((-1, exc.errno or 0, 0))
        else:
            identity.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(identity)


def _fsync_file(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # never blocks on a FIFO
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _marks_fit(seg: _Segment, records: Sequence[Record]) -> bool:
    """Whether ``seg``'s marks name its ``records`` as they are (a full read's check)."""
    for mark in seg.marks or ():
        if not _well_formed(mark):
            return False
        k = mark[0] - seg.first_seq
        if not 0 < k < len(records):
            return False
        if [records[k].offset, records[k - 1].hash, records[k - 1].total] != mark[1:]:
            return False
    return True


def _well_formed(mark: Any) -> bool:
    """``[seq, offset, hash, count]``: three ints around a hash, none negative."""
    return (
        type(mark) is list
        and len(mark) == 4
        and all(type(mark[i]) is int and mark[i] >= 0 for i in (0, 1, 3))
        and type(mark[2]) is str
    )
