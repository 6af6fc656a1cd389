"""Long-term memory: stores, the MemoryManager plugin, extraction, and a local store.

A :class:`MemoryManager` searches one or more :class:`MemoryStore` objects, injects
what it finds into model calls (ephemerally, see :mod:`perdure.injection`), offers
the model ``search_memory`` / ``add_memory`` tools, and can distil the conversation
into memories in the background. :class:`LocalMemoryStore` keeps memories in a
SQLite file with full-text (BM25) and optional embedding search.

Importing this package imports no optional dependency.
"""

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
    "default_format",
    "default_query",
    "has_method",
    "is_writable",
    "parse_facts",
]
