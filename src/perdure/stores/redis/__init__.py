"""The Redis backend (``perdure[redis]``): live sessions and their checkpoints.

- :mod:`.sessions` — :class:`RedisSessionStore`, a list per session, commits as
  one Lua script, native TTL, writer leases;
- :mod:`.checkpoints` — the checkpoints beside it;
- :mod:`._client` — one redis-py asyncio client per event loop;
- :mod:`._scripts`, :mod:`._keys` — the Lua scripts, key names and errors.

Importing this package imports redis-py.
"""

from __future__ import annotations

from perdure.stores.redis.checkpoints import RedisCheckpointStore
from perdure.stores.redis.sessions import RedisSessionStore

__all__ = ["RedisCheckpointStore", "RedisSessionStore"]
