"""Reading, writing and collecting snapshot blobs on a :class:`~perdure.storage.Storage`.

Key layout under one agent's prefix ``sessions/<session_id>/agents/<agent_id>/``::

    latest                  snapshot_latest (mutable): a manifest, or on a storage
                            that appends, a log (:mod:`perdure.snapshots.log`)
    snapshots/<ULID>        manifest of one immutable snapshot
    chunks/<sha256 hex>     content-addressed chunk (immutable)

Order of writes: every chunk a manifest references is written (and durable) before
the manifest, so a crash at any point leaves each manifest pointing at chunks that
exist. A collection lists the chunks *first*, then reads every manifest and follows
its references, and deletes only chunks that none reaches; a chunk written after the
listing is never a candidate, and a crash mid-collection only leaves garbage that the
next collection removes.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from perdure._runtime.threads import ProcessLock
from perdure.errors import SessionCorruptedError
from perdure.snapshots.format import (
    Manifest,
    Part,
    encode_message,
    parse_chunk,
)
from perdure.snapshots.layout import ChainNode, Layout, SealedPart, TailEntry, copy_message
from perdure.snapshots.log import ABSENT, LatestEnd, Replay, end_of, parse_latest
from perdure.storage import Storage

__all__ = [
    "Loaded",
    "collect",
    "delete_all",
    "gather_map",
    "gc_paused",
    "list_all",
    "load",
    "reachable",
    "read_latest",
    "read_manifest",
    "write_chunks",
]

T = TypeVar("T")
A = TypeVar("A")
_CONCURRENCY = 16
_PAGE = 1000


_gc_lock = ProcessLock()
_gc_pauses = 0
_gc_was_enabled = False


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause CPython's cyclic garbage collector for a bulk decode; nestable, thread-safe.

    Restoring 10k messages allocates ~50k containers; each allocation burst triggers
    collections that walk the whole heap (measured: restore 45 ms → 50-130 ms). The
    decoded JSON holds no reference cycles, so nothing is lost by collecting after.
    Collection resumes when the last pause ends (if it was enabled before the first).
    """
    global _gc_pauses, _gc_was_enabled
    with _gc_lock:
        if _gc_pauses == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pauses += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pauses -= 1
            if _gc_pauses == 0 and _gc_was_enabled:
                gc.enable()


async def gather_map(fn: Callable[[A], Awaitable[T]], items: Iterable[A]) -> list[T]:
    """Return ``[await fn(item) for item in items]``, running 16 at a time."""
    todo = list(items)
    results: list[T] = []
    for start in range(0, len(todo), _CONCURRENCY):
        batch = todo[start : start + _CONCURRENCY]
        results.extend(await asyncio.gather(*(fn(item) for item in batch)))
    return results


async def list_all(storage: Storage, prefix: str) -> list[str]:
    """Return every key under ``prefix``, paging through ``Storage.list``."""
    keys: list[str] = []
    cursor: str | None = None
    while True:
        page = await storage.list(prefix, limit=_PAGE, start_after=cursor)
        keys.extend(page)
        if len(page) < _PAGE:
            return keys
        cursor = page[-1]


async def read_manifest(storage: Storage, key: str) -> Manifest | None:
    """Read and verify the manifest (or log) under ``key``; ``None`` if there is none."""
    blob = await storage.read(key)
    return None if blob is None else parse_latest(blob, key)[0]


async def read_latest(
    storage: Storage, key: str
) -> tuple[Manifest | None, Replay | None, LatestEnd]:
    """Read ``latest``: its manifest, its replay when it is a log, and how it ends.

    Raises:
        SessionCorruptedError: it is damaged.
        SnapshotError: it is of an unknown format version.
    """
    blob = await storage.read(key)
    if blob is None:
        return None, None, ABSENT
    manifest, replayed = parse_latest(blob, key)
    return manifest, replayed, end_of(blob) if replayed is None else replayed.end


async def _read_chunk(storage: Storage, prefix: str, sha: str) -> dict[str, Any]:
    key = f"{prefix}chunks/{sha}"
    blob = await storage.read(key)
    if blob is None or len(blob) < 4096:
        return parse_chunk(blob, sha, key)
    # Inflating and hashing release the GIL: big chunks are parsed in parallel.
    return await asyncio.to_thread(parse_chunk, blob, sha, key)


