"""LangGraph's checkpointer on any perdure storage (``perdure[langgraph]``).

::

    from langgraph.graph import MessagesState, StateGraph
    from perdure.adapters.langgraph import PerdureSaver

    saver = PerdureSaver("sqlite:./graphs.db")  # file:DIR, postgresql://…, redis://…, s3://…
    graph = builder.compile(checkpointer=saver)
    graph.invoke({"messages": [...]}, {"configurable": {"thread_id": "user-42"}})

:class:`PerdureSaver` is a LangGraph ``BaseCheckpointSaver`` with the sync and async
methods (``put``, ``put_writes``, ``get_tuple``, ``list``, ``delete_thread`` and the
extended ``delete_for_runs``, ``copy_thread``, ``prune``) over a perdure
:class:`~perdure.storage.Storage` — a storage object, or a URL that
:func:`~perdure.storage.open_storage` opens (``file:``, ``sqlite:``, ``memory:``,
``postgresql://``, ``redis://``, ``s3://``). It passes the public
``langgraph-checkpoint-conformance`` suite, base and extended capabilities, on each
(``tests/adapters/test_langgraph_conformance.py``).

**What is stored, and how much.** LangGraph hands a saver the whole state at every
step (every channel's value) and says which channels changed (``new_versions``).
LangGraph's ``SqliteSaver`` stores the whole state each time, so a thread of N
messages costs O(N²) bytes. Here a checkpoint is one small *record* that names, per
channel, where its value is; only what changed is written:

- a value of up to :data:`INLINE_MAX` bytes once serialised (a counter, a branch
  marker, a short string) sits in the record itself;
- a larger value is one **content-addressed blob** per channel version (its key is
  the SHA-256 of its bytes; an unchanged channel's record entry names the same blob,
  and equal values share one);
- a ``list`` (``messages``) is cut into sealed runs of :data:`BIG_CHUNK_ITEMS`
  items, then of :data:`CHUNK_ITEMS`, each a content-addressed blob written once, and
  the record names them (32-byte digests) plus the last items (fewer than
  :data:`CHUNK_ITEMS`) inline. Appending a message writes one record of a few KB —
  and one new sealed chunk every :data:`CHUNK_ITEMS` messages, a big one every
  :data:`BIG_CHUNK_ITEMS` — never the history again.

Keys, under ``prefix`` (default ``langgraph``)::

    <prefix>/t/<thread>/c/<ns>/<checkpoint_id>          record
    <prefix>/t/<thread>/w/<ns>/<checkpoint_id>/<task>   pending writes of one task
    <prefix>/t/<thread>/b/<sha256 hex>                  content-addressed blob
    <prefix>/t/<thread>/g                               the thread's generation

(each ``<…>`` segment is ``_`` and the percent-encoded string, so any thread id,
namespace or task id makes a valid key). A ``put`` is one storage write in the
common case (plus a sealed chunk or a large value's blob when there is one), written
before the record that names it: a crash leaves an unused blob, never a record
naming a missing one. A ``put_writes`` is one write.

**Generations.** The first put into a thread writes its generation marker (a random
token) and every record names the generation it was written in; ``delete_thread``
deletes the marker first, and a record of an ended generation is never read. What a
saver remembers of a thread (blobs it stored, sealed chunks, unchanged channels'
references) belongs to one generation: it is dropped when the saver reads another
(``get_tuple`` and ``list`` read the marker, and every LangGraph run begins with
``get_tuple``). So a thread deleted by another process, between runs or during one,
never leaves a readable record naming a missing blob: a long-lived saver writes the
new generation whole, and what a run still writes into the ended one is never read.

**Integrity.** Every blob is checked on every read: a content-addressed blob against
its key, a record or writes blob against the SHA-256 in its header, and a record's
thread, namespace and id against its key. Damage — a flipped byte, a missing blob a
record names, a blob of the wrong kind, a checkpoint whose parent record is missing —
raises :class:`~perdure.errors.SessionCorruptedError` (``session_store_corrupted``, with
``details["key"]``; for a missing parent also ``thread_id``, ``checkpoint_id`` and
``parent``); nothing is skipped or read as empty. A parent deleted on purpose
(``prune``, ``delete_for_runs`` mark its children first) or by a ``delete_thread``
racing the read (the generation changed) is not an error.

**Writers.** Records are keyed by checkpoint id and blobs by content, so writers in
several processes never overwrite each other's checkpoints. ``put_writes`` merges
with what is stored for its task by a compare-and-set
(:class:`~perdure.storage.ConditionalStorage`, which every perdure backend is):
regular writes already stored are kept, special ones (errors, interrupts) replaced,
as LangGraph's own savers do. ``delete_thread``, ``prune``, ``delete_for_runs`` and
``copy_thread`` are one storage call per key, not transactions: a crash part-way
leaves some checkpoints deleted (records first, so never a record without its
blobs). ``prune`` and ``delete_for_runs`` collect the blobs no record names any
more; do not run them on a thread a graph is writing at the same time.

**Costs.** ``get_tuple`` without a ``checkpoint_id`` lists the namespace's records to
find the newest (one ``list`` call); ``delete_for_runs`` reads every record in the
storage (there is no index by run). Decoded chunks are cached (immutable, named by
their hash, checked once when read). A list item that is the very object the
channel's last list held, with the same attributes, keeps the bytes it was stored
with instead of being serialised again (so a step costs O(new items) in
serialisation); an item changed in place is seen by its attributes, but a change
deep inside one (a nested dict mutated in place) is not — LangGraph's reducers never
do that, they put new objects. The saver keeps the last list of the 256 threads it
wrote most recently for this.

**Event loops.** The async methods may be awaited from any event loop and thread;
the sync ones run on perdure's loop (:mod:`perdure._runtime.loop`), so a sync graph
(``graph.invoke``) works from any thread.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import re
import secrets
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterator, Sequence
from types import TracebackType
from typing import Any, NamedTuple

from perdure._runtime.loop import run_sync
from perdure.errors import SessionCorruptedError, StorageConflictError
from perdure.storage import ConditionalStorage, Storage, open_storage, validate_key
from perdure.storage.local_file import decode_segment, encode_segment

try:
    import ormsgpack
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import (
        WRITES_IDX_MAP,
        BaseCheckpointSaver,
        ChannelVersions,
        Checkpoint,
        CheckpointMetadata,
        CheckpointTuple,
        PendingWrite,
        get_checkpoint_id,
        get_checkpoint_metadata,
        writes_sort_key,
    )
    from langgraph.checkpoint.serde.base import SerializerProtocol
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "perdure.adapters.langgraph needs LangGraph: pip install 'perdure[langgraph]'"
    ) from exc

__all__ = ["BIG_CHUNK_ITEMS", "CHUNK_ITEMS", "INLINE_MAX", "PerdureSaver"]

CHUNK_ITEMS = 16
"""Items of a list channel per sealed, content-addressed chunk."""

BIG_CHUNK_ITEMS = 16 * CHUNK_ITEMS
"""Items per big chunk: every run of this many is sealed again as one blob, so a long
list reads in few blobs (1,000 items: 3 big chunks, up to 14 chunks and the tail)."""

INLINE_MAX = 512
"""Serialised values up to this many bytes sit in the checkpoint record itself."""

_PRUNE_STRATEGIES = ("keep_latest", "delete")

_RECORD = b"perdure-langgraph-checkpoint/1"
_WRITES = b"perdure-langgraph-writes/1"
_BLOB = b"perdure-langgraph-blob/1\n"
_GEN = b"perdure-langgraph-generation/1 "
_TOKEN = re.compile(rb"[0-9a-f]{32}")
_HEADER_LEN = {_RECORD: len(_RECORD) + 66, _WRITES: len(_WRITES) + 66}  # " <sha256>\n"
_CACHED_CHUNKS = 4096
_CACHED_REFS = 65536
_CACHED_LISTS = 256  # threads whose last list (and its items' bytes) a saver keeps
_KNOWN_MAX = 1 << 17
_CACHED_GENS = 65536
_PUT_WRITES_TRIES = 20
_BATCH = 64  # storage calls run together when many keys are deleted or copied

Typed = tuple[str, bytes]
"""A value as the serde stores it: its type tag and its bytes."""


class _Keys(NamedTuple):
    """A record's place: its thread, namespace and checkpoint id."""

    thread: str
    ns: str
    checkpoint_id: str


