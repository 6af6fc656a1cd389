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

from perdure.errors import SessionLockedError


class LockTable:
    """Per-session writer locks for one store instance.

    With ``directory`` set, each lock is also an ``flock`` on
    ``directory/<session_id>.lock`` so that other processes see it; without it the
    lock only excludes holders inside this process.
    """

    def __init__(self, directory: Path | None = None) -> None:
        self._directory = directory
        self._guard = threading.Lock()
        self._held: dict[str, int | None] = {}  # session id -> lock fd (None: in-process)
        # session id -> (the holding process, the current hold's number)
        self._hold_ids: dict[str, tuple[int, int]] = {}
        self._numbers = itertools.count(1)

    def is_held(self, session_id: str) -> bool:
        """True when this store instance holds ``session_id``'s lock."""
        with self._guard:
            return session_id in self._held

    def hold_id(self, session_id: str) -> int | None:
        """A number for the current hold of ``session_id``'s lock (None: not held).

        Every acquisition gets a new number, so a value remembered under one hold is
        known to be unchanged by anyone else while the number stays the same. In a
        child made by fork() while the lock was held it is None: parent and child
        then share the lock, and neither may trust what it remembered.
        """
        hold = self._hold_ids.get(session_id)
        if hold is None or hold[0] != os.getpid():
            return None
        return hold[1]

    def acquire(self, session_id: str) -> None:
        """Take the lock or raise ``SessionLockedError`` at once."""
        with self._guard:
            if session_id in self._held:
                raise SessionLockedError(
                    f"session {session_id!r} is locked by another writer in this process"
                )
            fd = self._flock(session_id) if self._directory is not None else None
            self._held[session_id] = fd
            self._hold_ids[session_id] = (os.getpid(), next(self._numbers))

    def release(self, session_id: str) -> None:
        """Release the lock (a lock not held is fine)."""
        with self._guard:
            fd = self._held.pop(session_id, None)
            self._hold_ids.pop(session_id, None)
        if fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def _flock(self, session_id: str) -> int:
        assert self._directory is not None
        self._directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._directory / f"{session_id}.lock", os.O_RDWR | os.O_CREAT, 0o644)
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
        return fd

    @contextlib.asynccontextmanager
    async def hold(self, session_id: str) -> AsyncIterator[None]:
        """Hold the lock for an ``async with`` block."""
        await asyncio.to_thread(self.acquire, session_id)
        try:
            yield
        finally:
            self.release(session_id)

    def for_write(self, session_id: str) -> contextlib.AbstractContextManager[None]:
        """Around one write: reuse a held lock, else take it for the write only."""
        if session_id in self._held:  # a turn's appends: no generator to set up
            return _REUSED
        return self._for_one_write(session_id)

    @contextlib.contextmanager
    def _for_one_write(self, session_id: str) -> Iterator[None]:
        self.acquire(session_id)
        try:
            yield
        finally:
            self.release(session_id)


_REUSED: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
