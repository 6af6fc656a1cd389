"""The PostgreSQL backends (``perdure[postgres]``): sessions and their checkpoints.

- :mod:`.sessions` — :class:`PostgresSessionStore`, a row per message;
- :mod:`.checkpoints` — :class:`PostgresCheckpointStore`;
- :mod:`.leases` — the writer leases (one writer per session across machines);
- :mod:`.schema` — their tables and version.

The connection pool, the schema's creation and version, and the translation of
psycopg's errors are shared by every PostgreSQL backend: they live in layer 0
(:mod:`perdure._runtime.postgres`). Importing this package imports psycopg.
"""

from __future__ import annotations

from perdure.stores.postgres.checkpoints import PostgresCheckpointStore
from perdure.stores.postgres.sessions import PostgresSessionStore

__all__ = ["PostgresCheckpointStore", "PostgresSessionStore"]
