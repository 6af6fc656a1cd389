"""LocalFileStorage specifics: the on-disk naming, temp files, and SIGKILL safety."""

from __future__ import annotations

import asyncio
import errno
import fcntl
import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perdure.errors import StorageConflictError
from perdure.storage import LocalFileStorage, local_file
from perdure.storage.local_file import decode_segment, encode_segment


async def test_keys_map_to_readable_paths(tmp_path: Path) -> None:
    storage = LocalFileStorage(tmp_path)
    await storage.write("sessions/my-session/agents/default/latest", b"x")
    await storage.write("odd/a.b/%/é", b"y")
    assert (tmp_path / "sessions/my-session/agents/default/latest.blob").read_bytes() == b"x"
    assert (tmp_path / "odd/a%2Eb/%25/%C3%A9.blob").read_bytes() == b"y"


@given(st.text(min_size=1, max_size=20).filter(lambda s: "/" not in s))
def test_segment_encoding_round_trips(segment: str) -> None:
    try:
        segment.encode("utf-8")
    except UnicodeEncodeError:
        return
    name = encode_segment(segment)
    assert decode_segment(name) == segment
    assert not name.startswith(".")
    assert "/" not in name
    assert not name.endswith(".blob")


def test_foreign_names_do_not_decode() -> None:
    assert decode_segment("a.b") is None
    assert decode_segment("%zz") is None
    assert decode_segment("%2e") is None  # lower-case hex is not the canonical form
    assert decode_segment("é") is None


async def test_foreign_and_temp_files_are_not_listed(tmp_path: Path) -> None:
    storage = LocalFileStorage(tmp_path)
    await storage.write("d/k", b"1")
    (tmp_path / "d" / ".tmp-deadbeef").write_bytes(b"half")
    (tmp_path / "d" / "notes.txt").write_bytes(b"foreign")
    (tmp_path / "d" / "Weird.Name.blob").write_bytes(b"foreign")
    assert await storage.list("") == ["d/k"]


async def test_delete_prunes_empty_directories_but_not_the_root(tmp_path: Path) -> None:
    storage = LocalFileStorage(tmp_path / "root")
    await storage.write("a/b/c", b"1")
    await storage.write("a/x", b"2")
    await storage.delete("a/b/c")
    assert not (tmp_path / "root/a/b").exists()
    assert (tmp_path / "root/a/x.blob").exists()
    await storage.delete("a/x")
    assert list((tmp_path / "root").iterdir()) == []


async def test_remove_temp_files_only_removes_old_ones(tmp_path: Path) -> None:
    storage = LocalFileStorage(tmp_path)
    await storage.write("a/b", b"1")
    old = tmp_path / "a" / ".tmp-old"
    new = tmp_path / "a" / ".tmp-new"
    old.write_bytes(b"")
    new.write_bytes(b"")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    assert await storage.remove_temp_files(older_than=3600) == 1
    assert not old.exists()
    assert new.exists()
    assert await storage.remove_temp_files(older_than=0) == 1
    with pytest.raises(ValueError, match="older_than"):
        await storage.remove_temp_files(older_than=-1)
    assert await LocalFileStorage(tmp_path / "nothing").remove_temp_files() == 0


async def test_an_overlong_segment_is_refused(tmp_path: Path) -> None:
    storage = LocalFileStorage(tmp_path)
    with pytest.raises(ValueError, match="250"):
        await storage.write("a/" + "x" * 300, b"")


def test_default_root_is_under_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    storage = LocalFileStorage()
    assert storage.root == tmp_path / ".perdure" / "storage"
    asyncio.run(storage.write("k", b"v"))
    assert (tmp_path / ".perdure/storage/k.blob").read_bytes() == b"v"
    with pytest.raises(TypeError, match="root"):
        LocalFileStorage(3)  # type: ignore[arg-type]