@dataclass
class Loaded:
    """A manifest read back: its fields, the full history, and the writer layout."""

    manifest: Manifest
    fields: dict[str, Any]
    messages: list[Any]
    layout: Layout
    refs: set[str]


def _corrupt(key: str, why: str) -> SessionCorruptedError:
    return SessionCorruptedError(f"snapshot {key!r} is damaged: {why}")


async def load(storage: Storage, prefix: str, key: str, manifest: Manifest) -> Loaded:
    """Read every chunk ``manifest`` references and reassemble the agent's data.

    Each chunk's SHA-256 is checked against its name and each count against the
    manifest; the result is exactly what was saved.

    Raises:
        SessionCorruptedError: a chunk is missing or damaged, or counts disagree.
        SnapshotError: a chunk is of an unknown format version.
    """

    async def read(sha: str) -> dict[str, Any]:
        return await _read_chunk(storage, prefix, sha)

    refs: set[str] = set()
    if manifest.fields is not None:
        fields = manifest.fields
    else:
        assert manifest.fields_ref is not None
        fields = (await _read_chunk(storage, prefix, manifest.fields_ref))["fields"]
        refs.add(manifest.fields_ref)
    if manifest.parts is not None:
        top: list[Part] = manifest.parts
    else:
        assert manifest.index_ref is not None
        top = (await _read_chunk(storage, prefix, manifest.index_ref))["parts"]
        refs.add(manifest.index_ref)

    # Expand the tree one level at a time (all nodes of a level read concurrently).
    frontier = list(top)
    while any(level > 0 for level, _, _ in frontier):
        inner = [part for part in frontier if part[0] > 0]
        bodies = await gather_map(read, [sha for _, _, sha in inner])
        children: dict[str, list[Part]] = {}
        for (level, count, sha), body in zip(inner, bodies, strict=True):
            refs.add(sha)
            if body.get("kind") != "node" or body["level"] != level:
                raise _corrupt(key, f"chunk {sha} is not a level-{level} node")
            kids = [(level - 1, c, s) for c, s in body["parts"]]
            if sum(c for _, c, _ in kids) != count:
                raise _corrupt(key, f"node {sha} does not hold {count} messages")
            children[sha] = kids
        frontier = [
            kid for part in frontier for kid in (children[part[2]] if part[0] > 0 else [part])
        ]

    bodies = await gather_map(read, [sha for _, _, sha in frontier])
    parts: list[SealedPart] = []
    for (_, count, sha), body in zip(frontier, bodies, strict=True):
        refs.add(sha)
        if body.get("kind") != "messages" or len(body["messages"]) != count:
            raise _corrupt(key, f"chunk {sha} does not hold {count} messages")
        parts.append(SealedPart(sha, body["messages"]))

    chain: list[ChainNode] = []
    chain_messages: list[list[Any]] = []
    link = manifest.chain_ref
    while link is not None:
        if len(chain) > 100_000:
            raise _corrupt(key, "its tail chain does not end")
        body = await _read_chunk(storage, prefix, link)
        if body.get("kind") != "tail":
            raise _corrupt(key, f"chunk {link} is not a tail link")
        refs.add(link)
        chain.append(ChainNode(link, len(body["messages"]), body["prev"]))
        chain_messages.append(body["messages"])
        link = body["prev"]
    chain.reverse()
    chain_messages.reverse()

    skip = manifest.skip
    while parts and skip >= len(parts[0].messages):
        skip -= len(parts.pop(0).messages)
    if skip and not parts:
        raise _corrupt(key, f"skip {manifest.skip} is beyond its sealed messages")
    messages: list[Any] = []
    for i, part in enumerate(parts):
        messages.extend(part.messages[skip:] if i == 0 else part.messages)
    sealed = len(messages)
    for delta in chain_messages:
        messages.extend(delta)
    messages.extend(manifest.inline)
    if len(messages) != manifest.count:
        raise _corrupt(key, f"it holds {len(messages)} messages, not {manifest.count}")
    tail = [
        TailEntry(m, copy_message(m), encode_message(m, sealed + i))
        for i, m in enumerate(messages[sealed:])
    ]
    layout = Layout(parts=parts, skip=skip, tail=tail, chain=chain)
    return Loaded(manifest, fields, messages, layout, refs | layout.refs())


