"""The one event loop behind perdure's sync entry points.

Sync calls (``agent("...")``, ``Session.resume``, the CLI) run their coroutine on a
single long-lived event loop in a daemon thread, created on first use. Never a new
loop or thread per call: async stores and connection pools that bind to a loop stay
valid across calls.

A sync call made inside someone else's running loop (a notebook cell, a web handler)
runs there too, blocking only the calling thread, and logs once (per process and
async twin) a warning that names the coroutine to await instead. Only a call made on
perdure's own loop thread is refused: it would wait for itself.

The loop belongs to the process that made it: a child made by ``fork()`` (a
pre-fork server's worker, a ``multiprocessing`` child) starts its own on first use,
even when the parent's was running at the fork (its thread did not come along).
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import threading
from collections.abc import Coroutine
from typing import Any, Generic, TypeVar, cast

from perdure._runtime.threads import PerProcess

T = TypeVar("T")

_log = logging.getLogger(__name__)


class _Runner:
    """perdure's event loop and its thread, in one process."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None
        self.warned: set[str] = set()  # async twins named in a warning already

    def get_loop(self) -> asyncio.AbstractEventLoop:
        with self.lock:
            if self.loop is None or self.loop.is_closed():
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="perdure-event-loop", daemon=True
                )
                thread.start()
                self.loop, self.thread = loop, thread
            return self.loop

    def shutdown(self) -> None:
        with self.lock:
            loop, thread = self.loop, self.thread
            self.loop = self.thread = None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        if not loop.is_running():
            loop.close()


# A forked child gets a new _Runner; the parent's (a loop whose thread is gone, an
# epoll instance shared with the parent) is kept alive there but never touched.
_runner: PerProcess[_Runner] = PerProcess(_Runner)


def _get_loop() -> asyncio.AbstractEventLoop:
    return _runner.value.get_loop()


@atexit.register
def _shutdown() -> None:
    _runner.value.shutdown()


def in_running_loop() -> bool:
    """True when the calling thread is running an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def is_runner_thread() -> bool:
    """True when called on perdure's own event-loop thread (in this process)."""
    thread = _runner.value.thread
    return thread is not None and threading.current_thread() is thread


def run_sync(coro: Coroutine[Any, Any, T], *, async_name: str) -> T:
    """Run ``coro`` on perdure's event loop and return its result.

    The calling thread waits; when it runs an event loop of its own, that loop is
    blocked until the call returns, and a warning naming ``async_name`` (the
    coroutine to await instead) is logged once per process.

    Raises:
        RuntimeError: called on perdure's own event-loop thread (from a tool or a
            hook of a running agent), where waiting would deadlock; the message
            names ``async_name``.
    """
    if is_runner_thread():
        coro.close()
        raise RuntimeError(
            "cannot call perdure's sync API on perdure's own event loop thread (inside "
            f"a tool or hook of a running agent): it would wait for itself; "
            f"use `await {async_name}` instead"
        )
    if in_running_loop():
        runner = _runner.value
        if async_name not in runner.warned:
            runner.warned.add(async_name)
            _log.warning(
                "a sync perdure call was made inside a running event loop: it runs on "
                "perdure's loop and blocks this one until it returns; use `await %s` "
                "instead",
                async_name,
            )
    return run_blocking(coro)


def run_blocking(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on perdure's loop and wait, even if this thread runs another loop.

    Must not be called from perdure's own loop thread (it would wait on itself).

    The hand-off is the lightest there is: one wake-up of the loop (its self-pipe),
    the coroutine run in a task that records its outcome and releases a plain lock
    as its last step, and the caller woken by that lock. (``run_coroutine_threadsafe``
    adds a loop iteration for the task's done-callbacks and a condition variable:
    on a bare agent turn, that was as much again as the turn itself.)
    """
    loop = _get_loop()
    if is_runner_thread():
        coro.close()
        raise RuntimeError("run_blocking called from perdure's own event loop thread")
    call: _Call[T] = _Call(coro)
    try:
        loop.call_soon_threadsafe(call.start, loop)
        call.done.acquire()
    except BaseException:
        # KeyboardInterrupt (or any escape) while waiting: stop the coroutine too.
        try:
            loop.call_soon_threadsafe(call.cancel)
        except RuntimeError:  # the loop is closed: nothing runs there any more
            coro.close()
        else:
            call.done.acquire(timeout=5)
        raise
    return call.result()


class _Call(Generic[T]):
    """One coroutine handed to perdure's loop by a blocked thread, and its outcome."""

    def __init__(self, coro: Coroutine[Any, Any, T]) -> None:
        self.coro = coro
        self.done = threading.Lock()
        self.done.acquire()  # released once the outcome is set
        self.task: asyncio.Task[None] | None = None
        self.value: T | None = None
        self.error: BaseException | None = None
        self.finished = False  # the outcome is set (touched on the loop's thread only)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.task = loop.create_task(self.run())

    def cancel(self) -> None:
        # Scheduled after start() by the same thread, when start() was scheduled at
        # all: the loop runs them in order, so no task here means it never will be.
        if self.task is None:
            self._never_ran()
            return
        self.task.cancel()
        # A task cancelled before its first step never enters run(): its finally
        # would not release the caller, nor would the coroutine be closed.
        self.task.add_done_callback(lambda _task: self._never_ran())

    def _never_ran(self) -> None:
        if not self.finished:
            self.coro.close()
            self._finish()

    def _finish(self) -> None:
        self.finished = True
        self.done.release()

    async def run(self) -> None:
        try:
            self.value = await self.coro
        except BaseException as exc:  # handed to the waiting thread, raised there
            self.error = exc
        finally:
            self._finish()

    def result(self) -> T:
        if self.error is not None:
            error, self.error = self.error, None  # no cycle through the traceback
            raise error
        return cast(T, self.value)  # run() set a value (None is one) or an error
