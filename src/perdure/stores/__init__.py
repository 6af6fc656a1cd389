"""The session-store backends: each one only moves bytes or rows (SPEC §7).

- :mod:`perdure.stores.file` — :class:`FileSessionStore`: one directory per session,
  an append-only hash-chained journal (:mod:`perdure.stores.file.journal`, the format).
- :mod:`perdure.stores.sqlite` — :class:`SQLiteSessionStore` (and its checkpoint store).
- :mod:`perdure.stores.memory` — :class:`MemorySessionStore`, for tests.
- :mod:`perdure.stores.postgres` — :class:`PostgresSessionStore` and
  :class:`PostgresCheckpointStore` (``perdure[postgres]``).

The rules every store obeys — what a commit appends or replaces, conflicts, encoding,
chain hashing, paging — live once in :mod:`perdure.session.rules`; a store calls them
and says what it guarantees after a return and after a crash. Import the stores from
:mod:`perdure.session`.
"""
