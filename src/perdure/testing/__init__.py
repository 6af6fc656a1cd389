"""Conformance suites every backend runs, perdure's own and third parties' (SPEC §7).

fsspec's abstract tests are the model: subclass a suite in a ``Test*`` class of your
own test module and give it the one fixture it names; pytest then runs the whole
contract against your backend. The suites are ``Test``-free base classes, so pytest
never collects them on their own.

- :class:`SessionStoreSuite` — a ``SessionStore``; fixture ``store_factory``.
- :class:`StorageSuite` — a ``Storage``; fixture ``storage_factory``.
- :class:`CheckpointStoreSuite` — a ``CheckpointStore``; fixture
  ``checkpoint_store_factory``.
- :class:`MemoryStoreSuite` — a writable ``MemoryStore``; fixture
  ``memory_store_factory``.

This package imports pytest and hypothesis; ``import perdure`` never imports it.
See ``docs/testing.md`` for a worked example.
"""

from __future__ import annotations

from perdure.testing.sessions import SessionStoreSuite
from perdure.testing.storage import StorageSuite

__all__ = ["CheckpointStoreSuite", "MemoryStoreSuite", "SessionStoreSuite", "StorageSuite"]
