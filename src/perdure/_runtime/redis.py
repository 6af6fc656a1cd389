"""Redis plumbing every Redis backend of perdure shares (layer 0): one client per loop.

redis-py's asyncio client is bound to the loop it first ran on, while a backend's
coroutines may be awaited from any loop and any thread (SPEC §7). So a backend keeps
one client per running loop (:class:`PerLoop`), made on the loop's first call. A
client is closed on its own loop when that loop shuts down: an ``asyncio.run`` (or
any :class:`asyncio.Runner`) closes the loop's async generators before it closes the
loop, and each client is watched by one (:func:`_closer`), whose ``finally`` closes
the client's connections there, so no socket outlives its loop.

The driver never sends a command again by itself (``Retry(NoBackoff(), 0)``): a
write sent again after a lost answer must be settled by the backend, which alone
knows whether doing it twice is harmless.

This module imports redis-py: only the Redis backends import it, lazily, so that
``import perdure`` never does.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any, Generic, TypeVar
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio as aioredis
import redis.exceptions as rexc
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

__all__ = ["UNAVAILABLE", "PerLoop", "where"]

UNAVAILABLE: tuple[type[BaseException], ...] = (rexc.ConnectionError, rexc.TimeoutError)
"""Driver errors that mean the server could not be reached (or stopped answering)."""

C = TypeVar("C")


def where(url: str) -> str:
    """The server of ``url`` without its password, for messages."""
    parts = urlsplit(url)
    host = parts.hostname or "localhost"
    port = f":{parts.port}" if parts.port else ""
    return urlunsplit((parts.scheme, f"{host}{port}", parts.path, "", ""))


class PerLoop(Generic[C]):
    """One connection (``make(client)``: the client with what the backend registers
    on it, its scripts) per running event loop (see the module docstring)."""

    def __init__(
        self,
        url: str,
        make: Callable[[aioredis.Redis], C],
        *,
        socket_timeout: float,
        connect_timeout: float,
    ) -> None:
        self.url = url
        self._make = make
        self._timeouts = (socket_timeout, connect_timeout)
        self._guard = threading.Lock()
        self._by_loop: dict[int, tuple[asyncio.AbstractEventLoop, C, Any]] = {}

    async def get(self) -> C:
        """The connection of the running loop (made on its first call)."""
        loop = asyncio.get_running_loop()
        with self._guard:
            found = self._by_loop.get(id(loop))
            if found is not None and found[0] is loop:
                return found[1]
            for key, (other, _, _) in list(self._by_loop.items()):
                if other.is_closed():  # closed without shutting its generators down
                    del self._by_loop[key]
            client = aioredis.Redis.from_url(
                self.url,
                socket_timeout=self._timeouts[0],
                socket_connect_timeout=self._timeouts[1],
                decode_responses=False,
                # No resending by the driver (see the module docstring).
                retry=Retry(NoBackoff(), 0),
            )
            connection = self._make(client)
            watcher = _closer(client, self, id(loop))
            self._by_loop[id(loop)] = (loop, connection, watcher)
        await watcher.__anext__()  # registered with the loop: closed at its shutdown
        return connection

    def forget(self, key: int) -> None:
        with self._guard:
            self._by_loop.pop(key, None)

    async def aclose(self) -> None:
        """Close the running loop's client (reopened on the next call)."""
        loop = asyncio.get_running_loop()
        with self._guard:
            found = self._by_loop.pop(id(loop), None)
        if found is not None:
            await found[2].aclose()

    def close(self) -> None:
        """Close every loop's client (each reopened on its loop's next call).

        A client is closed on its own loop: one another thread runs gets the work
        handed to it (waiting up to 5 s); one nobody runs is run here until done. The
        calling thread's own running loop cannot be waited for: its client stays, to
        be closed when that loop shuts down (or by :meth:`aclose`).
        """
        try:
            current: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        with self._guard:
            found = [v for v in self._by_loop.values() if v[0] is not current]
            for loop, _, _ in found:
                self._by_loop.pop(id(loop), None)
        for loop, _, watcher in found:
            if loop.is_closed():
                continue
            with contextlib.suppress(Exception):
                if loop.is_running():
                    asyncio.run_coroutine_threadsafe(watcher.aclose(), loop).result(timeout=5)
                else:
                    loop.run_until_complete(watcher.aclose())


async def _closer(client: aioredis.Redis, owner: PerLoop[Any], key: int) -> AsyncIterator[None]:
    try:
        yield
    finally:
        owner.forget(key)
        await client.aclose()
