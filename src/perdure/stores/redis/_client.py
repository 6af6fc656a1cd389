"""The Redis connection of a store: its scripts on one client, one client per event loop.

The client per loop is :class:`perdure._runtime.redis.PerLoop`'s (shared with
:class:`~perdure.storage.redis.RedisStorage`). Scripts are sent by their SHA1
(``EVALSHA``) and loaded (``SCRIPT LOAD``) when the server does not know them (the
first call, a restart, ``SCRIPT FLUSH``).
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions as rexc
from redis.asyncio.connection import AbstractConnection

from perdure._runtime import redis as _runtime
from perdure.stores.redis import _scripts

__all__ = ["Connection", "PerLoop", "pack"]

Script = Callable[..., Awaitable[Any]]


class Connection:
    """A client on one loop, with the store's scripts registered on it."""

    def __init__(self, client: aioredis.Redis) -> None:
        self.client = client
        # Connections the scripts borrowed from the client's pool and keep (one per
        # script call running at once on this loop); closed with the client.
        self._idle: list[Any] = []
        self.read = self._script(_scripts.READ)
        self.head = self._script(_scripts.HEAD)
        self.commit = self._script(_scripts.COMMIT)
        self.create = self._script(_scripts.CREATE)
        self.delete = self._script(_scripts.DELETE)
        self.renew = self._script(_scripts.RENEW)
        self.release = self._script(_scripts.RELEASE)
        self.acquire = self._script(_scripts.ACQUIRE)
        self.put_checkpoint = self._script(_scripts.PUT_CHECKPOINT)
        self.probe = self._script(_scripts.PROBE)

    def _script(self, lua: str) -> Script:
        """The script as a call ``(keys, args)``: ``EVALSHA`` on a connection of the
        client's pool that the scripts keep.

        What ``client.register_script(lua)(keys=…, args=…)`` sends, without redis-py's
        wrapping of each command (the script object, the retry and observability
        layers, the pool's lock and events on each borrowing): a quarter of a
        commit's time. Before each call a connection the server closed (or holding
        unread data) is made afresh (redis-py's pool skips that check when its
        maintenance notifications are on, as by default), and the connection's own
        methods disconnect it on any error or cancellation mid-command, as
        ``execute_command`` relies on. A server that lost the script
        (``NOSCRIPT``: a restart, ``SCRIPT FLUSH``) gets it loaded and asked again.
        """
        sha = hashlib.sha1(lua.encode("utf-8"), usedforsecurity=False).hexdigest()
        pool: Any = self.client.connection_pool  # untyped in redis-py
        idle = self._idle

        async def call(keys: list[str], args: list[Any]) -> Any:
            if idle:
                conn = idle.pop()
            else:  # kept from now on: the client's closing closes it
                conn = await (pool.get_connection("EVALSHA") if _NAMED else pool.get_connection())
            try:
                if conn.is_connected and await _stale(conn):
                    # Closed by the server (EOF) or holding bytes nobody asked for.
                    await conn.disconnect()  # the send connects afresh
                try:
                    return await _ask(conn, "EVALSHA", sha, len(keys), *keys, *args)
                except rexc.NoScriptError:
                    await _ask(conn, "SCRIPT", "LOAD", lua)
                    return await _ask(conn, "EVALSHA", sha, len(keys), *keys, *args)
            finally:
                idle.append(conn)

        return call


def _needs_command_name() -> bool:
    """Whether this redis-py's pool wants a command name (before 5.3; deprecated since)."""
    found = inspect.signature(aioredis.ConnectionPool.get_connection).parameters.get("command_name")
    return found is not None and found.default is inspect.Parameter.empty


_NAMED = _needs_command_name()
# Whether a connection has bytes to read or was closed: ``can_read`` from redis-py 8
# on (``can_read_destructive`` deprecated), ``can_read_destructive`` before.
_CAN_READ = "can_read" if hasattr(AbstractConnection, "can_read") else "can_read_destructive"


async def _stale(conn: Any) -> bool:
    """Whether a kept connection was closed by the server or holds unread bytes.

    Before redis-py 8.2 ``can_read`` answered True for a connection the server had
    closed; 8.2 raises ``ConnectionError`` instead (having disconnected it). Both
    mean the same here: make it afresh.
    """
    try:
        return bool(await getattr(conn, _CAN_READ)())
    except (rexc.ConnectionError, OSError):
        return True


async def _ask(conn: Any, *command: Any) -> Any:
    """One command on ``conn`` and its reply (a ``ResponseError`` reply is raised)."""
    await conn.send_packed_command(pack(command))
    return await conn.read_response()


def pack(command: Sequence[Any]) -> bytes:
    """``command`` in the Redis protocol (RESP), as ``Connection.pack_command`` packs
    it, at a third of its cost (a commit sends some 25 arguments): ``str`` as UTF-8,
    ``int`` and ``float`` as their decimal text, ``bytes`` as they are.

    Raises:
        TypeError: an argument of another type (a bool among them).
    """
    out = [b"*%d\r\n" % len(command)]
    for arg in command:
        if isinstance(arg, str):
            data = arg.encode("utf-8")
        elif isinstance(arg, bytes):
            data = arg
        elif isinstance(arg, int | float) and not isinstance(arg, bool):
            data = repr(arg).encode("ascii")
        else:
            raise TypeError(f"a Redis argument must be str, bytes or a number, got {arg!r}")
        out.append(b"$%d\r\n%b\r\n" % (len(data), data))
    return b"".join(out)


class PerLoop(_runtime.PerLoop[Connection]):
    """One :class:`Connection` per running event loop."""

    def __init__(self, url: str, *, socket_timeout: float, connect_timeout: float) -> None:
        super().__init__(
            url, Connection, socket_timeout=socket_timeout, connect_timeout=connect_timeout
        )
