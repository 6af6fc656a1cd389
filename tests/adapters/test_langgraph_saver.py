"""PerdureSaver under real LangGraph graphs, and what perdure adds to a checkpointer.

A ``StateGraph(MessagesState)`` runs through ``invoke`` and ``ainvoke`` and resumes in
a new saver over the same storage; the storage grows by the new messages, not by the
whole history each step; damage of any stored blob is a typed error; ``prune``
collects the blobs nothing names; two writers of one task's writes both land.
"""

from __future__ import annotations

import asyncio
import operator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from lg_support import import_langgraph

import_langgraph()

from langchain_core.messages import AIMessage, HumanMessage  # noqa: E402
from langgraph.checkpoint.serde.types import ERROR, INTERRUPT  # noqa: E402
from langgraph.graph import END, START, MessagesState, StateGraph  # noqa: E402

from perdure.adapters.langgraph import CHUNK_ITEMS, PerdureSaver  # noqa: E402
from perdure.errors import SessionCorruptedError  # noqa: E402
from perdure.storage import MemoryStorage  # noqa: E402


def builder(is_async: bool = False) -> StateGraph:
    graph = StateGraph(MessagesState)
    if is_async:

        async def answer_async(state: dict[str, Any]) -> dict[str, Any]:
            return {"messages": [AIMessage(f"answer {len(state['messages'])}")]}

        graph.add_node("model", answer_async)
    else:

        def answer(state: dict[str, Any]) -> dict[str, Any]:
            return {"messages": [AIMessage(f"answer {len(state['messages'])}")]}

        graph.add_node("model", answer)
    graph.add_edge(START, "model")
    graph.add_edge("model", END)
    return graph


CONFIG: Any = {"configurable": {"thread_id": "user-42"}}


def test_a_sync_graph_resumes_in_a_new_saver(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'graphs.db'}"
    with PerdureSaver(url) as saver:
        graph = builder().compile(checkpointer=saver)
        for n in range(3):
            graph.invoke({"messages": [HumanMessage(f"question {n}")]}, CONFIG)
        before = graph.get_state(CONFIG).values["messages"]
        history = list(graph.get_state_history(CONFIG))
    assert [m.content for m in before] == [
        text for n in range(3) for text in (f"question {n}", f"answer {2 * n + 1}")
    ]
    with PerdureSaver(url) as again:
        graph = builder().compile(checkpointer=again)
        assert graph.get_state(CONFIG).values["messages"] == before
        assert [s.config for s in graph.get_state_history(CONFIG)] == [s.config for s in history]
        graph.invoke({"messages": [HumanMessage("one more")]}, CONFIG)
        assert len(graph.get_state(CONFIG).values["messages"]) == 8


async def test_an_async_graph_on_a_file_storage(tmp_path: Path) -> None:
    saver = PerdureSaver(f"file:{tmp_path / 'blobs'}")
    graph = builder(is_async=True).compile(checkpointer=saver)
    for n in range(2):
        await graph.ainvoke({"messages": [HumanMessage(f"q{n}")]}, CONFIG)
    state = await graph.aget_state(CONFIG)
    assert [m.content for m in state.values["messages"]] == ["q0", "answer 1", "q1", "answer 3"]
    # the older checkpoints keep what they had
    states = [s async for s in graph.aget_state_history(CONFIG)]
    assert [len(s.values.get("messages", [])) for s in states] == [4, 3, 2, 2, 1, 0]


async def stored_bytes(storage: MemoryStorage) -> int:
    total = 0
    for key in await storage.list(""):
        total += len(await storage.read(key) or b"")
    return total


