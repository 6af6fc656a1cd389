"""MemorySessionStore: the persistent stores' semantics, in memory."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perdure.errors import SessionConflictError, SessionLockedError, SessionNotFoundError
from perdure.session.store import SupportsFlush, SupportsHistoryPage
from perdure.stores.memory import MemorySessionStore
from perdure.types import Message


def text(role: str, value: str) -> Message:
    return {"role": role, "content": [{"text": value}]}  # type: ignore[typeddict-item]


def history(n: int, prefix: str = "m") -> list[Message]:
    return [text("user" if i % 2 == 0 else "assistant", f"{prefix}{i}") for i in range(n)]


def call(tool_id: str) -> Message:
    return {
        "role": "assistant",
        "content": [{"toolUse": {"toolUseId": tool_id, "name": "f", "input": {}}}],
    }


def result(tool_id: str) -> Message:
    return {
        "role": "user",
        "content": [{"toolResult": {"toolUseId": tool_id, "status": "success", "content": []}}],
    }


@pytest.fixture
def memory_store() -> MemorySessionStore:
    return MemorySessionStore()


async def test_create_get_list_delete(memory_store: MemorySessionStore) -> None:
    meta = await memory_store.create("b")
    assert (meta.session_id, meta.message_count) == ("b", 0)
    assert meta.created_at.endswith("Z")
    with pytest.raises(SessionConflictError):
        await memory_store.create("b")
    await memory_store.create("a")
    await memory_store.commit("b", history(2))
    assert (await memory_store.create("b", exist_ok=True)).message_count == 2
    record = await memory_store.get("b")
    assert (record.messages, record.agent_state, record.offset) == (history(2), {}, 0)
    assert [m.session_id for m in await memory_store.list()] == ["a", "b"]
    assert [m.session_id for m in await memory_store.list(after="a")] == ["b"]
    assert [m.session_id for m in await memory_store.list(limit=1)] == ["a"]
    with pytest.raises(ValueError, match="limit"):
        await memory_store.list(limit=-1)
    await memory_store.delete("b")
    await memory_store.delete("b")
    with pytest.raises(SessionNotFoundError) as info:
        await memory_store.get("b")
    assert info.value.code == "session_not_found"
    with pytest.raises(SessionNotFoundError):
        await memory_store.commit("b", [])
    with pytest.raises(SessionNotFoundError):
        await memory_store.history_page("b", 0, 1)
    assert isinstance(memory_store, SupportsHistoryPage)
    assert not isinstance(memory_store, SupportsFlush)


@pytest.mark.parametrize("bad", ["", ".", "..", "a/b", "a\\b"])
async def test_bad_ids(memory_store: MemorySessionStore, bad: str) -> None:
    for attempt in (memory_store.create(bad), memory_store.get(bad), memory_store.delete(bad)):
        with pytest.raises(ValueError, match="session_id"):
            await attempt
    with pytest.raises(ValueError, match="session_id"):
        memory_store.writer_lock(bad)


async def test_commit_semantics(memory_store: MemorySessionStore) -> None:
    await memory_store.create("s")
    first = await memory_store.commit("s", history(2), agent_state={"k": b"\x00"})
    assert first.message_count == 2
    assert (await memory_store.commit("s", history(2))).tail == first.tail  # nothing written
    second = await memory_store.commit("s", history(4), expected_tail=first.tail)
    assert second.tail != first.tail
    with pytest.raises(SessionConflictError) as info:
        await memory_store.commit("s", history(5), expected_tail=first.tail)
    assert info.value.details["stored_tail"] == second.tail
    with pytest.raises(SessionConflictError, match="rewritten=True"):
        await memory_store.commit("s", history(3))
    record = await memory_store.get("s", offset=3)
    assert (record.messages, record.offset, record.message_count) == (history(4)[3:], 3, 4)
    assert record.agent_state == {"k": b"\x00"}
    assert record.tail == second.tail
    past = await memory_store.get("s", offset=10)
    assert (past.messages, past.offset) == ([], 4)


async def test_redactions_and_rewrites(memory_store: MemorySessionStore) -> None:
    await memory_store.create("s")
    await memory_store.commit("s", history(3), redactions={1: text("assistant", "[r]")})
    assert (await memory_store.get("s")).messages[1] == text("assistant", "[r]")
    assert (await memory_store.history_page("s", 1, 1)).messages == [text("assistant", "[r]")]
    with pytest.raises(ValueError, match="redaction index"):
        await memory_store.commit("s", history(3), redactions={3: text("user", "x")})
    await memory_store.commit("s", [text("user", "summary")], rewritten=True)
    record = await memory_store.get("s")
    assert record.messages == [text("user", "summary")]  # redactions went with the history


async def test_a_failing_commit_changes_nothing(memory_store: MemorySessionStore) -> None:
    await memory_store.create("s")
    await memory_store.commit("s", history(4), agent_state={"k": 1})
    before = await memory_store.get("s")
    unstorable: Any = {"role": "user", "content": [{"json": {1, 2}}]}
    for attempt in (
        memory_store.commit("s", [*history(6), unstorable], rewritten=True, agent_state={}),
        memory_store.commit("s", [*history(5), unstorable]),
        memory_store.commit("s", [*history(5), text("system", "x")]),
        memory_store.commit("s", history(4), agent_state={"x": object()}),
    ):
        with pytest.raises(ValueError):
            await attempt
    after = await memory_store.get("s")
    assert (after.messages, after.agent_state, after.tail) == (
        before.messages,
        before.agent_state,
        before.tail,
    )


async def test_copies_in_and_out(memory_store: MemorySessionStore) -> None:
    await memory_store.create("s")
    messages = [text("user", "hello")]
    state: dict[str, Any] = {"list": [1]}
    await memory_store.commit("s", messages, agent_state=state)
    messages[0]["content"].append({"text": "changed after commit"})
    state["list"].append(2)
    record = await memory_store.get("s")
    record.messages[0]["content"].clear()
    record.agent_state["list"].append(3)
    again = await memory_store.get("s")
    assert again.messages == [text("user", "hello")]
    assert again.agent_state == {"list": [1]}


async def test_pages_are_pair_aligned(memory_store: MemorySessionStore) -> None:
    messages = [text("user", "q"), call("t"), result("t"), text("assistant", "a")]
    await memory_store.create("s")
    await memory_store.commit("s", messages)
    page = await memory_store.history_page("s", 2, 1)
    assert (page.offset, page.next_offset, page.messages) == (1, 3, messages[1:3])
    page = await memory_store.history_page("s", 0, 2)
    assert (page.offset, page.next_offset, page.total) == (0, 3, 4)


async def test_writer_lock_within_the_process(memory_store: MemorySessionStore) -> None:
    await memory_store.create("s")
    async with memory_store.writer_lock("s"):
        await memory_store.commit("s", history(1))  # the holder's own commits go through
        errors: list[BaseException] = []

        def other_writer() -> None:
            try:
                asyncio.run(memory_store.writer_lock("s").__aenter__())
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=other_writer)
        thread.start()
        thread.join(timeout=10)
        assert len(errors) == 1
        assert isinstance(errors[0], SessionLockedError)
    async with memory_store.writer_lock("s"):
        pass


def test_any_loop_any_thread(memory_store: MemorySessionStore) -> None:
    asyncio.run(memory_store.create("s"))
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            asyncio.run(memory_store.create(f"w{n}"))
            for i in range(1, 20):
                asyncio.run(memory_store.commit(f"w{n}", history(i)))
                assert asyncio.run(memory_store.list())[0].session_id == "s"
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert errors == []
    assert [m.message_count for m in asyncio.run(memory_store.list())] == [0, 19, 19, 19, 19]


blocks = st.one_of(
    st.builds(lambda s: {"text": s}, st.text(max_size=20)),
    st.builds(
        lambda b: {"image": {"format": "png", "source": {"bytes": b}}}, st.binary(max_size=20)
    ),
)
messages_strategy = st.lists(
    st.builds(
        lambda role, content: {"role": role, "content": content},
        st.sampled_from(["user", "assistant"]),
        st.lists(blocks, max_size=3),
    ),
    max_size=15,
)


@settings(max_examples=50, deadline=None)
@given(messages=messages_strategy, split=st.integers(0, 15))
def test_random_histories_round_trip(messages: list[Message], split: int) -> None:
    store = MemorySessionStore()

    async def run() -> None:
        await store.create("h")
        await store.commit("h", messages[:split])
        await store.commit("h", messages)
        assert (await store.get("h")).messages == messages

    asyncio.run(run())
