"""SQLiteSessionStore: semantics, integrity, locking and any-loop use on real files."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sqlite3
import stat
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import exit_code, fork_child
from perdure.errors import (
    SessionConflictError,
    SessionCorruptedError,
    SessionLockedError,
    SessionNotFoundError,
)
from perdure.session.rules import ZERO_HASH, chain_hash
from perdure.session.store import SupportsFlush, SupportsHistoryPage
from perdure.stores import sqlite as sqlite_module
from perdure.stores.sqlite import SQLiteSessionStore
from perdure.types import Message

# ---------------------------------------------------------------- helpers


def text(role: str, value: str) -> Message:
    return {"role": role, "content": [{"text": value}]}  # type: ignore[typeddict-item]


def history(n: int, prefix: str = "m") -> list[Message]:
    return [text("user" if i % 2 == 0 else "assistant", f"{prefix}{i}") for i in range(n)]


def call(tool_id: str) -> Message:
    return {
        "role": "assistant",
        "content": [{"toolUse": {"toolUseId": tool_id, "name": "f", "input": {"q": tool_id}}}],
    }


def result(tool_id: str) -> Message:
    return {
        "role": "user",
        "content": [
            {"toolResult": {"toolUseId": tool_id, "status": "success", "content": [{"text": "r"}]}}
        ],
    }


def image(data: bytes) -> Message:
    return {
        "role": "user",
        "content": [{"text": "look"}, {"image": {"format": "png", "source": {"bytes": data}}}],
    }


class Raw:
    """Direct access to the database, as damage would reach it."""

    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None)

    def close(self) -> None:
        self.conn.close()

    def base(self, session_id: str) -> int:
        (sid,) = self.conn.execute(
            "SELECT sid FROM perdure_sessions WHERE id = ?", (session_id,)
        ).fetchone()
        return int(sid) << 32

    def row(self, session_id: str, index: int) -> tuple[str, str, str | None, str | None]:
        found = self.conn.execute(
            "SELECT body, hash, redacted, redacted_hash FROM perdure_messages WHERE key = ?",
            (self.base(session_id) + index,),
        ).fetchone()
        assert found is not None
        return found  # type: ignore[no-any-return]

    def set(self, session_id: str, index: int, **columns: Any) -> None:
        assignments = ", ".join(f"{name} = ?" for name in columns)
        self.conn.execute(
            f"UPDATE perdure_messages SET {assignments} WHERE key = ?",
            (*columns.values(), self.base(session_id) + index),
        )

    def rechain(self, session_id: str) -> None:
        """Recompute every hash and the head: only the payload check can then object."""
        base = self.base(session_id)
        prev = ZERO_HASH
        rows = self.conn.execute(
            "SELECT key, body FROM perdure_messages WHERE key >= ? AND key < ? ORDER BY key",
            (base, base + (1 << 32)),
        ).fetchall()
        for key, body in rows:
            prev = chain_hash(prev, body)
            self.conn.execute("UPDATE perdure_messages SET hash = ? WHERE key = ?", (prev, key))
        self.conn.execute("UPDATE perdure_sessions SET head = ? WHERE id = ?", (prev, session_id))

    def count(self, table: str) -> int:
        return int(self.conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "db" / "sessions.db"


@pytest.fixture
def sqlite_store(path: Path) -> Iterator[SQLiteSessionStore]:
    store = SQLiteSessionStore(path)
    yield store
    store.close()


@pytest.fixture
def raw(sqlite_store: SQLiteSessionStore, path: Path) -> Iterator[Raw]:
    asyncio.run(sqlite_store.list())  # creates the database
    handle = Raw(path)
    yield handle
    handle.close()


async def seeded(store: SQLiteSessionStore, n: int, session_id: str = "s") -> list[Message]:
    messages = history(n)
    await store.create(session_id)
    await store.commit(session_id, messages, agent_state={"k": 1})
    return messages


# ---------------------------------------------------------------- basics


async def test_create_get_list_and_protocols(sqlite_store: SQLiteSessionStore) -> None:
    meta = await sqlite_store.create("s1")
    assert (meta.session_id, meta.message_count) == ("s1", 0)
    assert meta.created_at == meta.updated_at
    assert meta.created_at.endswith("Z")
    record = await sqlite_store.get("s1")
    assert (record.messages, record.agent_state, record.offset) == ([], {}, 0)
    assert record.tail
    assert record.meta == meta
    assert isinstance(sqlite_store, SupportsHistoryPage)
    assert isinstance(sqlite_store, SupportsFlush)
    assert "sessions.db" in repr(sqlite_store)


async def test_create_existing(sqlite_store: SQLiteSessionStore) -> None:
    await sqlite_store.create("s")
    await sqlite_store.commit("s", history(2))
    with pytest.raises(SessionConflictError) as info:
        await sqlite_store.create("s")
    assert info.value.code == "session_conflict"
    meta = await sqlite_store.create("s", exist_ok=True)
    assert meta.message_count == 2
    assert len((await sqlite_store.get("s")).messages) == 2


async def test_unknown_session(sqlite_store: SQLiteSessionStore) -> None:
    for attempt in (
        sqlite_store.get("nope"),
        sqlite_store.commit("nope", history(1)),
        sqlite_store.history_page("nope", 0, 10),
    ):
        with pytest.raises(SessionNotFoundError) as info:
            await attempt
        assert info.value.code == "session_not_found"
        assert "nope" in str(info.value)
    await sqlite_store.delete("nope")  # idempotent


@pytest.mark.parametrize("bad", ["", ".", "..", "a/b", "a\\b", "nul\x00"])
async def test_bad_ids(sqlite_store: SQLiteSessionStore, bad: str) -> None:
    calls = [
        lambda: sqlite_store.create(bad),
        lambda: sqlite_store.get(bad),
        lambda: sqlite_store.commit(bad, []),
        lambda: sqlite_store.delete(bad),
        lambda: sqlite_store.history_page(bad, 0, 1),
        lambda: sqlite_store.flush(bad),
    ]
    for make in calls:
        with pytest.raises(ValueError, match="session_id"):
            await make()
    with pytest.raises(ValueError, match="session_id"):
        sqlite_store.writer_lock(bad)
    with pytest.raises(TypeError, match="session_id"):
        await sqlite_store.get(42)  # type: ignore[arg-type]


def test_constructor_arguments(tmp_path: Path) -> None:
    for bad in ("", ":memory:"):
        with pytest.raises(ValueError, match="path"):
            SQLiteSessionStore(bad)
    with pytest.raises(TypeError, match="path"):
        SQLiteSessionStore(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="durability"):
        SQLiteSessionStore(tmp_path / "x.db", durability="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="busy_timeout"):
        SQLiteSessionStore(tmp_path / "x.db", busy_timeout=-1)


async def test_list(sqlite_store: SQLiteSessionStore) -> None:
    for sid in ["b", "a", "é", "c", "B"]:
        await sqlite_store.create(sid)
    await sqlite_store.commit("c", history(3))
    metas = await sqlite_store.list()
    assert [m.session_id for m in metas] == sorted(["b", "a", "é", "c", "B"])
    assert {m.session_id: m.message_count for m in metas}["c"] == 3
    assert [m.session_id for m in await sqlite_store.list(limit=2)] == ["B", "a"]
    assert [m.session_id for m in await sqlite_store.list(after="a", limit=2)] == ["b", "c"]
    assert [m.session_id for m in await sqlite_store.list(after="zz")] == ["é"]
    assert await sqlite_store.list(limit=0) == []
    for bad in (-1, True, "3", 1.5):
        with pytest.raises(ValueError, match="limit"):
            await sqlite_store.list(limit=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="after"):
        await sqlite_store.list(after="a/b")


# ---------------------------------------------------------------- commit


async def test_commit_appends_only_what_is_new(sqlite_store: SQLiteSessionStore, raw: Raw) -> None:
    await sqlite_store.create("s")
    first = await sqlite_store.commit("s", history(2))
    assert first.message_count == 2
    second = await sqlite_store.commit("s", history(5), expected_tail=first.tail)
    assert second.message_count == 5
    assert raw.count("perdure_messages") == 5
    record = await sqlite_store.get("s")
    assert record.messages == history(5)
    assert record.tail == second.tail
    meta = record.meta
    assert meta.message_count == 5
    assert meta.updated_at >= meta.created_at


async def test_get_offset(sqlite_store: SQLiteSessionStore) -> None:
    messages = await seeded(sqlite_store, 6)
    record = await sqlite_store.get("s", offset=4)
    assert (record.messages, record.offset, record.message_count) == (messages[4:], 4, 6)
    assert record.agent_state == {"k": 1}
    past = await sqlite_store.get("s", offset=99)
    assert (past.messages, past.offset, past.message_count) == ([], 6, 6)
    with pytest.raises(ValueError, match="offset"):
        await sqlite_store.get("s", offset=-1)
    with pytest.raises(TypeError, match="offset"):
        await sqlite_store.get("s", offset="1")  # type: ignore[arg-type]


async def test_conflicts_write_nothing(sqlite_store: SQLiteSessionStore) -> None:
    await seeded(sqlite_store, 4)
    before = await sqlite_store.get("s")
    with pytest.raises(SessionConflictError) as info:
        await sqlite_store.commit("s", history(6), expected_tail="0-stale")
    assert info.value.code == "session_conflict"
    assert info.value.details == {"expected_tail": "0-stale", "stored_tail": before.tail}
    with pytest.raises(SessionConflictError, match="rewritten=True"):
        await sqlite_store.commit("s", history(3), agent_state={"k": 2})
    after = await sqlite_store.get("s")
    assert (after.messages, after.agent_state, after.tail) == (
        before.messages,
        before.agent_state,
        before.tail,
    )


async def test_tail_changes_on_every_write_only(sqlite_store: SQLiteSessionStore) -> None:
    await sqlite_store.create("s")
    tails = [(await sqlite_store.get("s")).tail]
    tails.append((await sqlite_store.commit("s", history(2))).tail)
    same = await sqlite_store.commit("s", history(2))  # nothing to write
    assert same.tail == tails[-1]
    tails.append((await sqlite_store.commit("s", history(2), agent_state={"a": 1})).tail)
    tails.append((await sqlite_store.commit("s", history(2), agent_state={"a": 1})).tail)
    tails.append(
        (await sqlite_store.commit("s", history(2), redactions={0: text("user", "x")})).tail
    )
    tails.append((await sqlite_store.commit("s", history(2), rewritten=True)).tail)
    assert len(set(tails)) == len(tails)
    assert (await sqlite_store.get("s")).tail == tails[-1]
    await sqlite_store.delete("s")
    await sqlite_store.create("s")
    assert (await sqlite_store.get("s")).tail not in tails  # a new incarnation


async def test_agent_state_is_replaced_and_round_trips(sqlite_store: SQLiteSessionStore) -> None:
    await sqlite_store.create("s")
    state = {"state": {"blob": b"\x00\xff", "n": [1, 2.5, None, True]}, "internal_state": {}}
    await sqlite_store.commit("s", [], agent_state=state)
    assert (await sqlite_store.get("s")).agent_state == state
    await sqlite_store.commit("s", history(1))  # without state: kept
    assert (await sqlite_store.get("s")).agent_state == state
    await sqlite_store.commit("s", history(1), agent_state={"other": "ü"})
    assert (await sqlite_store.get("s")).agent_state == {"other": "ü"}


async def test_bytes_and_text_round_trip_exactly(sqlite_store: SQLiteSessionStore) -> None:
    every_byte = bytes(range(256))
    messages: list[Message] = [
        image(every_byte),
        image(b""),
        {
            "role": "user",
            "content": [
                {
                    "toolResult": {
                        "toolUseId": "t",
                        "status": "error",
                        "content": [
                            {"document": {"format": "pdf", "name": "d", "source": {"bytes": b"%P"}}}
                        ],
                    }
                }
            ],
        },
        text("assistant", 'ünïcødé 中文 🎉 \u2028 \x00 "quoted" \\ '),
        text("assistant", "lone surrogate \ud800 kept"),
        {"role": "assistant", "content": [{"reasoningContent": {"text": "hmm", "sig": b"\x01"}}]},
    ]
    await sqlite_store.create("s")
    await sqlite_store.commit("s", messages)
    record = await sqlite_store.get("s")
    assert record.messages == messages
    assert record.messages[0]["content"][1]["image"]["source"]["bytes"] == every_byte
    page = await sqlite_store.history_page("s", 0, 10)
    assert page.messages == messages


async def test_messages_are_checked_before_anything_is_written(
    sqlite_store: SQLiteSessionStore,
) -> None:
    await seeded(sqlite_store, 2)
    before = await sqlite_store.get("s")
    bad_calls: list[tuple[type[Exception], str, Any]] = [
        (ValueError, "role", [*history(2), text("system", "x")]),
        (TypeError, "content", [*history(2), {"role": "user", "content": "x"}]),
        (ValueError, "JSON", [*history(2), text("user", "ok"), call("t") | {"extra": {1, 2}}]),
        (ValueError, "JSON", [*history(2), {"role": "user", "content": [{"json": float("nan")}]}]),
    ]
    for error, match, messages in bad_calls:
        with pytest.raises(error, match=match):
            await sqlite_store.commit("s", messages)
    with pytest.raises(TypeError, match="messages"):
        await sqlite_store.commit("s", "not a list")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="agent_state"):
        await sqlite_store.commit("s", history(2), agent_state=[1])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="agent_state"):
        await sqlite_store.commit("s", history(2), agent_state={"x": object()})
    with pytest.raises(TypeError, match="rewritten"):
        await sqlite_store.commit("s", history(2), rewritten=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="expected_tail"):
        await sqlite_store.commit("s", history(2), expected_tail=1)  # type: ignore[arg-type]
    after = await sqlite_store.get("s")
    assert (after.messages, after.tail, after.agent_state) == (
        before.messages,
        before.tail,
        before.agent_state,
    )


# ---------------------------------------------------------------- redactions and rewrites


async def test_redaction_keeps_the_original(sqlite_store: SQLiteSessionStore, raw: Raw) -> None:
    messages = await seeded(sqlite_store, 4)
    replacement = text("assistant", "[redacted]")
    new = [*messages, text("user", "secret 2")]
    await sqlite_store.commit(
        "s", new, redactions={1: replacement, 4: text("user", "[redacted 2]")}
    )
    record = await sqlite_store.get("s")
    assert record.messages[1] == replacement
    assert record.messages[4] == text("user", "[redacted 2]")
    assert record.messages[0] == messages[0]
    assert (await sqlite_store.get("s", offset=1)).messages[0] == replacement
    assert (await sqlite_store.history_page("s", 1, 1)).messages == [replacement]
    body, _, redacted, _ = raw.row("s", 1)
    assert json.loads(body) == messages[1]  # the original is kept
    assert redacted is not None
    assert json.loads(redacted) == replacement
    for bad in (5, -1, "1"):
        with pytest.raises(ValueError, match="redaction index"):
            await sqlite_store.commit("s", new, redactions={bad: replacement})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="role"):
        await sqlite_store.commit("s", new, redactions={0: text("system", "x")})
    assert (await sqlite_store.get("s")).tail == record.tail


async def test_rewrite_replaces_history_and_clears_redactions(
    sqlite_store: SQLiteSessionStore, raw: Raw
) -> None:
    await seeded(sqlite_store, 6)
    await sqlite_store.commit("s", history(6), redactions={0: text("user", "[r]")})
    summary = [text("user", "summary"), text("assistant", "ok")]
    result_ = await sqlite_store.commit("s", summary, rewritten=True)
    assert result_.message_count == 2
    record = await sqlite_store.get("s")
    assert record.messages == summary  # the redaction of row 0 went with the old history
    assert record.agent_state == {"k": 1}  # state untouched without agent_state
    assert raw.count("perdure_messages") == 2
    await sqlite_store.commit(
        "s", [text("user", "x")], rewritten=True, redactions={0: text("user", "y")}
    )
    assert (await sqlite_store.get("s")).messages == [text("user", "y")]
    await sqlite_store.commit("s", [], rewritten=True)
    assert (await sqlite_store.get("s")).messages == []


async def test_rewrite_is_atomic_when_an_insert_fails_midway(
    sqlite_store: SQLiteSessionStore, raw: Raw
) -> None:
    await seeded(sqlite_store, 10)
    await sqlite_store.commit("s", history(10), redactions={3: text("assistant", "[r]")})
    before = await sqlite_store.get("s")
    rows_before = raw.count("perdure_messages")
    new = history(10, prefix="new")
    # Valid in shape, so it is only found when row 5 is encoded, inside the transaction
    # after the old rows were deleted and rows 0-4 inserted.
    new[5] = {
        "role": "assistant",
        "content": [{"toolUse": {"toolUseId": "t", "name": "f", "input": {"x": {1, 2}}}}],
    }
    with pytest.raises(ValueError, match=r"messages\[5\]"):
        await sqlite_store.commit("s", new, rewritten=True, agent_state={"k": 2})
    after = await sqlite_store.get("s")
    assert (after.messages, after.agent_state, after.tail, after.message_count) == (
        before.messages,
        before.agent_state,
        before.tail,
        10,
    )
    assert raw.count("perdure_messages") == rows_before
    # The same holds for an append that fails after inserting some rows.
    with pytest.raises(ValueError, match=r"messages\[12\]"):
        await sqlite_store.commit("s", [*history(12), new[5], text("user", "z")])
    assert (await sqlite_store.get("s")).tail == before.tail
    assert raw.count("perdure_messages") == rows_before


REWRITER = textwrap.dedent(
    """
    import asyncio, sys
    from perdure.stores.sqlite import SQLiteSessionStore

    def version(tag, n):
        return [{"role": "user", "content": [{"text": f"{tag}{i}" + "x" * 300}]} for i in range(n)]

    async def main():
        store = SQLiteSessionStore(sys.argv[1])
        i = 0
        while True:
            i += 1
            tag = "a" if i % 2 else "b"
            await store.commit("s", version(tag, 1500 if tag == "a" else 700), rewritten=True)
            if i == 1:
                print("ready", flush=True)

    asyncio.run(main())
    """
)


def test_a_rewrite_killed_midway_is_all_or_nothing(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    store = SQLiteSessionStore(path)
    asyncio.run(store.create("s"))
    script = tmp_path / "rewriter.py"
    script.write_text(REWRITER)
    for delay in (0.0, 0.03, 0.07, 0.11):
        child = subprocess.Popen(
            [sys.executable, str(script), str(path)], stdout=subprocess.PIPE, text=True
        )
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        time.sleep(delay)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        child.stdout.close()
        record = asyncio.run(store.get("s"))
        texts = [m["content"][0]["text"] for m in record.messages]
        tags = {t[0] for t in texts}
        assert len(tags) == 1, "a rewrite was half applied"
        assert len(texts) == (1500 if tags == {"a"} else 700)
    store.close()


# ---------------------------------------------------------------- pages


def paired_history() -> list[Message]:
    # 0 u, 1 a:use t1, 2 u:result t1, 3 a, 4 u, 5 a:use t2, 6 u:result t2, 7 a
    return [
        text("user", "q"),
        call("t1"),
        result("t1"),
        text("assistant", "a"),
        text("user", "q2"),
        call("t2"),
        result("t2"),
        text("assistant", "done"),
    ]


async def test_history_page_never_splits_a_tool_pair(sqlite_store: SQLiteSessionStore) -> None:
    messages = paired_history()
    await sqlite_store.create("s")
    await sqlite_store.commit("s", messages)
    page = await sqlite_store.history_page("s", 2, 2)  # would open on a toolResult
    assert (page.offset, page.next_offset, page.total) == (1, 4, 8)
    assert page.messages == messages[1:4]
    page = await sqlite_store.history_page("s", 4, 2)  # would end on a toolUse
    assert (page.offset, page.next_offset) == (4, 7)
    assert page.messages == messages[4:7]
    tail = await sqlite_store.history_page("s", 6, 50)
    assert (tail.offset, tail.next_offset, tail.messages) == (5, 8, messages[5:])
    empty = await sqlite_store.history_page("s", 20, 5)
    assert (empty.messages, empty.offset, empty.next_offset) == ([], 8, 8)
    zero = await sqlite_store.history_page("s", 3, 0)
    assert (zero.messages, zero.offset, zero.next_offset) == ([], 3, 3)
    for offset, limit in ((-1, 1), (0, -1)):
        with pytest.raises(ValueError):
            await sqlite_store.history_page("s", offset, limit)


# ---------------------------------------------------------------- hypothesis

blocks = st.one_of(
    st.builds(lambda s: {"text": s}, st.text(max_size=40)),
    st.builds(
        lambda b: {"image": {"format": "png", "source": {"bytes": b}}}, st.binary(max_size=40)
    ),
    st.builds(
        lambda v: {"json": v},
        st.recursive(
            st.none()
            | st.booleans()
            | st.integers()
            | st.floats(allow_nan=False, allow_infinity=False)
            | st.text(max_size=10),
            lambda inner: (
                st.lists(inner, max_size=3)
                | st.dictionaries(st.text(max_size=5), inner, max_size=3)
            ),
            max_leaves=8,
        ),
    ),
)
plain_messages = st.builds(
    lambda role, content: {"role": role, "content": content},
    st.sampled_from(["user", "assistant"]),
    st.lists(blocks, max_size=3),
)


@st.composite
def histories(draw: st.DrawFn) -> list[Message]:
    """Messages and well-formed tool pairs (a result always right after its call)."""
    out: list[Message] = []
    for i, kind in enumerate(draw(st.lists(st.sampled_from(["plain", "pair"]), max_size=25))):
        if kind == "plain":
            out.append(draw(plain_messages))
        else:
            out.extend([call(f"t{i}"), result(f"t{i}")])
    return out


SETTINGS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


@SETTINGS
@given(messages=histories(), cuts=st.lists(st.integers(0, 60), max_size=4))
def test_random_histories_round_trip(
    sqlite_store: SQLiteSessionStore, messages: list[Message], cuts: list[int]
) -> None:
    async def run() -> None:
        await sqlite_store.delete("h")
        await sqlite_store.create("h")
        for cut in sorted(cuts):  # committed in a few growing steps
            await sqlite_store.commit("h", messages[:cut] if cut < len(messages) else messages)
        await sqlite_store.commit("h", messages)
        record = await sqlite_store.get("h")
        assert record.messages == messages
        assert record.message_count == len(messages)

    asyncio.run(run())


@SETTINGS
@given(messages=histories(), limit=st.integers(1, 7), start=st.integers(0, 5))
def test_walking_pages_covers_everything_once(
    sqlite_store: SQLiteSessionStore, messages: list[Message], limit: int, start: int
) -> None:
    async def run() -> None:
        await sqlite_store.delete("p")
        await sqlite_store.create("p")
        await sqlite_store.commit("p", messages)
        seen: list[Message] = []
        offset = 0
        while offset < len(messages):
            page = await sqlite_store.history_page("p", offset, limit)
            assert page.offset == offset  # well-formed pairs never move a walked start
            assert page.next_offset > offset
            assert page.total == len(messages)
            assert page.messages == messages[page.offset : page.next_offset]
            first, last = page.messages[0], page.messages[-1]
            assert not any("toolResult" in b for b in first["content"]) or page.offset == 0
            assert not any("toolUse" in b for b in last["content"]) or (
                page.next_offset == len(messages)
            )
            seen.extend(page.messages)
            offset = page.next_offset
        assert seen == messages
        # A page asked anywhere still returns whole pairs.
        page = await sqlite_store.history_page("p", min(start, len(messages)), limit)
        assert page.messages == messages[page.offset : page.next_offset]

    asyncio.run(run())


# ---------------------------------------------------------------- damage


def corrupted(excinfo: pytest.ExceptionInfo[SessionCorruptedError], row: int, kind: str) -> None:
    err = excinfo.value
    assert err.code == "session_store_corrupted"
    assert f"message row {row}" in err.message
    assert "'s'" in err.message
    assert err.details["row"] == row
    assert err.details["kind"] == kind


async def test_a_changed_body_is_named_by_get_and_by_a_page_covering_it(
    sqlite_store: SQLiteSessionStore, raw: Raw
) -> None:
    await seeded(sqlite_store, 20)
    body, *_ = raw.row("s", 3)
    raw.set("s", 3, body=body.replace("m3", "m4"))  # one byte, still valid JSON
    with pytest.raises(SessionCorruptedError) as info:
        await sqlite_store.get("s")
    corrupted(info, 3, "bad_hash")
    with pytest.raises(SessionCorruptedError) as info:
        await sqlite_store.get("s", offset=3)
    corrupted(info, 3, "bad_hash")
    with pytest.raises(SessionCorruptedError) as info:
        await sqlite_store.history_page("s", 2, 3)
    corrupted(info, 3, "bad_hash")
    # A page that does not read the row is served: the cost and the check follow the page.
    page = await sqlite_store.history_page("s", 10, 5)
    assert [m["content"][0]["text"] for m in page.messages] == [f"m{i}" for i in range(10, 15)]
    assert (await sqlite_store.list())[0].message_count == 20


async def test_a_changed_hash_is_named(sqlite_store: SQLiteSessionStore, raw: Raw) -> None:
    await seeded(sqlite_store, 5)
    _, digest, *_ = raw.row("s", 2)
    raw.set("s", 2, hash=("1" if digest[0] != "1" else "2") + digest[1:])
    with pytest.raises(SessionCorruptedError) as info:
        await sqlite_store.get("s")
    corrupted(info, 2, "bad_hash")
    with pytest.raises(SessionCorruptedError) as info:
        await sqlite_store.history_page("s", 2, 1)
    corrupted(info, 2, "bad_hash")


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ('{"role":"user","content":[{"text":"x"}]', "not valid JSON"),
        ('{"role":"user","content":[]} trailing', "not valid JSON"),
        ('{"role":"system","content":[]}', "not a message"),
        ('{"role":"user","content":"x"}', "not a message"),
        (
            '{"role":"user","content":[{"image":{"source":{"bytes":{"__bytes_encoded__":true,'
            '"data":"!!"}}}}]}',
            "not valid JSON",
        ),
        ("[1]", "not a message"),
    ],
)
async def test_a_bad_payload_with_a_valid_chain_is_named(
    sqlite_store: SQLiteSessionStore, raw: Raw, body: str, why: str
) -> None:
    await seeded(sqlite_store, 5)
    raw.set("s", 1, body=body)
    raw.rechain("s")
    with pytest.raises(SessionCorruptedError, match=why) as info:
        await sqlite_store.get("s")
    corrupted(info, 1, "bad_payload")
    with pytest.raises(SessionCorruptedError, match=why):
        await sqlite_store.history_page("s", 0, 2)


async def test_missing_and_extra_rows_are_named(sqlite_store: SQLiteSessionStore, raw: Raw) -> None:
    await seeded(sqlite_store, 6)
    base = raw.base("s")
    raw.conn.execute("DELETE FROM perdure_messages WHERE key = ?", (base + 2,))
    with pytest.raises(SessionCorruptedError) as info:
        await sqlite_store.get("s")
    corrupted(info, 2, "bad_sequence")
    with pytest.raises(SessionCorruptedError) as info:
        await sqlite_store.history_page("s", 3, 2)  # chains from the missing row
    corrupted(info, 2, "bad_sequence")
    await sqlite_store.delete("s")
    await seeded(sqlite_store, 6)
    base = raw.base("s")
    raw.conn.execute("DELETE FROM perdure_messages WHERE key = ?", (base + 5,))  # the last
    with pytest.raises(SessionCorruptedError) as info:
        await sqlite_store.get("s")
    corrupted(info, 5, "bad_sequence")
    raw.conn.execute(
        "INSERT INTO perdure_messages (key, body, hash) SELECT ?, body, hash "
        "FROM perdure_messages WHERE key = ?",
        (base + 7, base + 4),
    )
    raw.conn.execute(
        "INSERT INTO perdure_messages (key, body, hash) SELECT ?, body, hash "
        "FROM perdure_messages WHERE key = ?",
        (base + 5, base + 4),
    )
    with pytest.raises(SessionCorruptedError) as info:
        await sqlite_store.get("s")
    assert info.value.details["row"] == 5


async def test_a_moved_head_is_a_broken_chain(sqlite_store: SQLiteSessionStore, raw: Raw) -> None:
    await seeded(sqlite_store, 3)
    raw.conn.execute("UPDATE perdure_sessions SET head = ? WHERE id = 's'", ("f" * 32,))
    with pytest.raises(SessionCorruptedError) as info:
        await sqlite_store.get("s")
    corrupted(info, 2, "broken_chain")
    with pytest.raises(SessionCorruptedError):
        await sqlite_store.history_page("s", 2, 5)
    assert len((await sqlite_store.history_page("s", 0, 1)).messages) == 1


async def test_changed_redaction_and_state_are_detected(
    sqlite_store: SQLiteSessionStore, raw: Raw
) -> None:
    await seeded(sqlite_store, 3)
    await sqlite_store.commit("s", history(3), redactions={1: text("assistant", "[r1]")})
    raw.set("s", 1, redacted=json.dumps(text("assistant", "[r2]"), separators=(",", ":")))
    with pytest.raises(SessionCorruptedError) as info:
        await sqlite_store.get("s")
    corrupted(info, 1, "bad_hash")
    await sqlite_store.commit("s", history(3), redactions={1: text("assistant", "[r1]")})
    assert (await sqlite_store.get("s")).messages[1] == text("assistant", "[r1]")
    raw.conn.execute("UPDATE perdure_states SET body = '{\"k\":2}'")
    with pytest.raises(SessionCorruptedError, match="agent state") as state_info:
        await sqlite_store.get("s")
    assert state_info.value.details["kind"] == "bad_state"
    raw.conn.execute("DELETE FROM perdure_states")
    with pytest.raises(SessionCorruptedError, match="state row is missing"):
        await sqlite_store.get("s")


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(row=st.integers(0, 5), position=st.integers(0, 1000), char=st.characters(codec="ascii"))
def test_any_changed_character_is_detected(
    sqlite_store: SQLiteSessionStore, raw: Raw, row: int, position: int, char: str
) -> None:
    async def run() -> None:
        await sqlite_store.delete("s")
        await seeded(sqlite_store, 6)
        body, *_ = raw.row("s", row)
        at = position % len(body)
        if body[at] == char:
            return
        raw.set("s", row, body=body[:at] + char + body[at + 1 :])
        with pytest.raises(SessionCorruptedError) as info:
            await sqlite_store.get("s")
        corrupted(info, row, "bad_hash")

    asyncio.run(run())


async def test_a_file_that_is_not_a_database(tmp_path: Path) -> None:
    path = tmp_path / "garbage.db"
    path.write_bytes(b"this is not a database, " * 200)
    store = SQLiteSessionStore(path)
    with pytest.raises(SessionCorruptedError, match=r"garbage\.db") as info:
        await store.list()
    assert info.value.details["kind"] == "bad_database"
    assert not isinstance(info.value, sqlite3.Error)


async def test_a_foreign_schema_is_reported_not_leaked(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE perdure_sessions (x)")
    conn.commit()
    conn.close()
    with pytest.raises(SessionCorruptedError, match="not a perdure session database"):
        await SQLiteSessionStore(path).get("s")


async def test_io_errors_are_os_errors(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="SQLite session store") as info:
        await SQLiteSessionStore(tmp_path).list()  # a directory cannot be opened
    assert not isinstance(info.value, sqlite3.Error)


# ---------------------------------------------------------------- locking

HOLDER = textwrap.dedent(
    """
    import asyncio, sys
    from perdure.stores.sqlite import SQLiteSessionStore

    async def main():
        store = SQLiteSessionStore(sys.argv[1])
        async with store.writer_lock("s"):
            print("held", flush=True)
            await asyncio.to_thread(sys.stdin.read)

    asyncio.run(main())
    """
)


@pytest.fixture
def holder(tmp_path: Path, path: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process holding the writer lock of session ``s``."""
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    child = subprocess.Popen(
        [sys.executable, str(script), str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "held"
    yield child
    if child.poll() is None:
        child.kill()
    child.wait(timeout=10)
    for stream in (child.stdin, child.stdout):
        if stream is not None:
            stream.close()


async def test_another_process_holding_the_lock(
    sqlite_store: SQLiteSessionStore, holder: subprocess.Popen[str]
) -> None:
    await sqlite_store.create("other")  # other sessions are not locked
    started = time.monotonic()
    for attempt in (
        sqlite_store.create("s"),
        sqlite_store.commit("s", history(1)),
        sqlite_store.delete("s"),
    ):
        with pytest.raises(SessionLockedError) as info:
            await attempt
        assert info.value.code == "session_locked"
    with pytest.raises(SessionLockedError):
        async with sqlite_store.writer_lock("s"):
            pass
    assert time.monotonic() - started < 1.0  # at once, never waiting
    holder.send_signal(signal.SIGKILL)  # a crashed holder leaves nothing locked
    holder.wait(timeout=10)
    await sqlite_store.create("s")
    await sqlite_store.commit("s", history(2))
    assert (await sqlite_store.get("s")).message_count == 2


async def test_reads_do_not_need_the_lock(
    path: Path, sqlite_store: SQLiteSessionStore, holder: subprocess.Popen[str]
) -> None:
    await sqlite_store.create("t")
    assert [m.session_id for m in await sqlite_store.list()] == ["t"]
    with pytest.raises(SessionNotFoundError):
        await sqlite_store.get("s")


async def test_a_second_store_instance_is_another_writer(
    sqlite_store: SQLiteSessionStore, path: Path
) -> None:
    await sqlite_store.create("s")
    other = SQLiteSessionStore(path)
    async with sqlite_store.writer_lock("s"):
        await sqlite_store.commit("s", history(1))  # the holder commits freely
        with pytest.raises(SessionLockedError):
            await other.commit("s", history(2))
        with pytest.raises(SessionLockedError):
            async with sqlite_store.writer_lock("s"):  # not re-entrant
                pass
    await other.commit("s", history(2))
    assert (await sqlite_store.get("s")).message_count == 2
    other.close()


async def test_a_database_locked_elsewhere_is_session_locked(
    sqlite_store: SQLiteSessionStore, path: Path
) -> None:
    await seeded(sqlite_store, 2)
    impatient = SQLiteSessionStore(path, busy_timeout=0.05)
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(SessionLockedError, match="locked") as info:
            await impatient.commit("s", history(3))
        assert isinstance(info.value.__cause__, sqlite3.OperationalError)
        assert (await impatient.get("s")).message_count == 2  # WAL readers go on
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    await impatient.commit("s", history(3))
    impatient.close()


async def test_an_append_on_the_loop_never_waits_for_a_locked_database(path: Path) -> None:
    # A non-durable append runs on the caller's thread; when another connection holds
    # the database's write lock it must wait in a thread, not on the event loop.
    store = SQLiteSessionStore(path, durability="none", busy_timeout=10)
    await store.create("s")
    await store.commit("s", history(2))  # the writer connection is open now
    blocker = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    blocker.execute("BEGIN IMMEDIATE")
    release = threading.Timer(1.0, lambda: blocker.execute("COMMIT"))
    gaps: list[float] = []

    async def ticker() -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    ticking = asyncio.create_task(ticker())
    await asyncio.sleep(0.05)
    release.start()
    try:
        async with store.writer_lock("s"):
            started = time.monotonic()
            committed = await store.commit("s", history(3))
            waited = time.monotonic() - started
        await asyncio.sleep(0.05)  # the ticker's next tick measures any stall
    finally:
        ticking.cancel()
        release.join()
        blocker.close()
    assert committed.message_count == 3
    assert waited >= 0.5  # it did wait for the lock ...
    assert max(gaps) < 0.5  # ... while the loop went on
    assert (await store.get("s")).messages == history(3)
    store.close()


async def test_appends_on_the_loop_fold_the_wal_on_a_worker_thread(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Folding the WAL fsyncs: it must not run inside an append made on the event
    # loop, yet it must run, or the WAL would grow with every append — also while
    # appends go on faster than background folds catch up with them.
    folded_on: list[int] = []
    fold = SQLiteSessionStore._checkpoint_wal

    def spy(self: SQLiteSessionStore, conn: sqlite3.Connection) -> None:
        folded_on.append(threading.get_ident())
        fold(self, conn)

    monkeypatch.setattr(SQLiteSessionStore, "_checkpoint_wal", spy)
    store = SQLiteSessionStore(path, durability="none")
    await store.create("s")
    messages = [text("user" if i % 2 == 0 else "assistant", f"{i} " + "x" * 400) for i in range(2)]
    await store.commit("s", messages)
    wal = Path(f"{path}-wal")

    def wal_size() -> int:
        return wal.stat().st_size

    largest = 0
    async with store.writer_lock("s"):
        for i in range(2, 6000):
            messages.append(text("user" if i % 2 == 0 else "assistant", f"{i} " + "x" * 400))
            await store.commit("s", messages)
            largest = max(largest, wal_size())
    store.close()
    assert len(folded_on) >= 10
    assert threading.get_ident() not in folded_on
    # 6,000 appends of two pages each would make a 48 MiB WAL without folding; with
    # folds in the background, it is at most a few folds' worth (~2 MiB each).
    assert largest < 12 * 1024 * 1024
    reopened = SQLiteSessionStore(path)
    assert (await reopened.get("s")).messages == messages
    reopened.close()


# ---------------------------------------------------------------- any loop, any thread


async def test_any_loop_any_thread(sqlite_store: SQLiteSessionStore) -> None:
    await sqlite_store.create("s")
    errors: list[BaseException] = []
    stop = threading.Event()

    def reader() -> None:
        try:
            while not stop.is_set():
                metas = asyncio.run(sqlite_store.list())
                record = asyncio.run(sqlite_store.get("s"))
                assert metas[0].session_id == "s"
                assert record.messages == history(len(record.messages))
        except BaseException as exc:  # reported below
            errors.append(exc)

    def writer(session_id: str) -> None:
        async def run() -> None:
            await sqlite_store.create(session_id)
            for n in range(1, 30):
                await sqlite_store.commit(session_id, history(n))

        try:
            asyncio.run(run())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=reader), threading.Thread(target=writer, args=("w",))]
    for thread in threads:
        thread.start()
    for n in range(1, 30):  # meanwhile, this loop commits too
        await sqlite_store.commit("s", history(n))
    threads[1].join(timeout=30)
    stop.set()
    threads[0].join(timeout=30)
    assert errors == []
    assert (await sqlite_store.get("s")).message_count == 29
    assert (await sqlite_store.get("w")).message_count == 29


def test_a_store_outlives_its_first_loop(path: Path) -> None:
    store = SQLiteSessionStore(path)
    asyncio.run(store.create("s"))
    asyncio.run(store.commit("s", history(2)))

    async def locked_commit() -> int:
        async with store.writer_lock("s"):
            return (await store.commit("s", history(3))).message_count

    assert asyncio.run(locked_commit()) == 3
    assert asyncio.run(store.get("s")).message_count == 3
    store.close()
    assert asyncio.run(store.get("s")).message_count == 3  # reopens after close
    store.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_forked_child_opens_its_own_connections(path: Path) -> None:
    store = SQLiteSessionStore(path)
    asyncio.run(store.create("s"))
    asyncio.run(store.commit("s", history(2)))  # connections are open now

    def child() -> None:
        asyncio.run(store.commit("s", history(3)))
        store.close()

    assert exit_code(fork_child(child)) == 0
    assert asyncio.run(store.get("s")).messages == history(3)
    store.close()


# ---------------------------------------------------------------- durability


async def test_durability_invocation_and_flush(path: Path) -> None:
    store = SQLiteSessionStore(path, durability="invocation")
    await store.create("s")
    await store.commit("s", history(3))
    await store.flush("s")
    await store.flush("unknown")  # nothing to make durable
    store.close()
    reopened = SQLiteSessionStore(path)
    assert (await reopened.get("s")).messages == history(3)
    await reopened.flush("s")  # a no-op for durability="commit"
    mode = sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"
    reopened.close()


def test_durability_none_flushes_nothing_and_invocation_syncs_the_wal(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The three levels mean what they mean in the file store: "none" leaves the
    # syncing to WAL folds, "invocation" syncs at the end of a turn (flush).
    synced: list[int] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    for durability, expected in (("none", False), ("invocation", True)):
        where = path.with_name(f"{durability}.db")
        store = SQLiteSessionStore(where, durability=durability)  # type: ignore[arg-type]
        asyncio.run(store.create("s"))
        asyncio.run(store.commit("s", history(2)))
        monkeypatch.setattr(os, "fsync", fsync)
        synced.clear()
        asyncio.run(store.flush("s"))
        monkeypatch.setattr(os, "fsync", real_fsync)
        assert bool(synced) is expected, durability
        assert asyncio.run(store.get("s")).messages == history(2)
        store.close()


async def test_flush_keeps_sqlites_locks_so_no_other_process_deletes_the_wal(
    path: Path,
) -> None:
    # Opening and closing the database file would drop this process's POSIX locks on
    # it; another process's last connection would then fold and delete the live WAL,
    # and the commits after it would go to a deleted file.
    store = SQLiteSessionStore(path, durability="invocation")
    await store.create("s")
    await store.commit("s", history(1))
    await store.flush("s")
    wal_inode = (await asyncio.to_thread(os.stat, f"{path}-wal")).st_ino
    other = (
        "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
        "c.execute('SELECT count(*) FROM perdure_sessions').fetchall(); c.close()"
    )
    await asyncio.to_thread(subprocess.run, [sys.executable, "-c", other, str(path)], check=True)
    assert await asyncio.to_thread(Path(f"{path}-wal").exists)
    # The same file: the directory entry flush synced once still names the WAL.
    assert (await asyncio.to_thread(os.stat, f"{path}-wal")).st_ino == wal_inode
    await store.commit("s", history(5))
    reader = SQLiteSessionStore(path)
    assert (await reader.get("s")).messages == history(5)
    reader.close()
    store.close()


class _HeldSyncs:
    """Stands in for the store's start_fsync: each sync is real, but its result is
    handed to the commit only when the test releases it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.real = sqlite_module.start_fsync
        self.held: list[tuple[asyncio.Future[None], asyncio.Future[None]]] = []
        self.offloaded: list[bool] = []  # each sync: asked to leave the loop's CPU alone?
        monkeypatch.setattr(sqlite_module, "start_fsync", self.start)

    def start(self, fd: int, *args: Any, **kwargs: Any) -> asyncio.Future[None]:
        assert kwargs.get("datasync") is True  # the WAL, as SQLite syncs it
        assert Path(os.readlink(f"/proc/self/fd/{fd}")).name.endswith("-wal")
        released: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.offloaded.append(kwargs.get("offload", False))
        self.held.append((self.real(fd, *args, **kwargs), released))
        return released

    async def release(self, at: int = -1) -> None:
        real, released = self.held[at]
        await real
        released.set_result(None)


async def _two_sessions(path: Path) -> SQLiteSessionStore:
    """A durable store with sessions "a" and "b" of one message each: its writer is
    open and its WAL named, so the next append is made on the loop."""
    store = SQLiteSessionStore(path)
    for session_id in ("a", "b"):
        await store.create(session_id)
        await store.commit(session_id, history(1))
    return store


def _forbid_the_writer_thread(store: SQLiteSessionStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail any commit that goes to the writer thread: the loop is to write them all."""

    async def no_thread(item: Any) -> Any:
        raise AssertionError("a commit went to the writer thread")

    monkeypatch.setattr(store._group, "submit", no_thread)


async def _let_the_loop_run() -> None:
    """A few passes of the loop: what was started runs as far as it can."""
    for _ in range(20):
        await asyncio.sleep(0.005)


def _first_sync_held(monkeypatch: pytest.MonkeyPatch) -> list[asyncio.Future[None]]:
    """The store's first start_fsync gives a future that only the test settles (it is
    in the list returned); the later ones are real."""
    held: list[asyncio.Future[None]] = []
    real_start = sqlite_module.start_fsync

    def start_fsync(fd: int, *args: Any, **kwargs: Any) -> asyncio.Future[None]:
        if held:
            return real_start(fd, *args, **kwargs)
        held.append(asyncio.get_running_loop().create_future())
        return held[0]

    monkeypatch.setattr(sqlite_module, "start_fsync", start_fsync)
    return held


def _path_syncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the files the store fsyncs by path (the writer thread's own syncs)."""
    synced: list[str] = []
    real_fsync_path = sqlite_module._fsync_path

    def fsync_path(target: Path, *, directory: bool = False) -> None:
        synced.append(Path(target).name)
        real_fsync_path(target, directory=directory)

    monkeypatch.setattr(sqlite_module, "_fsync_path", fsync_path)
    return synced


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="reads /proc/self/fd")
async def test_a_durable_append_on_the_loop_returns_only_after_its_wal_sync(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SQLiteSessionStore(path)  # durability="commit"
    await store.create("s")
    await store.commit("s", history(1))  # opens the writer and names the WAL
    syncs = _HeldSyncs(monkeypatch)
    commit = asyncio.ensure_future(store.commit("s", history(2)))
    await _let_the_loop_run()
    assert len(syncs.held) == 1  # written on the loop, its fsync started at once
    assert not commit.done()  # and not acknowledged before that fsync returns
    await syncs.release()
    assert (await asyncio.wait_for(commit, 10)).message_count == 2
    assert (await store.get("s")).messages == history(2)
    store.close()


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="reads /proc/self/fd")
async def test_no_write_goes_into_the_wal_behind_an_append_whose_sync_is_in_flight(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Frames written after unsynced ones could survive a power cut without them: a
    # hole that the WAL check would report as damage. So while the first append's
    # fsync is in flight, the second (another session's) waits, on the loop, and is
    # written once that fsync has returned, with its own.
    monkeypatch.setattr(sqlite_module, "_INLINE_SYNC_WAIT", 30.0)
    store = await _two_sessions(path)
    syncs = _HeldSyncs(monkeypatch)
    first = asyncio.ensure_future(store.commit("a", history(2)))
    await _let_the_loop_run()
    assert len(syncs.held) == 1
    wal_size = os.stat(f"{path}-wal").st_size
    probe = sqlite3.connect(path)
    rows = probe.execute("SELECT count(*) FROM perdure_messages").fetchone()
    second = asyncio.ensure_future(store.commit("b", history(2)))
    await _let_the_loop_run()
    assert not second.done()
    assert os.stat(f"{path}-wal").st_size == wal_size
    assert probe.execute("SELECT count(*) FROM perdure_messages").fetchone() == rows
    await syncs.release()
    assert (await asyncio.wait_for(first, 10)).message_count == 2
    await _let_the_loop_run()
    assert len(syncs.held) == 2  # the second's own sync, started after the first's
    assert not second.done()  # and not acknowledged before it returns
    assert probe.execute("SELECT count(*) FROM perdure_messages").fetchone() == (rows[0] + 1,)
    await syncs.release()
    assert (await asyncio.wait_for(second, 10)).message_count == 2
    probe.close()
    assert (await store.get("b")).messages == history(2)
    store.close()


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="reads /proc/self/fd")
async def test_commits_that_come_while_a_sync_is_in_flight_share_the_next_one_on_the_loop(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Group commit on the loop: what queued behind the in-flight fsync goes in one
    # transaction with one fsync, none acknowledged before it returns, and no
    # commit goes to the writer thread. One that fails, fails alone; one whose caller
    # was cancelled before its batch is not written.
    monkeypatch.setattr(sqlite_module, "_INLINE_SYNC_WAIT", 30.0)  # the test holds syncs
    store = SQLiteSessionStore(path)
    names = [f"s{i}" for i in range(8)]
    for name in names:
        await store.create(name)
        await store.commit(name, history(1))

    _forbid_the_writer_thread(store, monkeypatch)
    syncs = _HeldSyncs(monkeypatch)
    first = asyncio.ensure_future(store.commit("s0", history(2)))
    await _let_the_loop_run()
    assert len(syncs.held) == 1
    queued = {name: asyncio.ensure_future(store.commit(name, history(2))) for name in names[1:5]}
    stale = asyncio.ensure_future(store.commit("s5", history(2, prefix="x")))
    dropped = asyncio.ensure_future(store.commit("s6", history(2)))
    await _let_the_loop_run()
    dropped.cancel()
    await _let_the_loop_run()
    assert len(syncs.held) == 1
    assert not any(task.done() for task in queued.values())
    await syncs.release()
    assert (await asyncio.wait_for(first, 10)).message_count == 2
    await _let_the_loop_run()
    assert len(syncs.held) == 2  # one fsync for all that queued
    # The lone commit's fsync ran the fast way; the batch's, behind which the loop
    # has other sessions to run, off the loop's CPU.
    assert syncs.offloaded == [False, True]
    assert not any(task.done() for task in queued.values())
    with pytest.raises(SessionConflictError):
        await asyncio.wait_for(stale, 10)  # its own error, at once: nothing of it stands
    await syncs.release()
    for name, task in queued.items():
        assert (await asyncio.wait_for(task, 10)).message_count == 2, name
    assert dropped.cancelled()
    for name in names[:5]:
        assert (await store.get(name)).messages == history(2)
    for name in names[5:]:
        assert (await store.get(name)).messages == history(1)
    store.close()


async def test_a_loop_batch_takes_savepoints_only_once_one_of_its_commits_failed(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two statements fewer a commit: a batch goes in whole, and only when one of its
    # commits fails is it rolled back and run again with a savepoint around each.
    monkeypatch.setattr(sqlite_module, "_INLINE_SYNC_WAIT", 30.0)  # the test holds syncs
    store = SQLiteSessionStore(path)
    names = ["a", "b", "c", "d"]
    for name in names:
        await store.create(name)
        await store.commit(name, history(1))

    _forbid_the_writer_thread(store, monkeypatch)
    statements: list[str] = []
    assert store._writer.conn is not None
    store._writer.conn.set_trace_callback(statements.append)
    syncs = _HeldSyncs(monkeypatch)

    async def batch(stale: str | None) -> dict[str, Any]:
        first = asyncio.ensure_future(
            store.commit("a", (await store.get("a")).messages + history(1))
        )
        await _let_the_loop_run()
        tasks = {
            name: asyncio.ensure_future(
                store.commit(
                    name,
                    history(1, prefix="x")
                    if name == stale
                    else (await store.get(name)).messages + history(1),
                )
            )
            for name in names[1:]
        }
        await _let_the_loop_run()
        statements.clear()
        await syncs.release()
        await asyncio.wait_for(first, 10)
        await _let_the_loop_run()
        await syncs.release()
        outcomes = await asyncio.gather(*tasks.values(), return_exceptions=True)
        return dict(zip(tasks, outcomes, strict=True))

    clean = await batch(stale=None)
    assert all(not isinstance(outcome, BaseException) for outcome in clean.values())
    assert not [sql for sql in statements if "SAVEPOINT" in sql or "RELEASE" in sql]
    assert sum(sql.startswith("INSERT INTO perdure_messages") for sql in statements) == 3

    failed = await batch(stale="c")
    assert isinstance(failed["c"], SessionConflictError)
    assert [outcome.message_count for name, outcome in failed.items() if name != "c"] == [3, 3]
    assert sum(sql.startswith("SAVEPOINT") for sql in statements) == 3  # the second run's
    for name in names:
        assert len((await store.get(name)).messages) == (2 if name == "c" else 3), name
    store.close()


async def test_a_queued_commit_goes_to_the_writer_thread_when_the_loop_cannot_write_it(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The fsync it waited for failed: the WAL's state is unsure, so the queued commit is
    # written by the writer thread, which syncs the WAL first (_cover_inline_sync).
    monkeypatch.setattr(sqlite_module, "_INLINE_SYNC_WAIT", 0.5)  # > the loop runs below
    store = await _two_sessions(path)
    failing = _first_sync_held(monkeypatch)
    to_thread: list[Any] = []
    real_submit = store._group.submit

    async def submit(item: Any) -> Any:
        to_thread.append(item)
        return await real_submit(item)

    monkeypatch.setattr(store._group, "submit", submit)
    first = asyncio.ensure_future(store.commit("a", history(2)))
    await _let_the_loop_run()
    second = asyncio.ensure_future(store.commit("b", history(2)))
    await _let_the_loop_run()
    assert not second.done()
    assert to_thread == []  # queued on the loop, behind the fsync in flight
    failing[0].set_exception(OSError(5, "Input/output error"))
    with pytest.raises(OSError, match="Input/output"):
        await asyncio.wait_for(first, 10)
    assert (await asyncio.wait_for(second, 10)).message_count == 2
    assert [commit.request.session_id for commit in to_thread] == ["b"]
    assert (await store.get("b")).messages == history(2)
    store.close()


async def test_a_loop_batch_whose_every_commit_fails_leaves_the_loop_free_to_write(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its transaction still committed (empty): the fsync after it is started too, so
    # the next commit is written on the loop, not sent to the thread to wait.
    monkeypatch.setattr(sqlite_module, "_INLINE_SYNC_WAIT", 30.0)
    store = await _two_sessions(path)
    held = _first_sync_held(monkeypatch)
    first = asyncio.ensure_future(store.commit("a", history(2)))
    await _let_the_loop_run()
    stale = [
        asyncio.ensure_future(store.commit(name, history(2, prefix="x"))) for name in "ab"
    ]  # two: each fails in its savepoint, and the (empty) transaction commits
    await _let_the_loop_run()

    _forbid_the_writer_thread(store, monkeypatch)
    held[0].set_result(None)
    assert (await asyncio.wait_for(first, 10)).message_count == 2
    for task in stale:
        with pytest.raises(SessionConflictError):
            await asyncio.wait_for(task, 10)
    await _let_the_loop_run()
    assert (await asyncio.wait_for(store.commit("b", history(2)), 10)).message_count == 2
    store.close()


async def test_a_queued_commit_whose_batch_breaks_gets_the_error_and_does_not_hang(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_module, "_INLINE_SYNC_WAIT", 30.0)
    store = await _two_sessions(path)
    held = _first_sync_held(monkeypatch)
    first = asyncio.ensure_future(store.commit("a", history(2)))
    await _let_the_loop_run()
    second = asyncio.ensure_future(store.commit("b", history(2)))
    await _let_the_loop_run()

    def broken(commits: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the batch broke")

    monkeypatch.setattr(store, "_write_here", broken)
    held[0].set_result(None)
    assert (await asyncio.wait_for(first, 10)).message_count == 2
    with pytest.raises(RuntimeError, match="the batch broke"):
        await asyncio.wait_for(second, 10)
    monkeypatch.undo()
    assert (await store.get("b")).messages == history(1)  # nothing of it was written
    store.close()


async def test_commits_queued_behind_a_sync_that_never_returns_go_to_the_writer_thread(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its caller still waits (nothing cancels it): after _INLINE_SYNC_WAIT the queue
    # is the writer thread's, which fsyncs the WAL itself (covering the first append).
    monkeypatch.setattr(sqlite_module, "_INLINE_SYNC_WAIT", 0.05)
    store = await _two_sessions(path)
    never = _first_sync_held(monkeypatch)
    synced = _path_syncs(monkeypatch)
    first = asyncio.ensure_future(store.commit("a", history(2)))
    await asyncio.sleep(0)
    assert len(never) == 1
    second = asyncio.ensure_future(store.commit("b", history(2)))
    await asyncio.sleep(0.01)
    assert not second.done()  # queued on the loop, under the wait
    assert (await asyncio.wait_for(second, 10)).message_count == 2
    assert f"{path.name}-wal" in synced  # the thread's own fsync, before it wrote
    assert not first.done()
    never[0].set_result(None)
    assert (await asyncio.wait_for(first, 10)).message_count == 2
    store.close()


async def test_a_sync_that_never_returns_holds_up_no_later_write(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The append's fsync is cancelled, or its loop closed before it was reaped: after a
    # moment the writer thread fsyncs the WAL itself (which covers it) and goes on.
    monkeypatch.setattr(sqlite_module, "_INLINE_SYNC_WAIT", 0.01)
    store = await _two_sessions(path)
    never: list[asyncio.Future[None]] = []
    real_start = sqlite_module.start_fsync

    def start_fsync(fd: int, *args: Any, **kwargs: Any) -> asyncio.Future[None]:
        never.append(asyncio.get_running_loop().create_future())
        return never[-1]

    monkeypatch.setattr(sqlite_module, "start_fsync", start_fsync)
    synced = _path_syncs(monkeypatch)
    first = asyncio.ensure_future(store.commit("a", history(2)))
    await _let_the_loop_run()
    assert len(never) == 1
    assert not first.done()
    first.cancel()
    second = await asyncio.wait_for(store.commit("b", history(2)), 10)
    assert second.message_count == 2
    assert f"{path.name}-wal" in synced  # the thread's own fsync, before it wrote
    assert len(never) == 1  # the second went to the thread: no append on the loop
    assert (await store.get("a")).messages == history(2)  # written, unacknowledged
    monkeypatch.setattr(sqlite_module, "start_fsync", real_start)  # syncs return again
    third = await asyncio.wait_for(store.commit("a", history(3)), 10)
    assert third.message_count == 3
    store.close()


def test_flush_syncs_the_wals_directory_entry_once_per_connection(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every flush fsyncs the WAL (on the writer thread, or started on the loop); its
    # directory entry only after the connection that keeps it alive was opened (a WAL
    # is deleted only when its last connection closes).
    synced: list[str] = []
    real_fsync = os.fsync
    real_start = sqlite_module.start_fsync

    def kind(fd: int) -> str:
        return "dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"

    def fsync(fd: int) -> None:
        synced.append(kind(fd))
        real_fsync(fd)

    def start_fsync(fd: int, *args: Any, **kwargs: Any) -> asyncio.Future[None]:
        synced.append(kind(fd))
        return real_start(fd, *args, **kwargs)

    monkeypatch.setattr(sqlite_module, "start_fsync", start_fsync)
    store = SQLiteSessionStore(path, durability="invocation")

    async def turns(count: int) -> None:
        for _ in range(count):
            stored = (await store.get("s")).meta.message_count
            await store.commit("s", history(stored + 1))
            await store.flush("s")

    asyncio.run(store.create("s"))
    monkeypatch.setattr(os, "fsync", fsync)
    asyncio.run(turns(3))
    assert synced.count("dir") == 1
    assert synced.count("file") >= 3  # the WAL, at every flush
    store.close()  # the WAL is folded and deleted: the next connection makes a new one
    synced.clear()
    asyncio.run(turns(2))
    assert synced.count("dir") == 1
    assert asyncio.run(store.get("s")).messages == history(5)
    store.close()


def test_disk_use_stays_near_the_message_bytes(path: Path) -> None:
    store = SQLiteSessionStore(path, durability="none")
    messages = [text("user", f"{i:05d} " + "x" * 360) for i in range(2000)]
    asyncio.run(store.create("s"))
    asyncio.run(store.commit("s", messages))
    store.close()  # checkpoints the WAL into the database and removes it
    raw_bytes = sum(len(json.dumps(m, separators=(",", ":"))) for m in messages)
    wal = Path(f"{path}-wal")
    on_disk = path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)
    assert on_disk < 1.3 * raw_bytes


def test_utc_now_is_datetimes_iso_format_with_z() -> None:
    # Stores stamp sessions with utc_now(), which formats the second only once a
    # second; it must read as datetime's own ISO form would.
    from datetime import UTC, datetime

    from perdure.session.rules import utc_now

    for _ in range(3):
        before = datetime.now(UTC)
        stamp = utc_now()
        after = datetime.now(UTC)
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", stamp)
        assert before <= datetime.fromisoformat(stamp.replace("Z", "+00:00")) <= after
        time.sleep(0.6)  # across a second boundary at least once


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_child_forked_during_a_background_fold_does_not_wait_for_it(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A fold the parent runs in the background is no fold of the child's: a child
    # that waited for it before folding itself would wait for ever.
    release = threading.Event()
    fold_behind = SQLiteSessionStore._fold_behind

    def stuck(self: SQLiteSessionStore) -> None:
        release.wait(30)
        fold_behind(self)

    monkeypatch.setattr(SQLiteSessionStore, "_fold_behind", stuck)
    store = SQLiteSessionStore(path, durability="none")
    store._fold_pages = 4  # a background fold after two appends
    messages = history(2)

    def child() -> None:
        # Another session: the child does not share its parent's hold of "s".
        asyncio.run(store.create("t"))
        for n in range(1, 6):  # past a fold
            asyncio.run(store.commit("t", history(n)))

    async def turn() -> int:
        await store.create("s")
        await store.commit("s", messages)
        async with store.writer_lock("s"):
            for n in range(3, 8):
                messages.append(history(n)[-1])
                await store.commit("s", messages)
            pid = await asyncio.to_thread(fork_child, child)
            return await asyncio.to_thread(exit_code, pid)

    try:
        code = asyncio.run(turn())
    finally:
        release.set()
    assert code == 0, "the child waited for its parent's fold"
    store.close()
    reopened = SQLiteSessionStore(path)
    assert asyncio.run(reopened.get("s")).messages == history(7)
    assert asyncio.run(reopened.get("t")).messages == history(5)
    reopened.close()
