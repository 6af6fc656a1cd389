"""LocalFileStorage specifics: the on-disk naming, temp files, and SIGKILL safety."""

from __future__ import annotations

import asyncio
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

from perdure.storage import LocalFileStorage
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
