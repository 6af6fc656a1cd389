"""The file store's commit log (perdure.stores.file.wal): one fdatasync for many
sessions' appends, and recovery of what a crash took from the journals."""

from __future__ import annotations

import asyncio
import fcntl
import os
import random
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from concurrent_writer import history
from perdure.errors import SessionCorruptedError
from perdure.session import FileSessionStore
from perdure.stores.file import layout, wal
from perdure.stores.file import store as store_module
from perdure.stores.file.journal import GENESIS
from perdure.stores.file.layout import JOURNAL

TESTS = Path(__file__).resolve().parents[1]


async def log_ready(store: FileSessionStore) -> wal.CommitLog:
    """The store's log once made (the first held append asks for it)."""
    log = store._commit_log
    assert log is not None
    for _ in range(2000):
        if log._state == "ready":
            return log
        await asyncio.sleep(0.001)
    raise AssertionError(f"the log never became ready: {log._state}")


async def turns(store: FileSessionStore, session_id: str, upto: int, start: int = 0) -> None:
    if start == 0:
        await store.create(session_id)
    async with store.writer_lock(session_id):
        for count in range(start + 1, upto + 1):
            await store.commit(session_id, history(count, session_id))


def log_files(root: Path) -> list[Path]:
    return sorted((root / wal.LOG_DIR).glob("*.log"))


def logged(root: Path) -> list[wal.Entry]:
    return [entry for path in log_files(root) for entry in wal.read_entries(path.read_bytes())]


offloaded: list[bool] = []  # each spied sync: was it offloaded (the loop busy)?


def spy_log_syncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    offloaded.clear()
    real = wal.start_fsync

    def counting(
        fd: int, executor: Any = None, *, datasync: bool = False, offload: bool = False
    ) -> Any:
        calls.append(fd)
        offloaded.append(offload)
        return real(fd, executor, datasync=datasync, offload=offload)

    monkeypatch.setattr(wal, "start_fsync", counting)
    return calls


# ------------------------------------------------------------------ the format


def test_entries_read_back_in_order_and_stop_at_damage() -> None:
    entries = [wal.Entry(f"s{i}", 100 + i, 7, "a" * 32, f"line {i}\n".encode()) for i in range(5)]
    data = bytearray(2 * wal.HALF)
    data[0:20] = wal._header(3)
    at = 4096
    for entry in entries:
        blob = wal.encode_entry(3, entry)
        data[at : at + len(blob)] = blob
        at += len(blob)
    assert list(wal.read_entries(bytes(data))) == entries
    flipped = bytearray(data)
    flipped[4096 + 2 * 80] ^= 1  # inside the third entry
    read = list(wal.read_entries(bytes(flipped)))
    assert read == entries[: len(read)]
    assert len(read) < len(entries)
    # An entry of another generation than its half's header is not this log's.
    stale = bytearray(data)
    stale[0:20] = wal._header(4)
    assert list(wal.read_entries(bytes(stale))) == []
    # The second half counts on its own header.
    data[wal.HALF : wal.HALF + 20] = wal._header(4)
    blob = wal.encode_entry(4, entries[0])
    data[wal.HALF + 4096 : wal.HALF + 4096 + len(blob)] = blob
    assert list(wal.read_entries(bytes(data))) == [*entries, entries[0]]


# ------------------------------------------------------------ group commit


async def test_sixteen_sessions_share_the_log_syncs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    syncs = spy_log_syncs(monkeypatch)
    store = FileSessionStore(tmp_path / "data")
    await turns(store, "warm", 2)
    await log_ready(store)
    sessions = [f"s{i}" for i in range(16)]
    for sid in sessions:
        await turns(store, sid, 1)  # each journal's first append syncs it (size 0)
    syncs.clear()
    await asyncio.gather(*(turns(store, sid, 21, start=1) for sid in sessions))
    # 320 durable commits; those that came while a sync was in flight shared the next.
    assert 0 < len(syncs) < 320 / 2, len(syncs)
    # Syncs started for commits that queued behind one run off the loop's CPU.
    assert any(offloaded)
    fresh = FileSessionStore(tmp_path / "data")
    for sid in sessions:
        assert (await fresh.get(sid)).messages == history(21, sid)
    store.close()
    fresh.close()


async def test_a_lone_commit_is_synced_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    syncs = spy_log_syncs(monkeypatch)
    store = FileSessionStore(tmp_path / "data")
    await turns(store, "s", 2)
    await log_ready(store)
    syncs.clear()
    await turns(store, "s", 7, start=2)
    assert len(syncs) == 5  # one each: none waits for company
    assert offloaded == [False] * 5  # a lone commit's loop only waits: the fast way
    assert [e.data.count(b"\n") for e in logged(tmp_path / "data")][-5:] == [1] * 5
    store.close()


