"""How an agent's messages map onto chunks, and what one save must write (pure).

A save never rewrites the whole history. The messages are laid out as::

    [ sealed level-0 chunks (immutable, ~64 KiB each) ][ open tail ]
      ^ the first ``skip`` messages of the first chunk were trimmed away

* **Sealed chunks** are written once. A tree of ``node`` chunks (fan-out
  :data:`FANOUT`) sits over them, so a manifest holds O(FANOUT × log n) references.
* **The open tail** is what came after the last seal. ``snapshot_latest`` carries it
  inline, so a save of ``latest`` is one small blob write (plus, once every
  :data:`SEAL_BYTES` / :data:`SEAL_MESSAGES`, one new chunk and a few nodes).
* **Immutable snapshots** must not copy the tail each time: they point at a chain of
  ``tail`` chunks, each holding only the messages added since the previous snapshot.
  After :data:`CHAIN_DEPTH` links the tail is sealed, so reading a snapshot follows at
  most that many links.

:class:`Layout` is the writer's memory of what it last wrote (or read): for sealed
chunks it keeps the message *objects* and matches them by identity (cheap: perdure
replaces a message rather than editing it); for the open tail it keeps deep copies
and matches by value, so an in-place edit of a recent message is saved too. Any
mismatch falls back to re-sealing from the first changed message; a trimmed prefix
(a conversation manager dropping old messages) only moves ``skip``.
"""

from __future__ import annotations

import copy
import operator
from dataclasses import dataclass, field
from typing import Any

from perdure.snapshots.format import (
    Part,
    encode_message,
    messages_chunk,
    node_chunk,
    sha256_hex,
    tail_chunk,
)

__all__ = [
    "CHAIN_DEPTH",
    "FANOUT",
    "SEAL_BYTES",
    "SEAL_MESSAGES",
    "ChainNode",
    "Layout",
    "SavePlan",
    "SealedPart",
    "TailEntry",
    "TailLists",
    "build_tree",
    "copy_message",
    "plan_save",
]

SEAL_BYTES = 64 * 1024
"""The open tail is sealed into a chunk once its messages reach this many JSON bytes."""

SEAL_MESSAGES = 512
"""…or this many messages."""

CHAIN_DEPTH = 32
"""Most ``tail`` links an immutable snapshot may need; past it the tail is sealed."""

FANOUT = 16
"""Children per tree node."""


@dataclass
class SealedPart:
    """A level-0 chunk: its sha256 and the message objects it holds (in order)."""

    sha: str
    messages: list[Any]


@dataclass
class TailEntry:
    """An open-tail message: the agent's object, a deep copy to compare, its JSON."""

    obj: Any
    copy: Any
    encoded: bytes


@dataclass(frozen=True)
class ChainNode:
    """A ``tail`` chunk: its sha256, how many messages it adds, its predecessor."""

    sha: str
    count: int
    prev: str | None


@dataclass(frozen=True)
class TailLists:
    """An open tail's objects, copies and encodings as lists, and its encoded size.

    What a save compares the agent's messages with, kept from one save to the next
    (extended, not rebuilt, when messages are only appended).
    """

    objs: list[Any]
    copies: list[Any]
    encoded: list[bytes]
    size: int

    @classmethod
    def of(cls, tail: list[TailEntry]) -> TailLists:
        """The lists of ``tail``."""
        encoded = [entry.encoded for entry in tail]
        return cls(
            [entry.obj for entry in tail],
            [entry.copy for entry in tail],
            encoded,
            sum(map(len, encoded)),
        )

    def extended(self, added: list[TailEntry]) -> TailLists:
        """These lists with ``added`` at the end (new lists; these stay as they are)."""
        more = TailLists.of(added)
        return TailLists(
            self.objs + more.objs,
            self.copies + more.copies,
            self.encoded + more.encoded,
            self.size + more.size,
        )


