"""The checkpoint stores (SPEC §3.1, §7).

- :mod:`~perdure.checkpoints.store` — the :class:`CheckpointStore` protocol, the sealed
  record format, :class:`FileCheckpointStore` and :class:`MemoryCheckpointStore`.
- :mod:`~perdure.checkpoints.storage` — :class:`StorageCheckpointStore`, over any
  byte-blob :class:`~perdure.storage.Storage`.
- :mod:`~perdure.checkpoints.export` — the portable export format.

``SQLiteCheckpointStore`` lives beside its session store in :mod:`perdure.stores.sqlite`
(its rows share the database and the transaction). Import them from
:mod:`perdure.session`.
"""
