"""Writer locks: one writer per session, across threads and processes.

File-backed stores use an OS advisory lock (``flock``) on a per-session lock file:
it is released by the kernel when the process dies, so a crashed writer never
leaves a session locked. Within one process, a lock table remembers which sessions
this store instance holds, so commits inside a held turn do not re-lock.
Acquisition never waits: a held lock raises ``SessionLockedError`` at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import itertools
import os
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from perdure._runtime.threads import PerProcess, on_fork_in_child
from perdure.errors import SessionLockedError

GITIGNORE = ".gitignore"
"""Written in a lock directory so that git never shows it (``*``: ignore everything)."""


def ignore_in_git(directory: Path) -> None:
    """Make git ignore ``directory`` (lock files beside a user's database or store).

    A ``.gitignore`` holding ``*`` hides the folder and itself from ``git status``;
    it is written once, never overwritten, and a failure to write it is ignored —
    locks work without it.
    """
    try:
        fd = os.open(directory / GITIGNORE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError:  # already there (the usual case), or a read-only directory
        return
    try:
        os.write(fd, b"# perdure's writer locks: nothing here belongs in version control\n*\n")
    finally:
        os.close(fd)


class LockTable:
    """Per-session writer locks for one store instance.

    With ``directory`` set, each lock is also an ``flock`` on
    ``directory/<session_id>.lock`` so that other processes see it; without it the
    lock only excludes holders inside this process.
    """

    def __init__(self, directory: Path | None = None) -> None:
        self._directory = directory
        # What this process holds: a child made by fork() holds none of its parent's
        # locks (an flock it inherited stays its parent's, and is closed there).
        self._here: PerProcess[_Held] = PerProcess(_Held)
        # Shared by parent and child: a number given in one is never given in the
        # other's later holds, so a value remembered under a parent's hold is never
        # trusted under a child's.
        self._numbers = itertools.count(1)
        on_fork_in_child(self, LockTable._close_inherited)

    def is_held(self, session_id: str) -> bool:
        """True when this store instance holds ``session_id``'s lock in this process."""
        here = self._here.value
        with here.guard:
            return session_id in here.held

    def hold_id(self, session_id: str) -> int | None:
        """A number for the current hold of ``session_id``'s lock (None: not held).

        Every acquisition gets a new number, so a value remembered under one hold is
        known to be unchanged by anyone else while the number stays the same. In a
        child made by fork() it is None until the child takes the lock itself.
        """
        return self._here.value.hold_ids.get(session_id)

    def acquire(self, session_id: str) -> None:
        """Take the lock or raise ``SessionLockedError`` at once."""
        here = self._here.value
        with here.guard:
            if session_id in here.held:
                raise SessionLockedError(
                    f"session {session_id!r} is locked by another writer in this process"
                )
            fd = self._flock(session_id) if self._directory is not None else None
            here.held[session_id] = fd
            here.hold_ids[session_id] = next(self._numbers)

    def release(self, session_id: str) -> None:
        """Release the lock (a lock not held is fine)."""
        here = self._here.value
        with here.guard:
            fd = here.held.pop(session_id, None)
            here.hold_ids.pop(session_id, None)
        if fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def _close_inherited(self) -> None:
        """In a child made by fork(): close the parent's lock files, never unlocking them.

        The parent's locks stay the parent's (an unlock here would release them for
        it too); the child must only not keep them alive after the parent is gone.
        """
        for fd in self._here.value.held.values():
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _flock(self, session_id: str) -> int:
        assert self._directory is not None
        here = self._here.value
        path = os.path.join(self._directory, session_id + ".lock")  # a Path's / is ~4x slower
        if session_id in here.opened:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            except FileNotFoundError:  # the directory went away since: make it again
                here.opened.discard(session_id)
                return self._flock(session_id)
        else:
            self._directory.mkdir(parents=True, exist_ok=True)
            ignore_in_git(self._directory)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise SessionLockedError(
                f"session {session_id!r} is locked by another writer (another process "
                "is running a turn or an operation on it)"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        here.opened.add(session_id)
        return fd

    @contextlib.asynccontextmanager
    async def hold(self, session_id: str) -> AsyncIterator[None]:
        """Hold the lock for an ``async with`` block.

        The first hold of a session makes its lock file (and directory) on a worker
        thread. Later holds take the lock on the caller's thread: opening a lock file
        that exists and a non-blocking ``flock`` are two system calls that never wait
        for the disk, far cheaper than the hop to a thread and back (which was the
        largest cost of a turn's persistence after its fsyncs).
        """
        if self._directory is None or self._opened_before(session_id):
            self.acquire(session_id)
        else:
            await asyncio.to_thread(self.acquire, session_id)
        try:
            yield
        finally:
            self.release(session_id)

    def _opened_before(self, session_id: str) -> bool:
        here = self._here.value
        with here.guard:
            return session_id in here.opened

    def for_write(self, session_id: str) -> contextlib.AbstractContextManager[None]:
        """Around one write: reuse a held lock, else take it for the write only."""
        if session_id in self._here.value.held:  # a turn's appends: no generator to set up
            return _REUSED
        return self._for_one_write(session_id)

    @contextlib.contextmanager
    def _for_one_write(self, session_id: str) -> Iterator[None]:
        self.acquire(session_id)
        try:
            yield
        finally:
            self.release(session_id)


class _Held:
    """The locks one process holds through one table."""

    def __init__(self) -> None:
        self.guard = threading.Lock()
        self.held: dict[str, int | None] = {}  # session id -> lock fd (None: in-process)
        self.hold_ids: dict[str, int] = {}  # session id -> the current hold's number
        self.opened: set[str] = set()  # sessions whose lock file this process opened


_REUSED: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
