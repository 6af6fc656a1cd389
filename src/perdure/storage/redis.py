"""RedisStorage: blobs in Redis, with versions and conditional writes.

Four Redis keys per storage (``perdure[redis]``; the client per event loop is
:mod:`perdure._runtime.redis`'s), all under ``<prefix>{storage}:``::

    <prefix>{storage}:data   hash        key -> blob
    <prefix>{storage}:meta   hash        key -> "<version> <tag>"
    <prefix>{storage}:keys   sorted set  every key, score 0 (ordered by its bytes)
    <prefix>{storage}:seq    string      the last version given (INCR)

Guarantees:

- **Atomic writes.** Every change is one Lua script, which Redis runs alone: the
  blob, its version and its place in the key index change together, and a reader
  sees the old blob or the new one. Durability is the server's (AOF/RDB): a write
  acknowledged by a server that keeps nothing on disk is gone at its restart.
- **Versions** (:class:`~perdure.storage.ConditionalStorage`): every write takes the
  next number of the storage's counter (``INCR``), so a key never has a version
  twice, even once deleted and written again. :meth:`RedisStorage.write_if`
  compares and writes in the same script, so of two writers expecting one version
  exactly one succeeds, and a refused write changes nothing
  (:class:`~perdure.errors.StorageConflictError`).
- **Order**: Redis has no ordered scan of its keys, so the storage keeps a sorted
  set of its keys, all with score 0: ``ZRANGEBYLEX`` reads them compared byte by
  byte (``memcmp``) — by their UTF-8 bytes, which is Python's ``sorted`` for the
  keys allowed here — and ``list`` reads one range of it.
- **Cluster**: the four keys share the hash tag ``{storage}``, so each script
  touches one slot, as Redis Cluster requires. The price: a storage — its sorted
  set of keys above all — lives in **one slot, on one node**, and does not spread
  over a cluster; nor do several storages, whatever their prefixes (the tag is the
  same). On a cluster, size that node for every blob the storages hold.
- **Faults**: a server that cannot be reached raises
  :class:`~perdure.errors.StoreUnavailableError` after three attempts; reads, plain
  writes and deletes are simply sent again meanwhile (doing one twice leaves what
  doing it once does). A conditional write whose connection was lost finds out
  whether it was applied from the ``tag`` (a random token each write names itself
  with) stored beside the version: applied, it returns the version it made;
  provably not (the key still has the version it expected, or still none for a
  create), it is sent again; otherwise another writer moved the key on, and it
  raises ``StorageConflictError`` with ``details["outcome"] == "unknown"``. A key of
  the storage holding another type raises
  :class:`~perdure.errors.SessionCorruptedError`; anything else
  :class:`~perdure.errors.StorageError` — never a redis-py exception.
- **Any loop, any thread**: one client per event loop, closed when its loop shuts
  down. The constructor does no I/O.
"""

from __future__ import annotations

import asyncio
import builtins
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions as rexc

from perdure._runtime.checks import check_seconds
from perdure._runtime.redis import UNAVAILABLE, PerLoop, where
from perdure.crypto import Cipher, check_cipher
from perdure.errors import (
    PerdureError,
    SessionCorruptedError,
    StorageConflictError,
    StorageError,
    StoreUnavailableError,
)
from perdure.storage.encrypted import open_blob, seal_blob
from perdure.storage.keys import (
    check_expected,
    counter_version,
    prefix_upper_bound,
    validate_key,
    validate_list_args,
    version_conflict,
)

__all__ = ["RedisStorage"]

_ATTEMPTS = 3

# KEYS: data meta keys seq. ARGV: key blob tag. Returns the new version.
_WRITE = """
local v = redis.call('INCR', KEYS[4])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], v .. ' ' .. ARGV[3])
redis.call('ZADD', KEYS[3], 0, ARGV[1])
return v
"""

# KEYS: data meta keys seq. ARGV: key blob tag expected ('' = the key must not exist).
# Returns {1, new version} or {0, the version found ('' = none)}. A key whose tag is
# this write's was written by an earlier send of it (a lost answer): {1, its version}.
_WRITE_IF = """
local m = redis.call('HGET', KEYS[2], ARGV[1])
local found = ''
if m then
  local tag
  found, tag = string.match(m, '^(%d+) (.+)$')
  if not found then return {0, '?'} end
  if tag == ARGV[3] then return {1, found} end
end
if found ~= ARGV[4] then return {0, found} end
local v = redis.call('INCR', KEYS[4])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], v .. ' ' .. ARGV[3])
redis.call('ZADD', KEYS[3], 0, ARGV[1])
return {1, v}
"""

# KEYS: data meta keys. ARGV: key.
_DELETE = """
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
return 1
"""

Script = Callable[..., Awaitable[Any]]


class _Connection:
    """A client on one loop, with the storage's scripts registered on it."""

    def __init__(self, client: aioredis.Redis) -> None:
        self.client = client
        self.write: Script = client.register_script(_WRITE)
        self.write_if: Script = client.register_script(_WRITE_IF)
        self.delete: Script = client.register_script(_DELETE)


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