@dataclass
class Layout:
    """What the writer last stored (or read) for one agent; see the module docstring.

    ``chain`` covers the first ``sum(node.count)`` entries of ``tail``.
    """

    parts: list[SealedPart] = field(default_factory=list)
    skip: int = 0
    tail: list[TailEntry] = field(default_factory=list)
    chain: list[ChainNode] = field(default_factory=list)
    _tree: tuple[list[SealedPart], tuple[str, ...], list[Part], dict[str, bytes]] | None = None
    _sealed: list[Any] | None = None
    _lists: TailLists | None = None

    def sealed(self) -> list[Any]:
        """The sealed messages in history order (after ``skip``), memoized."""
        if self._sealed is None:
            flat = [m for part in self.parts for m in part.messages]
            self._sealed = flat[self.skip :]
        return self._sealed

    def tail_lists(self) -> TailLists:
        """The open tail as parallel lists, and its size (memoized)."""
        if self._lists is None:
            self._lists = TailLists.of(self.tail)
        return self._lists

    def tree(self) -> tuple[list[Part], dict[str, bytes]]:
        """Return the tree top over :attr:`parts` and every node blob (memoized)."""
        memo = self._tree
        if memo is not None and memo[0] is self.parts:  # lists of parts are never changed
            return memo[2], memo[3]
        key = tuple(part.sha for part in self.parts)
        if memo is None or memo[1] != key:
            top, nodes = build_tree([(len(part.messages), part.sha) for part in self.parts])
            memo = (self.parts, key, top, nodes)
        else:
            memo = (self.parts, key, memo[2], memo[3])
        self._tree = memo
        return memo[2], memo[3]

    def refs(self) -> set[str]:
        """Every chunk this layout points at (sealed chunks, tree nodes, chain links)."""
        _, nodes = self.tree()
        return {part.sha for part in self.parts} | set(nodes) | {n.sha for n in self.chain}

    @staticmethod
    def tail_entry(message: Any, index: int, *, owned: bool = False) -> TailEntry:
        """Make a :class:`TailEntry` for ``message`` at position ``index``.

        ``owned``: the message is never edited in place (its caller made it and keeps
        it to itself), so it is its own copy to compare with.
        """
        copied = message if owned else copy_message(message)
        return TailEntry(message, copied, encode_message(message, index))


def copy_message(message: Any) -> Any:
    """A deep copy of ``message``, to compare it with later (value for value).

    Dicts and lists are copied, the immutable values inside them (strings, numbers,
    bytes, ``None``) shared, as :func:`copy.deepcopy` would, three times as fast;
    anything else (a tuple, a ``bytearray``, a subclass) takes :func:`copy.deepcopy`.
    Sharing the strings also keeps the later comparison fast (equal by identity).
    """
    kind = type(message)
    if kind is dict:
        return {key: copy_message(value) for key, value in message.items()}
    if kind is list:
        return [copy_message(value) for value in message]
    if kind in _SHARED:
        return message
    return copy.deepcopy(message)


_SHARED = frozenset({str, int, float, bool, bytes, type(None)})


def build_tree(level0: list[tuple[int, str]]) -> tuple[list[Part], dict[str, bytes]]:
    """Group level-0 chunks into a deterministic tree; return its top and node blobs.

    Every :data:`FANOUT` consecutive references of a level become one node of the
    next level, from the start; what is left over at each level stays in the top
    list, highest level (earliest messages) first. The same chunks always give the
    same nodes, so nodes are shared between saves.
    """
    nodes: dict[str, bytes] = {}
    leftovers: list[tuple[int, list[tuple[int, str]]]] = []
    level = 0
    current = level0
    while True:
        full = len(current) // FANOUT * FANOUT
        leftovers.append((level, current[full:]))
        if not full:
            break
        parents: list[tuple[int, str]] = []
        for start in range(0, full, FANOUT):
            group = current[start : start + FANOUT]
            blob = node_chunk(level + 1, group)
            sha = sha256_hex(blob)
            nodes[sha] = blob
            parents.append((sum(count for count, _ in group), sha))
        current = parents
        level += 1
    top: list[Part] = []
    for lvl, rest in reversed(leftovers):
        top.extend((lvl, count, sha) for count, sha in rest)
    return top, nodes


@dataclass
class SavePlan:
    """What one save writes: ``chunks`` (sha → blob) first, then a manifest of these."""

    layout: Layout
    chunks: dict[str, bytes]
    count: int
    top: list[Part]
    chain_ref: str | None
    inline: list[bytes]
    dropped: set[str]


def _realign(
    layout: Layout, messages: list[Any]
) -> tuple[list[SealedPart], int, list[TailEntry], list[ChainNode]]:
    """Find where the old layout's messages now start (a trimmed prefix), by identity."""
    if not messages:
        return [], 0, [], []
    first = messages[0]
    for i, part in enumerate(layout.parts):
        start = layout.skip if i == 0 else 0
        for offset in range(start, len(part.messages)):
            if part.messages[offset] is first:
                return layout.parts[i:], offset, layout.tail, layout.chain
    for offset, entry in enumerate(layout.tail):
        if entry.obj is first:
            return [], 0, layout.tail[offset:], layout.chain if offset == 0 else []
    return [], 0, [], []