async def test_storage_grows_with_new_messages_not_with_the_history() -> None:
    storage = MemoryStorage()
    saver = PerdureSaver(storage)
    graph = builder(is_async=True).compile(checkpointer=saver)
    turns = 100  # 200 messages, 300 checkpoints
    for n in range(turns):
        await graph.ainvoke({"messages": [HumanMessage(f"question {n} " * 20)]}, CONFIG)
    final = (await graph.aget_state(CONFIG)).values["messages"]
    assert len(final) == 2 * turns
    # what storing the whole state at every checkpoint (SqliteSaver) would take
    whole = 0
    async for state in graph.aget_state_history(CONFIG):
        whole += len(saver.serde.dumps_typed(state.values.get("messages", []))[1])
    total = await stored_bytes(storage)
    assert total * 5 < whole, (total, whole)
    # and a checkpoint's record stays small however long the history gets
    per_message = len(saver.serde.dumps_typed(final)[1]) / len(final)
    records = [k for k in await storage.list("langgraph/") if "/c/" in k]
    sizes = [len(await storage.read(k) or b"") for k in records]
    assert max(sizes) < CHUNK_ITEMS * per_message + 4096


async def damaged(storage: MemoryStorage, key: str) -> None:
    blob = bytearray(await storage.read(key) or b"")
    blob[-1] ^= 0x01
    await storage.write(key, bytes(blob))


async def filled(
    turns: int = 20, storage: MemoryStorage | None = None
) -> tuple[MemoryStorage, PerdureSaver]:
    storage = storage or MemoryStorage()
    saver = PerdureSaver(storage)
    graph = builder(is_async=True).compile(checkpointer=saver)
    for n in range(turns):
        await graph.ainvoke({"messages": [HumanMessage(f"q{n}")]}, CONFIG)
    return storage, saver


@pytest.mark.parametrize("part", ["c", "b"])
async def test_a_damaged_record_or_blob_is_a_typed_error(part: str) -> None:
    storage, _ = await filled()
    keys = [k for k in await storage.list("langgraph/") if f"/{part}/" in k]
    newest = max(keys) if part == "c" else keys[0]
    await damaged(storage, newest)
    fresh = PerdureSaver(storage)  # no cache of what was read before
    with pytest.raises(SessionCorruptedError) as caught:
        await fresh.aget_tuple(CONFIG) if part == "c" else [t async for t in fresh.alist(CONFIG)]
    assert caught.value.code == "session_store_corrupted"
    assert caught.value.details["key"] == newest


async def test_a_missing_chunk_is_a_typed_error_not_a_shorter_history() -> None:
    storage, _ = await filled(turns=CHUNK_ITEMS)
    chunks = [k for k in await storage.list("langgraph/") if "/b/" in k]
    assert chunks
    await storage.delete(chunks[0])
    with pytest.raises(SessionCorruptedError, match="is missing"):
        await PerdureSaver(storage).aget_tuple(CONFIG)


async def test_damaged_writes_are_a_typed_error() -> None:
    storage, saver = await filled(turns=1)
    stored = await saver.aget_tuple(CONFIG)
    assert stored is not None
    await saver.aput_writes(stored.config, [("messages", [AIMessage("late")])], "task-1")
    key = next(k for k in await storage.list("langgraph/") if k.endswith("/_task-1"))
    await damaged(storage, key)
    with pytest.raises(SessionCorruptedError):
        await saver.aget_tuple(CONFIG)


async def test_prune_collects_the_blobs_no_record_names() -> None:
    storage, saver = await filled(turns=CHUNK_ITEMS)
    before = (await saver.aget_tuple(CONFIG)).checkpoint  # type: ignore[union-attr]
    blobs = [k for k in await storage.list("langgraph/") if "/b/" in k]
    await saver.aprune(["user-42"])
    after = await PerdureSaver(storage).aget_tuple(CONFIG)
    assert after is not None
    assert after.checkpoint == before
    left = [k for k in await storage.list("langgraph/") if "/b/" in k]
    assert set(left) <= set(blobs)
    assert len(left) == len(before["channel_values"]["messages"]) // CHUNK_ITEMS
    await saver.adelete_thread("user-42")
    assert await storage.list("langgraph/") == []


