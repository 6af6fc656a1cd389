"""Threads and ``fork()``: the one place perdure knows about processes.

perdure keeps things that belong to one process: a store's worker thread, the event
loop behind the sync façade, SQLite connections, writer-lock tables, the kernel's
AIO context, and the locks guarding them. A child made by ``fork()`` inherits their
memory but not the threads behind them; it must not use an SQLite connection opened
before the fork; and a lock that one of the parent's threads held at the moment of
the fork stays locked in the child for ever.

One handler, registered with :func:`os.register_at_fork`, bumps a fork generation
in every child. The holders below compare it on use, so a child starts afresh:

- :class:`PerProcess` — a value made on first use in each process;
- :class:`ProcessLock` — a lock that is free in a child whatever the parent held;
- :class:`StoreThread` — a store's worker thread, started again in a child.

What a child inherits is never used there, and never finalised either (closing an
inherited SQLite connection or event loop could disturb the parent's files): it is
kept alive, untouched, for the life of the child. Work that must happen at once in
a child (closing descriptors it must not keep open) goes to :func:`on_fork_in_child`.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import threading
import weakref
from collections.abc import Callable
from types import TracebackType
from typing import Generic, TypeVar

__all__ = [
    "PerProcess",
    "ProcessLock",
    "StoreThread",
    "fork_generation",
    "on_fork_in_child",
]

T = TypeVar("T")
OwnerT = TypeVar("OwnerT")

_LOCK = type(threading.Lock())
_generation = 0
# Guards the creation of per-process values (reentrant: one value's initial() may
# read another's); made again in each child, since a thread of the parent may have
# held it at the moment of the fork.
_guard = threading.RLock()
# What children inherited: kept alive, never used nor finalised (see the docstring).
_inherited: list[object] = []
# (owner, callback) pairs run in a child right after fork(), while the owner lives.
_fork_callbacks: list[tuple[weakref.ref[object], Callable[[object], None]]] = []


def fork_generation() -> int:
    """How many ``fork()`` calls separate this process from the first one (0 there)."""
    return _generation


def _after_fork_in_child() -> None:
    global _generation, _guard
    _guard = threading.RLock()
    alive = []
    for owner_ref, callback in _fork_callbacks:
        owner = owner_ref()
        if owner is None:
            continue
        alive.append((owner_ref, callback))
        with contextlib.suppress(Exception):  # nothing here may stop the child
            callback(owner)
    _fork_callbacks[:] = alive
    _generation += 1  # after the callbacks: they see what the child inherited


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def on_fork_in_child(owner: OwnerT, callback: Callable[[OwnerT], None]) -> None:
    """Call ``callback(owner)`` in every child made by ``fork()`` while ``owner`` lives.

    It runs right after the fork, before anything else in the child, with no other
    thread running, and sees the :class:`PerProcess` values the child inherited
    (``value`` is still the parent's): keep it short and free of locks (close
    inherited descriptors).
    """
    with _guard:
        _fork_callbacks[:] = [(ref, cb) for ref, cb in _fork_callbacks if ref() is not None]
        _fork_callbacks.append((weakref.ref(owner), callback))  # type: ignore[arg-type]


class PerProcess(Generic[T]):
    """A value that belongs to the process that made it.

    ``value`` is made by ``initial()`` on first use in each process; a child made by
    ``fork()`` gets its own (``carry(parent_value)`` when given, else a fresh
    ``initial()``), and the parent's is kept alive, untouched. Setting ``value``
    sets this process's. Reading it costs one comparison once it exists.

    Args:
        initial: makes the value; runs under a process-wide lock, so it must be
            quick and must not block (open connections later, on use).
        carry: what a child makes of the value it inherited (e.g. an in-memory
            database that only exists in that copy); by default it is not used.
    """

    __slots__ = ("_carry", "_generation", "_initial", "_value")

    def __init__(self, initial: Callable[[], T], *, carry: Callable[[T], T] | None = None) -> None:
        self._initial = initial
        self._carry = carry
        self._generation = -1
        self._value: T | None = None

    @property
    def value(self) -> T:
        """This process's value (made on first use here)."""
        if self._generation == _generation:
            return self._value  # type: ignore[return-value]  # set with the generation
        return self._renew()

    @value.setter
    def value(self, value: T) -> None:
        with _guard:
            self._adopt()
            self._value = value
            self._generation = _generation

    def _renew(self) -> T:
        with _guard:
            if self._generation != _generation:
                inherited = self._adopt()
                if inherited is not None and self._carry is not None:
                    self._value = self._carry(inherited[0])
                else:
                    self._value = self._initial()
                self._generation = _generation
            return self._value  # type: ignore[return-value]

    def _adopt(self) -> tuple[T] | None:
        """Keep an inherited value alive, out of use; returns it (None: there was none)."""
        if self._generation == _generation or self._generation < 0:
            return None
        value: T = self._value  # type: ignore[assignment]
        _inherited.append(value)
        self._value = None
        self._generation = -1
        return (value,)


class ProcessLock:
    """A ``threading.Lock`` (or ``RLock``) per process: free in a child made by fork().

    A child holds none of the locks its parent's threads held at the fork, as a
    new process would; what they guarded is as the fork left it.
    """

    __slots__ = ("_locks",)

    def __init__(self, *, reentrant: bool = False) -> None:
        factory: Callable[[], threading.Lock | threading.RLock]
        factory = threading.RLock if reentrant else threading.Lock
        self._locks: PerProcess[threading.Lock | threading.RLock] = PerProcess(factory)

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Take the lock (see ``threading.Lock.acquire``)."""
        return self._locks.value.acquire(blocking, timeout)

    def release(self) -> None:
        """Release the lock."""
        self._locks.value.release()

    def locked(self) -> bool:
        """Whether the lock is held (in this process)."""
        lock = self._locks.value
        if isinstance(lock, _LOCK):
            return lock.locked()
        if lock.acquire(blocking=False):  # an RLock has no locked() before 3.14
            lock.release()
            return False
        return True

    def __enter__(self) -> bool:
        return self._locks.value.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._locks.value.release()


class StoreThread:
    """One worker thread, started on first use and started again after fork().

    A child made by fork() inherits a ``ThreadPoolExecutor`` but not its thread:
    work queued there would never run. :meth:`executor` gives each process its own.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._guard = ProcessLock()
        self._executor: PerProcess[concurrent.futures.ThreadPoolExecutor | None] = PerProcess(
            lambda: None
        )

    def executor(self) -> concurrent.futures.ThreadPoolExecutor:
        """The thread's executor in this process."""
        executor = self._executor.value
        if executor is not None:
            return executor
        with self._guard:
            executor = self._executor.value
            if executor is None:
                executor = concurrent.futures.ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix=self._name
                )
                self._executor.value = executor
            return executor

    def shutdown(self) -> None:
        """Wait for queued work and stop the thread (the next use starts another)."""
        with self._guard:
            executor = self._executor.value
            self._executor.value = None
        if executor is not None:
            executor.shutdown(wait=True)
