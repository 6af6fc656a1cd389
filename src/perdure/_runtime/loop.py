"""The one event loop behind perdure's sync entry points.

Sync calls (``agent("...")``, the CLI) run their coroutine on a single long-lived
event loop in a daemon thread, created on first use. Never a new loop or thread per
call: async stores and connection pools that bind to a loop stay valid across calls.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None


def _get_loop() -> asyncio.AbstractEventLoop:
    global _loop, _thread
    with _lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(
                target=loop.run_forever, name="perdure-event-loop", daemon=True
            )
            thread.start()
            _loop, _thread = loop, thread
            atexit.register(_shutdown)
        return _loop


def _shutdown() -> None:
    global _loop, _thread
    with _lock:
        loop, thread = _loop, _thread
        _loop = _thread = None
    if loop is None or thread is None:
        return
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=5)
    if not loop.is_running():
        loop.close()


def in_running_loop() -> bool:
    """True when the calling thread is running an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def run_sync(coro: Coroutine[Any, Any, T], *, async_name: str) -> T:
    """Run ``coro`` on perdure's event loop and return its result.

    Raises:
        RuntimeError: called from a thread that is running an event loop (the message
            names ``async_name``, the coroutine to await instead).
    """
    if in_running_loop():
        coro.close()
        raise RuntimeError(
            f"cannot call the sync API from inside a running event loop; "
            f"use `await {async_name}` instead"
        )
    return run_blocking(coro)


def run_blocking(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on perdure's loop and wait, even if this thread runs another loop.

    Must not be called from perdure's own loop thread (it would wait on itself).
    """
    loop = _get_loop()
    if threading.current_thread() is _thread:
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


def is_runner_thread() -> bool:
    """True when called on perdure's own event-loop thread."""
    return _thread is not None and threading.current_thread() is _thread
