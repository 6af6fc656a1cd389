"""File-store damage that repair must not make worse (SPEC §7.1): a lost manifest, a
missing segment, and files the OS will not read (permission denied, a directory, a
symlink loop or a FIFO in their place) — reported per session, never a bare OSError,
never a hang, never data deleted that was not read."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from perdure.errors import SessionCorruptedError
from perdure.maintenance import repair_store, verify_store
from perdure.session import FileSessionStore
from perdure.stores.file.store import Segmentation


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def message(i: int) -> dict[str, Any]:
    return {"role": "user" if i % 2 == 0 else "assistant", "content": [{"text": f"m{i}"}]}


def populate(root: Path, sid: str, count: int, *, segmented: bool = False) -> None:
    """``count`` messages, one commit each; with ``segmented``, sealed every 8 records."""
    store = FileSessionStore(root, segmentation=Segmentation(max_records=8) if segmented else None)

    async def go() -> None:
        await store.create(sid)
        history: list[dict[str, Any]] = []
        for i in range(count):
            history.append(message(i))
            await store.commit(sid, list(history))

    try:
        run(go())
    finally:
        store.close()


def tree(root: Path) -> dict[str, bytes | None]:
    """Every file under ``root`` with its bytes (a directory: ``None``)."""
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
        for p in sorted(root.rglob("*"))
    }


def messages_of(root: Path, sid: str) -> list[Any]:
    store = FileSessionStore(root)
    try:
        return list(run(store.get(sid)).messages)
    finally:
        store.close()


# ----------------------------------------------------------------------------- manifest


def test_repair_rebuilds_a_lost_manifest_and_keeps_every_sealed_segment(tmp_path: Path) -> None:
    populate(tmp_path, "seg", 24, segmented=True)
    sdir = tmp_path / "sessions" / "seg"
    assert len(list((sdir / "segments").iterdir())) >= 2
    manifest = json.loads((sdir / "manifest.json").read_bytes())
    (sdir / "manifest.json").unlink()
    segments = tree(sdir / "segments")

    verified = run(verify_store(FileSessionStore(tmp_path)))
    assert [Path(d.file or "").name for d in verified.damage] == ["manifest.json"]
    assert "segments/ holds" in verified.damage[0].detail

    before = tree(tmp_path)
    plan = run(repair_store(tmp_path, dry_run=True))
    assert tree(tmp_path) == before  # a dry run writes nothing
    assert [(r.session_id, r.status, r.quarantined) for r in plan.sessions] == [
        ("seg", "would_repair", 0)
    ]
    assert "manifest.json would be rebuilt" in (plan.sessions[0].detail or "")

    done = run(repair_store(tmp_path, dry_run=False))
    assert [(r.session_id, r.status, r.quarantined) for r in done.sessions] == [
        ("seg", "repaired", 0)
    ]
    assert "manifest.json rebuilt" in (done.sessions[0].detail or "")
    assert tree(sdir / "segments") == segments  # not one sealed byte touched
    assert json.loads((sdir / "manifest.json").read_bytes()) == manifest
    assert messages_of(tmp_path, "seg") == [message(i) for i in range(24)]
    assert run(verify_store(FileSessionStore(tmp_path))).damage == ()


def test_a_lost_manifest_beside_a_damaged_segment_is_left_alone(tmp_path: Path) -> None:
    populate(tmp_path, "seg", 24, segmented=True)
    sdir = tmp_path / "sessions" / "seg"
    (sdir / "manifest.json").unlink()
    second = sdir / "segments" / "000002.jsonl"
    data = bytearray(second.read_bytes())
    data[data.index(b'"m1') + 3] ^= 1  # one altered byte inside a message
    second.write_bytes(bytes(data))
    before = tree(tmp_path / "sessions")

    for dry_run in (True, False):
        report = run(repair_store(tmp_path, dry_run=dry_run))
        assert [(r.session_id, r.status) for r in report.sessions] == [("seg", "unrepairable")]
        assert "cannot be rebuilt" in (report.sessions[0].detail or "")
    assert tree(tmp_path / "sessions") == before


def test_segment_files_the_manifest_does_not_name_are_never_rewritten_away(
    tmp_path: Path,
) -> None:
    populate(tmp_path, "seg", 24, segmented=True)
    sdir = tmp_path / "sessions" / "seg"
    (sdir / "segments" / "000099.jsonl").write_bytes(b"kept for whoever looks\n")
    journal = sdir / "journal.jsonl"
    lines = journal.read_bytes().splitlines(keepends=True)
    journal.write_bytes(b"".join([lines[0], b"not a record\n", *lines[1:]]))
    before = tree(tmp_path / "sessions")

    report = run(repair_store(tmp_path, dry_run=False))
    assert [(r.session_id, r.status) for r in report.sessions] == [("seg", "unrepairable")]
    assert "does not name" in (report.sessions[0].detail or "")
    assert tree(tmp_path / "sessions") == before


# ----------------------------------------------------------------------------- segments


@pytest.mark.parametrize("lost", ["one_segment", "segments_dir"])
def test_a_missing_segment_is_unrepairable_and_the_walk_repairs_the_others(
    tmp_path: Path, lost: str
) -> None:
    populate(tmp_path, "seg", 24, segmented=True)
    populate(tmp_path, "other", 4)
    sdir = tmp_path / "sessions" / "seg"
    if lost == "one_segment":
        (sdir / "segments" / "000002.jsonl").unlink()
    else:
        shutil.rmtree(sdir / "segments")
    journal = tmp_path / "sessions" / "other" / "journal.jsonl"
    lines = journal.read_bytes().splitlines(keepends=True)
    lines[2] = b"not a record\n"
    journal.write_bytes(b"".join(lines))
    seg_before = tree(sdir)

    plan = run(repair_store(tmp_path, dry_run=True))
    assert {r.session_id: r.status for r in plan.sessions} == {
        "other": "would_repair",
        "seg": "unrepairable",
    }
    done = run(repair_store(tmp_path, dry_run=False))
    by_id = {r.session_id: r for r in done.sessions}
    assert by_id["other"].status == "repaired"
    assert by_id["other"].quarantined == 1
    assert by_id["seg"].status == "unrepairable"
    assert "file is missing" in (by_id["seg"].detail or "")
    assert tree(sdir) == seg_before  # left exactly as it was
    assert messages_of(tmp_path, "other") == [message(0), message(2), message(3)]


# ----------------------------------------------------------------------------- unreadable

# Lists, reads and verifies the store in a child process; prints what each gave.
_CHILD = textwrap.dedent(
    """
    import asyncio, json, sys
    from perdure.errors import SessionCorruptedError
    from perdure.maintenance import verify_store
    from perdure.session import FileSessionStore

    store = FileSessionStore(sys.argv[1])
    out = {}
    out["list"] = {m.session_id: bool(m.damaged) for m in asyncio.run(store.list())}
    try:
        asyncio.run(store.get("a"))
        out["get"] = None
    except SessionCorruptedError as exc:
        out["get"] = [exc.code, exc.details.get("kind"), exc.details.get("file"), exc.message]
    report = asyncio.run(verify_store(store))
    damage = [(d.session_id, d.kind, d.file) for d in report.damage]
    out["verify"] = [report.sessions_checked, damage]
    print(json.dumps(out))
    """
)


def read_in_child(root: Path, prefix: list[str] | None = None) -> dict[str, Any]:
    result = subprocess.run(
        [*(prefix or []), sys.executable, "-c", _CHILD, str(root)],
        capture_output=True,
        text=True,
        timeout=60,  # a FIFO opened for reading would block here forever
    )
    assert result.returncode == 0, result.stderr
    out: dict[str, Any] = json.loads(result.stdout)
    return out


def three_sessions(root: Path) -> Path:
    for sid in ("a", "b", "c"):
        populate(root, sid, 2)
    return root / "sessions" / "a"


def assert_a_is_reported(out: dict[str, Any], name: str) -> None:
    assert out["list"] == {"a": True, "b": False, "c": False}
    code, kind, file, text = out["get"]
    assert (code, kind, Path(file).name) == ("session_store_corrupted", "unreadable", name)
    assert name in text
    checked, damage = out["verify"]
    assert checked == 3
    assert [(sid, kind, Path(file).name) for sid, kind, file in damage] == [
        ("a", "unreadable", name)
    ]


@pytest.mark.parametrize("name", ["meta.json", "journal.jsonl", "head"])
@pytest.mark.parametrize("how", ["directory", "symlink_loop", "fifo"])
def test_a_file_replaced_by_what_cannot_be_read_is_one_damaged_session(
    tmp_path: Path, name: str, how: str
) -> None:
    path = three_sessions(tmp_path) / name
    path.unlink()
    if how == "directory":
        path.mkdir()
    elif how == "symlink_loop":
        path.symlink_to(path.name)
    else:
        os.mkfifo(path)
    assert_a_is_reported(read_in_child(tmp_path), name)


def without_read_override() -> list[str]:
    """How to run a child that chmod 000 stops: as is, or as root without the
    capabilities that read past permissions (skip when neither is possible)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: cannot drop CAP_DAC_OVERRIDE")
    caps = "-dac_override,-dac_read_search"
    prefix = [setpriv, f"--bounding-set={caps}", f"--inh-caps={caps}"]
    probe = subprocess.run([*prefix, "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"setpriv cannot drop capabilities here: {probe.stderr.strip()}")
    return prefix


@pytest.mark.parametrize("name", ["meta.json", "journal.jsonl", "head"])
def test_a_file_without_read_permission_is_one_damaged_session(tmp_path: Path, name: str) -> None:
    prefix = without_read_override()
    path = three_sessions(tmp_path) / name
    path.chmod(0)
    try:
        assert_a_is_reported(read_in_child(tmp_path, prefix), name)
    finally:
        path.chmod(0o644)


def test_repair_leaves_a_meta_json_it_cannot_read_in_place(tmp_path: Path) -> None:
    meta = three_sessions(tmp_path) / "meta.json"
    meta.unlink()
    meta.mkdir()
    report = run(repair_store(tmp_path, dry_run=False))
    assert [(r.session_id, r.status) for r in report.sessions] == [("a", "unrepairable")]
    assert meta.is_dir()
    store = FileSessionStore(tmp_path)
    try:
        with pytest.raises(SessionCorruptedError) as caught:
            run(store.get("a"))
        assert caught.value.details["kind"] == "unreadable"
        assert caught.value.details["errno"] is None  # a directory: refused by type
        assert "a directory, not a regular file" in caught.value.message
    finally:
        store.close()


def test_a_dry_run_says_a_session_it_cannot_copy_is_beyond_repair(tmp_path: Path) -> None:
    # The rehearsal copies the session aside first: a FIFO (or a file without read
    # permission) stopped that copy, and the dry run with it, with a bare error.
    meta = three_sessions(tmp_path) / "meta.json"
    meta.unlink()
    os.mkfifo(meta)
    report = run(repair_store(tmp_path, dry_run=True))
    assert [(r.session_id, r.status) for r in report.sessions] == [("a", "unrepairable")]
    assert "meta.json" in (report.sessions[0].detail or "")
    assert stat.S_ISFIFO(meta.stat().st_mode)  # left as it was