WRITER = textwrap.dedent(
    """
    import asyncio, hashlib, sys
    from perdure.storage import LocalFileStorage

    async def main() -> None:
        storage = LocalFileStorage(sys.argv[1])
        i = 0
        while True:
            body = bytes([i % 251]) * (200_000 + (i % 7) * 50_000)
            blob = hashlib.sha256(body).hexdigest().encode() + body
            await storage.write("k/blob", blob)
            print(i, flush=True)
            i += 1

    asyncio.run(main())
    """
)


def test_sigkill_during_writes_never_leaves_a_torn_blob(tmp_path: Path) -> None:
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    root = tmp_path / "root"
    storage = LocalFileStorage(root)
    for kill in range(12):
        child = subprocess.Popen(
            [sys.executable, str(script), str(root)], stdout=subprocess.PIPE, text=True
        )
        assert child.stdout is not None
        with child.stdout:
            child.stdout.readline()  # at least one write finished
            time.sleep(0.005 * (kill % 6))
            child.send_signal(signal.SIGKILL)
            child.wait()
        blob = asyncio.run(storage.read("k/blob"))
        assert blob is not None
        digest, body = blob[:64], blob[64:]
        assert hashlib.sha256(body).hexdigest().encode() == digest, f"torn blob after kill {kill}"
        assert asyncio.run(storage.list("")) == ["k/blob"]