async def test_a_loops_commits_never_wait_on_another_loops_sync(tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path / "data")
    await turns(store, "s", 2)
    log = await log_ready(store)
    other = asyncio.new_event_loop()  # e.g. a thread's loop, closed or busy
    try:
        log._chains[other] = wal._Chain()
        log._chains[other].syncing = True  # its sync never returns
        await asyncio.wait_for(turns(store, "s", 6, start=2), 10)
    finally:
        other.close()
    assert (await store.get("s")).messages == history(6, "s")
    store.close()


async def test_a_logged_turn_leaves_its_head_to_the_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileSessionStore(tmp_path / "data")
    await turns(store, "s", 2)
    await log_ready(store)
    synced_heads: list[str] = []
    real = store_module.start_fsync

    def spy(fd: int, executor: Any = None) -> Any:
        synced_heads.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real(fd, executor)

    monkeypatch.setattr(store_module, "start_fsync", spy)
    await turns(store, "s", 6, start=2)
    assert synced_heads == []  # neither the journal nor the head synced on their own
    head = store.session_dir("s") / "head"
    assert layout.head_ends(store.session_dir("s"))[-1][2] == 6
    store.close()  # syncs them, and deletes the log
    assert head.exists()
    assert log_files(tmp_path / "data") == []


async def test_appends_wait_for_the_sync_that_covers_them(tmp_path: Path) -> None:
    """A commit does not return before a log sync that started after its copy."""
    store = FileSessionStore(tmp_path / "data")
    await turns(store, "s", 2)
    log = await log_ready(store)
    async with store.writer_lock("s"):
        loop = asyncio.get_running_loop()
        chain = log._chains.setdefault(loop, wal._Chain())
        chain.syncing = True  # as if a sync were in flight: the next one waits for it
        commit = asyncio.ensure_future(store.commit("s", history(3, "s")))
        await asyncio.sleep(0.05)
        assert not commit.done()
        with log._lock:
            log._start_sync(loop, chain)  # the in-flight one "returned": the next starts
        await asyncio.wait_for(commit, 5)
    assert (await store.get("s")).messages == history(3, "s")
    store.close()