def plan_save(
    old: Layout | None, messages: list[Any], *, snapshot: bool, owned: bool = False
) -> SavePlan:
    """Work out the chunks and manifest content for saving ``messages``.

    Args:
        old: The layout of the previous save or restore (``None``: nothing stored yet).
        messages: The agent's history now (only read, and not kept: the caller may
            pass the agent's own list).
        snapshot: ``True`` for an immutable snapshot (the tail goes into a ``tail``
            chain link), ``False`` for ``snapshot_latest`` (the tail goes inline).
        owned: ``messages`` are only ever appended to, removed or replaced, never
            edited in place (an orchestrator's records, which the manager makes):
            new messages are not deep-copied, and the open tail compares by identity.

    Returns:
        The plan; ``old`` is not modified, so a failed write leaves it valid.

    Raises:
        SnapshotError: a new message is not JSON-serializable.
    """
    base = old or Layout()
    parts, skip, tail, chain = base.parts, base.skip, list(base.tail), list(base.chain)
    count = len(messages)
    sealed = base.sealed()

    # Fast path: nothing sealed changed (one C-level comparison, `is` short-cuts)
    # and, with nothing sealed, the tail still starts where it did.
    unmoved = bool(sealed) or not tail or (bool(messages) and messages[0] is tail[0].obj)
    intact = True  # the open tail is still base.tail, entry for entry
    if unmoved and messages[: len(sealed)] == sealed:
        pos = len(sealed)
        same_parts = True
    else:
        same_parts = False
        intact = False
        parts = [SealedPart(p.sha, p.messages) for p in base.parts]
        expected_first = parts[0].messages[skip] if parts else (tail[0].obj if tail else None)
        if expected_first is not None and (not messages or messages[0] is not expected_first):
            parts, skip, tail, chain = _realign(base, messages)
            parts = [SealedPart(p.sha, p.messages) for p in parts]
        # Find the first sealed chunk that changed; re-seal from there.
        pos = 0
        for i, part in enumerate(parts):
            start = skip if i == 0 else 0
            expected = part.messages[start:]
            window = messages[pos : pos + len(expected)]
            if window == expected:
                if start == 0:
                    part.messages = window  # keep the current objects for the next check
                pos += len(expected)
                continue
            parts = parts[:i]
            if i == 0:
                skip = 0
            tail, chain = [], []
            break

    # Open tail: compare by value against deep copies (catches in-place edits).
    lists = base.tail_lists() if intact else TailLists.of(tail)
    window = messages[pos : pos + len(tail)]
    if window != lists.copies:
        kept: list[TailEntry] = []
        for entry, current in zip(tail, window, strict=False):
            if current != entry.copy:
                break
            kept.append(entry)
        tail = kept
        intact = False
    if not all(map(operator.is_, window, lists.objs[: len(tail)])):
        tail = [
            entry if current is entry.obj else TailEntry(current, entry.copy, entry.encoded)
            for entry, current in zip(tail, window, strict=False)
        ]
        intact = False
    covered = 0
    chain_kept: list[ChainNode] = []
    for node in chain:
        if covered + node.count > len(tail):
            break
        chain_kept.append(node)
        covered += node.count
    chain = chain_kept
    added = [
        Layout.tail_entry(messages[index], index, owned=owned)
        for index in range(pos + len(tail), count)
    ]
    tail.extend(added)
    lists = lists.extended(added) if intact else TailLists.of(tail)

    # Seal full runs of the tail (and all of it when a snapshot's chain would get
    # too deep).
    chunks: dict[str, bytes] = {}
    pieces: list[tuple[int, int]] = []
    cut = acc_bytes = acc_count = 0
    if len(tail) >= SEAL_MESSAGES or lists.size >= SEAL_BYTES:
        for index, entry in enumerate(tail):
            acc_bytes += len(entry.encoded)
            acc_count += 1
            if acc_bytes >= SEAL_BYTES or acc_count >= SEAL_MESSAGES:
                pieces.append((cut, index + 1))
                cut, acc_bytes, acc_count = index + 1, 0, 0
    # A new link would be one too many:
    too_deep = len(chain) >= CHAIN_DEPTH and len(tail) > sum(node.count for node in chain)
    if snapshot and cut == 0 and too_deep:
        pieces.append((0, len(tail)))
        cut = len(tail)
    if pieces:
        parts = list(parts)
        same_parts = False
        for start, end in pieces:
            blob = messages_chunk([entry.encoded for entry in tail[start:end]])
            sha = sha256_hex(blob)
            chunks[sha] = blob
            if not parts:
                skip = 0
            parts.append(SealedPart(sha, [entry.obj for entry in tail[start:end]]))
        tail = tail[cut:]
        chain = []
        lists = TailLists.of(tail)

    chain_ref: str | None = None
    if snapshot:
        covered = sum(node.count for node in chain)
        if len(tail) > covered:
            prev = chain[-1].sha if chain else None
            blob = tail_chunk(prev, [entry.encoded for entry in tail[covered:]])
            sha = sha256_hex(blob)
            chunks[sha] = blob
            chain = [*chain, ChainNode(sha, len(tail) - covered, prev)]
        chain_ref = chain[-1].sha if chain else None

    layout = Layout(
        parts=parts,
        skip=skip,
        tail=tail,
        chain=chain,
        _tree=base._tree,
        _sealed=sealed if same_parts else None,
        _lists=lists,
    )
    top, nodes = layout.tree()
    same = layout._tree is base._tree and [n.sha for n in chain] == [n.sha for n in base.chain]
    chunks.update(nodes)
    return SavePlan(
        layout=layout,
        chunks=chunks,
        count=count,
        top=top,
        chain_ref=chain_ref,
        inline=[] if snapshot else lists.encoded,
        dropped=set() if old is None or same else base.refs() - layout.refs(),
    )
