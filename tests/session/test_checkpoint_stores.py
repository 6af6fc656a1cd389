"""The CheckpointStore contract, run by every checkpoint store (SPEC §7), and what
each placement adds: checkpoints beside a session die with it, damage is reported,
file writes are durable."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from perdure.checkpoints.storage import StorageCheckpointStore
from perdure.checkpoints.store import (
    CheckpointRecord,
    CheckpointStore,
    DamagedCheckpoint,
    FileCheckpointStore,
    MemoryCheckpointStore,
    new_checkpoint_id,
    scan_checkpoints,
    seal_checkpoint_bytes,
)
from perdure.errors import CheckpointNotFoundError, SessionCorruptedError
from perdure.session import FileSessionStore
from perdure.session.ulid import encode_ulid
from perdure.storage import LocalFileStorage, MemoryStorage, SQLiteStorage
from perdure.stores.memory import MemorySessionStore
from perdure.stores.sqlite import SQLiteSessionStore
from perdure.testing.checkpoints import (
    HISTORY,
    CheckpointStoreFactory,
    CheckpointStoreSuite,
    ids,
    make_record,
    put_new,
)
from perdure.types import Message


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

    def make(self, **retention: Any) -> CheckpointStore:
        """A store of this kind; persistent kinds see the data earlier ones wrote.

        ``retention``: ``max_checkpoints``, ``max_checkpoint_age``.
        """
        kind, path = self.kind, self.path
        if kind == "file":
            return FileCheckpointStore(path / "checkpoints", **retention)
        if kind == "file_session":
            return FileSessionStore(path / "fs", **retention).checkpoints
        if kind == "sqlite_session":
            sqlite_store = SQLiteSessionStore(path / "s.db", **retention)
            self._closers.append(sqlite_store.close)
            return sqlite_store.checkpoints
        if kind == "memory_session":
            return MemorySessionStore(**retention).checkpoints
        if kind == "memory":
            return MemoryCheckpointStore(**retention)
        if kind == "storage_memory":
            return StorageCheckpointStore(self._memory_storage, **retention)
        if kind == "storage_local_file":
            return StorageCheckpointStore(LocalFileStorage(path / "blobs"), **retention)
        if kind == "storage_sqlite":
            storage = SQLiteStorage(path / "blobs.db")
            self._closers.append(storage.close)
            return StorageCheckpointStore(storage, **retention)
        raise ValueError(kind)

    def close(self) -> None:
        for close in self._closers:
            close()


# ---------------------------------------------------------------- the contract
# Every kind runs perdure.testing's suite, as a third-party checkpoint store would.


class _Placement(CheckpointStoreSuite):
    kind: ClassVar[str]

    @pytest.fixture
    def checkpoint_store_factory(self, tmp_path: Path) -> Iterator[CheckpointStoreFactory]:
        bench = Bench(self.kind, tmp_path)
        yield bench.make
        bench.close()


class TestFileCheckpointStore(_Placement):
    kind = "file"


class TestFileSessionStoreCheckpoints(_Placement):
    kind = "file_session"


class TestSQLiteSessionStoreCheckpoints(_Placement):
    kind = "sqlite_session"

    @pytest.fixture
    def checkpoint_store_factory(self, tmp_path: Path) -> Iterator[CheckpointStoreFactory]:
        # Checkpoints beside a session need nothing of it, but live in a real one.
        sessions = SQLiteSessionStore(tmp_path / "s.db")
        asyncio.run(sessions.create("s"))
        sessions.close()
        bench = Bench(self.kind, tmp_path)
        yield bench.make
        bench.close()


class TestMemorySessionStoreCheckpoints(_Placement):
    kind = "memory_session"
    durable_across_reopen = False


class TestMemoryCheckpointStore(_Placement):
    kind = "memory"
    durable_across_reopen = False


class TestStorageCheckpointStoreInMemory(_Placement):
    kind = "storage_memory"  # one MemoryStorage per bench: instances share it


class TestStorageCheckpointStoreInLocalFiles(_Placement):
    kind = "storage_local_file"


class TestStorageCheckpointStoreInSQLite(_Placement):
    kind = "storage_sqlite"


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