async def test_a_missing_blob_is_answered_without_a_thread_hop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A graph's every new agent first reads a latest that is not there: a stat on
    # the caller's thread, not a hop to a worker (0.1-0.2 ms) for nothing.
    hops: list[object] = []
    real = asyncio.to_thread

    async def counting(func: object, *args: object) -> object:
        hops.append(func)
        return await real(func, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(local_file.asyncio, "to_thread", counting)
    storage = LocalFileStorage(tmp_path)
    assert await storage.read("sessions/s/agents/a/latest") is None
    assert hops == []
    await storage.write("sessions/s/agents/a/latest", b"here")
    hops.clear()
    assert await storage.read("sessions/s/agents/a/latest") == b"here"
    assert len(hops) == 1  # a blob that is there is read on the worker thread
    # Any other failure is the read's to report, as before.
    (tmp_path / "flat").write_bytes(b"a file where a directory should be")
    with pytest.raises(NotADirectoryError):
        await storage.read("flat/below")


# ------------------------------------------------------------- AppendStorage


async def test_an_append_extends_the_same_file_in_place(tmp_path: Path) -> None:
    storage = LocalFileStorage(tmp_path)
    await storage.replace("log", b"head\n", size=None, tail=b"")
    path = tmp_path / "log.blob"
    inode = path.stat().st_ino
    size = 5
    for i in range(20):
        line = f"record {i}\n".encode()
        await storage.append("log", line, size=size, tail=b"\n")
        size += len(line)
    assert path.stat().st_ino == inode  # no temp file renamed over it: one write, one fsync
    assert path.read_bytes().count(b"\n") == 21
    assert os.listdir(tmp_path) == ["log.blob"]
    big = b"x" * (200 * 1024) + b"\n"  # past the inline limit: the worker thread appends
    await storage.append("log", big, size=size, tail=b"\n")
    assert path.read_bytes().endswith(b"record 19\n" + big)
    assert path.stat().st_ino == inode


async def test_a_conditional_replace_renames_a_new_file_and_leaves_no_temp(
    tmp_path: Path,
) -> None:
    storage = LocalFileStorage(tmp_path)
    await storage.replace("d/log", b"one\n", size=None, tail=b"")
    first = (tmp_path / "d" / "log.blob").stat().st_ino
    await storage.replace("d/log", b"two\n", size=4, tail=b"one\n")
    assert (tmp_path / "d" / "log.blob").stat().st_ino != first
    with pytest.raises(StorageConflictError):
        await storage.replace("d/log", b"three\n", size=4, tail=b"one\n")
    assert os.listdir(tmp_path / "d") == ["log.blob"]
    assert (tmp_path / "d" / "log.blob").read_bytes() == b"two\n"


async def test_an_append_whose_fsync_fails_is_cut_back_and_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = LocalFileStorage(tmp_path)
    await storage.replace("log", b"head\n", size=None, tail=b"")

    def failing_fsync(fd: int, executor: object = None) -> asyncio.Future[None]:
        # The disk reports an error for this sync (EIO), as a failing device would.
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        future.set_exception(OSError(errno.EIO, "fsync failed: Input/output error"))
        return future

    monkeypatch.setattr(local_file, "start_fsync", failing_fsync)
    with pytest.raises(OSError, match="Input/output"):
        await storage.append("log", b"lost\n", size=5, tail=b"head\n")
    assert (tmp_path / "log.blob").read_bytes() == b"head\n"  # as it was: the next append fits
    monkeypatch.undo()
    await storage.append("log", b"kept\n", size=5, tail=b"head\n")
    assert await storage.read("log") == b"head\nkept\n"


RACER = textwrap.dedent(
    """
    import asyncio, sys, time
    from pathlib import Path
    from perdure.errors import StorageConflictError
    from perdure.storage import LocalFileStorage

    async def main():
        root, name, count, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
        storage = LocalFileStorage(root)
        print("ready", flush=True)
        while not go.exists():
            time.sleep(0.001)
        conflicts = 0
        for i in range(count):
            while True:
                blob = await storage.read("race")
                line = f"{name} {i} {len(blob)}\\n".encode()
                try:
                    await storage.append("race", line, size=len(blob), tail=blob[-12:])
                except StorageConflictError:
                    conflicts += 1
                    continue
                print(f"won {name} {i}", flush=True)
                break
        print(f"conflicts {conflicts}", flush=True)

    asyncio.run(main())
    """
)


def test_two_processes_appending_from_what_they_read_never_lose_a_line(tmp_path: Path) -> None:
    """Each process reads the end, appends on condition of it, and retries on conflict.

    Every acknowledged line is in the file exactly once, in each writer's order, and
    nothing else is; and each line starts exactly at the end its writer read (the
    offset it names): no append overwrote, tore or overtook another.
    """
    storage = LocalFileStorage(tmp_path / "blobs")
    asyncio.run(storage.replace("race", b"start\n", size=None, tail=b""))
    script = tmp_path / "racer.py"
    script.write_text(RACER)
    go = tmp_path / "go"
    count = 150
    children = [
        subprocess.Popen(
            [sys.executable, str(script), str(tmp_path / "blobs"), name, str(count), str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("a", "b")
    ]
    for child in children:  # both are ready before either starts
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
    go.write_bytes(b"")
    outputs = [child.communicate(timeout=120) for child in children]
    for child, (_, errors) in zip(children, outputs, strict=True):
        assert child.returncode == 0, errors
    won = {name: [] for name in ("a", "b")}
    conflicts = 0
    for stdout, _ in outputs:
        for line in stdout.splitlines():
            word, *rest = line.split()
            if word == "won":
                won[rest[0]].append(int(rest[1]))
            else:
                conflicts += int(rest[0])
    blob = asyncio.run(storage.read("race"))
    assert blob is not None
    lines = blob.decode().splitlines()
    assert lines[0] == "start"
    assert len(lines) == 1 + 2 * count
    for name in ("a", "b"):
        assert won[name] == list(range(count))
        assert [int(line.split()[1]) for line in lines[1:] if line.split()[0] == name] == won[name]
    offset = len(b"start\n")
    for line in lines[1:]:
        assert int(line.split()[2]) == offset, line
        offset += len(line) + 1
    assert conflicts > 0  # they did race


async def test_an_append_waits_for_a_writer_holding_the_file(tmp_path: Path) -> None:
    """The check and the write happen under the file's lock, which replaces also take."""
    storage = LocalFileStorage(tmp_path)
    await storage.replace("log", b"head\n", size=None, tail=b"")
    holder = os.open(tmp_path / "log.blob", os.O_RDONLY)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)  # another writer in the middle of its append
        pending = asyncio.ensure_future(storage.append("log", b"x\n", size=5, tail=b""))
        await asyncio.sleep(0.2)
        assert not pending.done()
    finally:
        os.close(holder)
    await asyncio.wait_for(pending, 10)
    assert await storage.read("log") == b"head\nx\n"
