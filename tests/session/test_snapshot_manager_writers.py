"""SnapshotSessionManager on a storage that appends: one record per save, and writers.

On a storage that cannot append but has versions (``ConditionalStorage``: SQLite,
PostgreSQL, Redis, S3) the same writers' tests run: each save of ``latest`` is a
``write_if`` on the version the manager last read or wrote.

``snapshot_latest`` is a log there (:mod:`perdure.snapshots.log`): a save appends one
record (one write and one fsync on ``LocalFileStorage``), conditional on the log
ending as the manager last saw it, so two writers never silently overwrite each
other. Logs in the older format (a manifest) still restore.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from perdure import Agent, NullConversationManager
from perdure.errors import SessionConflictError, SessionCorruptedError
from perdure.models import ScriptedModel
from perdure.snapshots import log as snapshot_log
from perdure.snapshots.manager import SnapshotSessionManager
from perdure.storage import (
    AppendStorage,
    ConditionalStorage,
    LocalFileStorage,
    MemoryStorage,
    SQLiteStorage,
    Storage,
)

KEY = "sessions/s/agents/default/latest"


def text(i: int, size: int = 1) -> dict[str, Any]:
    body = f"message {i} " + "x" * size
    return {"role": "user" if i % 2 == 0 else "assistant", "content": [{"text": body}]}


def agent_of(manager: SnapshotSessionManager | None, responses: list[str] | None = None) -> Agent:
    return Agent(
        model=ScriptedModel(responses or []),
        conversation_manager=NullConversationManager(),
        session_manager=manager,
    )


async def restored(storage: Storage) -> list[Any]:
    agent = agent_of(None)
    assert await SnapshotSessionManager("s", storage=storage).restore_snapshot(agent)
    return list(agent.messages)


class PlainStorage:
    """The four ``Storage`` methods of another storage, and nothing else.

    A manager on it writes ``latest`` as older perdure did: a format-1 manifest.
    """

    def __init__(self, inner: Storage) -> None:
        self.inner = inner

    async def write(self, key: str, data: bytes) -> None:
        await self.inner.write(key, data)

    async def read(self, key: str) -> bytes | None:
        return await self.inner.read(key)

    async def delete(self, key: str) -> None:
        await self.inner.delete(key)

    async def list(
        self, prefix: str, *, limit: int | None = None, start_after: str | None = None
    ) -> list[str]:
        return await self.inner.list(prefix, limit=limit, start_after=start_after)


class LostAcks(PlainStorage):
    """An ``AppendStorage`` whose appends raise, before or after writing (fault injection).

    What a writer sees when a disk error or a cancellation ends its call: it cannot
    tell whether the bytes landed.
    """

    def __init__(self, inner: LocalFileStorage) -> None:
        super().__init__(inner)
        self.files = inner
        self.fail: str | None = None  # "before" or "after" the inner append

    async def append(self, key: str, data: bytes, *, size: int, tail: bytes) -> None:
        if self.fail == "before":
            raise OSError("no space left on device")
        await self.files.append(key, data, size=size, tail=tail)
        if self.fail == "after":
            raise asyncio.CancelledError  # cancelled while the fsync finished

    async def replace(self, key: str, data: bytes, *, size: int | None, tail: bytes) -> None:
        await self.files.replace(key, data, size=size, tail=tail)


class VersionedOnly(PlainStorage):
    """A ``ConditionalStorage`` that cannot append (as SQLite, PostgreSQL, S3), with
    ``write_if`` raising before or after the inner write (fault injection)."""

    def __init__(self, inner: Storage) -> None:
        super().__init__(inner)
        assert isinstance(inner, ConditionalStorage)
        self.versions: ConditionalStorage = inner
        self.fail: str | None = None

    async def version(self, key: str) -> str | None:
        return await self.versions.version(key)

    async def write_if(self, key: str, data: bytes, *, expected: str | None) -> str:
        if self.fail == "before":
            raise OSError("connection reset")
        made = await self.versions.write_if(key, data, expected=expected)
        if self.fail == "after":
            raise asyncio.CancelledError
        return made


# ----------------------------------------------------------------- appends


def test_message_saves_append_one_record_to_one_file(tmp_path: Path) -> None:
    storage = LocalFileStorage(tmp_path)
    manager = SnapshotSessionManager("s", storage=storage, save_latest_on="message")
    agent = agent_of(manager, [f"answer {i}" for i in range(30)])
    agent("question 0")
    path = tmp_path / "sessions/s/agents/default/latest.blob"
    inode, lines = path.stat().st_ino, path.read_bytes().count(b"\n")
    for i in range(1, 30):
        agent(f"question {i}")
    assert path.stat().st_ino == inode  # appended to, never replaced
    assert path.read_bytes().count(b"\n") == lines + 2 * 29  # one record per message
    assert not [name for name in os.listdir(path.parent) if name.startswith(".")]
    assert asyncio.run(restored(storage)) == agent.messages


def test_the_log_is_started_afresh_when_it_grows_long(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(snapshot_log, "LOG_BYTES", 4096)
    storage = LocalFileStorage(tmp_path)
    manager = SnapshotSessionManager("s", storage=storage)
    agent = agent_of(None)
    path = tmp_path / "sessions/s/agents/default/latest.blob"
    rewrites, inode, base = 0, None, 0
    for i in range(200):
        agent.messages.append(text(i, 200))  # type: ignore[arg-type]
        asyncio.run(manager.save_snapshot(agent, is_latest=True))
        stat = path.stat()
        if stat.st_ino != inode:  # started afresh: the header and one full record
            rewrites, inode, base = rewrites + 1, stat.st_ino, stat.st_size
        # It grows until it reaches max(LOG_BYTES, twice its first record), then one more.
        assert stat.st_size < max(4096, 2 * base) + 400
    assert rewrites >= 4
    assert asyncio.run(restored(storage)) == agent.messages


async def test_a_restored_writer_appends_only_what_is_new(tmp_path: Path) -> None:
    storage = LocalFileStorage(tmp_path)
    first = agent_of(None)
    first.messages = [text(i) for i in range(5)]  # type: ignore[list-item]
    await SnapshotSessionManager("s", storage=storage).save_snapshot(first, is_latest=True)
    again = agent_of(None)
    manager = SnapshotSessionManager("s", storage=storage)
    assert await manager.restore_snapshot(again)
    path = tmp_path / "sessions/s/agents/default/latest.blob"
    inode = path.stat().st_ino
    again.messages.append(text(5))  # type: ignore[arg-type]
    await manager.save_snapshot(again, is_latest=True)
    again.messages.append(text(6))  # type: ignore[arg-type]
    await manager.save_snapshot(again, is_latest=True)
    assert path.stat().st_ino == inode
    last = path.read_bytes().splitlines()[-1]
    assert b"message 6" in last
    assert b"message 5" not in last
    assert await restored(storage) == again.messages


# ------------------------------------------------------------- two writers


@pytest.mark.parametrize("kind", ["local_file", "memory", "sqlite", "memory_versions"])
async def test_a_second_writer_gets_a_conflict_and_overwrites_nothing(
    tmp_path: Path, kind: str
) -> None:
    shared = MemoryStorage()

    def open_storage() -> Storage:
        if kind == "sqlite":
            return SQLiteStorage(tmp_path / "blobs.db")
        if kind == "memory_versions":
            return VersionedOnly(shared)
        return LocalFileStorage(tmp_path) if kind == "local_file" else shared

    if kind in ("sqlite", "memory_versions"):
        assert not isinstance(open_storage(), AppendStorage)
        assert isinstance(open_storage(), ConditionalStorage)

    seed = agent_of(None)
    seed.messages = [text(0)]  # type: ignore[list-item]
    await SnapshotSessionManager("s", storage=open_storage()).save_snapshot(seed, is_latest=True)
    one, two = agent_of(None), agent_of(None)
    first = SnapshotSessionManager("s", storage=open_storage())
    second = SnapshotSessionManager("s", storage=open_storage())
    assert await first.restore_snapshot(one)
    assert await second.restore_snapshot(two)
    one.messages.append(text(1))  # type: ignore[arg-type]
    await first.save_snapshot(one, is_latest=True)
    two.messages.append(text(2))  # type: ignore[arg-type]
    with pytest.raises(SessionConflictError, match="another writer") as info:
        await second.save_snapshot(two, is_latest=True)
    assert info.value.code == "session_conflict"
    assert await restored(open_storage()) == [text(0), text(1)]
    with pytest.raises(SessionConflictError):  # still stale: still refused
        await second.save_snapshot(two, is_latest=True)
    # Restoring picks up the other writer's save; saving then goes on from it.
    assert await second.restore_snapshot(two)
    two.messages.append(text(2))  # type: ignore[arg-type]
    await second.save_snapshot(two, is_latest=True)
    assert await restored(open_storage()) == [text(0), text(1), text(2)]
    await first.save_snapshot(one, is_latest=True)  # nothing new: nothing written, no conflict
    one.messages.append(text(3))  # type: ignore[arg-type]
    with pytest.raises(SessionConflictError):
        await first.save_snapshot(one, is_latest=True)
    assert await restored(open_storage()) == [text(0), text(1), text(2)]


@pytest.mark.parametrize("kind", ["local_file", "sqlite"])
async def test_two_writers_creating_one_latest_do_not_both_succeed(
    tmp_path: Path, kind: str
) -> None:
    def open_storage() -> Storage:
        if kind == "sqlite":
            return SQLiteStorage(tmp_path / "blobs.db")
        return LocalFileStorage(tmp_path)

    one, two = agent_of(None), agent_of(None)
    first = SnapshotSessionManager("s", storage=open_storage())
    second = SnapshotSessionManager("s", storage=open_storage())
    assert not await first.restore_snapshot(one)
    assert not await second.restore_snapshot(two)
    one.messages.append(text(1))  # type: ignore[arg-type]
    two.messages.append(text(2))  # type: ignore[arg-type]
    await first.save_snapshot(one, is_latest=True)
    with pytest.raises(SessionConflictError):
        await second.save_snapshot(two, is_latest=True)
    assert await restored(open_storage()) == [text(1)]


async def test_time_travel_replaces_latest_only_if_nobody_wrote_it_since(tmp_path: Path) -> None:
    storage = LocalFileStorage(tmp_path)
    writer = SnapshotSessionManager("s", storage=storage)
    agent = agent_of(None)
    agent.messages = [text(0)]  # type: ignore[list-item]
    old = await writer.save_snapshot(agent, is_latest=False)
    assert old is not None
    agent.messages.append(text(1))  # type: ignore[arg-type]
    await writer.save_snapshot(agent, is_latest=True)
    back = agent_of(None)
    traveller = SnapshotSessionManager("s", storage=LocalFileStorage(tmp_path))
    assert await traveller.restore_snapshot(back, snapshot_id=old)
    agent.messages.append(text(2))  # type: ignore[arg-type]
    await writer.save_snapshot(agent, is_latest=True)  # meanwhile
    with pytest.raises(SessionConflictError):
        await traveller.save_snapshot(back, is_latest=True)
    assert await restored(storage) == [text(0), text(1), text(2)]
    assert await traveller.restore_snapshot(back, snapshot_id=old)
    await traveller.save_snapshot(back, is_latest=True)  # nobody wrote since: it goes back
    assert await restored(storage) == [text(0)]


WRITER = textwrap.dedent(
    """
    import asyncio, sys, time
    from pathlib import Path
    from perdure import Agent, NullConversationManager
    from perdure.errors import SessionConflictError
    from perdure.models import ScriptedModel
    from perdure.snapshots.manager import SnapshotSessionManager
    from perdure.storage import LocalFileStorage

    async def main():
        root, name, count, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
        manager = SnapshotSessionManager("s", storage=LocalFileStorage(root))
        agent = Agent(model=ScriptedModel([]), conversation_manager=NullConversationManager())
        await manager.restore_snapshot(agent)
        print("ready", flush=True)
        while not go.exists():
            time.sleep(0.001)
        conflicts = 0
        for i in range(count):
            message = {"role": "user", "content": [{"text": f"{name} {i}"}]}
            while True:
                agent.messages.append(message)
                try:
                    await manager.save_snapshot(agent, is_latest=True)
                except SessionConflictError:
                    conflicts += 1
                    await manager.restore_snapshot(agent)  # take the other's saves
                    continue
                print(f"ack {name} {i}", flush=True)
                break
        print(f"conflicts {conflicts}", flush=True)

    asyncio.run(main())
    """
)


def test_two_processes_saving_one_agent_lose_no_acknowledged_message(tmp_path: Path) -> None:
    """Each process saves, and on a conflict restores (taking the other's messages).

    In the end ``latest`` holds every message either process had acknowledged, each
    once and in its writer's order: no save overwrote another's.
    """
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    go = tmp_path / "go"
    count = 60
    root = tmp_path / "blobs"
    children = [
        subprocess.Popen(
            [sys.executable, str(script), str(root), name, str(count), str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("a", "b")
    ]
    for child in children:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
    go.write_bytes(b"")
    outputs = [child.communicate(timeout=180) for child in children]
    conflicts = 0
    acked: dict[str, list[int]] = {"a": [], "b": []}
    for child, (stdout, errors) in zip(children, outputs, strict=True):
        assert child.returncode == 0, errors
        for line in stdout.splitlines():
            word, *rest = line.split()
            if word == "ack":
                acked[rest[0]].append(int(rest[1]))
            else:
                conflicts += int(rest[0])
    texts = [m["content"][0]["text"] for m in asyncio.run(restored(LocalFileStorage(root)))]
    assert len(texts) == 2 * count
    for name in ("a", "b"):
        assert acked[name] == list(range(count))
        assert [int(t.split()[1]) for t in texts if t.split()[0] == name] == acked[name]
    assert conflicts > 0  # they did collide


# ------------------------------------------------------ unknown outcomes


@pytest.mark.parametrize("when", ["before", "after"])
async def test_a_save_whose_outcome_is_unknown_is_settled_by_the_next_one(
    tmp_path: Path, when: str
) -> None:
    storage = LostAcks(LocalFileStorage(tmp_path))
    assert isinstance(storage, AppendStorage)
    manager = SnapshotSessionManager("s", storage=storage)
    agent = agent_of(None)
    agent.messages = [text(0)]  # type: ignore[list-item]
    await manager.save_snapshot(agent, is_latest=True)
    agent.messages.append(text(1))  # type: ignore[arg-type]
    storage.fail = when
    with pytest.raises((OSError, asyncio.CancelledError)):
        await manager.save_snapshot(agent, is_latest=True)
    storage.fail = None
    held = await restored(storage)
    assert held == ([text(0)] if when == "before" else [text(0), text(1)])
    agent.messages.append(text(2))  # type: ignore[arg-type]
    await manager.save_snapshot(agent, is_latest=True)  # no false conflict either way
    assert await restored(storage) == [text(0), text(1), text(2)]


async def test_after_an_unknown_outcome_another_writers_save_is_still_a_conflict(
    tmp_path: Path,
) -> None:
    storage = LostAcks(LocalFileStorage(tmp_path))
    manager = SnapshotSessionManager("s", storage=storage)
    agent = agent_of(None)
    agent.messages = [text(0)]  # type: ignore[list-item]
    await manager.save_snapshot(agent, is_latest=True)
    other = agent_of(None)
    other_manager = SnapshotSessionManager("s", storage=LocalFileStorage(tmp_path))
    assert await other_manager.restore_snapshot(other)
    agent.messages.append(text(1))  # type: ignore[arg-type]
    storage.fail = "after"
    with pytest.raises(asyncio.CancelledError):
        await manager.save_snapshot(agent, is_latest=True)
    storage.fail = None
    other.messages.append(text(9))  # type: ignore[arg-type]
    with pytest.raises(SessionConflictError):  # the lost ack's record did land
        await other_manager.save_snapshot(other, is_latest=True)
    assert await other_manager.restore_snapshot(other)
    other.messages.append(text(9))  # type: ignore[arg-type]
    await other_manager.save_snapshot(other, is_latest=True)
    agent.messages.append(text(2))  # type: ignore[arg-type]
    with pytest.raises(SessionConflictError):
        await manager.save_snapshot(agent, is_latest=True)
    assert await restored(storage) == [text(0), text(1), text(9)]


@pytest.mark.parametrize("when", ["before", "after"])
async def test_a_conditional_save_whose_outcome_is_unknown_is_settled_by_the_next_one(
    tmp_path: Path, when: str
) -> None:
    storage = VersionedOnly(SQLiteStorage(tmp_path / "blobs.db"))
    manager = SnapshotSessionManager("s", storage=storage)
    agent = agent_of(None)
    agent.messages = [text(0)]  # type: ignore[list-item]
    await manager.save_snapshot(agent, is_latest=True)
    agent.messages.append(text(1))  # type: ignore[arg-type]
    storage.fail = when
    with pytest.raises((OSError, asyncio.CancelledError)):
        await manager.save_snapshot(agent, is_latest=True)
    storage.fail = None
    held = await restored(storage)
    assert held == ([text(0)] if when == "before" else [text(0), text(1)])
    agent.messages.append(text(2))  # type: ignore[arg-type]
    await manager.save_snapshot(agent, is_latest=True)  # no false conflict either way
    assert await restored(storage) == [text(0), text(1), text(2)]


async def test_after_an_unknown_conditional_outcome_another_save_is_still_a_conflict(
    tmp_path: Path,
) -> None:
    storage = VersionedOnly(SQLiteStorage(tmp_path / "blobs.db"))
    manager = SnapshotSessionManager("s", storage=storage)
    agent = agent_of(None)
    agent.messages = [text(0)]  # type: ignore[list-item]
    await manager.save_snapshot(agent, is_latest=True)
    other = agent_of(None)
    other_manager = SnapshotSessionManager("s", storage=SQLiteStorage(tmp_path / "blobs.db"))
    assert await other_manager.restore_snapshot(other)
    agent.messages.append(text(1))  # type: ignore[arg-type]
    storage.fail = "after"
    with pytest.raises(asyncio.CancelledError):
        await manager.save_snapshot(agent, is_latest=True)
    storage.fail = None
    other.messages.append(text(9))  # type: ignore[arg-type]
    with pytest.raises(SessionConflictError):  # the lost ack's write did land
        await other_manager.save_snapshot(other, is_latest=True)
    assert await other_manager.restore_snapshot(other)
    other.messages.append(text(9))  # type: ignore[arg-type]
    await other_manager.save_snapshot(other, is_latest=True)
    agent.messages.append(text(2))  # type: ignore[arg-type]
    with pytest.raises(SessionConflictError):
        await manager.save_snapshot(agent, is_latest=True)
    assert await restored(storage) == [text(0), text(1), text(9)]


# ------------------------------------------------------------------ damage


async def test_a_torn_last_record_restores_the_save_before_it_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    storage = LocalFileStorage(tmp_path)
    manager = SnapshotSessionManager("s", storage=storage)
    agent = agent_of(None)
    for i in range(4):
        agent.messages.append(text(i))  # type: ignore[arg-type]
        await manager.save_snapshot(agent, is_latest=True)
    path = tmp_path / "sessions/s/agents/default/latest.blob"
    blob = path.read_bytes()
    path.write_bytes(blob[:-20])  # what a crash in the middle of the last append leaves
    again = agent_of(None)
    resumed = SnapshotSessionManager("s", storage=storage)
    with caplog.at_level("WARNING", logger="perdure"):
        assert await resumed.restore_snapshot(again)
    assert again.messages == agent.messages[:3]
    (record,) = [r for r in caplog.records if r.name.startswith("perdure")]
    assert "interrupted" in record.getMessage()
    assert "message 3" not in record.getMessage()
    # The next save starts the log afresh (no append after the torn bytes).
    inode = path.stat().st_ino
    again.messages.append(text(7))  # type: ignore[arg-type]
    await resumed.save_snapshot(again, is_latest=True)
    assert path.stat().st_ino != inode
    assert await restored(storage) == [text(0), text(1), text(2), text(7)]


async def test_a_damaged_record_in_the_middle_is_corruption(tmp_path: Path) -> None:
    storage = LocalFileStorage(tmp_path)
    manager = SnapshotSessionManager("s", storage=storage)
    agent = agent_of(None)
    for i in range(4):
        agent.messages.append(text(i))  # type: ignore[arg-type]
        await manager.save_snapshot(agent, is_latest=True)
    path = tmp_path / "sessions/s/agents/default/latest.blob"
    blob = bytearray(path.read_bytes())
    at = blob.index(b"message 2")
    blob[at + 8] ^= 0x01  # "message 3" in the third record
    path.write_bytes(bytes(blob))
    victim = agent_of(None)
    victim.messages = [text(99)]  # type: ignore[list-item]
    with pytest.raises(SessionCorruptedError, match="hash"):
        await SnapshotSessionManager("s", storage=storage).restore_snapshot(victim)
    assert victim.messages == [text(99)]


# ------------------------------------------------------------ old format


async def test_a_format_one_latest_restores_and_becomes_a_log(tmp_path: Path) -> None:
    files = LocalFileStorage(tmp_path)
    old = SnapshotSessionManager("s", storage=PlainStorage(files))  # as older perdure wrote
    agent = agent_of(None)
    agent.messages = [text(i, 300) for i in range(700)]  # type: ignore[list-item]
    agent.state.set("k", "v")
    snapshot_id = await old.save_snapshot(agent, is_latest=False)
    await old.save_snapshot(agent, is_latest=True)
    blob = await files.read(KEY)
    assert blob is not None
    assert blob.startswith(b"perdure-snapshot/1 crc32=")

    again = agent_of(None)
    manager = SnapshotSessionManager("s", storage=files)
    assert await manager.restore_snapshot(again)
    assert again.messages == agent.messages
    assert again.state.get() == {"k": "v"}
    again.messages.append(text(700))  # type: ignore[arg-type]
    await manager.save_snapshot(again, is_latest=True)
    blob = await files.read(KEY)
    assert blob is not None
    assert blob.startswith(b"perdure-snapshot/2\n")
    assert await restored(files) == again.messages
    past = agent_of(None)
    assert await manager.restore_snapshot(past, snapshot_id=snapshot_id)
    assert past.messages == agent.messages


async def test_a_format_one_latest_is_replaced_only_if_unchanged(tmp_path: Path) -> None:
    files = LocalFileStorage(tmp_path)
    old = SnapshotSessionManager("s", storage=PlainStorage(files))
    agent = agent_of(None)
    agent.messages = [text(0)]  # type: ignore[list-item]
    await old.save_snapshot(agent, is_latest=True)
    again = agent_of(None)
    manager = SnapshotSessionManager("s", storage=files)
    assert await manager.restore_snapshot(again)
    agent.messages.append(text(1))  # type: ignore[arg-type]
    await old.save_snapshot(agent, is_latest=True)  # an older perdure writes meanwhile
    again.messages.append(text(2))  # type: ignore[arg-type]
    with pytest.raises(SessionConflictError):
        await manager.save_snapshot(again, is_latest=True)
    assert await restored(files) == [text(0), text(1)]