class SlowReads(MemoryStorage):
    """Every read hands the loop to others before it returns: two writers that read,
    merge and write interleave (both read before either writes)."""

    async def read(self, key: str) -> bytes | None:
        found = await super().read(key)
        await asyncio.sleep(0.01)
        return found


async def test_two_writers_of_one_task_both_land() -> None:
    storage, _ = await filled(turns=1, storage=SlowReads())
    first, second = PerdureSaver(storage), PerdureSaver(storage)
    stored = await first.aget_tuple(CONFIG)
    assert stored is not None
    for n in range(5):
        await first.aput_writes(stored.config, [(INTERRUPT, "first")], f"task{n}")
        await asyncio.gather(
            first.aput_writes(stored.config, [("messages", "regular")], f"task{n}"),
            second.aput_writes(stored.config, [(ERROR, "boom")], f"task{n}"),
        )
    again = await first.aget_tuple(stored.config)
    assert again is not None
    assert sorted(w for w in again.pending_writes or []) == sorted(
        (f"task{n}", channel, value)
        for n in range(5)
        for channel, value in ((INTERRUPT, "first"), ("messages", "regular"), (ERROR, "boom"))
    )


def test_bad_arguments_are_named() -> None:
    with pytest.raises(TypeError, match="url_or_store"):
        PerdureSaver(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="prefix"):
        PerdureSaver("memory:", prefix="/bad")
    saver = PerdureSaver("memory:")
    with pytest.raises(ValueError, match="thread_id"):
        saver.get_tuple({"configurable": {}})
    with pytest.raises(ValueError, match="strategy"):
        saver.prune(["t"], strategy="oldest")
    with pytest.raises(TypeError, match="thread_ids"):
        saver.prune("t")
    with pytest.raises(ValueError, match="checkpoint_id"):
        saver.put_writes({"configurable": {"thread_id": "t"}}, [("a", 1)], "task")


async def test_an_item_changed_in_place_is_stored_as_it_is_now() -> None:
    """Unchanged items are not serialised again, but one changed in place is."""
    saver = PerdureSaver(MemoryStorage())
    message = HumanMessage("before")
    note: dict[str, Any] = {"n": 1}
    history: list[Any] = [message, note]
    config: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    for step in range(3):
        checkpoint: Any = {
            "v": 1,
            "id": f"0000000{step}",
            "ts": "2026-01-01T00:00:00+00:00",
            "channel_values": {"messages": list(history)},
            "channel_versions": {"messages": saver.get_next_version(None, None)},
            "versions_seen": {},
            "pending_sends": [],
            "updated_channels": None,
        }
        config = await saver.aput(
            config, checkpoint, {"step": step}, dict(checkpoint["channel_versions"])
        )
        message.content = f"changed {step}"
        note["n"] += 1
    first = await saver.aget_tuple(
        {"configurable": {**config["configurable"], "checkpoint_id": "00000000"}}
    )
    last = await saver.aget_tuple(config)
    assert first is not None
    assert last is not None
    assert [
        m if isinstance(m, dict) else m.content
        for m in first.checkpoint["channel_values"]["messages"]
    ] == ["before", {"n": 1}]
    assert [
        m if isinstance(m, dict) else m.content
        for m in last.checkpoint["channel_values"]["messages"]
    ] == ["changed 1", {"n": 3}]


WRITER = """
import asyncio, sys
from langgraph.checkpoint.serde.types import ERROR, INTERRUPT
from perdure.adapters.langgraph import PerdureSaver

url, me, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
channel = ERROR if me == "a" else INTERRUPT


async def main() -> None:
    saver = PerdureSaver(url)
    config = {"configurable": {"thread_id": "shared", "checkpoint_ns": "", "checkpoint_id": "0"}}
    for n in range(rounds):
        await saver.aput_writes(config, [(channel, f"{me}{n}")], "task")
        checkpoint = {
            "v": 1, "id": f"1-{me}-{n:04}", "ts": "2026-01-01T00:00:00+00:00",
            "channel_values": {"messages": [f"{me}{i}" for i in range(n + 1)]},
            "channel_versions": {"messages": f"{n + 1}"}, "versions_seen": {},
            "updated_channels": None,
        }
        parent = {"configurable": {"thread_id": "shared", "checkpoint_ns": ""}}
        await saver.aput(parent, checkpoint, {"writer": me}, {"messages": f"{n + 1}"})
    saver.close()


asyncio.run(main())
"""


def test_two_processes_write_one_thread_and_nothing_is_lost(tmp_path: Path) -> None:
    """Two processes put checkpoints on one thread and writes for one task at once:
    every checkpoint is there, whole, and each writer's last special write too."""
    import os
    import subprocess
    import sys

    url = f"sqlite:{tmp_path / 'shared.db'}"
    root: Any = {"configurable": {"thread_id": "shared", "checkpoint_ns": ""}}
    with PerdureSaver(url) as saver:
        first: Any = {
            "v": 1, "id": "0", "ts": "2026-01-01T00:00:00+00:00", "channel_values": {},
            "channel_versions": {}, "versions_seen": {}, "updated_channels": None,
        }  # fmt: skip
        saver.put(root, first, {"writer": "test"}, {})
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": src}
    rounds = 40
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, url, me, str(rounds)], env=env)
        for me in ("a", "b")
    ]
    assert [w.wait(timeout=120) for w in writers] == [0, 0]
    with PerdureSaver(url) as saver:
        listed = list(saver.list({"configurable": {"thread_id": "shared"}}))
        assert len(listed) == 2 * rounds + 1
        for item in listed[:-1]:
            me, n = item.metadata["writer"], int(item.checkpoint["id"].rsplit("-", 1)[1])
            assert item.checkpoint["channel_values"]["messages"] == [
                f"{me}{i}" for i in range(n + 1)
            ]
        task = saver.get_tuple({"configurable": {**root["configurable"], "checkpoint_id": "0"}})
    assert task is not None
    assert sorted(task.pending_writes or []) == sorted(
        [("task", ERROR, f"a{rounds - 1}"), ("task", INTERRUPT, f"b{rounds - 1}")]
    )


async def test_a_copy_into_a_thread_replaces_what_the_saver_remembered_of_it() -> None:
    saver = PerdureSaver(MemoryStorage())

    def checkpoint(checkpoint_id: str, value: str) -> Any:
        return {
            "v": 1, "id": checkpoint_id, "ts": "2026-01-01T00:00:00+00:00",
            "channel_values": {"a": value}, "channel_versions": {"a": "1"},
            "versions_seen": {}, "updated_channels": None,
        }  # fmt: skip

    for thread, value in (("dst", "old"), ("src", "new")):
        config: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
        await saver.aput(config, checkpoint("1", value), {}, {"a": "1"})
    await saver.acopy_thread("src", "dst")
    parent: Any = {"configurable": {"thread_id": "dst", "checkpoint_ns": "", "checkpoint_id": "1"}}
    stored = await saver.aput(parent, checkpoint("2", "new"), {}, {})  # "a" unchanged
    found = await saver.aget_tuple(stored)
    assert found is not None
    assert found.checkpoint["channel_values"] == {"a": "new"}


def test_an_interrupt_in_a_subgraph_resumes_from_a_new_saver(tmp_path: Path) -> None:

    from langgraph.types import Command, interrupt

    class State(TypedDict):
        text: str

    def ask(state: State) -> State:
        return {"text": state["text"] + " / " + interrupt("approve?")}

    inner = StateGraph(State)
    inner.add_node("ask", ask)
    inner.add_edge(START, "ask")
    inner.add_edge("ask", END)
    outer = StateGraph(State)
    outer.add_node("inner", inner.compile())
    outer.add_edge(START, "inner")
    outer.add_edge("inner", END)
    url = f"file:{tmp_path / 'blobs'}"
    config: Any = {"configurable": {"thread_id": "review"}}
    with PerdureSaver(url) as saver:
        first = outer.compile(checkpointer=saver).invoke({"text": "draft"}, config)
        assert first["__interrupt__"][0].value == "approve?"
        namespaces = {t.config["configurable"]["checkpoint_ns"] for t in saver.list(config)}
        assert any(ns.startswith("inner:") for ns in namespaces)  # the subgraph's own
    with PerdureSaver(url) as saver:  # a new process, say
        graph = outer.compile(checkpointer=saver)
        assert graph.get_state(config).next == ("inner",)
        done = graph.invoke(Command(resume="yes"), config)
    assert done == {"text": "draft / yes"}


