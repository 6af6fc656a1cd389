"""The Redis connection of a store: one client (with its pool) per event loop.

redis-py's asyncio client is bound to the loop it first ran on, while a store's
coroutines may be awaited from any loop and any thread (SPEC §7). So a store keeps
one client per running loop, made on the loop's first call. A client is closed on
its own loop when that loop shuts down: an ``asyncio.run`` (or any
:class:`asyncio.Runner`) closes the loop's async generators before it closes the
loop, and each client is watched by one (:func:`_closer`), whose ``finally``
closes the client's connections there, so no socket outlives its loop.

Scripts are registered per client; redis-py loads a script (``SCRIPT LOAD``) again
when the server lost it (a restart, ``SCRIPT FLUSH``).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from perdure.stores.redis import _scripts

__all__ = ["Connection", "PerLoop"]

Script = Callable[..., Awaitable[Any]]


class Connection:
    """A client on one loop, with the store's scripts registered on it."""

    def __init__(self, client: aioredis.Redis) -> None:
        self.client = client
        self.read = self._script(_scripts.READ)
        self.head = self._script(_scripts.HEAD)
        self.commit = self._script(_scripts.COMMIT)
        self.create = self._script(_scripts.CREATE)
        self.delete = self._script(_scripts.DELETE)
        self.renew = self._script(_scripts.RENEW)
        self.release = self._script(_scripts.RELEASE)
        self.put_checkpoint = self._script(_scripts.PUT_CHECKPOINT)

    def _script(self, lua: str) -> Script:
        script = self.client.register_script(lua)

        def call(keys: list[str], args: list[Any]) -> Awaitable[Any]:
            return script(keys=keys, args=args)

        return call


class PerLoop:
    """One :class:`Connection` per running event loop (see the module docstring)."""

    def __init__(self, url: str, *, socket_timeout: float, connect_timeout: float) -> None:
        self.url = url
        self._timeouts = (socket_timeout, connect_timeout)
        self._guard = threading.Lock()
        self._by_loop: dict[int, tuple[asyncio.AbstractEventLoop, Connection, Any]] = {}

    async def get(self) -> Connection:
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
                # No resending by the driver: a commit sent again after a lost answer
                # must be settled by the store (see sessions._send); reads retry there.
                retry=Retry(NoBackoff(), 0),
            )
            connection = Connection(client)
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


async def _closer(client: aioredis.Redis, owner: PerLoop, key: int) -> AsyncIterator[None]:
    try:
        yield
    finally:
        owner.forget(key)
        await client.aclose()
