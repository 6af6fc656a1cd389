"""MemoryEntry: one piece of long-term memory, as a store returns it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["MemoryEntry"]


@dataclass(frozen=True)
class MemoryEntry:
    """One memory found by a search.

    Attributes:
        content: the remembered text.
        store_name: the store it came from; the :class:`MemoryManager` sets it.
        metadata: what the store keeps beside the text (JSON-compatible), or None.
        score: the store's relevance score (higher is better; only comparable
            within one store's results), or None.
    """

    content: str
    store_name: str | None = None
    metadata: dict[str, Any] | None = field(default=None, hash=False)
    score: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.content, str):
            raise TypeError(f"content must be a str, got {type(self.content).__name__}")
        if self.store_name is not None and not isinstance(self.store_name, str):
            raise TypeError(f"store_name must be a str or None, got {self.store_name!r}")
        if self.metadata is not None and not isinstance(self.metadata, dict):
            raise TypeError(f"metadata must be a dict or None, got {type(self.metadata).__name__}")
        if self.score is not None and (
            isinstance(self.score, bool) or not isinstance(self.score, int | float)
        ):
            raise TypeError(f"score must be a number or None, got {self.score!r}")