async def write_chunks(storage: Storage, prefix: str, chunks: dict[str, bytes]) -> None:
    """Write ``chunks`` (sha → blob) under ``prefix``; all are durable on return."""

    async def write(item: tuple[str, bytes]) -> None:
        await storage.write(f"{prefix}chunks/{item[0]}", item[1])

    await gather_map(write, list(chunks.items()))


async def _children(
    storage: Storage, prefix: str, sha: str, kind: str, cache: dict[str, list[tuple[str, str]]]
) -> list[tuple[str, str]]:
    """Return ``(kind, sha)`` of what chunk ``sha`` references (immutable: cached)."""
    if sha in cache:
        return cache[sha]
    body = await _read_chunk(storage, prefix, sha)
    found: list[tuple[str, str]] = []
    if body["kind"] == "node":
        child = "node" if body["level"] > 1 else "messages"
        found = [(child, s) for _, s in body["parts"]]
    elif body["kind"] == "index":
        found = [("node" if level else "messages", s) for level, _, s in body["parts"]]
    elif body["kind"] == "tail":
        found = [] if body["prev"] is None else [("tail", body["prev"])]
    if body["kind"] != kind and not (kind == "node" and body["kind"] == "index"):
        raise SessionCorruptedError(
            f"snapshot chunk {prefix}chunks/{sha} is a {body['kind']!r} chunk, "
            f"referenced as {kind!r}"
        )
    cache[sha] = found
    return found


async def reachable(
    storage: Storage, prefix: str, cache: dict[str, list[tuple[str, str]]]
) -> set[str]:
    """Return every chunk sha that the agent's manifests (latest and snapshots) reach.

    Raises:
        SessionCorruptedError: a manifest or an inner chunk is unreadable — the caller
            must then delete nothing.
    """
    keys = [f"{prefix}latest", *await list_all(storage, f"{prefix}snapshots/")]

    async def read(key: str) -> Manifest | None:
        return await read_manifest(storage, key)

    manifests = await gather_map(read, keys)

    async def children(item: tuple[str, str]) -> list[tuple[str, str]]:
        return await _children(storage, prefix, item[1], item[0], cache)

    seen: set[str] = set()
    pending: list[tuple[str, str]] = []
    for manifest in manifests:
        if manifest is None:
            continue
        if manifest.fields_ref is not None:
            pending.append(("fields", manifest.fields_ref))
        if manifest.index_ref is not None:
            pending.append(("index", manifest.index_ref))
        for level, _, sha in manifest.parts or []:
            pending.append(("node" if level else "messages", sha))
        if manifest.chain_ref is not None:
            pending.append(("tail", manifest.chain_ref))
    while pending:
        batch = [(kind, sha) for kind, sha in dict.fromkeys(pending) if sha not in seen]
        pending = []
        seen.update(sha for _, sha in batch)
        inner = [(kind, sha) for kind, sha in batch if kind in ("node", "index", "tail")]
        found = await gather_map(children, inner)
        for kids in found:
            pending.extend(kids)
    return seen


async def collect(
    storage: Storage, prefix: str, cache: dict[str, list[tuple[str, str]]]
) -> set[str]:
    """Delete the agent's chunks that no manifest reaches; return their shas.

    Safe against crashes at any point (see the module docstring). Not safe against a
    save of the same agent running at the same time in another process: that save's
    new chunks are unreferenced until its manifest lands and could be deleted.

    Raises:
        SessionCorruptedError: some manifest or inner chunk is damaged; nothing is
            deleted.
    """
    listed = await list_all(storage, f"{prefix}chunks/")
    present = {key.rsplit("/", 1)[1] for key in listed}
    keep = await reachable(storage, prefix, cache)
    doomed = sorted(present - keep)

    async def delete(sha: str) -> None:
        await storage.delete(f"{prefix}chunks/{sha}")

    await gather_map(delete, doomed)
    for sha in doomed:
        cache.pop(sha, None)
    return set(doomed)


async def delete_all(storage: Storage, prefix: str) -> int:
    """Delete every key under ``prefix``, manifests before chunks; return the count.

    A crash part-way leaves manifests that are complete, or chunks without manifests
    (garbage), never a manifest without its chunks.
    """
    keys = await list_all(storage, prefix)
    manifests = [key for key in keys if "/chunks/" not in key]
    chunks = [key for key in keys if "/chunks/" in key]
    for group in (manifests, chunks):
        await gather_map(storage.delete, group)
    return len(keys)
