"""The Redis connection of a store: its scripts on one client, one client per event loop.

The client per loop is :class:`perdure._runtime.redis.PerLoop`'s (shared with
:class:`~perdure.storage.redis.RedisStorage`). Scripts are registered per client;
redis-py loads a script (``SCRIPT LOAD``) again when the server lost it (a restart,
``SCRIPT FLUSH``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis

from perdure._runtime import redis as _runtime
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


class PerLoop(_runtime.PerLoop[Connection]):
    """One :class:`Connection` per running event loop."""

    def __init__(self, url: str, *, socket_timeout: float, connect_timeout: float) -> None:
        super().__init__(
            url, Connection, socket_timeout=socket_timeout, connect_timeout=connect_timeout
        )
