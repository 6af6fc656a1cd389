"""Configuration objects of the MemoryManager; each checks its arguments when built."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perdure.injection import Trigger, check_trigger
from perdure.memory.entry import MemoryEntry
from perdure.types import Message

if TYPE_CHECKING:
    from perdure.memory.extraction import Extractor

__all__ = [
    "DEFAULT_MAX_ENTRIES",
    "DEFAULT_MAX_SEARCH_RESULTS",
    "ExtractionConfig",
    "MemoryAddToolConfig",
    "MemoryInjectionConfig",
    "MemoryToolConfig",
]

DEFAULT_MAX_SEARCH_RESULTS = 3
"""How many entries each store returns to one search, unless told otherwise."""

DEFAULT_MAX_ENTRIES = 5
"""How many entries are injected into one model call, unless told otherwise."""

_TOOL_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


def _check_tool_name(name: object) -> None:
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    if not 1 <= len(name) <= 64 or not set(name) <= _TOOL_NAME_CHARS:
        raise ValueError(f"name {name!r} must match ^[a-zA-Z0-9_-]{{1,64}}$")


def _check_description(description: object) -> None:
    if description is not None and (not isinstance(description, str) or not description.strip()):
        raise ValueError(f"description must be a non-empty str or None, got {description!r}")


def _check_store_names(stores: object, argument: str = "stores") -> tuple[str, ...] | None:
    if stores is None:
        return None
    if isinstance(stores, str | bytes) or not isinstance(stores, Sequence):
        raise TypeError(f"{argument} must be a list of store names or None, got {stores!r}")
    names = tuple(stores)
    if not names:
        raise ValueError(f"{argument} must name at least one store (or be None for all)")
    for name in names:
        if not isinstance(name, str) or not name:
            raise TypeError(f"{argument} must hold non-empty str store names, got {name!r}")
    return names


def _check_positive_int(value: object, argument: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{argument} must be an int >= 1, got {value!r}")


@dataclass(frozen=True)
class MemoryToolConfig:
    """The ``search_memory`` tool the model can call.

    Attributes:
        name: the tool's name.
        description: what the model is told the tool does (None: a default).
        stores: names of the stores it searches (None: all).
        max_results: entries per store when the model gives no ``limit``.
    """

    name: str = "search_memory"
    description: str | None = None
    stores: Sequence[str] | None = None
    max_results: int = DEFAULT_MAX_SEARCH_RESULTS

    def __post_init__(self) -> None:
        _check_tool_name(self.name)
        _check_description(self.description)
        object.__setattr__(self, "stores", _check_store_names(self.stores))
        _check_positive_int(self.max_results, "max_results")


@dataclass(frozen=True)
class MemoryAddToolConfig:
    """The ``add_memory`` tool the model can call.

    Attributes:
        name: the tool's name.
        description: what the model is told the tool does (None: a default).
        stores: names of the writable stores it writes to (None: every writable
            store).
    """

    name: str = "add_memory"
    description: str | None = None
    stores: Sequence[str] | None = None

    def __post_init__(self) -> None:
        _check_tool_name(self.name)
        _check_description(self.description)
        object.__setattr__(self, "stores", _check_store_names(self.stores))


@dataclass(frozen=True)
class MemoryInjectionConfig:
    """How found memories are injected into model calls.

    Attributes:
        max_entries: at most this many entries per call.
        query: ``(messages) -> str | None`` choosing the search query; None: the
            adaptive default (the latest user text on a user turn, else the latest
            assistant text). Returning ``None`` or ``""`` skips injection.
        format: ``(entries) -> str | None`` rendering the entries; None: the
            escaped ``<memory>`` block.
        trigger: when to inject: ``"user_turn"`` (default), ``"every_turn"`` or a
            predicate over :class:`~perdure.injection.InjectionContext`.
        stores: names of the stores searched (None: all).
        max_results_per_store: entries asked of each store.
    """

    max_entries: int = DEFAULT_MAX_ENTRIES
    query: Callable[[list[Message]], str | None] | None = None
    format: Callable[[list[MemoryEntry]], str | None] | None = None
    trigger: Trigger = "user_turn"
    stores: Sequence[str] | None = None
    max_results_per_store: int = DEFAULT_MAX_SEARCH_RESULTS

    def __post_init__(self) -> None:
        _check_positive_int(self.max_entries, "max_entries")
        _check_positive_int(self.max_results_per_store, "max_results_per_store")
        if self.query is not None and not callable(self.query):
            raise TypeError(f"query must be callable or None, got {type(self.query).__name__}")
        if self.format is not None and not callable(self.format):
            raise TypeError(f"format must be callable or None, got {type(self.format).__name__}")
        check_trigger(self.trigger)
        object.__setattr__(self, "stores", _check_store_names(self.stores))


MEMORY_OUTBOX = ":memory:"
"""``ExtractionConfig(outbox=MEMORY_OUTBOX)``: keep the buffer in memory (lost on a crash)."""


@dataclass(frozen=True)
class ExtractionConfig:
    """Background extraction of memories from the conversation, for one store.

    Messages added to the agent's history are buffered in a durable outbox; when a
    trigger fires they are distilled in the background — by ``extractor`` (its
    facts go to the store's ``add``) or, without one, by the store's own
    ``add_messages`` — and removed from the outbox only once the store accepted
    them. A crash in between means they are extracted again after a restart (at
    least once), so stores must tolerate duplicates.

    Attributes:
        extractor: an :class:`~perdure.memory.Extractor`, or a
            :class:`~perdure.models.Model` (wrapped in a
            :class:`~perdure.memory.ModelExtractor`), or None to hand the messages
            to the store's ``add_messages``.
        every_n_messages: extract whenever this many messages are buffered.
        on_invocation_end: extract at the end of every invocation.
        outbox: the SQLite file holding buffered messages. None: next to a
            :class:`~perdure.memory.LocalMemoryStore` (in its own file), required
            for other stores; ``":memory:"`` opts out of durability.
        batch_size: at most this many messages per extraction call.
    """

    extractor: Extractor | Any | None = None
    every_n_messages: int | None = None
    on_invocation_end: bool = True
    outbox: str | os.PathLike[str] | None = None
    batch_size: int = 50

    def __post_init__(self) -> None:
        from perdure.memory.extraction import as_extractor

        object.__setattr__(self, "extractor", as_extractor(self.extractor))
        if self.every_n_messages is not None:
            _check_positive_int(self.every_n_messages, "every_n_messages")
        if not isinstance(self.on_invocation_end, bool):
            raise TypeError(
                f"on_invocation_end must be a bool, got {type(self.on_invocation_end).__name__}"
            )
        if self.every_n_messages is None and not self.on_invocation_end:
            raise ValueError(
                "ExtractionConfig needs a trigger: set every_n_messages or on_invocation_end=True"
            )
        if self.outbox is not None and not isinstance(self.outbox, str | os.PathLike):
            raise TypeError(f"outbox must be a path, ':memory:' or None, got {self.outbox!r}")
        if isinstance(self.outbox, str) and not self.outbox:
            raise ValueError("outbox must not be an empty path")
        _check_positive_int(self.batch_size, "batch_size")

    @property
    def outbox_path(self) -> Path | None:
        """The outbox file, or None when in memory or not chosen."""
        if self.outbox is None or self.outbox == MEMORY_OUTBOX:
            return None
        return Path(self.outbox)
