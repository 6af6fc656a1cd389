"""Plumbing the suites share: closing a backend, and running work in other threads."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any


def close(backend: object) -> None:
    """Close ``backend`` when it has a ``close()`` (a store, storage or memory store may)."""
    closer = getattr(backend, "close", None)
    if closer is not None:
        closer()


def run_in_threads(
    work: Callable[[int], Coroutine[Any, Any, None]], count: int
) -> list[BaseException]:
    """Run ``work(i)`` for ``i`` in ``range(count)`` at once, each in its own thread and
    event loop (``asyncio.run``); return what they raised (empty: all went well)."""
    errors: list[BaseException] = []

    def worker(index: int) -> None:
        try:
            asyncio.run(work(index))
        except BaseException as exc:  # handed to the caller, who asserts on it
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors
