"""Byte flips in real SQLite files: every outcome is the right content or a PerdureError.

Every SQLite user in perdure (the session store, the blob storage, the memory store)
translates driver errors in one place (``perdure._runtime.sqlite``): damage is a
structured error, never ``OSError``, ``UnicodeDecodeError`` or a ``sqlite3`` error,
and ``verify_store`` / ``perdure verify`` report it instead of crashing.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from perdure._runtime.sqlite import SQLiteBugError, sqlite_fault
from perdure._runtime.sqlite_wal import _frame_checksum, wal_checksum, wal_damage
from perdure.cli.main import cli
from perdure.errors import (
    MemoryStoreError,
    PerdureError,
    SessionCorruptedError,
    SessionNotFoundError,
)
from perdure.maintenance import verify_store
from perdure.memory import LocalMemoryStore
from perdure.session import DamagedCheckpoint, Session, scan_checkpoints
from perdure.storage import SQLiteStorage
from perdure.stores.sqlite import SQLiteSessionStore
from perdure.types import Message

SESSIONS = ("alpha", "beta")


def history(session_id: str, n: int = 12) -> list[Message]:
    # Non-ASCII text, so that flipped bytes can make stored text invalid UTF-8.
    return [
        {
            "role": "user" if i % 2 == 0 else "assistant",
            "content": [{"text": f"{session_id} message {i}: café, naïve, 東京 ✓"}],
        }
        for i in range(n)
    ]


def state(session_id: str) -> dict[str, Any]:
    return {"owner": session_id, "visits": 12}


def seed_sessions(path: Path) -> None:
    async def seed() -> None:
        store = SQLiteSessionStore(path)
        for sid in SESSIONS:
            await store.create(sid)
            messages = history(sid)
            for end in range(1, len(messages) + 1):
                await store.commit(sid, messages[:end], agent_state=state(sid))
            await Session(store, sid).checkpoint(label="before")
        store.close()  # folds and deletes the WAL: one file

    asyncio.run(seed())
    assert not Path(f"{path}-wal").exists()


def flipped(data: bytes, offset: int, rng: random.Random) -> bytes:
    damaged = bytearray(data)
    damaged[offset] ^= rng.randrange(1, 256)
    return bytes(damaged)


def fresh(path: Path, data: bytes) -> None:
    for suffix in ("-wal", "-shm", ".damaged-wal"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    path.write_bytes(data)


async def read_sessions(path: Path) -> str:
    """``same``, ``error`` (a PerdureError), or anything else as what leaked."""
    store = SQLiteSessionStore(path)
    try:
        for sid in SESSIONS:
            record = await store.get(sid)
            if record.messages != history(sid) or record.agent_state != state(sid):
                return "DIFFERENT CONTENT"
            for meta in await store.checkpoints.list(sid):
                await store.checkpoints.get(sid, meta.checkpoint_id)
        metas = await store.list()
        if [m.session_id for m in metas] != list(SESSIONS):
            return "DIFFERENT LISTING"
        return "same"
    except SessionNotFoundError:
        # A flip in a session row's id renames the session: the id is not covered by
        # the chain (see the README's reliability section). Nothing else may do this.
        try:
            return "renamed" if len(await store.list()) == len(SESSIONS) else "NOT FOUND"
        except PerdureError:
            return "error"
    except PerdureError:
        return "error"
    except Exception as exc:
        return f"LEAKED {type(exc).__name__}: {exc}"
    finally:
        store.close()


async def verify(path: Path) -> str:
    store = SQLiteSessionStore(path)
    try:
        report = await verify_store(store)
        return "clean" if report.clean else "damage"
    except Exception as exc:
        return f"CRASHED {type(exc).__name__}: {exc}"
    finally:
        store.close()


def test_flipped_bytes_in_a_session_database_are_reported_never_leaked(tmp_path: Path) -> None:
    seeded = tmp_path / "seed.db"
    seed_sessions(seeded)
    data = seeded.read_bytes()
    path = tmp_path / "damaged.db"
    rng = random.Random(14)
    outcomes: Counter[str] = Counter()
    leaks: list[tuple[int, str]] = []
    for offset in range(0, len(data), 11):
        fresh(path, flipped(data, offset, rng))
        read = asyncio.run(read_sessions(path))
        checked = asyncio.run(verify(path))
        outcomes[read] += 1
        if read not in ("same", "error", "renamed"):
            leaks.append((offset, read))
        if checked.startswith("CRASHED"):
            leaks.append((offset, checked))
        if read == "error" and checked == "clean":
            leaks.append((offset, "verify missed damage that reads report"))
    assert not leaks, leaks[:10]
    assert outcomes["error"] > 50, outcomes  # the flips did hit what is read


def test_perdure_verify_never_prints_a_traceback(tmp_path: Path) -> None:
    seeded = tmp_path / "seed.db"
    seed_sessions(seeded)
    data = seeded.read_bytes()
    path = tmp_path / "damaged.db"
    rng = random.Random(7)
    runner = CliRunner(env={"COLUMNS": "200", "PERDURE_STORE": None})
    exits: Counter[int] = Counter()
    for offset in range(0, len(data), 97):
        fresh(path, flipped(data, offset, rng))
        result = runner.invoke(cli, ["verify", "--store", f"sqlite:{path}"])
        assert result.exception is None or isinstance(result.exception, SystemExit), (
            offset,
            result.exception,
        )
        assert "Traceback" not in result.output, (offset, result.output)
        assert result.exit_code in (0, 1, 4), (offset, result.output)
        exits[result.exit_code] += 1
    assert exits[1] > 0, exits


def test_stored_text_that_is_not_utf8_is_corruption_without_quoting_it(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    seed_sessions(path)
    conn = sqlite3.connect(path)
    conn.execute(
        "UPDATE perdure_messages SET body = CAST(X'7B22726F6C65223AFF22' AS TEXT) "
        "WHERE key = (SELECT MIN(key) FROM perdure_messages)"
    )
    conn.commit()
    conn.close()

    async def main() -> None:
        store = SQLiteSessionStore(path)
        with pytest.raises(PerdureError) as info:
            await store.get(SESSIONS[0])
        store.close()
        assert info.value.code == "session_store_corrupted"
        assert "not valid UTF-8" in info.value.message
        assert "role" not in info.value.message  # content is never quoted

    asyncio.run(main())


def test_perdures_own_sql_errors_are_bugs_not_damage(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "x.db")
    conn.execute("CREATE TABLE t (k INTEGER PRIMARY KEY)")
    conn.execute("INSERT INTO t VALUES (1)")
    errors: list[sqlite3.Error] = []
    for statement in ("INSERT INTO t VALUES (1)", "SELECT nosuch FROM t", "SELEC 1"):
        with pytest.raises(sqlite3.Error) as info:
            conn.execute(statement)
        errors.append(info.value)
    conn.close()
    assert [sqlite_fault(e) for e in errors] == ["bug", "bug", "bug"]
    assert issubclass(SQLiteBugError, RuntimeError)
    assert not issubclass(SQLiteBugError, PerdureError)


def test_a_table_gone_from_the_schema_is_damage_not_a_new_empty_store(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    seed_sessions(path)
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE perdure_sessions")  # as a damaged schema page would lose it
    conn.commit()
    conn.close()

    async def main() -> None:
        store = SQLiteSessionStore(path)
        with pytest.raises(PerdureError) as info:
            await store.list()
        store.close()
        assert info.value.code == "session_store_corrupted"
        assert "perdure_sessions" in info.value.message

    asyncio.run(main())
    tables = sqlite3.connect(path).execute("SELECT name FROM sqlite_master").fetchall()
    assert ("perdure_sessions",) not in tables  # nothing was created over the damage


def test_flipped_bytes_in_a_blob_storage_are_reported_never_leaked(tmp_path: Path) -> None:
    blobs = {f"agents/a{i}/snapshot": f"blob {i} é".encode() * 40 for i in range(8)}
    seeded = tmp_path / "seed.db"

    async def seed() -> None:
        storage = SQLiteStorage(seeded)
        for key, value in blobs.items():
            await storage.write(key, value)
        storage.close()

    asyncio.run(seed())
    data = seeded.read_bytes()
    path = tmp_path / "damaged.db"
    rng = random.Random(3)

    async def read() -> str:
        storage = SQLiteStorage(path)
        try:
            keys = await storage.list("agents/")
            values = {key: await storage.read(key) for key in keys}
            return "same" if values == blobs else "different"
        except PerdureError:
            return "error"
        except Exception as exc:
            return f"LEAKED {type(exc).__name__}: {exc}"
        finally:
            storage.close()

    outcomes: Counter[str] = Counter()
    for offset in range(0, len(data), 13):
        fresh(path, flipped(data, offset, rng))
        outcome = asyncio.run(read())
        assert not outcome.startswith("LEAKED"), (offset, outcome)
        outcomes[outcome] += 1
    # Blobs carry no hash: a flip inside one reads back as other bytes (the snapshot
    # formats above check their own hashes). What must not happen is a leak.
    assert outcomes["error"] > 0, outcomes


def test_flipped_bytes_in_a_memory_store_are_memory_store_errors(tmp_path: Path) -> None:
    seeded = tmp_path / "seed.sqlite"

    async def seed() -> None:
        store = LocalMemoryStore(seeded, namespace="alice")
        for i in range(10):
            await store.add(f"memory {i}: the user likes café ✓", metadata={"n": i})
        store.close()

    asyncio.run(seed())
    data = seeded.read_bytes()
    path = tmp_path / "damaged.sqlite"
    rng = random.Random(5)

    async def read() -> str:
        store = LocalMemoryStore(path, namespace="alice")
        try:
            await store.list()
            await store.search("café", limit=5)
            await store.add("one more: the user likes trains")
            return "read"
        except MemoryStoreError:
            return "error"
        except Exception as exc:
            return f"LEAKED {type(exc).__name__}: {exc}"
        finally:
            store.close()

    outcomes: Counter[str] = Counter()
    # A sample of the file, and every 7th byte of its last pages, where the FTS5
    # index and its structure record live.
    offsets = sorted({*range(0, len(data), 37), *range(len(data) - 3 * 4096, len(data), 7)})
    for offset in offsets:
        fresh(path, flipped(data, offset, rng))
        outcome = asyncio.run(read())
        assert not outcome.startswith("LEAKED"), (offset, outcome)
        outcomes[outcome] += 1
    assert outcomes["error"] > 0, outcomes


# ---------------------------------------------------------------- the WAL


@pytest.fixture
def fast_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory in memory when there is one: these tests fsync a lot (SQLite folds
    the WAL when each copy is closed), and what they test is not the disk."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or not os.access(shm, os.W_OK):
        yield tmp_path
        return
    with tempfile.TemporaryDirectory(dir=shm, prefix="perdure-test-") as directory:
        yield Path(directory)


def test_the_fast_wal_checksum_is_sqlites() -> None:
    rng = random.Random(6)
    for big_endian in (False, True):
        for size in (512, 4096, 65536):
            head = rng.randbytes(24)
            page = rng.randbytes(size)
            s1, s2 = rng.getrandbits(32), rng.getrandbits(32)
            assert _frame_checksum(head, page, big_endian, s1, s2) == wal_checksum(
                head[:8] + page, big_endian, s1, s2
            )


def open_copy(path: Path, n: int) -> tuple[bytes, bytes]:
    """Commit ``n`` messages one by one and copy the database and its WAL while open.

    The copy is what a writer killed at that moment leaves behind: SQLite has not
    folded the last commits into the database yet.
    """

    async def write_and_copy() -> tuple[bytes, bytes]:
        # Copy while the store is open, before close() folds the WAL.
        store = SQLiteSessionStore(path)
        await store.create("s")
        messages = history("s", n)
        for end in range(1, n + 1):
            await store.commit("s", messages[:end])
        copied = await asyncio.to_thread(
            lambda: (path.read_bytes(), Path(f"{path}-wal").read_bytes())
        )
        store.close()
        return copied

    return asyncio.run(write_and_copy())


async def read_copy(path: Path, n: int) -> str:
    store = SQLiteSessionStore(path)
    try:
        record = await store.get("s")
        if record.messages == history("s", n):
            return "same"
        return f"shorter by {n - len(record.messages)}"
    except PerdureError as exc:
        return exc.details.get("kind", exc.code)
    finally:
        store.close()


def test_a_damaged_wal_frame_is_corruption_not_a_shorter_history(fast_dir: Path) -> None:
    n = 60
    database, wal = open_copy(fast_dir / "source.db", n)
    assert wal_damage(wal) is None  # the undamaged log reads to its end
    path = fast_dir / "copy.db"
    fresh(path, database)
    Path(f"{path}-wal").write_bytes(wal)
    assert asyncio.run(read_copy(path, n)) == "same"
    rng = random.Random(60)
    outcomes: Counter[str] = Counter()
    for offset in range(0, len(wal), 2003):
        fresh(path, database)
        Path(f"{path}-wal").write_bytes(flipped(wal, offset, rng))
        outcomes[asyncio.run(read_copy(path, n))] += 1
    # Damage in the last transaction of the log looks exactly like a torn tail and
    # loses that one commit (the README says so); anything earlier is detected.
    assert set(outcomes) <= {"same", "bad_wal", "shorter by 1"}, outcomes
    assert outcomes["bad_wal"] > 10 * outcomes["shorter by 1"], outcomes


def test_a_wal_cut_by_a_crash_is_a_torn_tail(fast_dir: Path) -> None:
    n = 30
    database, wal = open_copy(fast_dir / "source.db", n)
    frame = 24 + 4096
    path = fast_dir / "copy.db"
    for cut in (len(wal) - 100, len(wal) - frame, len(wal) - 3 * frame - 7):
        assert wal_damage(wal[:cut]) is None
        fresh(path, database)
        Path(f"{path}-wal").write_bytes(wal[:cut])
        assert asyncio.run(read_copy(path, n)).startswith("shorter by"), cut


def test_a_damaged_wal_header_is_corruption(fast_dir: Path) -> None:
    n = 30
    database, wal = open_copy(fast_dir / "source.db", n)
    path = fast_dir / "copy.db"
    for offset in range(0, 32, 3):
        fresh(path, database)
        Path(f"{path}-wal").write_bytes(flipped(wal, offset, random.Random(offset)))
        assert asyncio.run(read_copy(path, n)) == "bad_wal", offset


def test_verify_reports_a_damaged_wal(fast_dir: Path) -> None:
    n = 30
    database, wal = open_copy(fast_dir / "source.db", n)
    path = fast_dir / "copy.db"
    fresh(path, database)
    Path(f"{path}-wal").write_bytes(flipped(wal, 32 + 24 + 100, random.Random(1)))
    report = asyncio.run(verify(path))
    assert report == "damage"
    result = CliRunner(env={"COLUMNS": "200", "PERDURE_STORE": None}).invoke(
        cli, ["verify", "--store", f"sqlite:{path}"]
    )
    assert result.exit_code == 1, result.output
    assert "bad_wal" in result.output
    assert "copy.db.damaged-wal byte" in result.output


def test_repair_moves_a_damaged_wal_to_quarantine_and_keeps_the_prefix(fast_dir: Path) -> None:
    n = 30
    database, wal = open_copy(fast_dir / "source.db", n)
    path = fast_dir / "copy.db"
    fresh(path, database)
    Path(f"{path}-wal").write_bytes(flipped(wal, 32 + 20 * (24 + 4096) + 500, random.Random(2)))
    runner = CliRunner(env={"COLUMNS": "200", "PERDURE_STORE": None})
    url = f"sqlite:{path}"
    assert runner.invoke(cli, ["verify", "--store", url]).exit_code == 1
    dry = runner.invoke(cli, ["repair", "--store", url])
    assert dry.exit_code == 1, dry.output
    assert "would move the damaged WAL" in dry.output
    assert Path(f"{path}.damaged-wal").exists()
    quarantine = fast_dir / "q"
    applied = runner.invoke(
        cli, ["repair", "--store", url, "--apply", "--quarantine-dir", str(quarantine), "--json"]
    )
    assert applied.exit_code == 0, applied.output
    report = json.loads(applied.stdout)
    (moved,) = report["moved_files"]
    assert Path(moved).parent == quarantine
    assert Path(moved).read_bytes()[:32] == wal[:32]  # the log as it was found
    assert not Path(f"{path}.damaged-wal").exists()
    assert runner.invoke(cli, ["verify", "--store", url]).exit_code == 0
    kept = asyncio.run(read_copy(path, n))
    assert kept.startswith("shorter by") or kept == "session_not_found", kept


KILLED_WRITER = """
import asyncio, os, signal, sys
from perdure.stores.sqlite import SQLiteSessionStore

async def main():
    store = SQLiteSessionStore(sys.argv[1])
    await store.create("s")
    messages = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": [{"text": f"m{i}"}]}
        for i in range(int(sys.argv[2]))
    ]
    for end in range(1, len(messages) + 1):
        await store.commit("s", messages[:end])  # durable: acknowledged when it returns
    os.kill(os.getpid(), signal.SIGKILL)

asyncio.run(main())
"""


def test_a_flipped_byte_in_the_wal_of_a_killed_writer_is_reported(fast_dir: Path) -> None:
    path = fast_dir / "killed.db"
    n = 40
    done = subprocess.run(
        [sys.executable, "-c", KILLED_WRITER, str(path), str(n)],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        check=False,
    )
    assert done.returncode == -signal.SIGKILL
    wal = Path(f"{path}-wal")
    assert wal.stat().st_size > 10 * (24 + 4096)  # the commits are in the WAL only
    damaged = bytearray(wal.read_bytes())
    damaged[32 + 10 * (24 + 4096) + 1000] ^= 0x01  # one bit in frame 10's page
    wal.write_bytes(bytes(damaged))

    async def read() -> None:
        store = SQLiteSessionStore(path)
        try:
            with pytest.raises(SessionCorruptedError) as info:
                await store.get("s")
            assert info.value.details["kind"] == "bad_wal"
            assert info.value.details["frame"] == 10
        finally:
            store.close()

    asyncio.run(read())
    asyncio.run(read())  # still reported: the log was set aside, not folded and forgotten


def test_a_damaged_page_of_session_rows_or_their_index_is_never_a_missing_session(
    tmp_path: Path,
) -> None:
    # SQLite can skip the rows of a damaged B-tree page without an error: a session
    # would then be "not found", or missing from the listing that verify walks.
    seeded = tmp_path / "seed.db"
    seed_sessions(seeded)
    data = seeded.read_bytes()
    conn = sqlite3.connect(seeded)
    roots = dict(
        conn.execute(
            "SELECT name, rootpage FROM sqlite_master WHERE name IN "
            "('perdure_sessions', 'sqlite_autoindex_perdure_sessions_1')"
        ).fetchall()
    )
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    conn.close()
    path = tmp_path / "damaged.db"
    outcomes: Counter[str] = Counter()
    for name, root in roots.items():
        start = (root - 1) * page_size
        for offset in range(start, start + 12):  # the page header: kind, counts, pointers
            for value in (0x00, 0x01, 0x7F, 0xE1, 0xFF):
                damaged = bytearray(data)
                if damaged[offset] == value:
                    continue
                damaged[offset] = value
                fresh(path, bytes(damaged))
                read = asyncio.run(read_sessions(path))
                checked = asyncio.run(verify(path))
                outcomes[read] += 1
                assert read in ("same", "error"), (name, offset, value, read)
                assert (read == "same") == (checked == "clean"), (name, offset, value, checked)
    assert outcomes["error"] > 20, outcomes


def test_a_checkpoint_stored_under_a_malformed_id_is_damage(tmp_path: Path) -> None:
    """A flipped byte in a checkpoint's id column: verify reports it, never raises
    the ValueError a caller's malformed id gets, and new checkpoints still work."""
    path = tmp_path / "s.db"
    seed_sessions(path)
    with sqlite3.connect(path) as conn:
        (good,) = conn.execute(
            "SELECT checkpoint_id FROM perdure_checkpoints WHERE session_id = ?", (SESSIONS[0],)
        ).fetchone()
        conn.execute(
            "UPDATE perdure_checkpoints SET checkpoint_id = ? WHERE checkpoint_id = ?",
            (good[:9] + "!" + good[10:], good),
        )
    conn.close()
    store = SQLiteSessionStore(path)
    try:
        report = asyncio.run(verify_store(store))
        assert [(d.session_id, d.kind) for d in report.damage] == [(SESSIONS[0], "bad_checkpoint")]
        found = asyncio.run(scan_checkpoints(store.checkpoints, SESSIONS[0]))
        assert [isinstance(c, DamagedCheckpoint) for c in found] == [True]
        made = asyncio.run(Session(store, SESSIONS[0]).checkpoint(label="after"))
        assert made.label == "after"
    finally:
        store.close()


def test_a_non_durable_store_does_not_take_a_hole_in_its_wal_for_damage(fast_dir: Path) -> None:
    """With durability="none" (synchronous=NORMAL) the kernel may write later WAL
    frames before earlier ones, so a power cut can leave a hole in front of complete
    transactions: the commits are lost as "none" allows, and the store opens."""
    n = 20
    database, wal = open_copy(fast_dir / "source.db", n)
    hole = bytearray(wal)
    hole[32 + 3 * (24 + 4096) : 32 + 4 * (24 + 4096)] = bytes(24 + 4096)  # frame 3 zeroed
    path = fast_dir / "copy.db"
    for durability, outcome in (("commit", "bad_wal"), ("none", "opened")):
        fresh(path, database)
        Path(f"{path}-wal").write_bytes(bytes(hole))

        async def read(durability: Any = durability) -> str:
            store = SQLiteSessionStore(path, durability=durability)
            try:
                await store.get("s")
                return "opened"
            except PerdureError as exc:
                return str(exc.details.get("kind", exc.code))
            finally:
                store.close()

        assert asyncio.run(read()) == outcome


def test_a_row_past_the_recorded_count_is_damage_not_a_bug(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = SQLiteSessionStore(path)
    messages = history("s", 3)
    asyncio.run(store.create("s"))
    asyncio.run(store.commit("s", messages))
    store.close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE perdure_sessions SET message_count = 2")
    conn.close()
    store = SQLiteSessionStore(path)
    try:
        with pytest.raises(SessionCorruptedError, match="past the recorded end"):
            asyncio.run(store.commit("s", [*messages[:2], messages[0]]))
    finally:
        store.close()


# ------------------------------------------------------------ a database cut to nothing

APPLICATION_ID = 0x70726472  # "prdr", perdure's mark in the database header


def application_id(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("PRAGMA application_id").fetchone()[0])
    finally:
        conn.close()


@pytest.mark.parametrize("wal", ["without", "with"])
def test_a_database_cut_to_nothing_is_damage_not_an_empty_store(tmp_path: Path, wal: str) -> None:
    path = tmp_path / "s.db"
    kept_wal = b""

    async def seed() -> None:
        nonlocal kept_wal
        store = SQLiteSessionStore(path)
        await store.create("s")
        await store.commit("s", history("s"), agent_state=state("s"))
        # The commits, before close folds them into the database.
        kept_wal = await asyncio.to_thread(Path(f"{path}-wal").read_bytes)
        store.close()

    asyncio.run(seed())
    assert kept_wal
    path.write_bytes(b"")
    if wal == "with":
        Path(f"{path}-wal").write_bytes(kept_wal)

    async def read() -> list[SessionCorruptedError]:
        store = SQLiteSessionStore(path)
        errors = []
        try:
            for call in (store.list, lambda: store.get("s"), lambda: store.create("t")):
                with pytest.raises(SessionCorruptedError) as info:
                    await call()
                errors.append(info.value)
        finally:
            store.close()
        return errors

    for error in asyncio.run(read()):
        assert error.code == "session_store_corrupted"
        assert error.details["kind"] == "bad_database"
        assert error.details["file"] == str(path)
        assert str(path) in error.message
        assert "empty (0 bytes)" in error.message
        assert "move it aside" in error.message
    # Nothing was written over the damage: no new database, the WAL left as it was.
    assert path.read_bytes() == b""
    if wal == "with":
        assert Path(f"{path}-wal").read_bytes() == kept_wal
    assert asyncio.run(verify(path)) == "damage"  # reported, not a crash


def test_a_new_database_is_made_whole_with_perdures_mark(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "s.db"

    async def main() -> None:
        store = SQLiteSessionStore(path)
        assert await store.list() == []
        await store.create("s")
        await store.commit("s", history("s"), agent_state=state("s"))
        store.close()
        again = SQLiteSessionStore(path)
        record = await again.get("s")
        again.close()
        assert (record.messages, record.agent_state) == (history("s"), state("s"))

    asyncio.run(main())
    assert application_id(path) == APPLICATION_ID
    assert not [p.name for p in path.parent.iterdir() if ".new-" in p.name]  # no temp left


CRASH_WHILE_CREATING = """
import asyncio, os, signal, sys
from perdure.stores.sqlite import SQLiteSessionStore

def die(*args, **kwargs):  # the process dies where the new database is linked in
    os.kill(os.getpid(), signal.SIGKILL)

os.link = die
asyncio.run(SQLiteSessionStore(sys.argv[1]).list())
"""


def test_a_crash_while_a_database_is_made_does_not_block_the_next_open(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", CRASH_WHILE_CREATING, str(path)], env=env, timeout=60
    )
    assert done.returncode == -signal.SIGKILL
    assert not path.exists()
    assert [p for p in tmp_path.iterdir() if ".new-" in p.name]  # the half-made one

    async def main() -> None:
        store = SQLiteSessionStore(path)
        assert await store.list() == []
        await store.create("s")
        await store.commit("s", history("s"))
        assert (await store.get("s")).messages == history("s")
        store.close()

    asyncio.run(main())
    assert application_id(path) == APPLICATION_ID


def test_an_empty_database_with_a_header_but_no_tables_yet_opens_as_new(tmp_path: Path) -> None:
    # What a crash of an older perdure left while it made the database in place.
    path = tmp_path / "s.db"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.close()
    assert path.stat().st_size > 0

    async def main() -> None:
        store = SQLiteSessionStore(path)
        assert await store.list() == []
        await store.create("s")
        assert [m.session_id for m in await store.list()] == ["s"]
        store.close()

    asyncio.run(main())


def test_a_database_made_before_the_mark_opens_and_gets_it(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    seed_sessions(path)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA application_id = 0")  # as databases made before the mark
    conn.commit()
    conn.close()

    async def main() -> None:
        store = SQLiteSessionStore(path)
        assert (await store.get(SESSIONS[0])).messages == history(SESSIONS[0])
        await store.create("new")  # the first writer marks it
        store.close()

    asyncio.run(main())
    assert application_id(path) == APPLICATION_ID


def test_perdures_tables_all_gone_from_its_database_is_damage(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    seed_sessions(path)
    conn = sqlite3.connect(path)
    for table in ("perdure_sessions", "perdure_states", "perdure_messages", "perdure_checkpoints"):
        conn.execute(f"DROP TABLE {table}")
    conn.commit()
    conn.close()

    async def main() -> None:
        store = SQLiteSessionStore(path)
        with pytest.raises(SessionCorruptedError, match="tables are gone") as info:
            await store.list()
        store.close()
        assert info.value.details["kind"] == "bad_database"

    asyncio.run(main())
    tables = sqlite3.connect(path).execute("SELECT name FROM sqlite_master").fetchall()
    assert tables == [("sqlite_sequence",)]  # nothing was created over the damage


def test_another_applications_database_gets_perdures_tables_beside_its_own(
    tmp_path: Path,
) -> None:
    path = tmp_path / "app.db"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA application_id = 7")
    conn.execute("CREATE TABLE app_things (x)")
    conn.commit()
    conn.close()

    async def main() -> None:
        store = SQLiteSessionStore(path)
        await store.create("s")
        await store.commit("s", history("s"))
        assert (await store.get("s")).messages == history("s")
        store.close()

    asyncio.run(main())
    assert application_id(path) == 7  # another application's mark is left alone
    names = {r[0] for r in sqlite3.connect(path).execute("SELECT name FROM sqlite_master")}
    assert {"app_things", "perdure_sessions"} <= names


RACE_TO_CREATE = """
import asyncio, os, sys, time
from perdure.stores.sqlite import SQLiteSessionStore

while not os.path.exists(sys.argv[2]):  # all start together
    time.sleep(0.001)

async def main():
    store = SQLiteSessionStore(sys.argv[1])
    await store.create(sys.argv[3])
    store.close()

asyncio.run(main())
"""


def test_processes_racing_to_make_the_database_share_one(tmp_path: Path) -> None:
    path, go = tmp_path / "s.db", tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    names = [f"p{i}" for i in range(4)]
    children = [
        subprocess.Popen([sys.executable, "-c", RACE_TO_CREATE, str(path), str(go), name], env=env)
        for name in names
    ]
    go.touch()
    assert [child.wait(timeout=60) for child in children] == [0] * len(names)

    async def main() -> None:
        store = SQLiteSessionStore(path)
        assert sorted(m.session_id for m in await store.list()) == names
        store.close()

    asyncio.run(main())
    assert not [p.name for p in tmp_path.iterdir() if ".new-" in p.name]
