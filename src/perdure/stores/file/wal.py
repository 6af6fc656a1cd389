"""The file store's commit log: one fdatasync makes many journals' appends durable.

With ``durability="commit"`` every append must be on stable storage before its
commit returns. Syncing each session's own journal costs one fsync per append, and
on ext4 each of those is a journal commit of the file's new size: sixteen sessions
appending at once cost sixteen (``benchmarks/concurrency.py``: 0.4-0.5x the rate
with no fsync at all). Like a database's write-ahead log, this log lets one
``fdatasync`` cover them all: an append is written to its journal (page cache, no
sync) and, as a copy, to this process's log; the commit returns once a
``fdatasync`` of the log that started after the copy was written has returned.
Appends that arrive while one sync is in flight are covered by the next one, which
starts as soon as it returns: a lone append waits for no company. Their copies wait
in memory meanwhile, and the next sync writes them with one ``pwrite`` just before
it starts (one write a sync, not one an append, and none into a page the kernel is
writing back). A copy that never reached the file belongs to a commit that had not
returned; its journal bytes, if a later process reads them, are synced by that
process's first commit of the session, which reads the journal's end from disk and
fsyncs the journal itself. Such a sync, behind which commits queued, is started
with ``offload`` (:func:`~perdure._runtime.fsync.start_fsync`): the loop has other
sessions' turns to run, and the sync then takes nothing from its CPU.

The log is a file of fixed size, filled with zeros when it is made, so a sync
writes data blocks only — no size or extent changes, no file-system journal commit
(on one VM: ~120 µs against ~155 µs for an append and fsync of the journal itself).
It has two halves of :data:`HALF` bytes, each a header page naming its generation
and then entries. When the active half is full, entries go on in the other under a
new generation (its header is written first, and made durable by the sync the
entries after it wait for), and a checkpoint on the store's writer thread fsyncs
every journal the full half holds copies for; only then may that half be used
again. Appends that find both halves full fsync their own journal, as without a
log.

One log per process and store directory: ``<dir>/.wal/<random>.log``, held under an
exclusive ``flock`` as long as its process lives (it is made under a temporary name
and renamed into place locked, so nobody takes a log being made for an orphan).

Recovery (:func:`recover`, run when a :class:`~perdure.session.FileSessionStore` is
made, under ``<dir>/.wal/.lock``, which a store that starts meanwhile waits for): a
log whose lock is free belongs to a process that died. Its entries of the header's
generation with a good checksum are replayed, over all such logs, journal by journal
in the order of their offsets: an entry whose bytes the journal already holds is
left alone; one the journal lacks is written back only where the journal is still
the one the entry was written to — the same inode, ending where the entry begins
on a complete line whose hash the entry's first record chains on from — and
otherwise (the journal was sealed, rewritten or deleted since) is dropped. Then
every journal the logs name is fsynced, and the logs deleted. A process that dies
without an OS crash leaves its appends in the page cache, where the next recovery
makes them durable; an OS crash or power cut loses unsynced journal bytes, which
the log puts back before any read or writer checks a journal against its head.

A head file, which a turn's end writes, is not synced on its own when the turn's
appends went to the log: a checkpoint syncs it with the journal (a head that a crash
leaves behind is never damage).

Entry: ``b"PE"``, generation (u64), payload length (u32), CRC-32 of the generation
and payload (u32); payload: the journal's size before the append (u64), its inode
(u64), the hash the first appended record chains on from (32 ASCII bytes), the
session id's length (u16) and UTF-8 bytes, then the appended bytes.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import errno
import fcntl
import functools
import logging
import os
import struct
import threading
import uuid
import weakref
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path

from perdure._runtime.fs import fsync_dir
from perdure._runtime.fsync import start_fsync
from perdure.stores.file import journal
from perdure.stores.file.layout import HEAD, JOURNAL

__all__ = ["HALF", "LOG_DIR", "CommitLog", "Entry", "read_entries", "recover"]

_log = logging.getLogger("perdure.stores.file")

LOG_DIR = ".wal"
"""The logs' directory under the store's root."""
_LOCK = ".lock"
_SUFFIX = ".log"
_TEMP = ".tmp-"
_MAGIC = b"PDWAL1\n\0"
_HEADER = struct.Struct("<8sQI")  # magic, generation, CRC-32 of the generation
_HEADER_SIZE = 4096  # entries start on the second page
_ENTRY = struct.Struct("<2sQII")  # b"PE", generation, payload length, CRC-32
_ENTRY_MAGIC = b"PE"
_PAYLOAD = struct.Struct("<QQ32sH")  # size before, inode, prev hash, session id length
HALF = 1024 * 1024
"""A log is two halves of this size, each a header page and then entries."""
_ZEROS = bytes(64 * 1024)


@dataclass(frozen=True)
class Entry:
    """One logged append."""

    session_id: str
    size: int
    ino: int
    prev: str
    data: bytes


def encode_entry(generation: int, entry: Entry) -> bytes:
    sid = entry.session_id.encode("utf-8")
    payload = (
        _PAYLOAD.pack(entry.size, entry.ino, entry.prev.encode("ascii"), len(sid))
        + sid
        + entry.data
    )
    gen = generation.to_bytes(8, "little")
    crc = zlib.crc32(payload, zlib.crc32(gen))
    return _ENTRY.pack(_ENTRY_MAGIC, generation, len(payload), crc) + payload


def _header(generation: int) -> bytes:
    gen = generation.to_bytes(8, "little")
    return _HEADER.pack(_MAGIC, generation, zlib.crc32(gen))


def read_entries(data: bytes) -> Iterator[Entry]:
    """The entries a log holds: in each half, those of the generation its header
    names, in order, up to the first that is not one (a zeroed, torn or older
    region ends the half)."""
    half = len(data) // 2
    for start in (0, half) if half >= _HEADER_SIZE else ():
        yield from _half_entries(data[start : start + half])


def _half_entries(data: bytes) -> Iterator[Entry]:
    magic, generation, crc = _HEADER.unpack_from(data)
    if magic != _MAGIC or crc != zlib.crc32(generation.to_bytes(8, "little")):
        return
    gen = generation.to_bytes(8, "little")
    at = _HEADER_SIZE
    while at + _ENTRY.size <= len(data):
        magic, entry_gen, length, crc = _ENTRY.unpack_from(data, at)
        start = at + _ENTRY.size
        payload = data[start : start + length]
        if (
            magic != _ENTRY_MAGIC
            or entry_gen != generation
            or len(payload) != length
            or length < _PAYLOAD.size
            or zlib.crc32(payload, zlib.crc32(gen)) != crc
        ):
            return
        size, ino, prev, sid_len = _PAYLOAD.unpack_from(payload)
        sid_end = _PAYLOAD.size + sid_len
        try:
            session_id = payload[_PAYLOAD.size : sid_end].decode("utf-8")
            prev_hash = prev.decode("ascii")
        except UnicodeDecodeError:
            return
        yield Entry(session_id, size, ino, prev_hash, payload[sid_end:])
        at = start + length


class _Waiter:
    __slots__ = ("future", "loop", "number")

    def __init__(self, number: int, future: asyncio.Future[None]) -> None:
        self.number = number
        self.future = future
        self.loop = future.get_loop()


class _Chain:
    """One event loop's commits waiting for a sync, and whether one is in flight.

    Each loop syncs for its own commits: a sync started on one loop resolves there,
    so a commit never waits on another loop staying alive (or free)."""

    __slots__ = ("syncing", "waiting")

    def __init__(self) -> None:
        self.syncing = False
        self.waiting: list[_Waiter] = []


class CommitLog:
    """This process's log for one store directory (see the module docstring).

    ``add`` runs on an event loop (any); ``prepare`` and ``checkpoint`` on the
    store's writer thread (``executor``), ``close`` once that thread has stopped.
    Until ``prepare`` has made the file, while both halves are full, after a failed
    write or sync, and in a child made by ``fork()``, ``add`` returns None: the
    caller fsyncs its journal itself.
    """

    def __init__(self, root: Path, executor: Callable[[], Executor]) -> None:
        self.directory = root / LOG_DIR
        self._sessions = root / "sessions"
        self._executor = executor
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._state = "absent"  # preparing, ready, broken
        self._fd = -1
        self.path: Path | None = None
        self._generation = 0
        self._active = 0  # the half entries go to
        self._end = _HEADER_SIZE
        # Per half: the sessions with copies there, and whether it may be reused
        # (every journal it holds copies for is synced).
        self._dirty: tuple[set[str], set[str]] = (set(), set())
        self._clean = [False, True]
        self._written = 0  # entries added, ever
        # Entries added while a sync is in flight, not written yet: the bytes and the
        # offset of the first. The next sync writes them first, with one pwrite (only
        # a sync that starts after an entry is in the file may cover it, and none
        # starts before this is written), instead of one pwrite an append.
        self._pending: list[bytes] = []
        self._pending_at = 0
        self._chains: dict[asyncio.AbstractEventLoop, _Chain] = {}
        self._epoch = 0  # a new one at each close: a sync started before settles nobody

    # ------------------------------------------------------------ on the loop

    def add(self, entry: Entry) -> asyncio.Future[None] | None:
        """Copy an append into the log; the future resolves once a sync covers it."""
        with self._lock:
            if self._state != "ready" or self._pid != os.getpid():
                if self._state == "absent" and self._pid == os.getpid():
                    self._state = "preparing"
                    self._executor().submit(self.prepare)
                return None
            blob = encode_entry(self._generation, entry)
            if self._end + len(blob) > (self._active + 1) * HALF and not self._switch(blob):
                return None
            loop = asyncio.get_running_loop()
            chain = self._chains.get(loop)
            if chain is None:
                chain = self._chains[loop] = _Chain()
            if not chain.syncing:  # a lone append: written and synced at once
                try:
                    self._write(blob, self._end)
                except OSError as exc:
                    self._broken(exc)
                    return None
            else:  # written by the sync that will cover it, with the others meanwhile
                if not self._pending:
                    self._pending_at = self._end
                self._pending.append(blob)
            self._end += len(blob)
            self._dirty[self._active].add(entry.session_id)
            self._written += 1
            future: asyncio.Future[None] = loop.create_future()
            chain.waiting.append(_Waiter(self._written, future))
            if not chain.syncing:
                self._start_sync(loop, chain)
        return future

    def _write(self, data: bytes, at: int) -> None:
        """Write into the log at ``at`` (under the lock); OSError when it failed."""
        if os.pwrite(self._fd, data, at) != len(data):  # a file of fixed size: broken
            raise OSError(errno.EIO, "short write to the commit log")

    def _write_pending(self) -> None:
        """Write the entries added while a sync was in flight (under the lock)."""
        if self._pending:
            pending, self._pending = self._pending, []
            self._write(b"".join(pending), self._pending_at)

    def _switch(self, blob: bytes) -> bool:
        """The active half is full: go on in the other, checkpoint this one (under the
        lock). False while the other is still being checkpointed."""
        other = 1 - self._active
        if not self._clean[other] or len(blob) > HALF - _HEADER_SIZE:
            return False
        try:
            self._write_pending()  # before its half's checkpoint can clean it
            # The new generation's header: the next sync, which every entry written
            # after it waits for, makes it durable with them; until then the other
            # half's old entries, all synced in their journals, are what it holds.
            os.pwrite(self._fd, _header(self._generation + 1), other * HALF)
        except OSError as exc:
            self._broken(exc)
            return False
        retired = self._active
        self._generation += 1
        self._active, self._end = other, other * HALF + _HEADER_SIZE
        self._clean[other] = False
        self._dirty[other].clear()
        self._clean[retired] = False
        self._executor().submit(self.checkpoint, retired, set(self._dirty[retired]))
        return True

    def _start_sync(
        self, loop: asyncio.AbstractEventLoop, chain: _Chain, *, offload: bool = False
    ) -> None:
        """Start a sync covering every entry written so far, for ``loop``'s waiting
        commits (under the lock, on that loop). ``offload``: commits queued behind the
        last sync, so the loop is busy with other sessions; the sync then runs where
        it takes no time from the loop's CPU (``start_fsync``'s ``offload``)."""
        chain.syncing = True
        covered = self._written
        try:
            self._write_pending()
            synced = start_fsync(self._fd, self._executor(), datasync=True, offload=offload)
        except OSError as exc:
            chain.syncing = False
            done, chain.waiting = chain.waiting, []
            del self._chains[loop]
            self._broken(exc)
            _settle(done, exc)
            return
        synced.add_done_callback(functools.partial(self._synced, self._epoch, loop, chain, covered))

    def _synced(
        self,
        epoch: int,
        loop: asyncio.AbstractEventLoop,
        chain: _Chain,
        covered: int,
        synced: asyncio.Future[None],
    ) -> None:
        error = synced.exception()
        stranded: list[_Waiter] = []
        with self._lock:
            if epoch != self._epoch:
                return  # closed meanwhile: close settled the waiting commits
            if error is not None:
                done, chain.waiting = chain.waiting, []
                self._broken(error)
            else:
                at = 0
                while at < len(chain.waiting) and chain.waiting[at].number <= covered:
                    at += 1
                done, chain.waiting = chain.waiting[:at], chain.waiting[at:]
            if chain.waiting and self._state == "ready":
                self._start_sync(loop, chain, offload=True)
            else:
                chain.syncing = False
                # The log broke meanwhile (a failed write): no sync will cover these.
                stranded, chain.waiting = chain.waiting, []
                if self._chains.get(loop) is chain:
                    del self._chains[loop]
        _settle(done, error)
        _settle(stranded, OSError(errno.EIO, f"the commit log {self.path} failed"))

    def _broken(self, error: BaseException) -> None:
        """After a failed write or sync the log is not trusted again (under the lock)."""
        if self._state != "broken":
            _log.warning("commit log %s failed (%s); journals sync themselves", self.path, error)
        self._state = "broken"

    # ---------------------------------------------------- on the writer thread

    def prepare(self) -> None:
        """Make this process's log: zeroed, synced, locked, renamed into place."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            # Before any log is there, so whoever finds a log finds the recovery lock.
            flags = os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC
            os.close(os.open(self.directory / _LOCK, flags, 0o644))
            temp = self.directory / f"{_TEMP}{uuid.uuid4().hex}"
            fd = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            with self._lock:
                self._broken(exc)
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            _fill(fd, 0, 2 * HALF)
            os.pwrite(fd, _header(1), 0)
            os.fsync(fd)
            path = self.directory / f"{uuid.uuid4().hex}{_SUFFIX}"
            os.rename(temp, path)
            fsync_dir(self.directory)
        except OSError as exc:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(temp)
            with self._lock:
                self._broken(exc)
            return
        with self._lock:
            if self._state != "preparing" or self._pid != os.getpid():
                os.close(fd)  # closed meanwhile
                with contextlib.suppress(OSError):
                    os.unlink(path)
                return
            self._fd, self.path = fd, path
            self._generation, self._active, self._end = 1, 0, _HEADER_SIZE
            self._pending = []
            self._clean = [False, True]
            self._state = "ready"
            _LIVE.add(self)

    def checkpoint(self, half: int, session_ids: set[str]) -> None:
        """Fsync the journals a retired half holds copies for; then it may be reused."""
        try:
            self._sync_journals(session_ids)
        except OSError as exc:
            with self._lock:
                self._broken(exc)
            return
        with self._lock:
            self._clean[half] = True

    def _sync_journals(self, session_ids: set[str]) -> None:
        """Fsync the journals (and heads, which a logged turn leaves unsynced)."""
        for session_id in session_ids:
            sdir = self._sessions / session_id
            _sync_path(sdir / JOURNAL)
            _sync_path(sdir / HEAD)

    def close(self) -> None:
        """Make what the log covers durable in the journals, and delete the log.

        Called once the writer thread has stopped (no prepare or checkpoint runs).
        Commits still waiting for a sync of the log are settled here, once their
        journals are synced. The next ``add`` makes a new log.
        """
        with self._lock:
            state = self._state
            if state != "broken":
                self._state = "absent"
            dirty = self._dirty[0] | self._dirty[1]
            self._dirty = (set(), set())
            self._pending = []  # their commits are settled below, once their journals are synced
            fd, self._fd = self._fd, -1
            waiting = [w for chain in self._chains.values() for w in chain.waiting]
            self._chains = {}
            self._epoch += 1
            mine = self._pid == os.getpid()
        _LIVE.discard(self)
        if fd < 0 or not mine:  # no log was made, or it is the parent's
            return
        error: BaseException | None = None
        try:
            self._sync_journals(dirty)
            if state != "broken":
                assert self.path is not None
                with contextlib.suppress(FileNotFoundError):  # its directory went
                    os.unlink(self.path)
                    fsync_dir(self.directory)
        except OSError as exc:  # the log stays: the next recovery replays it
            _log.warning("closing the commit log %s: %s", self.path, exc)
            error = exc
        finally:
            os.close(fd)
        _settle(waiting, error)


