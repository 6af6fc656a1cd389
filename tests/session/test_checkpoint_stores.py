"""The CheckpointStore contract, run by every checkpoint store (SPEC §7), and what
each placement adds: checkpoints beside a session die with it, damage is reported,
file writes are durable."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sqlite3
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from perdure.checkpoints.storage import StorageCheckpointStore
from perdure.checkpoints.store import (
    CheckpointMeta,
    CheckpointRecord,
    CheckpointStore,
    CheckpointTrigger,
    DamagedCheckpoint,
    FileCheckpointStore,
    MemoryCheckpointStore,
    new_checkpoint_id,
    now_iso,
    scan_checkpoints,
    seal_checkpoint_bytes,
)
from perdure.errors import CheckpointNotFoundError, SessionCorruptedError
from perdure.session import FileSessionStore
from perdure.session.ulid import encode_ulid, ulid_timestamp_ms
from perdure.storage import LocalFileStorage, MemoryStorage, SQLiteStorage
from perdure.stores.memory import MemorySessionStore
from perdure.stores.sqlite import SQLiteSessionStore
from perdure.types import Message

KINDS = [
    "file",
    "file_session",
    "sqlite_session",
    "memory_session",
    "memory",
    "storage_memory",
    "storage_local_file",
    "storage_sqlite",
]
PERSISTENT_KINDS = [
    "file",
    "file_session",
    "sqlite_session",
    "storage_local_file",
    "storage_sqlite",
]

PNG = b"\x89PNG\r\n\x1a\n\x00\xff\xfe binary"
HISTORY: list[Message] = [
    {
        "role": "user",
        "content": [
            {"text": "what is in this picture? ünïcode ✓"},
            {"image": {"format": "png", "source": {"bytes": PNG}}},
        ],
    },
    {
        "role": "assistant",
        "content": [{"toolUse": {"toolUseId": "t1", "name": "look", "input": {"zoom": 2}}}],
    },
    {
        "role": "user",
        "content": [
            {"toolResult": {"toolUseId": "t1", "status": "success", "content": [{"text": "a cat"}]}}
        ],
    },
    {"role": "assistant", "content": [{"text": "A cat."}]},
]  # type: ignore[typeddict-item]
AGENT_STATE: dict[str, Any] = {
    "state": {"budget": 40, "tags": ["a", "b"], "raw": b"\x00\x01\x02"},
    "internal_state": {"interrupt_state": {}},
}


def make_record(
    session_id: str,
    checkpoint_id: str,
    *,
    trigger: CheckpointTrigger = "manual",
    label: str | None = None,
    messages: list[Message] | None = None,
) -> CheckpointRecord:
    history = HISTORY if messages is None else messages
    meta = CheckpointMeta(checkpoint_id, session_id, trigger, label, len(history), now_iso())
    return CheckpointRecord(meta, json_copy(history), json_copy(AGENT_STATE))


def json_copy(value: Any) -> Any:
    """A deep copy (bytes kept) so that a record never shares objects with HISTORY."""
    if isinstance(value, dict):
        return {k: json_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_copy(v) for v in value]
    return value


async def put_new(
    store: CheckpointStore, session_id: str, trigger: CheckpointTrigger = "manual", **kw: Any
) -> CheckpointRecord:
    record = make_record(
        session_id, await new_checkpoint_id(store, session_id), trigger=trigger, **kw
    )
    await store.put(record)
    return record


def ids(metas: list[CheckpointMeta]) -> list[str]:
    return [meta.checkpoint_id for meta in metas]


def fresh_session() -> str:
    """A session id no other test uses (ids are monotonic per session id, process-wide)."""
    return f"s-{uuid.uuid4().hex[:12]}"


def files_under(root: Path) -> list[Path]:
    """Every file below ``root`` but writer-lock files."""
    return [p for p in root.rglob("*") if p.is_file() and p.parent.name != ".locks"]


# ---------------------------------------------------------------- the stores


class Bench:
    """Builds the checkpoint store of one kind over one directory, and closes it."""

    def __init__(self, kind: str, path: Path) -> None:
        self.kind = kind
        self.path = path
        self._closers: list[Callable[[], None]] = []
        self._memory_storage = MemoryStorage()

    def make(self, *, max_checkpoints: int | None = None) -> CheckpointStore:
        """A store of this kind; persistent kinds see the data earlier ones wrote."""
        kind, path = self.kind, self.path
        if kind == "file":
            return FileCheckpointStore(path / "checkpoints", max_checkpoints=max_checkpoints)
        if kind == "file_session":
            return FileSessionStore(path / "fs", max_checkpoints=max_checkpoints).checkpoints
        if kind == "sqlite_session":
            sqlite_store = SQLiteSessionStore(path / "s.db", max_checkpoints=max_checkpoints)
            self._closers.append(sqlite_store.close)
            return sqlite_store.checkpoints
        if kind == "memory_session":
            return MemorySessionStore(max_checkpoints=max_checkpoints).checkpoints
        if kind == "memory":
            return MemoryCheckpointStore(max_checkpoints=max_checkpoints)
        if kind == "storage_memory":
            return StorageCheckpointStore(self._memory_storage, max_checkpoints=max_checkpoints)
        if kind == "storage_local_file":
            return StorageCheckpointStore(
                LocalFileStorage(path / "blobs"), max_checkpoints=max_checkpoints
            )
        if kind == "storage_sqlite":
            storage = SQLiteStorage(path / "blobs.db")
            self._closers.append(storage.close)
            return StorageCheckpointStore(storage, max_checkpoints=max_checkpoints)
        raise ValueError(kind)

    def close(self) -> None:
        for close in self._closers:
            close()


@pytest.fixture(params=KINDS)
def bench(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Bench]:
    bench = Bench(str(request.param), tmp_path)
    yield bench
    bench.close()


@pytest.fixture
def store(bench: Bench) -> CheckpointStore:
    return bench.make()


# ---------------------------------------------------------------- the contract


def test_every_store_is_a_checkpoint_store(store: CheckpointStore) -> None:
    assert isinstance(store, CheckpointStore)


async def test_put_get_round_trip(store: CheckpointStore) -> None:
    record = make_record("s", await new_checkpoint_id(store, "s"), label="before ✓")
    await store.put(record)
    got = await store.get("s", record.meta.checkpoint_id)
    assert got.meta == record.meta
    assert got.messages == HISTORY
    assert got.messages[0]["content"][1]["image"]["source"]["bytes"] == PNG  # type: ignore[typeddict-item]
    assert got.agent_state == AGENT_STATE
    assert got.agent_state["state"]["raw"] == b"\x00\x01\x02"


async def test_put_stores_a_copy_and_get_returns_one(store: CheckpointStore) -> None:
    record = await put_new(store, "s")
    record.messages.append({"role": "user", "content": [{"text": "later"}]})
    record.agent_state["state"]["budget"] = 0
    first = await store.get("s", record.meta.checkpoint_id)
    first.messages.clear()
    second = await store.get("s", record.meta.checkpoint_id)
    assert second.messages == HISTORY
    assert second.agent_state == AGENT_STATE


async def test_put_with_an_existing_id_replaces_it(store: CheckpointStore) -> None:
    record = await put_new(store, "s", label="one")
    replacement = make_record("s", record.meta.checkpoint_id, label="two", messages=HISTORY[:1])
    await store.put(replacement)
    assert ids(await store.list("s")) == [record.meta.checkpoint_id]
    got = await store.get("s", record.meta.checkpoint_id)
    assert (got.meta.label, got.messages) == ("two", HISTORY[:1])


async def test_list_is_oldest_first_with_the_meta(store: CheckpointStore) -> None:
    assert await store.list("s") == []
    made = [await new_checkpoint_id(store, "s") for _ in range(3)]
    records = {
        cid: make_record("s", cid, trigger=trigger, label=label, messages=HISTORY[:n])
        for cid, trigger, label, n in zip(
            made,
            ["manual", "pre_compaction", "pre_restore"],
            ["a", None, "c"],
            [4, 2, 0],
            strict=True,
        )
    }
    for cid in reversed(made):  # stored newest first: list must still sort
        await store.put(records[cid])
    listed = await store.list("s")
    assert listed == [records[cid].meta for cid in made]
    assert [m.trigger for m in listed] == ["manual", "pre_compaction", "pre_restore"]
    assert [m.message_count for m in listed] == [4, 2, 0]


async def test_new_ids_strictly_increase_and_list_keeps_their_order(
    store: CheckpointStore,
) -> None:
    session = fresh_session()
    made = [(await put_new(store, session)).meta.checkpoint_id for _ in range(30)]
    assert made == sorted(made)
    assert len(set(made)) == len(made)
    assert ids(await store.list(session)) == made


async def test_new_ids_increase_within_one_millisecond(store: CheckpointStore) -> None:
    # A stored id from the future pins every later id to its millisecond: they must
    # still sort after it and after each other (ids are monotonic per session).
    session = fresh_session()
    future_ms = ulid_timestamp_ms(await new_checkpoint_id(store, session)) + 10**7
    future = encode_ulid(future_ms, 5)
    await store.put(make_record(session, future))
    made = [(await put_new(store, session)).meta.checkpoint_id for _ in range(20)]
    made += [await new_checkpoint_id(store, session) for _ in range(200)]
    assert {ulid_timestamp_ms(cid) for cid in made} == {future_ms}
    assert [future, *made] == sorted({future, *made})
    assert ids(await store.list(session)) == [future, *made[:20]]


async def test_get_of_an_absent_id_raises_checkpoint_not_found(store: CheckpointStore) -> None:
    absent = encode_ulid(1_700_000_000_000, 42)
    for session in ("never-used", "s"):
        with pytest.raises(CheckpointNotFoundError) as caught:
            await store.get(session, absent)
        assert caught.value.code == "checkpoint_not_found"
        await put_new(store, "s")
    deleted = await put_new(store, "s")
    await store.delete("s", deleted.meta.checkpoint_id)
    with pytest.raises(CheckpointNotFoundError):
        await store.get("s", deleted.meta.checkpoint_id)


MALFORMED_IDS = [
    "not-a-ulid",
    "",
    "01hzzzzzzzzzzzzzzzzzzzzzzz",  # lower case
    "01HZZZZZZZZZZZZZZZZZZZZZZ",  # 25 characters
    "01HZZZZZZZZZZZZZZZZZZZZZZU",  # U is not Crockford base32
    "8ZZZZZZZZZZZZZZZZZZZZZZZZZ",  # more than 128 bits
    "../../../../etc/passwd0000",
    None,
    42,
]


@pytest.mark.parametrize("bad", MALFORMED_IDS)
async def test_a_malformed_id_raises_value_error(store: CheckpointStore, bad: Any) -> None:
    kept = await put_new(store, "s")
    with pytest.raises(ValueError, match="checkpoint_id"):
        await store.get("s", bad)
    with pytest.raises(ValueError, match="checkpoint_id"):
        await store.delete("s", bad)
    if isinstance(bad, str):
        with pytest.raises(ValueError):
            await store.put(make_record("s", bad))
    assert ids(await store.list("s")) == [kept.meta.checkpoint_id]


async def test_delete_is_idempotent(store: CheckpointStore) -> None:
    first = await put_new(store, "s")
    second = await put_new(store, "s")
    await store.delete("s", first.meta.checkpoint_id)
    await store.delete("s", first.meta.checkpoint_id)
    await store.delete("never-used", first.meta.checkpoint_id)
    assert ids(await store.list("s")) == [second.meta.checkpoint_id]
    await store.delete("s", second.meta.checkpoint_id)
    assert await store.list("s") == []


async def test_retention_evicts_the_oldest_whatever_the_trigger(bench: Bench) -> None:
    store = bench.make(max_checkpoints=3)
    session = fresh_session()
    triggers: list[CheckpointTrigger] = [
        "manual",
        "import",
        "pre_restore",
        "pre_compaction",
        "pre_compaction",
        "manual",
    ]
    made: list[str] = []
    other = await put_new(store, "other")
    for trigger in triggers:
        made.append((await put_new(store, session, trigger)).meta.checkpoint_id)
        listed = await store.list(session)
        assert ids(listed) == made[-3:]
    assert [m.trigger for m in await store.list(session)] == triggers[-3:]
    with pytest.raises(CheckpointNotFoundError):
        await store.get(session, made[0])
    # Retention is per session: the other session keeps its checkpoint.
    assert ids(await store.list("other")) == [other.meta.checkpoint_id]


async def test_retention_of_one_keeps_the_newest(bench: Bench) -> None:
    store = bench.make(max_checkpoints=1)
    for _ in range(3):
        newest = await put_new(store, "s", "pre_compaction")
    assert ids(await store.list("s")) == [newest.meta.checkpoint_id]


async def test_sessions_are_isolated(store: CheckpointStore) -> None:
    # "a" is a prefix of "ab": a store keyed by prefixes must not mix them up.
    in_a = await put_new(store, "a")
    in_ab = await put_new(store, "ab")
    assert ids(await store.list("a")) == [in_a.meta.checkpoint_id]
    assert ids(await store.list("ab")) == [in_ab.meta.checkpoint_id]
    with pytest.raises(CheckpointNotFoundError):
        await store.get("ab", in_a.meta.checkpoint_id)
    await store.delete("ab", in_a.meta.checkpoint_id)
    assert (await store.get("a", in_a.meta.checkpoint_id)).meta == in_a.meta
    assert await store.list("b") == []


@pytest.mark.parametrize("bad", ["", ".", "..", "a/b", "a\\b"])
async def test_a_bad_session_id_raises_value_error(
    bench: Bench, store: CheckpointStore, bad: str
) -> None:
    valid = encode_ulid(1_700_000_000_000, 1)
    with pytest.raises(ValueError):
        await store.list(bad)
    with pytest.raises(ValueError):
        await store.get(bad, valid)
    with pytest.raises(ValueError):
        await store.delete(bad, valid)
    with pytest.raises(ValueError):
        await store.put(make_record(bad, valid))


async def test_usable_from_any_loop_and_any_thread(store: CheckpointStore) -> None:
    session = fresh_session()

    def in_own_loop(count: int) -> list[str]:
        async def work() -> list[str]:
            return [(await put_new(store, session)).meta.checkpoint_id for _ in range(count)]

        return asyncio.run(work())

    # Made on another loop in a worker thread, read on this loop.
    first = await asyncio.to_thread(in_own_loop, 2)
    assert ids(await store.list(session)) == first

    # Several threads, each with its own loop, at once.
    results: list[list[str]] = []
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            results.append(in_own_loop(3))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    everything = sorted([*first, *(cid for made in results for cid in made)])
    assert ids(await store.list(session)) == everything

    # A record put on this loop is read on another.
    record = await put_new(store, session)
    got = await asyncio.to_thread(
        lambda: asyncio.run(store.get(session, record.meta.checkpoint_id))
    )
    assert got.meta == record.meta


@pytest.mark.parametrize("kind", PERSISTENT_KINDS)
async def test_checkpoints_survive_reopening_the_store(kind: str, tmp_path: Path) -> None:
    bench = Bench(kind, tmp_path)
    try:
        if kind == "sqlite_session":
            # Checkpoints beside a session need nothing of it, but reopen a real one.
            sessions = SQLiteSessionStore(tmp_path / "s.db")
            await sessions.create("s")
            sessions.close()
        record = await put_new(bench.make(), "s")
        reopened = bench.make()
        assert ids(await reopened.list("s")) == [record.meta.checkpoint_id]
        assert (await reopened.get("s", record.meta.checkpoint_id)).messages == HISTORY
    finally:
        bench.close()


@pytest.mark.parametrize("bad", [0, -1, True, 2.5, "3"])
def test_max_checkpoints_is_checked(tmp_path: Path, bad: Any) -> None:
    with pytest.raises(ValueError, match="max_checkpoints"):
        SQLiteSessionStore(tmp_path / "s.db", max_checkpoints=bad)
    with pytest.raises(ValueError, match="max_checkpoints"):
        MemorySessionStore(max_checkpoints=bad)
    with pytest.raises(ValueError, match="max_checkpoints"):
        StorageCheckpointStore(MemoryStorage(), max_checkpoints=bad)


# ---------------------------------------------------------------- beside a session

SESSION_KINDS = ["file", "sqlite", "memory"]


def session_store(kind: str, path: Path, **options: Any) -> Any:
    if kind == "file":
        return FileSessionStore(path / "fs", **options)
    if kind == "sqlite":
        return SQLiteSessionStore(path / "s.db", **options)
    return MemorySessionStore(**options)


@pytest.fixture(params=SESSION_KINDS)
def sessions(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    store = session_store(str(request.param), tmp_path)
    yield store
    if isinstance(store, SQLiteSessionStore):
        store.close()


async def test_checkpoints_are_deleted_with_their_session(sessions: Any) -> None:
    for session_id in ("doomed", "kept"):
        await sessions.create(session_id)
        await sessions.commit(session_id, HISTORY)
    doomed = [await put_new(sessions.checkpoints, "doomed") for _ in range(2)]
    kept = await put_new(sessions.checkpoints, "kept")
    await sessions.delete("doomed")
    assert await sessions.checkpoints.list("doomed") == []
    for record in doomed:
        with pytest.raises(CheckpointNotFoundError):
            await sessions.checkpoints.get("doomed", record.meta.checkpoint_id)
    assert ids(await sessions.checkpoints.list("kept")) == [kept.meta.checkpoint_id]
    # A session created again under the same id starts without checkpoints.
    await sessions.create("doomed")
    assert await sessions.checkpoints.list("doomed") == []


async def test_a_new_session_does_not_inherit_leftover_checkpoints(sessions: Any) -> None:
    await put_new(sessions.checkpoints, "later")
    await sessions.create("later")
    assert await sessions.checkpoints.list("later") == []


async def test_deleting_an_absent_session_drops_leftover_checkpoints(sessions: Any) -> None:
    await put_new(sessions.checkpoints, "ghost")
    await sessions.delete("ghost")
    assert await sessions.checkpoints.list("ghost") == []


async def test_session_store_retention_reaches_its_checkpoints(tmp_path: Path) -> None:
    for kind in SESSION_KINDS:
        store = session_store(kind, tmp_path / kind, max_checkpoints=2)
        try:
            await store.create("s")
            made = [(await put_new(store.checkpoints, "s")).meta.checkpoint_id for _ in range(4)]
            assert ids(await store.checkpoints.list("s")) == made[-2:], kind
        finally:
            if isinstance(store, SQLiteSessionStore):
                store.close()


async def test_sqlite_adds_the_checkpoint_table_to_an_older_database(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    old = SQLiteSessionStore(path)
    await old.create("s")
    await old.commit("s", HISTORY)
    old.close()
    raw = sqlite3.connect(path, isolation_level=None)
    raw.execute("DROP TABLE perdure_checkpoints")
    raw.close()
    store = SQLiteSessionStore(path)
    try:
        record = await put_new(store.checkpoints, "s")
        assert ids(await store.checkpoints.list("s")) == [record.meta.checkpoint_id]
        assert (await store.get("s")).messages == HISTORY
    finally:
        store.close()


# ---------------------------------------------------------------- damage


def sealed(body: dict[str, Any]) -> bytes:
    """A checkpoint record as SPEC §7.1 lays it out: ``body`` and its sha256, which match."""
    raw = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
    digest = hashlib.sha256(raw).hexdigest().encode()
    return b'{"format":"perdure-checkpoint-record/2","sha256":"%s","record":%s}' % (digest, raw)


def body_of(record: CheckpointRecord) -> dict[str, Any]:
    """The parsed body of a stored record (after checking the record is laid out as sealed)."""
    data = json.loads(record.to_json_bytes())
    assert set(data) == {"format", "sha256", "record"}
    assert sealed(data["record"]) == record.to_json_bytes()
    return dict(data["record"])


def damaged_bodies(record: CheckpointRecord, other: CheckpointRecord) -> dict[str, bytes]:
    body = record.to_json_bytes()
    shape = body_of(record)
    shape["messages"] = [1, 2]
    bad_meta = body_of(record)
    bad_meta["meta"]["trigger"] = "whenever"
    extra = {**body_of(record), "extra": 1}
    return {
        "garbage": b"\x00\xffnot json at all",
        "truncated": body[: len(body) // 2],
        "not_utf8": body.replace(b"cat", b"\xff\xfe\xfd"),
        "edited": body.replace(b"a cat", b"a dog"),
        "edited_digest": body.replace(b'"sha256":"', b'"sha256":"0', 1)[:-1],
        "extra_byte": body + b" ",
        "bad_meta": sealed(bad_meta),
        "bad_message_shape": sealed(shape),
        "extra_field": sealed(extra),
        "another_checkpoint": other.to_json_bytes(),
        "another_format": json.dumps({"format": "something-else/1"}).encode(),
    }


DAMAGE = [
    "garbage",
    "truncated",
    "not_utf8",
    "edited",
    "edited_digest",
    "extra_byte",
    "bad_meta",
    "bad_message_shape",
    "extra_field",
    "another_checkpoint",
    "another_format",
]


def damage_params(kinds: list[str]) -> list[Any]:
    return [
        pytest.param(
            kind,
            damage,
            id=f"{kind}-{damage}",
        )
        for kind in kinds
        for damage in DAMAGE
    ]


async def _assert_damage_reported(
    store: CheckpointStore, record: CheckpointRecord, *, in_list: bool
) -> None:
    with pytest.raises(SessionCorruptedError) as caught:
        await store.get("s", record.meta.checkpoint_id)
    assert caught.value.code == "session_store_corrupted"
    assert record.meta.checkpoint_id in str(caught.value)
    assert caught.value.details["checkpoint_id"] == record.meta.checkpoint_id
    if in_list:
        with pytest.raises(SessionCorruptedError):
            await store.list("s")


async def _assert_damage_is_listed_and_deletable(
    store: CheckpointStore, intact: CheckpointRecord, damaged: CheckpointRecord
) -> None:
    """The damaged checkpoint does not hide ``intact``, nor block new ones, and deletes."""
    first, second = await scan_checkpoints(store, "s")
    assert first == intact.meta
    assert isinstance(second, DamagedCheckpoint)
    assert second.checkpoint_id == damaged.meta.checkpoint_id
    assert second.kind == "bad_checkpoint"
    assert second.to_dict()["error"]["code"] == "session_store_corrupted"
    newer = await put_new(store, "s")  # a new id sorts after the damaged one
    assert newer.meta.checkpoint_id > damaged.meta.checkpoint_id
    await store.delete("s", damaged.meta.checkpoint_id)
    assert await store.list("s") == [intact.meta, newer.meta]
    assert await scan_checkpoints(store, "s") == [intact.meta, newer.meta]


@pytest.mark.parametrize(("kind", "damage"), damage_params(["file", "file_session"]))
async def test_a_damaged_checkpoint_file_raises_corrupted(
    kind: str, damage: str, tmp_path: Path
) -> None:
    bench = Bench(kind, tmp_path)
    store = bench.make()
    intact = await put_new(store, "s")
    record = await put_new(store, "s")
    other = make_record("s", await new_checkpoint_id(store, "s"))
    [path] = [p for p in files_under(tmp_path) if p.name == f"{record.meta.checkpoint_id}.json"]
    path.write_bytes(damaged_bodies(record, other)[damage])
    await _assert_damage_reported(store, record, in_list=True)
    with pytest.raises(SessionCorruptedError) as caught:
        await store.get("s", record.meta.checkpoint_id)
    assert caught.value.details["file"] == str(path)
    assert str(path) in caught.value.message
    await _assert_damage_is_listed_and_deletable(store, intact, record)
    assert not path.exists()


@pytest.mark.parametrize(
    ("kind", "damage"), damage_params(["storage_memory", "storage_local_file", "storage_sqlite"])
)
async def test_a_damaged_checkpoint_blob_raises_corrupted(
    kind: str, damage: str, tmp_path: Path
) -> None:
    bench = Bench(kind, tmp_path)
    try:
        store = bench.make()
        assert isinstance(store, StorageCheckpointStore)
        intact = await put_new(store, "s")
        record = await put_new(store, "s")
        other = make_record("s", await new_checkpoint_id(store, "s"))
        key = f"checkpoints/s/{record.meta.checkpoint_id}"
        await store.storage.write(key, damaged_bodies(record, other)[damage])
        await _assert_damage_reported(store, record, in_list=True)
        await _assert_damage_is_listed_and_deletable(store, intact, record)
    finally:
        bench.close()


def unsealed(record: CheckpointRecord) -> bytes:
    """The record as perdure 0.1 wrote it: format /1 and no hash."""
    return json.dumps({"format": "perdure-checkpoint-record/1", **body_of(record)}).encode()


@pytest.mark.parametrize("kind", ["file", "file_session", "storage_memory", "storage_local_file"])
async def test_a_checkpoint_without_a_hash_is_refused_by_file_and_blob_stores(
    kind: str, tmp_path: Path
) -> None:
    # perdure 0.1 wrote checkpoints without a sha256: nothing can tell an edit in one
    # from its original, so they are not read until `repair` seals them.
    bench = Bench(kind, tmp_path)
    store = bench.make()
    record = await put_new(store, "s")
    if isinstance(store, StorageCheckpointStore):
        await store.storage.write(f"checkpoints/s/{record.meta.checkpoint_id}", unsealed(record))
    else:
        [path] = [p for p in files_under(tmp_path) if p.suffix == ".json"]
        path.write_bytes(unsealed(record))
    with pytest.raises(SessionCorruptedError) as caught:
        await store.get("s", record.meta.checkpoint_id)
    assert caught.value.details["kind"] == "unsealed_checkpoint"
    assert "without a sha256" in caught.value.message
    [found] = await scan_checkpoints(store, "s")
    assert isinstance(found, DamagedCheckpoint)
    assert found.kind == "unsealed_checkpoint"
    # Sealing (what repair does once told to trust it) keeps the content as it was.
    resealed = seal_checkpoint_bytes(unsealed(record))
    assert resealed == record.to_json_bytes()


async def test_sqlite_reads_its_rows_written_without_the_record_hash(
    sqlite_sessions: SQLiteSessionStore,
) -> None:
    # A perdure 0.1 row: the body has no hash of its own, the row's hash column has.
    from perdure.session.rules import blob_hash

    store = sqlite_sessions.checkpoints
    record = await put_new(store, "s")
    body = unsealed(record)
    raw_update(
        sqlite_sessions.path,
        "UPDATE perdure_checkpoints SET body = ?, hash = ?",
        body,
        blob_hash(body),
    )
    assert await store.get("s", record.meta.checkpoint_id) == record
    edited = body.replace(b"a cat", b"a dog")
    raw_update(sqlite_sessions.path, "UPDATE perdure_checkpoints SET body = ?", edited)
    await _assert_damage_reported(store, record, in_list=False)


@pytest.mark.parametrize("kind", ["file", "sqlite"])
async def test_an_edited_checkpoint_is_never_restored_exported_or_forked(
    kind: str, tmp_path: Path
) -> None:
    """ISSUE 14 item 5: "pay 100 EUR" edited into "pay 900 EUR" in a stored checkpoint."""
    from perdure.maintenance import verify_store
    from perdure.session import Session

    sessions: Any = (
        FileSessionStore(tmp_path / "fs")
        if kind == "file"
        else SQLiteSessionStore(tmp_path / "s.db")
    )
    try:
        await sessions.create("s")
        paid: list[Message] = [{"role": "user", "content": [{"text": "pay 100 EUR"}]}]
        await sessions.commit("s", paid)
        session = Session(sessions, "s")
        meta = await session.checkpoint()
        later: list[Message] = [{"role": "assistant", "content": [{"text": "paid"}]}]
        await sessions.commit("s", paid + later)
        if kind == "file":
            [path] = (tmp_path / "fs" / "sessions" / "s" / "checkpoints").glob("*.json")
            path.write_bytes(path.read_bytes().replace(b"pay 100 EUR", b"pay 900 EUR"))
            where = str(path)
        else:
            raw = sqlite3.connect(tmp_path / "s.db", isolation_level=None)
            raw.execute(
                "UPDATE perdure_checkpoints SET body = replace(body, ?, ?)",
                (b"pay 100 EUR", b"pay 900 EUR"),
            )
            raw.close()
            where = meta.checkpoint_id
        for operation in (session.restore, session.export_checkpoint, session.fork):
            with pytest.raises(SessionCorruptedError) as caught:
                await operation(meta.checkpoint_id)
            assert where in caught.value.message
        with pytest.raises(SessionCorruptedError):
            await sessions.checkpoints.get("s", meta.checkpoint_id)
        # Nothing was written: no pre_restore checkpoint, no fork, the history as it was.
        assert (await sessions.get("s")).messages == paid + later
        assert [m.session_id for m in await sessions.list()] == ["s"]
        assert await sessions.checkpoints.checkpoint_ids("s") == [meta.checkpoint_id]
        report = await verify_store(sessions)
        [damage] = report.damage
        assert (damage.session_id, damage.checkpoint_id, damage.kind) == (
            "s",
            meta.checkpoint_id,
            "bad_checkpoint",
        )
    finally:
        sessions.close()


@pytest.fixture
def sqlite_sessions(tmp_path: Path) -> Iterator[SQLiteSessionStore]:
    store = SQLiteSessionStore(tmp_path / "s.db")
    yield store
    store.close()


def raw_update(path: Path, sql: str, *params: Any) -> None:
    raw = sqlite3.connect(path, isolation_level=None)
    try:
        assert raw.execute(sql, params).rowcount == 1
    finally:
        raw.close()


@pytest.mark.parametrize("damage", DAMAGE)
async def test_a_damaged_sqlite_body_raises_corrupted(
    sqlite_sessions: SQLiteSessionStore, damage: str
) -> None:
    from perdure.session.rules import blob_hash

    store = sqlite_sessions.checkpoints
    record = await put_new(store, "s")
    other = make_record("s", await new_checkpoint_id(store, "s"))
    body = damaged_bodies(record, other)[damage]
    # Damage the body alone (its hash no longer matches) …
    raw_update(sqlite_sessions.path, "UPDATE perdure_checkpoints SET body = ?", body)
    await _assert_damage_reported(store, record, in_list=False)
    # … and with a matching hash (only the parse or the meta check can tell).
    raw_update(sqlite_sessions.path, "UPDATE perdure_checkpoints SET hash = ?", blob_hash(body))
    await _assert_damage_reported(store, record, in_list=False)


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("hash", "0" * 32),
        ("body", "text, not a blob"),
        ("trigger", "whenever"),
        ("message_count", -1),
        ("label", "another label"),
        ("created_at", "2000-01-01T00:00:00Z"),
    ],
)
async def test_a_damaged_sqlite_row_raises_corrupted(
    sqlite_sessions: SQLiteSessionStore, column: str, value: Any
) -> None:
    store = sqlite_sessions.checkpoints
    record = await put_new(store, "s")
    raw_update(sqlite_sessions.path, f"UPDATE perdure_checkpoints SET {column} = ?", value)
    with pytest.raises(SessionCorruptedError) as caught:
        await store.get("s", record.meta.checkpoint_id)
    assert caught.value.details["checkpoint_id"] == record.meta.checkpoint_id
    assert caught.value.details["kind"] == "bad_checkpoint"
    if column in ("trigger", "message_count"):
        with pytest.raises(SessionCorruptedError):
            await store.list("s")


async def test_sqlite_errors_are_translated(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    path.write_bytes(b"this is not a database, " * 100)
    store = SQLiteSessionStore(path)
    try:
        with pytest.raises(SessionCorruptedError):
            await store.checkpoints.list("s")
        with pytest.raises(SessionCorruptedError):
            await put_new(store.checkpoints, "s")
    finally:
        store.close()


# ---------------------------------------------------------------- durable file writes


@pytest.mark.parametrize("kind", ["file", "file_session"])
async def test_file_checkpoints_are_written_with_temp_fsync_rename(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Bench(kind, tmp_path).make()
    record = make_record("s", await new_checkpoint_id(store, "s"))
    expected = record.to_json_bytes()
    fsynced: list[int] = []
    renames: list[tuple[Path, Path, bytes, bool]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def spy_fsync(fd: int) -> None:
        fsynced.append(fd)
        real_fsync(fd)

    def spy_replace(src: Any, dst: Any) -> None:
        src, dst = Path(src), Path(dst)
        renames.append((src, dst, src.read_bytes(), dst.exists()))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", spy_fsync)
    monkeypatch.setattr(os, "replace", spy_replace)
    await store.put(record)
    monkeypatch.undo()

    [(src, dst, content, existed)] = [r for r in renames if r[1].suffix == ".json"]
    assert dst.name == f"{record.meta.checkpoint_id}.json"
    assert src.parent == dst.parent
    assert src.name.startswith(".")
    assert src.suffix == ".tmp"
    assert content == expected  # the temp file was complete before the rename
    assert not existed
    assert len(fsynced) >= 2  # the file, then its directory
    assert sorted(p.name for p in dst.parent.iterdir()) == [dst.name]  # no temp left
    assert dst.read_bytes() == expected


@pytest.mark.parametrize("kind", ["file", "file_session"])
async def test_a_failed_file_write_leaves_no_file_and_no_temp(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Bench(kind, tmp_path).make()
    kept = await put_new(store, "s")
    record = make_record("s", await new_checkpoint_id(store, "s"))

    def crash(src: Any, dst: Any) -> None:
        raise OSError("simulated crash at the rename")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="simulated"):
        await store.put(record)
    monkeypatch.undo()
    checkpoint_files = [p for p in files_under(tmp_path) if "checkpoints" in p.parts]
    assert [p.name for p in checkpoint_files] == [f"{kept.meta.checkpoint_id}.json"]
    assert ids(await store.list("s")) == [kept.meta.checkpoint_id]


# ---------------------------------------------------------------- StorageCheckpointStore


async def test_storage_store_key_layout_and_foreign_keys() -> None:
    storage = MemoryStorage()
    store = StorageCheckpointStore(storage, prefix="app/cps")
    record = await put_new(store, "s")
    assert await storage.list("") == [f"app/cps/s/{record.meta.checkpoint_id}"]
    # Keys under the session that are not checkpoints are ignored.
    await storage.write("app/cps/s/README", b"not a checkpoint")
    await storage.write(f"app/cps/s/{record.meta.checkpoint_id}/nested", b"nor this")
    assert ids(await store.list("s")) == [record.meta.checkpoint_id]
    other = StorageCheckpointStore(storage)  # another prefix sees nothing
    assert await other.list("s") == []


@pytest.mark.parametrize("prefix", ["", "/abs", "a//b", "a/", "../x"])
def test_storage_store_checks_its_prefix(prefix: str) -> None:
    with pytest.raises(ValueError, match="prefix"):
        StorageCheckpointStore(MemoryStorage(), prefix=prefix)


def test_storage_store_needs_a_storage() -> None:
    with pytest.raises(TypeError, match="storage"):
        StorageCheckpointStore(object())  # type: ignore[arg-type]


# ---------------------------------------------------------------- the seal


@pytest.mark.parametrize("mask", [0x01, 0x20, 0x80, 0xFF])
def test_every_changed_byte_of_a_sealed_record_is_refused(mask: int) -> None:
    """SPEC §7.1: whatever byte of a stored checkpoint changes, reading it fails."""
    record = make_record("s", encode_ulid(1_700_000_000_000, 7))
    data = record.to_json_bytes()
    assert CheckpointRecord.from_json_bytes(data) == record
    for at in range(len(data)):
        changed = bytearray(data)
        changed[at] ^= mask
        with pytest.raises(ValueError):
            CheckpointRecord.from_json_bytes(bytes(changed))
    for cut in range(len(data)):
        with pytest.raises(ValueError):
            CheckpointRecord.from_json_bytes(data[:cut])
