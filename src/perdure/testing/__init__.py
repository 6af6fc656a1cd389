"""Conformance suites every backend runs, perdure's own and third parties' (SPEC §7).

fsspec's abstract tests are the model: subclass a suite in a ``Test*`` class of your
own test module and give it the one fixture it names; pytest then runs the whole
contract against your backend. The suites are ``Test``-free base classes, so pytest
never collects them on their own.

- :class:`SessionStoreSuite` — a ``SessionStore``; fixture ``store_factory``.
- :class:`StorageSuite` — a ``Storage``; fixture ``storage_factory``;
  :class:`AppendStorageSuite` the same for an ``AppendStorage``.
- :class:`ConditionalStorageSuite` — a ``ConditionalStorage``; fixture
  ``storage_factory``.
- :class:`CipherStorageSuite` — a ``Storage`` built with ``cipher=``; fixture
  ``cipher_storage_factory``.
- :class:`CheckpointStoreSuite` — a ``CheckpointStore``; fixture
  ``checkpoint_store_factory``.
- :class:`MemoryStoreSuite` — a writable ``MemoryStore``; fixture
  ``memory_store_factory``.
- :class:`CrashSuite` — a ``SessionStore`` under SIGKILL; fixture ``crash_target``.
- :class:`CorruptionSuite` — a ``SessionStore`` with files; fixture
  ``corruption_target``.

This package imports pytest and hypothesis; ``import perdure`` never imports it.
See ``docs/testing.md`` for a worked example.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from perdure.testing.checkpoints import CheckpointStoreSuite as CheckpointStoreSuite
    from perdure.testing.corruption import CorruptionSuite as CorruptionSuite
    from perdure.testing.corruption import CorruptionTarget as CorruptionTarget
    from perdure.testing.crash import CrashSuite as CrashSuite
    from perdure.testing.crash import CrashTarget as CrashTarget
    from perdure.testing.memory import MemoryStoreSuite as MemoryStoreSuite
    from perdure.testing.sessions import SessionStoreSuite as SessionStoreSuite
    from perdure.testing.storage import AppendStorageSuite as AppendStorageSuite
    from perdure.testing.storage import CipherStorageSuite as CipherStorageSuite
    from perdure.testing.storage import ConditionalStorageSuite as ConditionalStorageSuite
    from perdure.testing.storage import StorageSuite as StorageSuite

# Loaded on first use: the crash suite's writer process imports this package and
# must start fast, without pytest and hypothesis.
_EXPORTS: dict[str, str] = {
    "AppendStorageSuite": "perdure.testing.storage",
    "CheckpointStoreSuite": "perdure.testing.checkpoints",
    "CipherStorageSuite": "perdure.testing.storage",
    "ConditionalStorageSuite": "perdure.testing.storage",
    "CorruptionSuite": "perdure.testing.corruption",
    "CorruptionTarget": "perdure.testing.corruption",
    "CrashSuite": "perdure.testing.crash",
    "CrashTarget": "perdure.testing.crash",
    "MemoryStoreSuite": "perdure.testing.memory",
    "SessionStoreSuite": "perdure.testing.sessions",
    "StorageSuite": "perdure.testing.storage",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'perdure.testing' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
