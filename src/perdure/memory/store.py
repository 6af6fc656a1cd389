"""The MemoryStore protocol and the capability probe that reads it.

A store must implement :meth:`MemoryStore.search`; ``add``, ``add_messages``,
``initialize`` and ``get_tools`` are optional. Implementations usually subclass
:class:`MemoryStore` to say so — and thereby inherit the protocol's stub methods.
:func:`has_method` tells a real implementation from an inherited stub, so a store
that subclasses the protocol but does not implement ``add`` is not writable.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from perdure.memory.entry import MemoryEntry
from perdure.tools import AgentTool
from perdure.types import Message

__all__ = ["OPTIONAL_METHODS", "MemoryStore", "has_method", "is_writable", "store_name"]

OPTIONAL_METHODS = ("add", "add_messages", "initialize", "get_tools")


class MemoryStore(Protocol):
    """A long-term memory backend: a vector database, a knowledge base, a local file.

    Every coroutine may be awaited from any event loop and any thread.

    Attributes:
        name: how results and tools refer to the store; defaults to the class name
            when absent. Names must be unique among one manager's stores.
    """

    name: str

    async def search(self, query: str, *, limit: int) -> list[MemoryEntry]:
        """Return at most ``limit`` entries relevant to ``query``, best first (required)."""
        ...

    async def add(self, content: str, *, metadata: dict[str, Any] | None = None) -> None:
        """Remember ``content`` (optional).

        Extraction is at least once, so a store must tolerate receiving the same
        content twice.
        """
        ...

    async def add_messages(
        self, messages: Sequence[Message], *, metadata: dict[str, Any] | None = None
    ) -> None:
        """Remember what matters in a stretch of conversation, the store's own way (optional).

        Must tolerate receiving the same messages twice (extraction is at least once).
        """
        ...

    async def initialize(self) -> None:
        """Prepare the store (open files, resolve remote resources, check configuration).

        Optional; the manager awaits it once when it attaches to an agent.
        """
        ...

    def get_tools(self) -> Sequence[AgentTool]:
        """Extra tools the store offers the model (optional)."""
        return ()


def has_method(store: object, name: str) -> bool:
    """True when ``store``'s class really implements method ``name``.

    A method inherited unchanged from :class:`MemoryStore`'s stub counts as absent,
    and so does a missing or non-callable attribute. The probe reads the class, not
    the instance, like the interpreter does for special methods.
    """
    method = getattr(type(store), name, None)
    if method is None:
        return False
    if method is getattr(MemoryStore, name, None):
        return False
    return callable(method)


def is_writable(store: object) -> bool:
    """True when ``store`` implements ``add`` or ``add_messages``."""
    return has_method(store, "add") or has_method(store, "add_messages")


def store_name(store: object) -> str:
    """The store's ``name`` attribute when it is a non-empty str, else its class name."""
    name = getattr(store, "name", None)
    if isinstance(name, str) and name:
        return name
    return type(store).__name__
