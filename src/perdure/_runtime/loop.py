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
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

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
    """
    loop = _get_loop()
    if is_runner_thread():
        coro.close()
        raise RuntimeError("run_blocking called from perdure's own event loop thread")
    future = asyncio.run_coroutine_threadsafe(coro, loop)
    try:
        return future.result()
    except BaseException:
        # KeyboardInterrupt (or any escape) while waiting: stop the coroutine too.
        if not future.done():
            future.cancel()
            with contextlib.suppress(concurrent.futures.CancelledError, Exception):
                future.result(timeout=5)
        raise
