"""Marks in sealed segments: a page deep inside a bulk-written segment reads a window.

One bulk commit (a copy, an import, a migration) writes a whole history into one
journal, sealed as one segment however long. The seal records every 256th record's
position and chain hash in the manifest; a page read verifies the chain between the
two marks around it instead of reading to the segment's end.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from perdure.errors import SessionCorruptedError
from perdure.maintenance import verify_store
from perdure.session import FileSessionStore, Segmentation
from perdure.stores.file import store as file_store_module
from perdure.types import Message

SIZE = 6000


def text(role: str, value: str) -> Message:
    return {"role": role, "content": [{"text": value}]}  # type: ignore[typeddict-item]


def conversation(n: int) -> list[Message]:
    return [text("user" if i % 2 == 0 else "assistant", f"m{i}") for i in range(n)]


def bulk(tmp_path: Path) -> tuple[FileSessionStore, list[Message]]:
    """A session of SIZE messages from one commit, sealed; then a few more appended."""
    store = FileSessionStore(tmp_path / "data", segmentation=Segmentation(max_records=1000))
    history = conversation(SIZE)
    asyncio.run(store.create("s"))
    asyncio.run(store.commit("s", history, redactions={2500: text("assistant", "[gone]")}))
    history = [*history, text("user", "after"), text("assistant", "the seal")]
    asyncio.run(store.commit("s", history))
    history[2500] = text("assistant", "[gone]")
    return store, history


def manifest(store: FileSessionStore) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((store.session_dir("s") / "manifest.json").read_text())
    return data


def segment(store: FileSessionStore) -> Path:
    return store.session_dir("s") / "segments" / "000001.jsonl"


def page(store: FileSessionStore, offset: int, limit: int = 50) -> list[Message]:
    return asyncio.run(store.history_page("s", offset, limit)).messages


def test_a_bulk_written_segment_is_sealed_with_marks_and_every_page_is_right(
    tmp_path: Path,
) -> None:
    store, history = bulk(tmp_path)
    (sealed,) = manifest(store)["segments"]
    assert sealed["count"] == SIZE
    every = file_store_module._MARK_EVERY
    assert len(sealed["marks"]) == (SIZE + 2) // every  # records: SIZE + redaction + state
    for offset in (0, 1, every - 1, every, 2480, 2500, 3071, 4096, 5990, 5998, 6000):
        assert page(store, offset) == history[offset : offset + 50], offset
    assert page(store, 0, limit=SIZE + 2) == history
    assert asyncio.run(FileSessionStore(tmp_path / "data").get("s")).messages == history


def test_a_deep_page_reads_only_the_window_between_two_marks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, _ = bulk(tmp_path)
    read: list[int] = []
    real = file_store_module.FileSessionStore._scan_bytes

    def counted(self: Any, session_id: str, path: Path, data: bytes, *args: Any) -> Any:
        read.append(len(data))
        return real(self, session_id, path, data, *args)

    monkeypatch.setattr(file_store_module.FileSessionStore, "_scan_bytes", counted)
    page(store, 3000)
    size = segment(store).stat().st_size
    assert read
    assert max(read) < size // 6  # two marks apart, not the rest of the segment


def test_a_record_edited_inside_the_window_is_damage_and_outside_it_verify_finds_it(
    tmp_path: Path,
) -> None:
    store, history = bulk(tmp_path)
    path = segment(store)
    good = path.read_bytes()
    path.write_bytes(good.replace(b'"m3010"', b'"M3010"', 1))
    with pytest.raises(SessionCorruptedError):
        page(FileSessionStore(tmp_path / "data"), 3000)
    # An edit far from the page: the page, read between its marks, is still right ...
    path.write_bytes(good.replace(b'"m100"', b'"M100"', 1))
    assert page(FileSessionStore(tmp_path / "data"), 5000) == history[5000:5050]
    # ... and the full read and verify still see the damage.
    with pytest.raises(SessionCorruptedError):
        asyncio.run(FileSessionStore(tmp_path / "data").get("s"))
    report = asyncio.run(verify_store(FileSessionStore(tmp_path / "data")))
    assert report.damaged_sessions == ("s",)


@pytest.mark.parametrize(
    "edit",
    [
        lambda mark: [mark[0], mark[1] + 1, mark[2], mark[3]],  # another offset
        lambda mark: [mark[0], mark[1], "0" * 64, mark[3]],  # another hash
        lambda mark: [mark[0], mark[1], mark[2], mark[3] - 1],  # another message count
        lambda mark: ["x", mark[1], mark[2], mark[3]],  # not a mark at all
        lambda mark: [mark[0], "12", mark[2], mark[3]],
        lambda mark: [mark[0], -5, mark[2], mark[3]],
    ],
)
def test_an_edited_mark_is_damage_for_pages_and_full_reads(tmp_path: Path, edit: Any) -> None:
    store, _ = bulk(tmp_path)
    data = manifest(store)
    marks = data["segments"][0]["marks"]
    before = marks[2][3]  # messages before the third mark
    marks[2] = edit(marks[2])  # the third mark
    (store.session_dir("s") / "manifest.json").write_text(json.dumps(data))
    fresh = FileSessionStore(tmp_path / "data")
    failed = 0
    for offset in (before + 1, before - 51, before):  # each read starts one earlier
        try:
            page(fresh, offset)
        except SessionCorruptedError:
            failed += 1
    assert failed  # some page read starting or ending at the mark sees it
    with pytest.raises(SessionCorruptedError):
        asyncio.run(fresh.get("s"))


def test_a_segment_sealed_without_marks_is_still_read_whole(tmp_path: Path) -> None:
    store, history = bulk(tmp_path)
    data = manifest(store)
    del data["segments"][0]["marks"]  # as sealed before marks existed
    (store.session_dir("s") / "manifest.json").write_text(json.dumps(data))
    fresh = FileSessionStore(tmp_path / "data")
    assert page(fresh, 3000) == history[3000:3050]
    assert asyncio.run(fresh.get("s")).messages == history
