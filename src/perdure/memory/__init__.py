"""Long-term memory: stores, the MemoryManager plugin, extraction, and a local store.

A :class:`MemoryManager` searches one or more :class:`MemoryStore` objects, injects
what it finds into model calls (ephemerally, see :mod:`perdure.injection`), offers
the model ``search_memory`` / ``add_memory`` tools, and can distil the conversation
into memories in the background. :class:`LocalMemoryStore` keeps memories in a
SQLite file with full-text (BM25) and optional embedding search;
:class:`PostgresMemoryStore` keeps the same contract on PostgreSQL
(``perdure[postgres]``).

Importing this package imports no optional dependency (``PostgresMemoryStore``
imports psycopg when it is first named).
"""

import typing as _typing

from perdure._runtime.lazy import lazy_exports as _lazy_exports
from perdure.memory.config import (
    DEFAULT_MAX_ENTRIES,
    DEFAULT_MAX_SEARCH_RESULTS,
    ExtractionConfig,
    MemoryAddToolConfig,
    MemoryInjectionConfig,
    MemoryToolConfig,
)
from perdure.memory.embedder import Embedder, MiniLMEmbedder
from perdure.memory.entry import MemoryEntry
from perdure.memory.errors import MemoryStoreError, MemoryStoreLockedError
from perdure.memory.extraction import (
    DEFAULT_EXTRACTION_INSTRUCTIONS,
    Extractor,
    ModelExtractor,
    parse_facts,
)
from perdure.memory.local_store import LocalMemoryStore
from perdure.memory.manager import MemoryManager, default_format, default_query
from perdure.memory.outbox import ExtractionOutbox
from perdure.memory.store import MemoryStore, has_method, is_writable

if _typing.TYPE_CHECKING:
    from perdure.memory.postgres_store import PostgresMemoryStore as PostgresMemoryStore

__all__ = [
    "DEFAULT_EXTRACTION_INSTRUCTIONS",
    "DEFAULT_MAX_ENTRIES",
    "DEFAULT_MAX_SEARCH_RESULTS",
    "Embedder",
    "ExtractionConfig",
    "ExtractionOutbox",
    "Extractor",
    "LocalMemoryStore",
    "MemoryAddToolConfig",
    "MemoryEntry",
    "MemoryInjectionConfig",
    "MemoryManager",
    "MemoryStore",
    "MemoryStoreError",
    "MemoryStoreLockedError",
    "MemoryToolConfig",
    "MiniLMEmbedder",
    "ModelExtractor",
    "PostgresMemoryStore",
    "default_format",
    "default_query",
    "has_method",
    "is_writable",
    "parse_facts",
]

# Loaded on first use: the module imports psycopg.
__getattr__, __dir__ = _lazy_exports(
    __name__, {"PostgresMemoryStore": "perdure.memory.postgres_store"}
)