async def test_lists_of_any_length_read_back_exactly_from_few_blobs() -> None:
    from perdure.adapters.langgraph import BIG_CHUNK_ITEMS

    storage = MemoryStorage()
    saver = PerdureSaver(storage)
    config: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    items = [{"i": i, "text": f"item {i}"} for i in range(700)]
    lengths = [250, 255, 256, 257, 271, 600, 3, 700]  # grows, crosses the seals, shrinks
    stored = []
    for step, length in enumerate(lengths):
        value = items[:length] if length != 3 else [{"i": -1}, *items[1:3]]  # not a prefix
        checkpoint: Any = {
            "v": 1, "id": f"{step:08}", "ts": "2026-01-01T00:00:00+00:00",
            "channel_values": {"messages": value},
            "channel_versions": {"messages": f"{step + 1}"},
            "versions_seen": {}, "updated_channels": None,
        }  # fmt: skip
        config = await saver.aput(config, checkpoint, {}, {"messages": f"{step + 1}"})
        stored.append((dict(config["configurable"]), value))
    fresh = PerdureSaver(storage)  # nothing cached: every blob read and checked
    for configurable, value in stored:
        found = await fresh.aget_tuple({"configurable": configurable})
        assert found is not None
        assert found.checkpoint["channel_values"]["messages"] == value
    blob_reads: list[str] = []
    read = storage.read

    async def counted(key: str) -> bytes | None:
        if "/b/" in key:
            blob_reads.append(key)
        return await read(key)

    storage.read = counted  # type: ignore[method-assign]
    last = await PerdureSaver(storage).aget_tuple({"configurable": stored[-1][0]})
    assert last is not None
    assert last.checkpoint["channel_values"]["messages"] == items
    # 700 items: 2 big chunks of 256 and 11 chunks of 16 (and a tail of 12 in the record)
    assert len(blob_reads) == 700 // BIG_CHUNK_ITEMS + (700 % BIG_CHUNK_ITEMS) // CHUNK_ITEMS
    assert len(blob_reads) == 13


def test_parallel_branches_of_a_sync_graph_write_at_once(tmp_path: Path) -> None:
    """Three nodes of one super-step run in LangGraph's threads and save their writes
    at the same time; an interrupted run resumes with every branch's result."""

    class State(TypedDict):
        done: Annotated[list[str], operator.add]

    def branch(name: str) -> Any:
        def run(state: State) -> State:
            return {"done": [name]}

        return run

    def gate(state: State) -> State:
        from langgraph.types import interrupt

        return {"done": [str(interrupt("go?"))]}

    builder = StateGraph(State)
    for name in ("a", "b", "c"):
        builder.add_node(name, branch(name))
        builder.add_edge(START, name)
        builder.add_edge(name, "gate")
    builder.add_node("gate", gate)
    builder.add_edge("gate", END)
    url = f"sqlite:{tmp_path / 'graphs.db'}"
    config: Any = {"configurable": {"thread_id": "fan"}}
    with PerdureSaver(url) as saver:
        builder.compile(checkpointer=saver).invoke({"done": []}, config)
    with PerdureSaver(url) as saver:
        from langgraph.types import Command

        result = builder.compile(checkpointer=saver).invoke(Command(resume="yes"), config)
    assert sorted(result["done"]) == ["a", "b", "c", "yes"]
