"""Small MemoryStore implementations for the memory tests."""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Sequence
from typing import Any, ClassVar

from perdure.memory import MemoryEntry, MemoryStore
from perdure.types import Message


class ListStore(MemoryStore):
    """Keeps memories in a list; search returns those sharing a word with the query."""

    def __init__(self, name: str = "list", items: Sequence[str] = (), delay: float = 0.0):
        self.name = name
        self.items: list[str] = list(items)
        self.delay = delay
        self.queries: list[tuple[str, int]] = []
        self.initialized = 0

    async def initialize(self) -> None:
        self.initialized += 1

    async def search(self, query: str, *, limit: int) -> list[MemoryEntry]:
        self.queries.append((query, limit))
        if self.delay:
            await asyncio.sleep(self.delay)
        words = set(re.findall(r"\w+", query.lower()))
        found = [i for i in self.items if words & set(re.findall(r"\w+", i.lower()))]
        return [MemoryEntry(content=i, score=1.0) for i in found[: limit + 5]]  # too many

    async def add(self, content: str, *, metadata: dict[str, Any] | None = None) -> None:
        if content not in self.items:
            self.items.append(content)


class ReadOnlyStore(MemoryStore):
    """Search only: add and add_messages are the protocol's stubs."""

    name = "readonly"

    async def search(self, query: str, *, limit: int) -> list[MemoryEntry]:
        return [MemoryEntry(content="read-only fact", score=0.5)][:limit]


class FailingStore(MemoryStore):
    """Every call raises."""

    name = "failing"

    async def search(self, query: str, *, limit: int) -> list[MemoryEntry]:
        raise ConnectionError("store is down")

    async def add(self, content: str, *, metadata: dict[str, Any] | None = None) -> None:
        raise ConnectionError("store is down")


class MessagesStore(MemoryStore):
    """Writable only through add_messages (the store distils on its own)."""

    name = "messages"

    def __init__(self) -> None:
        self.batches: list[list[Message]] = []

    async def search(self, query: str, *, limit: int) -> list[MemoryEntry]:
        return []

    async def add_messages(
        self, messages: Sequence[Message], *, metadata: dict[str, Any] | None = None
    ) -> None:
        self.batches.append(list(messages))


class PlainStore:
    """Not a MemoryStore subclass: structural search only, no name attribute."""

    async def search(self, query: str, *, limit: int) -> list[MemoryEntry]:
        return [MemoryEntry(content=f"plain: {query}")]


class WordEmbedder:
    """A tiny deterministic embedder: words hashed into buckets, synonyms shared."""

    model_id = "test/word-buckets"
    dimension = 16
    SYNONYMS: ClassVar[dict[str, str]] = {
        "night": "dark",
        "theme": "mode",
        "scheme": "mode",
        "colour": "mode",
    }

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        vectors = []
        for text in texts:
            vector = [0.0] * self.dimension
            for word in text.lower().replace(".", " ").replace("?", " ").split():
                word = self.SYNONYMS.get(word, word)
                bucket = hashlib.sha256(word.encode()).digest()[0] % self.dimension
                vector[bucket] += 1.0
            norm = sum(v * v for v in vector) ** 0.5 or 1.0
            vectors.append([v / norm for v in vector])
        return vectors
