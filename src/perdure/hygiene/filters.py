"""Persistence filters: what is written is what the filters make of it (SPEC §9).

A persistence filter is any callable that takes a :class:`PersistedItem` — one
value about to be written, with what it is (``kind``) and where it goes
(``write``) — and returns the value to store in its place::

    def drop_reasoning(item: PersistedItem) -> Any:
        if item.kind == "message":
            content = [b for b in item.value["content"] if "reasoningContent" not in b]
            return {**item.value, "content": content}
        return item.value

Pass a list as ``filters=[...]`` to :class:`~perdure.session.Session`,
:class:`~perdure.SnapshotSessionManager` or
:class:`~perdure.memory.MemoryManager`. :class:`~perdure.hygiene.PIIRedactor` is
one.

What a filter sees (``kind``, and the type of ``value`` it receives and must return):

- ``"message"``: one message (a dict, SPEC §2). Every message perdure writes:
  committed to a session store, copied into a checkpoint, exported, saved in a
  snapshot, buffered for memory extraction.
- ``"agent_state"``: the agent's persisted state other than messages (a dict:
  ``Session`` writes its state document — ``state``, ``internal_state`` with the
  interrupts and model state, ``conversation_manager_state``; a snapshot its
  fields). Its shape must survive: change values, not the keys perdure reads.
- ``"memory_entry"``: the text of a memory about to be added to a memory store (a
  str), by ``MemoryManager.add``, the ``add_memory`` tool or extraction.

``write`` says where it goes: ``"session"``, ``"checkpoint"``, ``"export"``,
``"snapshot"``, ``"memory"`` or ``"extraction"`` (the durable buffer of messages
waiting to be extracted into memories).

Guarantees:

- Filters compose: each one receives what the one before it returned.
- A filter runs before anything of the write reaches the store. One that raises,
  or returns a value of the wrong type, fails the write with
  :class:`~perdure.errors.FilterFailedError` (code ``filter_failed``): nothing of
  it is written. Its error says which filter, on what kind, and the exception's
  type — never the value, so no content reaches a log through it.
- The live agent keeps the original for the rest of its turn; what it reads back
  after a resume, a restore or a compaction is the filtered version.
- Filters must be pure and idempotent: a value already stored passes through them
  again whenever it is written again (a checkpoint copies the stored session, a
  restore writes a checkpoint back, a compaction rewrites the history).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from perdure.errors import FilterFailedError

__all__ = [
    "FilterChain",
    "ItemKind",
    "PersistedItem",
    "PersistenceFilter",
    "WriteTarget",
    "check_filters",
]

ItemKind = Literal["message", "agent_state", "memory_entry"]
"""What a :class:`PersistedItem` holds."""

WriteTarget = Literal["session", "checkpoint", "export", "snapshot", "memory", "extraction"]
"""Where a :class:`PersistedItem` is written."""


@dataclass(frozen=True)
class PersistedItem:
    """One value about to be written, as a persistence filter receives it.

    Attributes:
        kind: what ``value`` is (see the module docstring).
        value: the value, as the previous filter left it; never change it in
            place: return a new one.
        write: where it goes.
        session_id: the session it belongs to (``None`` for memory entries).
    """

    kind: ItemKind
    value: Any
    write: WriteTarget
    session_id: str | None = None


@runtime_checkable
class PersistenceFilter(Protocol):
    """Maps a value about to be written to the value to store (see the module docstring)."""

    def __call__(self, item: PersistedItem) -> Any:
        """The value to store in place of ``item.value`` (of the same type)."""
        ...


_TYPES: dict[str, tuple[type, ...]] = {
    "message": (Mapping,),
    "agent_state": (Mapping,),
    "memory_entry": (str,),
}


def check_filters(filters: Iterable[PersistenceFilter] | None) -> tuple[PersistenceFilter, ...]:
    """``filters`` as a tuple, each checked callable (``None``: no filters).

    Raises:
        TypeError: ``filters`` is not a list of callables (the message names it).
    """
    if filters is None:
        return ()
    if isinstance(filters, str | bytes) or callable(filters) or not isinstance(filters, Iterable):
        raise TypeError(
            f"filters must be a list of persistence filters, got {type(filters).__name__}"
        )
    checked = tuple(filters)
    for index, one in enumerate(checked):
        if not callable(one):
            raise TypeError(
                f"filters[{index}] must be callable (a PersistenceFilter), got {type(one).__name__}"
            )
    return checked


class FilterChain:
    """Runs a list of filters over what a writer is about to write.

    ``bool(chain)`` is false when there are no filters: a writer then skips all of
    this (and copies nothing).
    """

    __slots__ = ("filters",)

    def __init__(self, filters: Iterable[PersistenceFilter] | None) -> None:
        self.filters = check_filters(filters)

    def __bool__(self) -> bool:
        return bool(self.filters)

    def __repr__(self) -> str:
        return f"FilterChain({list(self.filters)!r})"

    def apply(
        self, kind: ItemKind, value: Any, write: WriteTarget, session_id: str | None = None
    ) -> Any:
        """``value`` through every filter in order.

        Raises:
            FilterFailedError: a filter raised or returned a value of the wrong type.
        """
        expected = _TYPES[kind]
        for index, one in enumerate(self.filters):
            try:
                value = one(PersistedItem(kind, value, write, session_id))
            except Exception as exc:
                raise FilterFailedError(
                    f"persistence filter {index} ({_name(one)}) raised {type(exc).__name__} "
                    f"on a {kind} written to {write}; nothing was written",
                    details={"filter": index, "kind": kind, "write": write},
                ) from exc
            if not isinstance(value, expected):
                raise FilterFailedError(
                    f"persistence filter {index} ({_name(one)}) returned a "
                    f"{type(value).__name__} for a {kind} written to {write}, expected "
                    f"{' or '.join(t.__name__ for t in expected)}; nothing was written",
                    details={"filter": index, "kind": kind, "write": write},
                )
        return value

    def message(self, message: Any, write: WriteTarget, session_id: str | None = None) -> Any:
        """One message through the filters (see :meth:`apply`)."""
        return self.apply("message", message, write, session_id)

    def messages(
        self, messages: Iterable[Any], write: WriteTarget, session_id: str | None = None
    ) -> list[Any]:
        """Every message through the filters (see :meth:`apply`)."""
        return [self.apply("message", m, write, session_id) for m in messages]

    def state(self, state: Any, write: WriteTarget, session_id: str | None = None) -> Any:
        """Agent state through the filters (see :meth:`apply`)."""
        return self.apply("agent_state", state, write, session_id)


def _name(one: Callable[..., Any]) -> str:
    return getattr(one, "__qualname__", None) or type(one).__name__