class RedisStorage:
    """Blobs in Redis: atomic, versioned, listed in order (see the module docstring).

    Implements :class:`~perdure.storage.Storage` and
    :class:`~perdure.storage.ConditionalStorage`. One storage (one ``prefix``) is
    one Redis Cluster slot: its keys share the hash tag ``{storage}``.

    Args:
        url: a ``redis://``, ``rediss://`` or ``unix://`` URL (``redis://host:6379/0``).
        prefix: put before the storage's Redis keys (no braces); storages with
            different prefixes on one server are independent.
        socket_timeout: seconds to wait for an answer of the server.
        connect_timeout: seconds to wait for a connection.
        cipher: a :class:`~perdure.crypto.Cipher`: every blob is stored encrypted
            (:func:`~perdure.storage.encrypted.seal_blob`); a read of a blob that does
            not decrypt raises :class:`~perdure.errors.DecryptionError`.

    Raises:
        TypeError, ValueError: a bad argument (the message names it).
    """

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "perdure:",
        socket_timeout: float = 10.0,
        connect_timeout: float = 5.0,
        cipher: Cipher | None = None,
    ) -> None:
        self.cipher = check_cipher(cipher)
        if not isinstance(url, str) or not url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"url must be a redis://, rediss:// or unix:// URL, got {url!r}")
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
        if "{" in prefix or "}" in prefix:
            raise ValueError(f"prefix {prefix!r} must not contain '{{' or '}}' (hash tags)")
        self.url = url
        self.prefix = prefix
        self.server = where(url)
        self._clients = PerLoop(
            url,
            _Connection,
            socket_timeout=check_seconds("socket_timeout", socket_timeout),
            connect_timeout=check_seconds("connect_timeout", connect_timeout),
        )
        base = f"{prefix}{{storage}}:"
        self._data, self._meta, self._index, self._seq = (
            base + s for s in ("data", "meta", "keys", "seq")
        )
        self._keys = [self._data, self._meta, self._index, self._seq]

    def __repr__(self) -> str:
        return f"RedisStorage({self.server!r}, prefix={self.prefix!r})"

    async def aclose(self) -> None:
        """Close the running loop's connections (reopened on the next call)."""
        await self._clients.aclose()

    def close(self) -> None:
        """Close the connections of every loop (reopened on use); see
        :meth:`PerLoop.close <perdure._runtime.redis.PerLoop.close>`."""
        self._clients.close()

    # ------------------------------------------------------------------ Storage

    async def write(self, key: str, data: bytes) -> None:
        """Atomically replace the blob under ``key`` (a new version).

        Raises:
            ValueError: ``key`` is invalid.
            TypeError: ``data`` is not bytes.
            StoreUnavailableError: the server stayed away (``details["outcome"]``:
                ``"unknown"``: the write may have been applied).
        """
        validate_key(key)
        blob = seal_blob(self.cipher, data)
        tag = secrets.token_hex(8)
        await self._call(
            lambda c: c.write(keys=self._keys, args=[key, blob, tag]),
            f"writing {key!r}",
            resent=True,
        )

    async def read(self, key: str) -> bytes | None:
        """The blob under ``key``, or ``None`` when there is none."""
        validate_key(key)
        found = await self._call(lambda c: c.client.hget(self._data, key), f"reading {key!r}")
        return open_blob(self.cipher, None if found is None else bytes(found))

    async def delete(self, key: str) -> None:
        """Remove ``key`` (idempotent)."""
        validate_key(key)
        await self._call(
            lambda c: c.delete(keys=self._keys[:3], args=[key]),
            f"deleting {key!r}",
            resent=True,
        )

    async def list(
        self, prefix: str, *, limit: int | None = None, start_after: str | None = None
    ) -> builtins.list[str]:
        """The keys starting with ``prefix``, sorted by their UTF-8 bytes, after
        ``start_after`` (exclusive), at most ``limit`` of them."""
        validate_list_args(prefix, limit, start_after)
        if limit == 0:
            return []
        if start_after is not None and start_after >= prefix:
            low = b"(" + start_after.encode("utf-8")
        else:
            low = b"[" + prefix.encode("utf-8") if prefix else b"-"
        upper = prefix_upper_bound(prefix)
        high = b"+" if upper is None else b"(" + upper.encode("utf-8")
        page = (0, limit) if limit is not None else (None, None)
        found = await self._call(
            lambda c: c.client.zrangebylex(self._index, low, high, *page),
            f"listing {prefix!r}",
        )
        return [bytes(k).decode("utf-8") for k in found]

    # ------------------------------------------------------------------ ConditionalStorage

    async def version(self, key: str) -> str | None:
        """The version of the blob under ``key``, or ``None`` when there is none."""
        validate_key(key)
        meta = await self._call(
            lambda c: c.client.hget(self._meta, key), f"reading the version of {key!r}"
        )
        return None if meta is None else self._split(key, meta)[0]

    async def write_if(self, key: str, data: bytes, *, expected: str | None) -> str:
        """Replace the blob under ``key`` only if its version is ``expected``
        (``None``: only if there is none); return the new version.

        The comparison and the write are one script.

        Raises:
            StorageConflictError: the version is not ``expected``; nothing was
                written (``details["outcome"] == "unknown"`` when the connection was
                lost and the key moved on meanwhile: see the module docstring).
            ValueError: ``key`` is invalid.
            TypeError: ``data`` is not bytes, ``expected`` neither a str nor None.
            StoreUnavailableError: the server stayed away (``details["outcome"]``).
        """
        validate_key(key)
        blob = seal_blob(self.cipher, data)
        check_expected(expected)
        if expected is not None and counter_version(expected) is None:
            raise self._conflict(key, expected, "unknown version")
        tag = secrets.token_hex(8)
        args = [key, blob, tag, expected or ""]
        doing = f"writing {key!r} if its version is {expected}"
        for attempt in range(_ATTEMPTS):
            try:
                conn = await self._clients.get()
                reply = await conn.write_if(keys=self._keys, args=args)
            except UNAVAILABLE as exc:
                made = await self._resolve(key, tag, expected, exc)
                if made is not None:
                    return made
                if attempt + 1 == _ATTEMPTS:
                    error = self._translate(exc, doing)
                    error.details.update(key=key, outcome="not_applied")
                    raise error from exc
                await asyncio.sleep(0.1 * (attempt + 1))
                continue
            except Exception as exc:
                raise self._translate(exc, doing) from exc
            if int(reply[0]) == 1:
                return _text(reply[1])
            found = _text(reply[1])
            raise self._conflict(key, expected, found or None)
        raise AssertionError("unreachable")

    # ------------------------------------------------------------------ internals

    async def _call(self, work: Any, doing: str, *, resent: bool = False) -> Any:
        """Run ``work(connection)``, sent again (up to 3 times) when the connection
        is lost: only for work that is safe to repeat."""
        for attempt in range(_ATTEMPTS):
            try:
                conn = await self._clients.get()
                return await work(conn)
            except UNAVAILABLE as exc:
                if attempt + 1 == _ATTEMPTS:
                    error = self._translate(exc, doing)
                    if resent:
                        error.details["outcome"] = "unknown"
                    raise error from exc
                await asyncio.sleep(0.1 * (attempt + 1))
            except Exception as exc:
                raise self._translate(exc, doing) from exc
        raise AssertionError("unreachable")

    async def _resolve(
        self, key: str, tag: str, expected: str | None, cause: BaseException
    ) -> str | None:
        """After a lost connection: the version the write made, or None if it provably
        made none.

        Raises:
            StorageConflictError: the key moved on; whether the write was applied
                first cannot be told (``details["outcome"] == "unknown"``).
            StoreUnavailableError: the server did not come back (outcome unknown).
        """
        try:
            meta = await self._call(
                lambda c: c.client.hget(self._meta, key),
                f"checking whether the write of {key!r} was applied",
            )
        except StoreUnavailableError as exc:
            exc.details.update(key=key, outcome="unknown")
            raise exc from cause
        if meta is None:
            if expected is None:
                return None  # still no blob: the create was not applied
            found = None
        else:
            found, found_tag = self._split(key, meta)
            if found_tag == tag:
                return found
            if found == expected:
                return None  # still the version it expected: not applied
        raise self._conflict(key, expected, found, lost=True) from cause

    def _split(self, key: str, meta: Any) -> tuple[str, str]:
        version, _, tag = _text(meta).partition(" ")
        if counter_version(version) is None or not tag:
            raise SessionCorruptedError(
                f"Redis storage at {self.server}: the version of {key!r} reads "
                f"{_text(meta)[:40]!r}, not '<version> <tag>'",
                details={"server": self.server, "key": key, "kind": "bad_meta"},
            )
        return version, tag

    def _translate(self, exc: BaseException, doing: str) -> PerdureError:
        """perdure's error for a driver error (the caller raises it ``from exc``)."""
        details: dict[str, Any] = {"server": self.server, "prefix": self.prefix}
        if isinstance(exc, UNAVAILABLE):
            return StoreUnavailableError(
                f"Redis storage at {self.server}: {doing}: the server cannot be reached ({exc})",
                details=details,
            )
        if isinstance(exc, rexc.ResponseError) and str(exc).startswith("WRONGTYPE"):
            return SessionCorruptedError(
                f"Redis storage at {self.server}: {doing}: a key of the storage holds "
                f"the wrong type of value ({exc})",
                details={**details, "kind": "bad_meta"},
            )
        return StorageError(f"Redis storage at {self.server}: {doing}: {exc}", details=details)

    def _conflict(
        self, key: str, expected: str | None, found: str | None, *, lost: bool = False
    ) -> StorageConflictError:
        return version_conflict(f"Redis storage at {self.server}", key, expected, found, lost=lost)