# The logs this process has in use: a process that exits without closing its stores
# syncs their journals and deletes its logs (after its worker threads were joined),
# leaving nothing for the next store to replay.
_LIVE: weakref.WeakSet[CommitLog] = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
    for log in list(_LIVE):
        log.close()


def _settle(done: list[_Waiter], error: BaseException | None) -> None:
    here: asyncio.AbstractEventLoop | None
    try:
        here = asyncio.get_running_loop()
    except RuntimeError:
        here = None
    for waiter in done:
        if waiter.loop is here:
            _resolve(waiter.future, error)
        else:
            with contextlib.suppress(RuntimeError):  # that loop is closed
                waiter.loop.call_soon_threadsafe(_resolve, waiter.future, error)


def _resolve(future: asyncio.Future[None], error: BaseException | None) -> None:
    if future.done():  # its awaiting commit was cancelled
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(OSError(getattr(error, "errno", errno.EIO), f"fsync failed: {error}"))


def _fill(fd: int, start: int, end: int) -> None:
    at = start
    while at < end:
        at += os.pwrite(fd, _ZEROS[: min(len(_ZEROS), end - at)], at)


def _sync_path(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:  # deleted, or sealed (a seal syncs what it renames)
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -------------------------------------------------------------------- recovery


def recover(root: Path) -> int:
    """Replay the logs of dead processes into their journals (see the module).

    Returns how many entries were written back. Raises ``OSError`` when a journal
    cannot be written or synced (the logs then stay, for the next try).

    A live process holds its log under an exclusive ``flock`` for life. Looking for
    dead ones takes each log's lock shared (a live one refuses), under a shared lock
    of ``.wal/.lock``; a recovery takes ``.wal/.lock`` exclusively, so a store that
    looks while another replays waits for it to finish, rather than taking the logs
    being replayed for live ones and reading journals not yet put back.
    """
    directory = root / LOG_DIR
    candidates = _candidates(directory)
    if not candidates:
        return 0  # no log was ever left here
    if not _orphans_there(directory, candidates):
        return 0  # only live logs: nothing to take, nothing written
    lock = os.open(directory / _LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one recovery at a time; lookers wait
        orphans: list[tuple[Path, int]] = []
        try:
            for path in _candidates(directory):
                fd = _take(path, fcntl.LOCK_EX)
                if fd is not None:
                    orphans.append((path, fd))
            return _replay(root, orphans)
        finally:
            for _, fd in orphans:
                os.close(fd)
    finally:
        os.close(lock)  # and with it the lock


def _candidates(directory: Path) -> list[Path]:
    try:
        names = sorted(os.listdir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [directory / n for n in names if n.endswith(_SUFFIX) or n.startswith(_TEMP)]


def _take(path: Path, how: int) -> int | None:
    """An open descriptor of a dead process's log, locked ``how``; None if it lives
    (or is gone)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, how | fcntl.LOCK_NB)
    except BlockingIOError:  # a live process's log (or one being replayed)
        os.close(fd)
        return None
    return fd


def _orphans_there(directory: Path, candidates: list[Path]) -> bool:
    """Is one of ``candidates`` a dead process's log? Waits for a recovery under way
    (``.wal/.lock``, made before the first log)."""
    try:
        lock: int | None = os.open(directory / _LOCK, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        lock = None
    try:
        if lock is not None:
            fcntl.flock(lock, fcntl.LOCK_SH)
        for path in candidates:
            fd = _take(path, fcntl.LOCK_SH)
            if fd is not None:
                os.close(fd)
                return True
        return False
    finally:
        if lock is not None:
            os.close(lock)


def _replay(root: Path, orphans: list[tuple[Path, int]]) -> int:
    by_session: dict[str, list[Entry]] = {}
    for path, fd in orphans:
        if path.name.startswith(_TEMP):
            continue  # a log never put in place holds no entry
        data = _read_all(fd)
        for entry in read_entries(data):
            by_session.setdefault(entry.session_id, []).append(entry)
    restored = 0
    for session_id, entries in by_session.items():
        restored += _replay_journal(root / "sessions" / session_id / JOURNAL, entries)
    for path, _ in orphans:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    if orphans:
        fsync_dir(root / LOG_DIR)
    return restored


def _replay_journal(path: Path, entries: list[Entry]) -> int:
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return 0  # the session was deleted, or its journal sealed and not yet begun again
    restored = 0
    try:
        ino = os.fstat(fd).st_ino
        for entry in sorted(entries, key=lambda e: e.size):
            if entry.ino != ino:
                continue  # a journal since replaced (a rewrite, a seal, a new session)
            have = os.pread(fd, len(entry.data), entry.size)
            if have == entry.data:
                continue
            if not entry.data.startswith(have) or not _ends_on(fd, entry.size, entry.prev):
                continue  # the journal went on another way: the entry is not its
            _write_at(fd, entry.data, entry.size)
            restored += 1
        os.fsync(fd)
    finally:
        os.close(fd)
    if restored:
        _log.warning("%s: %d append(s) restored from the commit log", path, restored)
    return restored


def _ends_on(fd: int, size: int, prev: str) -> bool:
    """Does the file hold a complete line ending at ``size`` whose hash is ``prev``?"""
    if size <= 0:
        return False
    chunk = 8 * 1024
    while True:
        start = max(0, size - chunk)
        data = os.pread(fd, size - start, start)
        if len(data) != size - start or not data.endswith(b"\n"):
            return False
        cut = data.rfind(b"\n", 0, len(data) - 1)
        if cut >= 0 or start == 0:
            return journal.peek_hash(data[cut + 1 : -1]) == prev
        chunk *= 4


def _write_at(fd: int, data: bytes, at: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, at)
        view, at = view[written:], at + written


def _read_all(fd: int) -> bytes:
    size = os.fstat(fd).st_size
    chunks: list[bytes] = []
    at = 0
    while at < size:
        chunk = os.pread(fd, min(1 << 20, size - at), at)
        if not chunk:
            break
        chunks.append(chunk)
        at += len(chunk)
    return b"".join(chunks)