async def test_copies_made_during_a_sync_are_written_at_once_before_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a sync is in flight, copies wait in memory: the next sync writes them
    all with one pwrite, before it starts (each is in the file before the sync that
    covers it), and none of their commits returns before that sync does."""
    root = tmp_path / "data"
    store = FileSessionStore(root)
    await turns(store, "warm", 2)
    log = await log_ready(store)
    sessions = [f"s{i}" for i in range(4)]
    for sid in sessions:
        await turns(store, sid, 1)  # each journal's first append syncs it (size 0)
    base = len(logged(root))
    in_file: list[int] = []  # entries in the log file as each sync starts
    held: list[asyncio.Future[None]] = []

    def holding(
        fd: int, executor: Any = None, *, datasync: bool = False, offload: bool = False
    ) -> Any:
        in_file.append(len(logged(root)))
        held.append(asyncio.get_running_loop().create_future())
        return held[-1]

    log_writes: list[int] = []
    real_pwrite = os.pwrite

    def pwrite(fd: int, data: Any, offset: int) -> int:
        if fd == log._fd:
            log_writes.append(len(data))
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(wal, "start_fsync", holding)
    monkeypatch.setattr(os, "pwrite", pwrite)
    commits = [asyncio.ensure_future(turns(store, sid, 2, start=1)) for sid in sessions]
    for _ in range(500):
        if len(log._pending) == 3:
            break
        await asyncio.sleep(0.001)
    assert len(log._pending) == 3
    assert len(held) == 1
    assert in_file == [base + 1]
    assert len(log_writes) == 1
    held[0].set_result(None)
    await asyncio.sleep(0.01)
    assert [c.done() for c in commits] == [True, False, False, False]
    # The next sync started after one write of the three copies that waited.
    assert in_file == [base + 1, base + 4]
    assert len(log_writes) == 2
    assert log._pending == []
    held[1].set_result(None)
    await asyncio.wait_for(asyncio.gather(*commits), 5)
    monkeypatch.undo()
    fresh = FileSessionStore(root)
    for sid in sessions:
        assert (await fresh.get(sid)).messages == history(2, sid)
    store.close()
    fresh.close()


async def test_copies_that_fail_to_reach_the_log_fail_their_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "data"
    store = FileSessionStore(root)
    await turns(store, "warm", 2)
    log = await log_ready(store)
    sessions = [f"s{i}" for i in range(3)]
    for sid in sessions:
        await turns(store, sid, 1)
    held: list[asyncio.Future[None]] = []

    def holding(
        fd: int, executor: Any = None, *, datasync: bool = False, offload: bool = False
    ) -> Any:
        held.append(asyncio.get_running_loop().create_future())
        return held[-1]

    real_pwrite = os.pwrite

    def pwrite(fd: int, data: Any, offset: int) -> int:
        if fd == log._fd and held:  # the copies that waited for the first sync
            raise OSError(28, "No space left on device")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(wal, "start_fsync", holding)
    monkeypatch.setattr(os, "pwrite", pwrite)
    commits = [asyncio.ensure_future(turns(store, sid, 2, start=1)) for sid in sessions]
    for _ in range(500):
        if len(log._pending) == 2:
            break
        await asyncio.sleep(0.001)
    assert len(log._pending) == 2
    held[0].set_result(None)
    results = await asyncio.wait_for(asyncio.gather(*commits, return_exceptions=True), 5)
    assert results[0] is None
    assert [type(r) for r in results[1:]] == [OSError, OSError]
    assert log._state == "broken"
    monkeypatch.undo()
    # The next commits sync their journals themselves; nothing acknowledged is lost.
    for sid in sessions:
        await turns(store, sid, 3, start=2)
    fresh = FileSessionStore(root)
    for sid in sessions:
        assert (await fresh.get(sid)).messages == history(3, sid)
    store.close()
    fresh.close()


async def test_a_failed_log_sync_fails_its_commits_and_journals_sync_themselves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileSessionStore(tmp_path / "data")
    await turns(store, "s", 2)
    log = await log_ready(store)

    def failing(
        fd: int, executor: Any = None, *, datasync: bool = False, offload: bool = False
    ) -> Any:
        future = asyncio.get_running_loop().create_future()
        future.set_exception(OSError(5, "Input/output error"))
        return future

    monkeypatch.setattr(wal, "start_fsync", failing)
    with pytest.raises(OSError, match="fsync failed"):
        await turns(store, "s", 3, start=2)
    assert log._state == "broken"
    monkeypatch.undo()
    syncs = spy_log_syncs(monkeypatch)
    await turns(store, "s", 5, start=3)  # acknowledged by the journal's own fsync
    assert syncs == []
    messages = (await FileSessionStore(tmp_path / "data").get("s")).messages
    assert messages == history(5, "s")
    store.close()


# ------------------------------------------------------------------ lifecycle


async def test_close_syncs_the_journals_and_deletes_the_log(tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path / "data")
    await turns(store, "s", 3)
    await log_ready(store)
    await turns(store, "s", 6, start=3)
    assert len(log_files(tmp_path / "data")) == 1
    store.close()
    assert log_files(tmp_path / "data") == []
    await turns(store, "s", 9, start=6)  # used again: a new log
    await log_ready(store)
    await turns(store, "s", 10, start=9)
    assert len(log_files(tmp_path / "data")) == 1
    assert (await store.get("s")).messages == history(10, "s")
    store.close()


def test_a_process_that_exits_without_closing_leaves_no_log(tmp_path: Path) -> None:
    root = tmp_path / "data"
    script = (
        "import asyncio, sys\n"
        "from test_commit_log import FileSessionStore, log_ready, turns\n"
        "async def main():\n"
        "    store = FileSessionStore(sys.argv[1])\n"
        "    await turns(store, 's', 2)\n"
        "    await log_ready(store)\n"
        "    await turns(store, 's', 9, start=2)\n"
        "asyncio.run(main())\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS / "session"), str(TESTS)])}
    done = subprocess.run(
        [sys.executable, "-c", script, str(root)], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert list((root / wal.LOG_DIR).glob("*.log")) == []
    assert "commit log" not in done.stderr
    store = FileSessionStore(root)
    assert asyncio.run(store.get("s")).messages == history(9, "s")
    store.close()


async def test_two_live_stores_never_take_each_others_log(tmp_path: Path) -> None:
    first = FileSessionStore(tmp_path / "data")
    await turns(first, "a", 2)
    await log_ready(first)
    await turns(first, "a", 4, start=2)
    (mine,) = log_files(tmp_path / "data")
    second = FileSessionStore(tmp_path / "data")  # recovers: the first's log is held
    assert log_files(tmp_path / "data") == [mine]
    await turns(first, "a", 6, start=4)
    await turns(second, "b", 3)
    assert (await second.get("a")).messages == history(6, "a")
    first.close()
    second.close()


async def test_a_full_half_switches_and_is_checkpointed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(wal, "HALF", 16 * 1024)
    store = FileSessionStore(tmp_path / "data")
    await turns(store, "s", 2)
    log = await log_ready(store)
    await turns(store, "s", 200, start=2)  # ~25 KB of copies: past the first half
    assert log._generation > 1
    assert log._state == "ready"
    await asyncio.get_running_loop().run_in_executor(store._write_executor(), lambda: None)
    assert log._clean[1 - log._active]  # the retired half's journals were synced
    assert (await FileSessionStore(tmp_path / "data").get("s")).messages == history(200, "s")
    store.close()


# ------------------------------------------------------------------ recovery


def lose_page_cache(root: Path, rng: random.Random) -> int:
    """Cut each journal the logs cover back to a random point the logs can restore:
    what an OS crash could take. Returns how many were cut."""
    by_session: dict[str, list[wal.Entry]] = {}
    for entry in logged(root):
        by_session.setdefault(entry.session_id, []).append(entry)
    cut = 0
    for session_id, entries in by_session.items():
        path = root / "sessions" / session_id / JOURNAL
        size = path.stat().st_size
        # The bytes the log holds without a gap up to the journal's end (before a gap,
        # the journal itself was synced: a crash cannot take those).
        start = size
        for entry in sorted(entries, key=lambda e: e.size, reverse=True):
            if entry.size + len(entry.data) < start:
                break
            start = min(start, entry.size)
        if start < size:
            with path.open("r+b") as handle:
                handle.truncate(rng.randint(start, size - 1))
            cut += 1
    return cut


def test_recovery_puts_back_what_a_crash_took_from_the_journals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "data"

    async def write() -> FileSessionStore:
        store = FileSessionStore(root)
        await turns(store, "warm", 2)
        await log_ready(store)
        for i in range(4):  # each journal's first append is its own
            await turns(store, f"s{i}", 1)
        await asyncio.gather(*(turns(store, f"s{i}", 30, start=1) for i in range(4)))
        return store  # not closed: it "dies" with its log in place

    dead = asyncio.run(write())
    assert dead._commit_log is not None
    os.close(dead._commit_log._fd)  # a dead process's lock is free
    dead._commit_log._fd = -1  # and it closes nothing at exit
    assert lose_page_cache(root, random.Random(4)) >= 4
    with monkeypatch.context() as patch:  # without the log: an acknowledged loss
        patch.setattr(store_module, "recover", lambda root: 0)
        with pytest.raises(SessionCorruptedError):
            asyncio.run(FileSessionStore(root).get("s0"))
    fresh = FileSessionStore(root)  # recovers
    for i in range(4):
        assert asyncio.run(fresh.get(f"s{i}")).messages == history(30, f"s{i}")
    assert log_files(root) == []
    fresh.close()


def test_a_store_made_while_another_recovers_waits_for_it(tmp_path: Path) -> None:
    root = tmp_path / "data"

    async def write() -> FileSessionStore:
        store = FileSessionStore(root)
        await turns(store, "s", 2)
        await log_ready(store)
        await turns(store, "s", 5, start=2)
        return store

    dead = asyncio.run(write())
    assert dead._commit_log is not None
    os.close(dead._commit_log._fd)  # its process "died"
    dead._commit_log._fd = -1
    # Another process is replaying: it holds the recovery lock and the dead log.
    recovering = os.open(root / wal.LOG_DIR / ".lock", os.O_RDONLY)
    fcntl.flock(recovering, fcntl.LOCK_EX)
    (log,) = log_files(root)
    taken = os.open(log, os.O_RDONLY)
    fcntl.flock(taken, fcntl.LOCK_EX)
    made = threading.Event()
    thread = threading.Thread(target=lambda: (FileSessionStore(root), made.set()))
    thread.start()
    assert not made.wait(0.3)  # it does not take the held log for a live one and go on
    os.close(taken)
    os.close(recovering)
    thread.join(10)
    assert made.is_set()
    assert log_files(root) == []  # it recovered the log once free


def test_recovery_drops_entries_of_a_journal_that_went_on_another_way(tmp_path: Path) -> None:
    root = tmp_path / "data"
    store = FileSessionStore(root)
    asyncio.run(store.create("s"))
    asyncio.run(store.commit("s", history(2, "s")))
    path = root / "sessions" / "s" / JOURNAL
    journal = path.read_bytes()
    ino = path.stat().st_ino
    last = journal.rstrip(b"\n").rsplit(b"\n", 1)[-1]
    prev = last[6:38].decode()
    line = b'{"h":"' + b"0" * 32 + b'","n":99}\n'
    entries = [
        wal.Entry("s", len(journal), ino + 1, prev, line),  # another inode
        wal.Entry("s", len(journal), ino, GENESIS, line),  # does not chain on
        wal.Entry("s", len(journal) - 5, ino, prev, line),  # not at a line's end
        wal.Entry("s", 0, ino, prev, journal[:10]),  # what the journal holds already
    ]
    assert wal._replay_journal(path, entries) == 0
    assert path.read_bytes() == journal
    # The one that fits is written back.
    assert wal._replay_journal(path, [wal.Entry("s", len(journal), ino, prev, line)]) == 1
    assert path.read_bytes() == journal + line
    store.close()


def test_a_deleted_sessions_copies_never_reach_its_re_creation(tmp_path: Path) -> None:
    # The log still holds copies of a session deleted and made again under the same
    # id, with the same creation time and the same first messages, so the new journal
    # is byte for byte the old one up to where the old copies go on, and may have the
    # old inode. Its genesis record's random id starts another hash chain, so no old
    # copy chains on, and the deleted messages stay deleted.
    root = tmp_path / "data"
    created = "2026-01-01T00:00:00+00:00"

    async def write() -> FileSessionStore:
        store = FileSessionStore(root)
        await turns(store, "warm", 2)
        await log_ready(store)
        await store.create("s", created_at=created)
        async with store.writer_lock("s"):
            for count in range(1, 7):
                await store.commit("s", history(count, "s"))
        await store.delete("s")
        await store.create("s", created_at=created)
        async with store.writer_lock("s"):
            for count in range(1, 4):
                await store.commit("s", history(count, "s"))
        return store

    dead = asyncio.run(write())
    assert dead._commit_log is not None
    end = (root / "sessions" / "s" / JOURNAL).stat().st_size
    # A copy of the old session's fourth message begins where the new journal ends.
    assert any(e.size == end for e in logged(root) if e.session_id == "s")
    os.close(dead._commit_log._fd)  # its process "died"
    dead._commit_log._fd = -1
    fresh = FileSessionStore(root)  # replays the log
    assert asyncio.run(fresh.get("s")).messages == history(3, "s")
    assert log_files(root) == []
    fresh.close()


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL (POSIX)")
def test_sigkill_and_lost_page_cache_with_sixteen_sessions_lose_nothing_acknowledged(
    tmp_path: Path,
) -> None:
    """SIGKILL the writer at random points among sixteen sessions' logged commits, cut
    the journals back as an OS crash could, reopen: every acknowledged commit is
    there, and nothing else."""
    root = tmp_path / "store"
    rng = random.Random(2512)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), *sys.path])}
    sessions = 16
    acked = {f"s{i}": 0 for i in range(sessions)}
    rounds_cut = 0
    for _ in range(6):
        with subprocess.Popen(
            [sys.executable, str(TESTS / "commit_log_writer.py"), str(root), str(sessions)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        ) as proc:
            assert proc.stdout is not None
            lines = []
            while True:
                line = proc.stdout.readline()
                assert line, proc.stderr.read() if proc.stderr else ""
                if line.strip() == "ready":
                    break
                lines.append(line)
            lines += [proc.stdout.readline() for _ in range(rng.randint(50, 1500))]
            proc.send_signal(signal.SIGKILL)
            rest = proc.stdout.read()
            err = proc.stderr.read() if proc.stderr is not None else ""
            proc.wait(timeout=30)
        assert proc.returncode == -signal.SIGKILL, err
        for line in [*lines, *rest.splitlines()]:
            if line.startswith("ack "):
                _, sid, count = line.split()
                acked[sid] = max(acked[sid], int(count))
        rounds_cut += lose_page_cache(root, rng) > 0
        store = FileSessionStore(root)  # recovery, then the reads
        for sid, count in acked.items():
            messages = asyncio.run(store.get(sid)).messages
            assert messages == history(len(messages), sid), f"{sid} invented"
            assert len(messages) in (count, count + 1), (sid, len(messages), count)
            acked[sid] = len(messages)
        store.close()
        assert log_files(root) == []
    assert rounds_cut >= 4, "the crashes took too little for recovery to put back"
    assert sum(acked.values()) > 1000, "the writers made too little progress"