# ----------------------------------------------------------------------- formats (pure)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _seg(text: str) -> str:
    """One key segment for any string (``_`` keeps ``""`` a valid segment)."""
    return "_" + encode_segment(text)


_PLAIN = re.compile(r"_[A-Za-z0-9_-]*")


def _unseg(segment: str) -> str | None:
    """The string a :func:`_seg` segment encodes (``None``: not such a segment)."""
    if _PLAIN.fullmatch(segment):
        return segment[1:]  # nothing was escaped (uuids, most ids): the common case
    if not segment.startswith("_"):
        return None
    return decode_segment(segment[1:])


def _corrupt(key: str, why: str) -> SessionCorruptedError:
    return SessionCorruptedError(
        f"LangGraph checkpoint data at {key!r} is damaged: {why}",
        details={"key": key, "reason": why},
    )


def _pack(value: Any) -> bytes:
    return ormsgpack.packb(value)


def _unpack(body: bytes, key: str) -> Any:
    try:
        return ormsgpack.unpackb(body)
    except (ormsgpack.MsgpackDecodeError, ValueError, TypeError) as exc:
        raise _corrupt(key, f"its body does not decode ({exc})") from None


def _sealed(kind: bytes, body: Any) -> bytes:
    """``kind``, the SHA-256 of the packed ``body``, a newline, then the body."""
    packed = _pack(body)
    return kind + b" " + _sha(packed).encode("ascii") + b"\n" + packed


def _unseal(kind: bytes, blob: bytes, key: str) -> Any:
    """The body of a blob made by :func:`_sealed`, checked against its hash.

    Raises:
        SessionCorruptedError: the header, the hash or the body is wrong.
    """
    size = _HEADER_LEN[kind]
    head = blob[:size]
    if not head.startswith(kind + b" ") or head[-1:] != b"\n":
        raise _corrupt(key, f"it does not start with {kind.decode()!r}")
    packed = blob[size:]
    if _sha(packed).encode("ascii") != head[len(kind) + 1 : -1]:
        raise _corrupt(key, "its SHA-256 does not match its header")
    return _unpack(packed, key)


def _typed(value: Any, key: str) -> Typed:
    if (
        isinstance(value, list)
        and len(value) == 2
        and isinstance(value[0], str)
        and isinstance(value[1], bytes)
    ):
        return value[0], value[1]
    raise _corrupt(key, "a serialised value is not [type, bytes]")


def _typed_list(value: Any, key: str) -> list[Typed]:
    if not isinstance(value, list):
        raise _corrupt(key, "a list of serialised values is not a list")
    return [_typed(item, key) for item in value]


class _Record(NamedTuple):
    """A decoded checkpoint record (values still serialised)."""

    where: _Keys
    parent: str | None
    checkpoint: Typed
    metadata: Typed
    channels: dict[str, list[Any]]
    gen: str | None = None  # the thread's generation it was written in (None: older format)
    orphan: bool = False  # its parent was deleted on purpose (prune, delete_for_runs)


def _record_blob(where: _Keys, parent: str | None, checkpoint: Typed, metadata: Typed,
                 channels: dict[str, list[Any]], *, gen: str | None = None,
                 orphan: bool = False) -> bytes:  # fmt: skip
    body: dict[str, Any] = {
        "thread": where.thread,
        "ns": where.ns,
        "id": where.checkpoint_id,
        "parent": parent,
        "checkpoint": list(checkpoint),
        "metadata": list(metadata),
        "channels": channels,
    }
    if gen is not None:
        body["gen"] = gen
    if orphan:
        body["orphan"] = True
    return _sealed(_RECORD, body)


