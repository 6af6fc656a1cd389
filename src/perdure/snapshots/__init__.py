"""The snapshot manager (SPEC §8): :class:`SnapshotSessionManager` and its chunked format.

- :mod:`~perdure.snapshots.manager` — the manager (seed 003's API, kept exactly).
- :mod:`~perdure.snapshots.format` — the record format; :mod:`~perdure.snapshots.layout`
  — which parts a save writes; :mod:`~perdure.snapshots.io` — reading and writing them
  through a :class:`~perdure.storage.Storage`.
"""