def _parse_record(blob: bytes, key: str, where: _Keys | None) -> _Record:
    body = _unseal(_RECORD, blob, key)
    if not isinstance(body, dict):
        raise _corrupt(key, "the record is not a map")
    try:
        found = _Keys(str(body["thread"]), str(body["ns"]), str(body["id"]))
        parent = body["parent"]
        channels = body["channels"]
        checkpoint = _typed(body["checkpoint"], key)
        metadata = _typed(body["metadata"], key)
    except KeyError as exc:
        raise _corrupt(key, f"the record has no {exc.args[0]!r}") from None
    gen = body.get("gen")
    orphan = body.get("orphan", False)
    if where is not None and found != where:
        raise _corrupt(key, f"the record is for {tuple(found)!r}, not {tuple(where)!r}")
    if parent is not None and not isinstance(parent, str):
        raise _corrupt(key, "the record's parent is not a string")
    if (gen is not None and not isinstance(gen, str)) or not isinstance(orphan, bool):
        raise _corrupt(key, "the record's generation or orphan mark is malformed")
    if not isinstance(channels, dict) or not all(
        isinstance(ref, list) and ref for ref in channels.values()
    ):
        raise _corrupt(key, "the record's channels are not a map of references")
    return _Record(found, parent, checkpoint, metadata, channels, gen, orphan)


def _gen_blob(token: str) -> bytes:
    return _GEN + token.encode("ascii") + b"\n"


def _parse_gen(blob: bytes, key: str) -> str:
    token = blob[len(_GEN) : -1]
    if not (blob.startswith(_GEN) and blob.endswith(b"\n") and _TOKEN.fullmatch(token)):
        raise _corrupt(key, "it is not a thread generation marker")
    return token.decode("ascii")


class _ThreadGone(Exception):
    """The thread was deleted (its generation ended) while it was being read."""


def _blob_shas(ref: list[Any]) -> list[str]:
    """The content-addressed blobs a channel reference names (hex SHA-256s)."""
    if ref[0] == "b":
        return [ref[1]]
    if ref[0] == "l":
        return [d.hex() for d in ref[1] if isinstance(d, bytes)]
    return []


class _SeenList(NamedTuple):
    """A list channel's last value as this saver stored it."""

    objects: list[Any]
    looks: list[Any]  # _look of each object then
    items: list[Typed]
    blocks: list[tuple[int, int, str]]  # its sealed chunks: (first item, items, sha)


_IMMUTABLE = (str, bytes, int, float, bool, type(None))


def _fields(item: Any) -> Any:
    """What :func:`_look` pictured of ``item``, as it is now (no copy)."""
    return item if isinstance(item, dict) else getattr(item, "__dict__", None)


def _look(item: Any) -> Any:
    """A shallow picture of ``item`` to tell whether it was changed in place since
    (``None``: no picture; the item is serialised again every time)."""
    if isinstance(item, _IMMUTABLE):
        return True
    if isinstance(item, dict):
        return dict(item)
    fields = getattr(item, "__dict__", None)
    return dict(fields) if isinstance(fields, dict) else None


# ------------------------------------------------------------------------------ saver


class PerdureSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpoint saver on a perdure storage.

    See the module docstring for the layout, the guarantees and the costs.

    Args:
        url_or_store: A :class:`~perdure.storage.Storage` (any perdure backend, or a
            third party's that passes perdure's storage suite), or a storage URL
            (``"sqlite:./graphs.db"``, ``"file:./data"``, ``"memory:"``,
            ``"postgresql://…"``, ``"redis://…"``, ``"s3://bucket/prefix"``); a
            storage opened from a URL is this saver's own and :meth:`close` closes it.
        prefix: The first key segments of everything this saver writes (a valid key).
        serde: LangGraph's serializer (default: LangGraph's ``JsonPlusSerializer``).

    Raises:
        TypeError: ``url_or_store`` is neither a storage nor a string.
        ValueError: a malformed URL or ``prefix``.
    """

    def __init__(
        self,
        url_or_store: Storage | str,
        *,
        prefix: str = "langgraph",
        serde: SerializerProtocol | None = None,
    ) -> None:
        super().__init__(serde=serde)
        validate_key(prefix, "prefix")
        if isinstance(url_or_store, str):
            self.storage: Storage = open_storage(url_or_store)
            self._owns_storage = True
        elif isinstance(url_or_store, Storage):
            self.storage = url_or_store
            self._owns_storage = False
        else:
            raise TypeError(
                "url_or_store must be a perdure Storage or a storage URL, "
                f"got {type(url_or_store).__name__}"
            )
        self.prefix = prefix
        self._conditional = isinstance(self.storage, ConditionalStorage)  # checked once
        self._chunks: OrderedDict[str, list[Typed]] = OrderedDict()  # sha -> checked items
        self._known: set[str] = set()  # blob keys known to be stored
        self._refs: dict[tuple[str, str, str, str], list[Any]] = {}  # (t, ns, ch, ver) -> ref
        self._lists: OrderedDict[tuple[str, str, str], _SeenList] = OrderedDict()
        # thread -> the generation the caches above hold for it (see _sync_gen)
        self._gens: OrderedDict[str, str] = OrderedDict()

    def __repr__(self) -> str:
        return f"PerdureSaver({self.storage!r}, prefix={self.prefix!r})"

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Close the storage if this saver opened it from a URL (else nothing)."""
        if self._owns_storage:
            close = getattr(self.storage, "close", None)
            if callable(close):
                close()

    def __enter__(self) -> PerdureSaver:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()

    async def __aenter__(self) -> PerdureSaver:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ keys

    def _thread_prefix(self, thread: str) -> str:
        return f"{self.prefix}/t/{_seg(thread)}/"

    def _record_key(self, where: _Keys) -> str:
        t = self._thread_prefix(where.thread)
        return f"{t}c/{_seg(where.ns)}/{_seg(where.checkpoint_id)}"

    def _writes_prefix(self, where: _Keys) -> str:
        t = self._thread_prefix(where.thread)
        return f"{t}w/{_seg(where.ns)}/{_seg(where.checkpoint_id)}/"

    def _gen_key(self, thread: str) -> str:
        return f"{self._thread_prefix(thread)}g"

    def _blob_key(self, thread: str, sha: str) -> str:
        return f"{self._thread_prefix(thread)}b/{sha}"

    def _parse_record_key(self, key: str) -> _Keys | None:
        """The place a record key names (``None``: not a record key of this saver)."""
        parts = key[len(self.prefix) + 1 :].split("/")
        if len(parts) != 5 or parts[0] != "t" or parts[2] != "c":
            return None
        thread, ns, checkpoint_id = _unseg(parts[1]), _unseg(parts[3]), _unseg(parts[4])
        if thread is None or ns is None or checkpoint_id is None:
            return None
        return _Keys(thread, ns, checkpoint_id)

    @staticmethod
    def _config_keys(config: RunnableConfig, where: str) -> tuple[str, str]:
        configurable = config.get("configurable") if isinstance(config, dict) else None
        if not isinstance(configurable, dict) or configurable.get("thread_id") is None:
            raise ValueError(f"{where}: config['configurable']['thread_id'] is required")
        return str(configurable["thread_id"]), str(configurable.get("checkpoint_ns") or "")

    @staticmethod
    def _config(where: _Keys) -> RunnableConfig:
        return {
            "configurable": {
                "thread_id": where.thread,
                "checkpoint_ns": where.ns,
                "checkpoint_id": where.checkpoint_id,
            }
        }

    # ------------------------------------------------------------------ storage

    async def _list_all(self, prefix: str) -> list[str]:
        return await self.storage.list(prefix)

    async def _delete_keys(self, keys: Sequence[str]) -> None:
        for start in range(0, len(keys), _BATCH):
            await asyncio.gather(*(self.storage.delete(k) for k in keys[start : start + _BATCH]))

    async def _store_blob(self, thread: str, blob: bytes) -> str:
        """Write a content-addressed blob unless it is known to be stored; its sha."""
        sha = _sha(blob)
        key = self._blob_key(thread, sha)
        if key not in self._known:
            if await self.storage.read(key) != blob:
                await self.storage.write(key, blob)
            self._remember(key)
        return sha

    def _remember(self, key: str) -> None:
        """Note a blob as stored (a bounded set: forgetting costs one read later)."""
        if len(self._known) >= _KNOWN_MAX:
            self._known.clear()
        self._known.add(key)

    async def _read_blob(self, thread: str, sha: str, record_key: str) -> Any:
        key = self._blob_key(thread, sha)
        blob = await self.storage.read(key)
        if blob is None:
            raise _corrupt(record_key, f"the blob {sha} it names is missing")
        if _sha(blob) != sha:
            raise _corrupt(key, "its SHA-256 does not match its key")
        if not blob.startswith(_BLOB):
            raise _corrupt(key, f"it does not start with {_BLOB.decode().strip()!r}")
        self._remember(key)
        return _unpack(blob[len(_BLOB) :], key)

    async def _chunk(self, thread: str, sha: str, record_key: str) -> list[Typed]:
        items = self._chunks.get(sha)
        if items is not None:
            self._chunks.move_to_end(sha)
            return items
        body = await self._read_blob(thread, sha, record_key)
        key = self._blob_key(thread, sha)
        if not (isinstance(body, list) and len(body) == 2 and body[0] == "chunk"):
            raise _corrupt(key, "it is not a chunk of list items")
        items = _typed_list(body[1], key)
        self._chunks[sha] = items
        if len(self._chunks) > _CACHED_CHUNKS:
            self._chunks.popitem(last=False)
        return items

    async def _read_record(self, key: str, where: _Keys | None) -> _Record | None:
        blob = await self.storage.read(key)
        return None if blob is None else _parse_record(blob, key, where)

    async def _exists(self, key: str) -> bool:
        if self._conditional:
            assert isinstance(self.storage, ConditionalStorage)
            return await self.storage.version(key) is not None
        return await self.storage.read(key) is not None

    # ------------------------------------------------------------------ generations
    #
    # A thread's generation is a random token in its marker key, made by the first put
    # into the thread and deleted first by delete_thread. A record carries the
    # generation it was written in and is seen only while that generation lasts, so a
    # delete_thread is over the moment its first call returns, for every process. A
    # saver's caches of what is stored (blobs, chunks, channel references) belong to
    # one generation of a thread: they are dropped when the saver sees another
    # (every run begins with get_tuple, which reads the marker). A record a saver
    # writes from stale caches names the generation they belong to — one that has
    # ended — and is never read.

    async def _read_gen(self, thread: str) -> str | None:
        """The thread's generation in storage (``None``: no marker)."""
        key = self._gen_key(thread)
        blob = await self.storage.read(key)
        return None if blob is None else _parse_gen(blob, key)

    async def _make_gen(self, thread: str) -> str:
        """The thread's generation, the marker written first if there is none."""
        key = self._gen_key(thread)
        for _ in range(_PUT_WRITES_TRIES):
            token = await self._read_gen(thread)
            if token is not None:
                return token
            token = secrets.token_hex(16)
            if not self._conditional:
                await self.storage.write(key, _gen_blob(token))
                return token
            assert isinstance(self.storage, ConditionalStorage)
            try:
                await self.storage.write_if(key, _gen_blob(token), expected=None)
                return token
            except StorageConflictError:
                continue  # another writer made it first: read theirs
        raise StorageConflictError(
            f"put: {key!r} kept changing under {_PUT_WRITES_TRIES} tries", details={"key": key}
        )

    def _sync_gen(self, thread: str, token: str | None) -> None:
        """Note the thread's generation seen in storage; a different one than the
        caches hold (or an unknown one) drops what the saver remembers of the thread."""
        if self._gens.get(thread) != token or token is None:
            self._forget(thread)
        if token is None:
            self._gens.pop(thread, None)
            return
        self._gens[thread] = token
        self._gens.move_to_end(thread)
        if len(self._gens) > _CACHED_GENS:
            self._gens.popitem(last=False)

    @staticmethod
    def _visible(record: _Record, token: str | None) -> bool:
        """Whether a record belongs to the thread's current generation (a record of
        the older format, without one, always does)."""
        return record.gen is None or record.gen == token

    async def _check_parent(
        self, record: _Record, key: str, listed: set[_Keys], token: str | None
    ) -> None:
        """Raise unless the record's parent is stored (or was deleted on purpose).

        Raises:
            _ThreadGone: the parent is missing because the thread was deleted since
                ``token`` was read.
            SessionCorruptedError: the parent is missing and the thread was not deleted.
        """
        where = record.where
        if record.parent is None or record.orphan:
            return
        parent = _Keys(where.thread, where.ns, record.parent)
        if parent in listed or await self._exists(self._record_key(parent)):
            return
        if await self._read_gen(where.thread) != token:
            raise _ThreadGone(where.thread)
        raise SessionCorruptedError(
            f"LangGraph checkpoint {where.checkpoint_id!r} of thread {where.thread!r} "
            f"names the parent {record.parent!r}, which is missing",
            details={
                "key": key,
                "thread_id": where.thread,
                "checkpoint_ns": where.ns,
                "checkpoint_id": where.checkpoint_id,
                "parent": record.parent,
                "reason": "its parent checkpoint is missing",
            },
        )

    # ------------------------------------------------------------------ values

    async def _ref(self, thread: str, ns: str, channel: str, value: Any) -> list[Any]:
        """Store a channel's value as needed; the reference a record keeps for it."""
        if type(value) is list:
            seen = self._lists.get((thread, ns, channel))
            items, looks = self._serialised_items(value, seen)
            previous = seen.items if seen else []
            known = {(start, size): sha for start, size, sha in seen.blocks} if seen else {}
            blocks: list[tuple[int, int, str]] = []
            start = 0
            for size in (BIG_CHUNK_ITEMS, CHUNK_ITEMS):
                while start + size <= len(items):
                    run = items[start : start + size]
                    sha = known.get((start, size))
                    if sha is None or previous[start : start + size] != run:
                        blob = _BLOB + _pack(["chunk", [list(item) for item in run]])
                        sha = await self._store_blob(thread, blob)
                    blocks.append((start, size, sha))
                    start += size
            self._lists[(thread, ns, channel)] = _SeenList(list(value), looks, items, blocks)
            self._lists.move_to_end((thread, ns, channel))
            if len(self._lists) > _CACHED_LISTS:
                self._lists.popitem(last=False)
            tail = items[start:]
            digests = [bytes.fromhex(sha) for _, _, sha in blocks]
            return ["l", digests, [list(item) for item in tail]]
        kind, data = self.serde.dumps_typed(value)
        if len(data) <= INLINE_MAX:
            return ["i", kind, data]
        blob = _BLOB + _pack(["value", kind, data])
        return ["b", await self._store_blob(thread, blob)]

    def _loads_items(self, items: list[Typed]) -> list[Any]:
        """The items decoded; msgpack items in one call, as the array their bytes make."""
        if all(kind == "msgpack" for kind, _ in items):
            count = len(items)
            head = bytes([0x90 | count]) if count < 16 else (
                b"\xdc" + count.to_bytes(2, "big") if count < 2**16
                else b"\xdd" + count.to_bytes(4, "big")
            )  # fmt: skip
            decoded = self.serde.loads_typed(("msgpack", head + b"".join(d for _, d in items)))
            if isinstance(decoded, list) and len(decoded) == count:
                return decoded
        return [self.serde.loads_typed(item) for item in items]

    def _serialised_items(
        self, value: list[Any], seen: _SeenList | None
    ) -> tuple[list[Typed], list[Any]]:
        """Each item serialised, and how it looked; an item that is the very object the
        last list of the channel held, looking the same, keeps its bytes from then."""
        items: list[Typed] = []
        looks: list[Any] = []
        objects: Sequence[Any] = seen.objects if seen is not None else ()
        for index, item in enumerate(value):
            if index < len(objects) and objects[index] is item:
                assert seen is not None
                look = seen.looks[index]
                if look is True or (look is not None and look == _fields(item)):
                    items.append(seen.items[index])
                    looks.append(look)  # the picture taken then is still true
                    continue
            items.append(self.serde.dumps_typed(item))
            looks.append(_look(item))
        return items, looks

    async def _value(self, thread: str, ref: list[Any], record_key: str) -> tuple[bool, Any]:
        """``(present, value)`` of a channel reference (``False`` for an empty channel)."""
        kind = ref[0]
        if kind == "i" and len(ref) == 3:
            typed = _typed(ref[1:], record_key)
            if typed[0] == "empty":
                return False, None
            return True, self.serde.loads_typed(typed)
        if kind == "b" and len(ref) == 2 and isinstance(ref[1], str):
            body = await self._read_blob(thread, ref[1], record_key)
            if not (isinstance(body, list) and len(body) == 3 and body[0] == "value"):
                raise _corrupt(self._blob_key(thread, ref[1]), "it is not a channel value")
            return True, self.serde.loads_typed(_typed(body[1:], record_key))
        if kind == "l" and len(ref) == 3 and isinstance(ref[1], list):
            if not all(isinstance(d, bytes) and len(d) == 32 for d in ref[1]):
                raise _corrupt(record_key, "a chunk reference is not a SHA-256 digest")
            chunks = await asyncio.gather(
                *(self._chunk(thread, digest.hex(), record_key) for digest in ref[1])
            )
            items = [item for chunk in chunks for item in chunk]
            items.extend(_typed_list(ref[2], record_key))
            return True, self._loads_items(items)
        raise _corrupt(record_key, f"a channel reference of unknown shape {kind!r}")

    # ------------------------------------------------------------------ tuples

    async def _pending_writes(self, where: _Keys) -> list[PendingWrite]:
        entries: list[tuple[tuple[str, str, int], PendingWrite]] = []
        for key in await self._list_all(self._writes_prefix(where)):
            blob = await self.storage.read(key)
            if blob is None:
                continue  # deleted since the listing
            task_id, stored = self._parse_writes(blob, key, where)
            for idx, (channel, typed, task_path) in stored.items():
                entries.append(
                    (
                        writes_sort_key(task_path, task_id, idx),
                        (task_id, channel, self.serde.loads_typed(typed)),
                    )
                )
        entries.sort(key=lambda entry: entry[0])
        return [write for _, write in entries]

    def _parse_writes(
        self, blob: bytes, key: str, where: _Keys
    ) -> tuple[str, dict[int, tuple[str, Typed, str]]]:
        body = _unseal(_WRITES, blob, key)
        try:
            found = _Keys(str(body["thread"]), str(body["ns"]), str(body["id"]))
            task_id = body["task"]
            rows = body["writes"]
        except (KeyError, TypeError) as exc:
            raise _corrupt(key, f"the writes blob lacks {exc}") from None
        if found != where or not isinstance(task_id, str) or not isinstance(rows, list):
            raise _corrupt(key, "the writes blob is not for this checkpoint")
        stored: dict[int, tuple[str, Typed, str]] = {}
        for row in rows:
            if not (
                isinstance(row, list)
                and len(row) == 5
                and isinstance(row[0], int)
                and isinstance(row[1], str)
                and isinstance(row[4], str)
            ):
                raise _corrupt(key, "a write is not [idx, channel, type, bytes, task_path]")
            stored[row[0]] = (row[1], _typed(row[2:4], key), row[4])
        return task_id, stored

    async def _tuple(self, record: _Record, key: str) -> CheckpointTuple:
        where = record.where
        checkpoint: Checkpoint = self.serde.loads_typed(record.checkpoint)
        values: dict[str, Any] = {}
        for channel, ref in record.channels.items():
            present, value = await self._value(where.thread, ref, key)
            if present:
                values[channel] = value
        parent = (
            self._config(_Keys(where.thread, where.ns, record.parent)) if record.parent else None
        )
        return CheckpointTuple(
            config=self._config(where),
            checkpoint={**checkpoint, "channel_values": values},
            metadata=self.serde.loads_typed(record.metadata),
            parent_config=parent,
            pending_writes=await self._pending_writes(where),
        )

    async def _record_places(self, thread: str, ns: str | None = None) -> list[_Keys]:
        prefix = f"{self._thread_prefix(thread)}c/"
        if ns is not None:
            prefix += f"{_seg(ns)}/"
        places = []
        for key in await self._list_all(prefix):
            where = self._parse_record_key(key)
            if where is not None:
                places.append(where)
        return places

    # ------------------------------------------------------------------ async API

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint ``config`` names (its newest when it names no id), or ``None``.

        Raises:
            SessionCorruptedError: its record, a blob it names or its writes are damaged.
            ValueError: ``config`` has no ``thread_id``.
        """
        thread, ns = self._config_keys(config, "get_tuple")
        checkpoint_id = get_checkpoint_id(config)
        if checkpoint_id:
            listed: set[_Keys] = set()
            places = [_Keys(thread, ns, checkpoint_id)]
            token = await self._read_gen(thread)
        else:
            places, token = await asyncio.gather(
                self._record_places(thread, ns), self._read_gen(thread)
            )
            listed = set(places)
            places.sort(key=lambda p: p.checkpoint_id, reverse=True)
        self._sync_gen(thread, token)
        for where in places:  # the newest of the thread's generation
            key = self._record_key(where)
            record = await self._read_record(key, where)
            if record is None or not self._visible(record, token):
                continue  # deleted since the listing, or of an ended generation
            try:
                await self._check_parent(record, key, listed, token)
            except _ThreadGone:
                return None
            return await self._tuple(record, key)
        return None

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Checkpoints newest first: of ``config``'s thread (and namespace, and id, if
        it names them), else of every thread; whose metadata has ``filter``'s items;
        older than ``before``'s checkpoint; at most ``limit``.

        Raises:
            SessionCorruptedError: a record, blob or writes blob read is damaged.
        """
        tokens: dict[str, str | None] = {}  # thread -> its generation, read once
        if config is not None:
            thread, _ = self._config_keys(config, "list")
            places, tokens[thread] = await asyncio.gather(
                self._record_places(thread), self._read_gen(thread)
            )
            self._sync_gen(thread, tokens[thread])
        else:
            places = await self._list_places(None)
        listed = set(places)  # every record of the threads, for the parents' check
        if config is not None:
            ns = config["configurable"].get("checkpoint_ns")
            wanted_id = get_checkpoint_id(config)
            places = [
                p
                for p in places
                if (ns is None or p.ns == ns) and (not wanted_id or p.checkpoint_id == wanted_id)
            ]
        before_id = get_checkpoint_id(before) if before else None
        if before_id:
            places = [p for p in places if p.checkpoint_id < before_id]
        places.sort(key=lambda p: p.checkpoint_id, reverse=True)
        gone: set[str] = set()  # threads deleted while they were being listed
        left = limit
        for where in places:
            if left is not None and left <= 0:
                return
            if where.thread in gone:
                continue
            if where.thread not in tokens:
                tokens[where.thread] = token = await self._read_gen(where.thread)
                self._sync_gen(where.thread, token)
            token = tokens[where.thread]
            key = self._record_key(where)
            record = await self._read_record(key, where)
            if record is None and await self._read_gen(where.thread) != token:
                gone.add(where.thread)  # deleted since the listing: the rest is going too
                continue
            if record is None or not self._visible(record, token):
                continue  # pruned since the listing, or of an ended generation
            try:
                await self._check_parent(record, key, listed, token)
            except _ThreadGone:
                gone.add(where.thread)
                continue
            if filter:
                metadata = self.serde.loads_typed(record.metadata)
                if not all(metadata.get(k) == v for k, v in filter.items()):
                    continue
            if left is not None:
                left -= 1
            yield await self._tuple(record, key)

    async def _list_places(self, config: RunnableConfig | None) -> list[_Keys]:
        if config is not None:
            thread, _ = self._config_keys(config, "list")
            return await self._record_places(thread)
        places = []
        for key in await self._list_all(f"{self.prefix}/t/"):
            where = self._parse_record_key(key)
            if where is not None:
                places.append(where)
        return places

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint: the record, and blobs for what is new (see the module).

        Durable when it returns (on a durable backend): the blobs first, the record last.

        Returns:
            The config naming the stored checkpoint.

        Raises:
            ValueError: ``config`` has no ``thread_id``.
        """
        thread, ns = self._config_keys(config, "put")
        parent = config["configurable"].get("checkpoint_id")
        gen = self._gens.get(thread)
        if gen is None:  # the first put of this saver into the thread (or it was deleted)
            gen = await self._make_gen(thread)
            self._sync_gen(thread, gen)
        stored: dict[str, Any] = dict(checkpoint)
        values: dict[str, Any] = stored.pop("channel_values")
        channels: dict[str, list[Any]] = {}
        for channel, version in checkpoint["channel_versions"].items():
            if channel not in values:
                continue  # an empty channel
            cache_key = (thread, ns, channel, str(version))
            ref = None if channel in new_versions else self._refs.get(cache_key)
            if ref is None:
                ref = await self._ref(thread, ns, channel, values[channel])
                if len(self._refs) >= _CACHED_REFS:
                    self._refs.clear()
                self._refs[cache_key] = ref
            channels[channel] = ref
        where = _Keys(thread, ns, checkpoint["id"])
        blob = _record_blob(
            where,
            str(parent) if parent else None,
            self.serde.dumps_typed(stored),
            self.serde.dumps_typed(get_checkpoint_metadata(config, metadata)),
            channels,
            gen=gen,
        )
        await self.storage.write(self._record_key(where), blob)
        return self._config(where)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's writes for the checkpoint ``config`` names (one storage write).

        A regular write already stored for ``(task_id, index)`` is kept; a special
        one (error, interrupt, …) is replaced — as LangGraph's own savers do.

        Raises:
            ValueError: ``config`` names no thread or no checkpoint.
            SessionCorruptedError: the task's stored writes are damaged.
        """
        thread, ns = self._config_keys(config, "put_writes")
        checkpoint_id = config["configurable"].get("checkpoint_id")
        if not checkpoint_id:
            raise ValueError("put_writes: config['configurable']['checkpoint_id'] is required")
        where = _Keys(thread, ns, str(checkpoint_id))
        key = self._writes_prefix(where) + _seg(str(task_id))
        new = {
            WRITES_IDX_MAP.get(channel, idx): (channel, self.serde.dumps_typed(value), task_path)
            for idx, (channel, value) in enumerate(writes)
        }
        conditional = self._conditional
        expected: str | None = None
        stored: dict[int, tuple[str, Typed, str]] = {}
        for _ in range(_PUT_WRITES_TRIES):
            merged = dict(stored)
            for idx, entry in new.items():
                if idx < 0 or idx not in stored:
                    merged[idx] = entry
            if stored and merged == stored:
                return  # nothing new: the call is a repeat
            blob = _sealed(
                _WRITES,
                {
                    "thread": thread,
                    "ns": ns,
                    "id": where.checkpoint_id,
                    "task": str(task_id),
                    "writes": [
                        [idx, channel, kind, data, path]
                        for idx, (channel, (kind, data), path) in sorted(merged.items())
                    ],
                },
            )
            if not conditional:
                if not stored:
                    found = await self.storage.read(key)
                    if found is not None:
                        stored = self._parse_writes(found, key, where)[1]
                        continue
                await self.storage.write(key, blob)
                return
            assert isinstance(self.storage, ConditionalStorage)
            try:
                await self.storage.write_if(key, blob, expected=expected)
                return
            except StorageConflictError:
                expected = await self.storage.version(key)
                found = await self.storage.read(key) if expected is not None else None
                stored = {} if found is None else self._parse_writes(found, key, where)[1]
        raise StorageConflictError(
            f"put_writes: {key!r} kept changing under {_PUT_WRITES_TRIES} tries",
            details={"key": key},
        )

    async def adelete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint, write and blob of a thread (absent: nothing).

        The thread's generation marker goes first: from then on no process reads its
        checkpoints (nor any a writer in another process adds to that generation), and
        the next put starts a new generation. A crash part-way leaves keys no record
        that is read names; deleting the thread again removes them.
        """
        thread = str(thread_id)
        base = self._thread_prefix(thread)
        self._sync_gen(thread, None)
        await self.storage.delete(self._gen_key(thread))
        for part in ("c/", "w/", "b/"):  # records first: none is left naming a lost blob
            await self._delete_keys(await self._list_all(base + part))
        self._sync_gen(thread, None)

    def _forget(self, thread: str) -> None:
        base = self._thread_prefix(thread)
        self._known = {k for k in self._known if not k.startswith(base)}
        self._refs = {k: v for k, v in self._refs.items() if k[0] != thread}
        for key in [k for k in self._lists if k[0] == thread]:
            del self._lists[key]

    async def _mark_orphans(self, records: Sequence[_Record], doomed: set[_Keys]) -> None:
        """Mark the records whose parent is about to be deleted on purpose (before it
        is: a crash between leaves a marked record whose parent is still there)."""
        for record in records:
            where = record.where
            if record.orphan or record.parent is None:
                continue
            if _Keys(where.thread, where.ns, record.parent) in doomed:
                await self.storage.write(
                    self._record_key(where),
                    _record_blob(
                        where,
                        record.parent,
                        record.checkpoint,
                        record.metadata,
                        record.channels,
                        gen=record.gen,
                        orphan=True,
                    ),
                )

    async def _delete_checkpoints(self, places: Sequence[_Keys]) -> None:
        await self._delete_keys([self._record_key(p) for p in places])
        for where in places:
            await self._delete_keys(await self._list_all(self._writes_prefix(where)))

    async def _collect_blobs(self, thread: str) -> None:
        """Delete the thread's blobs that no record names any more."""
        named: set[str] = set()
        for where in await self._record_places(thread):
            record = await self._read_record(self._record_key(where), where)
            if record is not None:
                for ref in record.channels.values():
                    named.update(_blob_shas(ref))
        base = f"{self._thread_prefix(thread)}b/"
        unnamed = [k for k in await self._list_all(base) if k[len(base) :] not in named]
        self._forget(thread)
        await self._delete_keys(unnamed)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (and their writes) whose metadata ``run_id`` is listed.

        Reads every record of the storage; then collects the touched threads' blobs.
        """
        if isinstance(run_ids, str):
            raise TypeError("run_ids must be a sequence of run ids, not a str")
        wanted = {str(r) for r in run_ids}
        if not wanted:
            return
        doomed: list[_Keys] = []
        kept: list[_Record] = []
        for where in await self._list_places(None):
            record = await self._read_record(self._record_key(where), where)
            if record is None:
                continue
            if self.serde.loads_typed(record.metadata).get("run_id") in wanted:
                doomed.append(where)
            else:
                kept.append(record)
        await self._mark_orphans(kept, set(doomed))
        await self._delete_checkpoints(doomed)
        for thread in sorted({p.thread for p in doomed}):
            await self._collect_blobs(thread)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint, write and blob of a thread into another thread.

        Blobs first, then writes, then records, each checked as it is read; checkpoints
        already in the target with the same ids are replaced, others kept.

        Raises:
            SessionCorruptedError: something read from the source is damaged (what
                was copied before stays: copying again is safe).
            ValueError: the two ids are the same.
        """
        source, target = str(source_thread_id), str(target_thread_id)
        if source == target:
            raise ValueError("copy_thread: source_thread_id and target_thread_id are the same")
        self._forget(target)  # what this saver remembers of the target is about to change
        source_gen = await self._read_gen(source)
        target_gen = await self._make_gen(target)
        self._sync_gen(target, target_gen)
        base = self._thread_prefix(source)
        for key in await self._list_all(base + "b/"):
            sha = key[len(base) + 2 :]
            blob = await self.storage.read(key)
            if blob is None:
                continue
            if _sha(blob) != sha:
                raise _corrupt(key, "its SHA-256 does not match its key")
            await self._store_blob(target, blob)
        for key in await self._list_all(base + "w/"):
            parts = key[len(base) :].split("/")
            if len(parts) != 4:
                continue
            ns, checkpoint_id = _unseg(parts[1]), _unseg(parts[2])
            blob = await self.storage.read(key)
            if blob is None or ns is None or checkpoint_id is None:
                continue
            body = _unseal(_WRITES, blob, key)
            self._parse_writes(blob, key, _Keys(source, ns, checkpoint_id))
            body["thread"] = target
            new_key = self._writes_prefix(_Keys(target, ns, checkpoint_id)) + parts[3]
            await self.storage.write(new_key, _sealed(_WRITES, body))
        for where in await self._record_places(source):
            record = await self._read_record(self._record_key(where), where)
            if record is None or not self._visible(record, source_gen):
                continue
            copy = _Keys(target, where.ns, where.checkpoint_id)
            await self.storage.write(
                self._record_key(copy),
                _record_blob(
                    copy,
                    record.parent,
                    record.checkpoint,
                    record.metadata,
                    record.channels,
                    gen=target_gen,
                    orphan=record.orphan,
                ),
            )

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Prune threads: ``keep_latest`` keeps each namespace's newest checkpoint (with
        its writes and the blobs it names), ``delete`` removes the threads.

        Raises:
            TypeError: ``thread_ids`` is a single string.
            ValueError: ``strategy`` is unknown.
            NotImplementedError: ``keep_latest`` on a thread that uses a LangGraph
                ``DeltaChannel`` (its latest value is rebuilt from older checkpoints).
        """
        if isinstance(thread_ids, str):
            raise TypeError("thread_ids must be a sequence of thread ids, not a str")
        if strategy not in _PRUNE_STRATEGIES:
            raise ValueError(
                f"strategy must be one of {', '.join(_PRUNE_STRATEGIES)}, got {strategy!r}"
            )
        for thread in dict.fromkeys(str(t) for t in thread_ids):
            if strategy == "delete":
                await self.adelete_thread(thread)
                continue
            places, token = await asyncio.gather(
                self._record_places(thread), self._read_gen(thread)
            )
            places.sort(key=lambda p: p.checkpoint_id, reverse=True)
            newest: dict[str, _Record] = {}  # ns -> its newest record of the generation
            for where in places:
                if where.ns in newest:
                    continue
                record = await self._read_record(self._record_key(where), where)
                if record is not None and self._visible(record, token):
                    newest[where.ns] = record
            for record in newest.values():
                if "counters_since_delta_snapshot" in self.serde.loads_typed(record.metadata):
                    raise NotImplementedError(
                        f"keep_latest can't prune thread {thread!r}: it uses a DeltaChannel"
                    )
            kept = {r.where for r in newest.values()}
            doomed = [p for p in places if p not in kept]
            await self._mark_orphans(list(newest.values()), set(doomed))
            await self._delete_checkpoints(doomed)
            await self._collect_blobs(thread)

    # ------------------------------------------------------------------ sync API

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Sync :meth:`aget_tuple`."""
        return run_sync(self.aget_tuple(config), async_name="saver.aget_tuple(config)")

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Sync :meth:`alist` (the matching tuples are read before the first is given)."""

        async def collect() -> list[CheckpointTuple]:
            return [
                item async for item in self.alist(config, filter=filter, before=before, limit=limit)
            ]

        return iter(run_sync(collect(), async_name="saver.alist(config)"))

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Sync :meth:`aput`."""
        return run_sync(
            self.aput(config, checkpoint, metadata, new_versions),
            async_name="saver.aput(...)",
        )

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Sync :meth:`aput_writes`."""
        run_sync(
            self.aput_writes(config, writes, task_id, task_path),
            async_name="saver.aput_writes(...)",
        )

    def delete_thread(self, thread_id: str) -> None:
        """Sync :meth:`adelete_thread`."""
        run_sync(self.adelete_thread(thread_id), async_name="saver.adelete_thread(thread_id)")

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Sync :meth:`adelete_for_runs`."""
        run_sync(self.adelete_for_runs(run_ids), async_name="saver.adelete_for_runs(run_ids)")

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Sync :meth:`acopy_thread`."""
        run_sync(
            self.acopy_thread(source_thread_id, target_thread_id),
            async_name="saver.acopy_thread(...)",
        )

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Sync :meth:`aprune`."""
        run_sync(
            self.aprune(thread_ids, strategy=strategy),
            async_name="saver.aprune(thread_ids)",
        )

    def get_next_version(self, current: str | None, channel: None) -> str:
        """The next channel version: a zero-padded counter and a random fraction, so
        versions sort as LangGraph needs and two forks of one version differ."""
        if current is None:
            number = 0
        elif isinstance(current, int):
            number = current
        else:
            number = int(str(current).split(".")[0])
        return f"{number + 1:032}.{random.random():016}"
