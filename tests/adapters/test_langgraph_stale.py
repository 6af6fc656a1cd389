"""What another process does to a thread never makes a PerdureSaver write a checkpoint
that cannot be read, and a checkpoint whose parent is missing is a typed error.

A long-lived saver remembers which blobs it stored; a thread deleted by another
process (between runs, or while a run goes on) must not leave that saver writing
records that name blobs no longer there. Two real processes on real storages.
"""

from __future__ import annotations

import operator
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any

import pytest
from lg_support import import_langgraph

import_langgraph()

from langchain_core.messages import AIMessage, HumanMessage  # noqa: E402
from langgraph.graph import END, START, MessagesState, StateGraph  # noqa: E402

from perdure.adapters.langgraph import CHUNK_ITEMS, PerdureSaver  # noqa: E402
from perdure.errors import SessionCorruptedError  # noqa: E402
from perdure.storage import MemoryStorage  # noqa: E402

PROMPT = "You are a helpful assistant. " * 40  # larger than INLINE_MAX: its own blob
THREAD: Any = {"configurable": {"thread_id": "t1"}}


class Chat(MessagesState):
    prompt: str
    turns: Annotated[list[int], operator.add]


def chat_graph(on_answer: Any = None) -> StateGraph:
    """A messages graph with a large unchanging value and a list that seals chunks."""

    def answer(state: dict[str, Any]) -> dict[str, Any]:
        if on_answer is not None:
            on_answer()
        # enough messages per turn that the list seals a chunk every run
        replies = [AIMessage(f"answer {len(state['messages'])}.{i}") for i in range(CHUNK_ITEMS)]
        return {"messages": replies, "prompt": PROMPT, "turns": [len(state["turns"])]}

    graph = StateGraph(Chat)
    graph.add_node("model", answer)
    graph.add_edge(START, "model")
    graph.add_edge("model", END)
    return graph


def delete_in_another_process(url: str, thread_id: str = "t1") -> None:
    code = (
        "import sys\n"
        "from perdure.adapters.langgraph import PerdureSaver\n"
        "with PerdureSaver(sys.argv[1]) as saver:\n"
        "    saver.delete_thread(sys.argv[2])\n"
    )
    subprocess.run([sys.executable, "-c", code, url, thread_id], check=True, timeout=120)


def read_in_another_process(url: str) -> str:
    """What a fresh process reads of thread t1: ``none``, ``ok N`` or the error."""
    code = (
        "import sys\n"
        "from perdure.adapters.langgraph import PerdureSaver\n"
        "cfg = {'configurable': {'thread_id': 't1'}}\n"
        "with PerdureSaver(sys.argv[1]) as saver:\n"
        "    try:\n"
        "        found = saver.get_tuple(cfg)\n"
        "        history = list(saver.list(cfg))\n"
        "    except Exception as exc:\n"
        "        print(type(exc).__name__, exc)\n"
        "    else:\n"
        "        print('none' if found is None else\n"
        "              f\"ok {len(found.checkpoint['channel_values']['messages'])}\"\n"
        "              f' {len(history)}')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, url], check=True, timeout=120, capture_output=True, text=True
    )
    return done.stdout.strip()


@pytest.fixture(params=["file", "sqlite"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return (
        f"file:{tmp_path / 'blobs'}" if request.param == "file" else f"sqlite:{tmp_path / 'g.db'}"
    )


def test_a_thread_deleted_by_another_process_is_written_whole_again(url: str) -> None:
    with PerdureSaver(url) as saver:  # a long-lived worker
        graph = chat_graph().compile(checkpointer=saver)
        graph.invoke({"messages": [HumanMessage("hello")], "turns": []}, THREAD)
        delete_in_another_process(url)
        assert read_in_another_process(url) == "none"
        # the same values again: every blob and chunk the worker remembers is gone
        graph.invoke({"messages": [HumanMessage("hello")], "turns": []}, THREAD)
        graph.invoke({"messages": [HumanMessage("again")], "turns": []}, THREAD)
    assert read_in_another_process(url) == f"ok {2 * (1 + CHUNK_ITEMS)} 6"
    with PerdureSaver(url) as fresh:
        state = chat_graph().compile(checkpointer=fresh).get_state(THREAD)
        assert state.values["prompt"] == PROMPT
        assert state.values["turns"] == [0, 1]


def test_a_thread_deleted_by_another_process_during_a_run_stays_readable(url: str) -> None:
    deleted: list[bool] = []

    def delete_once() -> None:
        if len(deleted) == 1:  # in the second run, while the worker is in the node
            delete_in_another_process(url)
        deleted.append(True)

    with PerdureSaver(url) as saver:
        graph = chat_graph(delete_once).compile(checkpointer=saver)
        graph.invoke({"messages": [HumanMessage("one")], "turns": []}, THREAD)
        graph.invoke({"messages": [HumanMessage("two")], "turns": []}, THREAD)
        # whatever of the second run survives the delete, every reader can read it
        seen = read_in_another_process(url)
        assert seen == "none" or seen.startswith("ok "), seen
        graph.invoke({"messages": [HumanMessage("three")], "turns": []}, THREAD)
    seen = read_in_another_process(url)
    assert seen.startswith("ok "), seen
    with PerdureSaver(url) as fresh:
        state = chat_graph().compile(checkpointer=fresh).get_state(THREAD)
        assert state.values["prompt"] == PROMPT
        assert state.values["messages"][-1].content.startswith("answer")


# ------------------------------------------------------------- a checkpoint's parent


def simple_graph() -> StateGraph:
    def answer(state: dict[str, Any]) -> dict[str, Any]:
        return {"messages": [AIMessage(f"answer {len(state['messages'])}")]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", answer)
    graph.add_edge(START, "model")
    graph.add_edge("model", END)
    return graph


async def history_of(storage: MemoryStorage, turns: int) -> tuple[PerdureSaver, list[Any]]:
    saver = PerdureSaver(storage)
    graph = simple_graph().compile(checkpointer=saver)
    for n in range(turns):
        await graph.ainvoke(
            {"messages": [HumanMessage(f"q{n}")]},
            {"configurable": {"thread_id": "t1", "run_id": f"run-{n}"}},
        )
    return saver, [t async for t in saver.alist(THREAD)]


async def test_a_missing_middle_checkpoint_is_a_typed_error_not_a_shorter_history() -> None:
    storage = MemoryStorage()
    _, history = await history_of(storage, 2)
    victim, child = history[2], history[1]
    record = next(
        k
        for k in await storage.list("langgraph/")
        if "/c/" in k and k.endswith(victim.config["configurable"]["checkpoint_id"])
    )
    await storage.delete(record)
    fresh = PerdureSaver(storage)
    with pytest.raises(SessionCorruptedError) as caught:
        [t async for t in fresh.alist(THREAD)]
    assert caught.value.code == "session_store_corrupted"
    details = caught.value.details
    assert details["thread_id"] == "t1"
    assert details["checkpoint_id"] == child.config["configurable"]["checkpoint_id"]
    assert details["parent"] == victim.config["configurable"]["checkpoint_id"]
    with pytest.raises(SessionCorruptedError):  # the child itself, by its id
        await fresh.aget_tuple(child.config)
    assert (await fresh.aget_tuple(THREAD)) is not None  # the newest's parent is there


async def test_checkpoints_deleted_on_purpose_leave_a_readable_history() -> None:
    storage = MemoryStorage()
    saver, history = await history_of(storage, 3)
    await saver.adelete_for_runs(["run-1"])
    left = [t async for t in PerdureSaver(storage).alist(THREAD)]
    assert 0 < len(left) < len(history)
    assert {t.metadata.get("run_id") for t in left} == {"run-0", "run-2"}
    await saver.aprune(["t1"], strategy="keep_latest")
    fresh = PerdureSaver(storage)
    assert [t.config async for t in fresh.alist(THREAD)] == [history[0].config]
    newest = await fresh.aget_tuple(THREAD)
    assert newest is not None
    assert newest.parent_config == history[0].parent_config
    await saver.adelete_thread("t1")
    assert await storage.list("langgraph/") == []
    assert [t async for t in fresh.alist(THREAD)] == []


async def test_a_listing_racing_a_delete_thread_ends_without_an_error() -> None:
    storage = MemoryStorage()
    saver, history = await history_of(storage, 2)
    listing = PerdureSaver(storage).alist(THREAD)
    first = await anext(listing)
    assert first.config == history[0].config
    # what delete_thread has done part-way: the generation ended, some records gone
    marker = next(k for k in await storage.list("langgraph/") if k.endswith("/g"))
    await storage.delete(marker)
    parent = history[1].parent_config["configurable"]["checkpoint_id"]  # type: ignore[index]
    record = next(k for k in await storage.list("langgraph/") if k.endswith(parent))
    await storage.delete(record)
    rest = [t.config async for t in listing]  # what was read before the delete, no error
    assert rest == [t.config for t in history[1 : 1 + len(rest)]]
    assert len(rest) < len(history) - 2
    assert await saver.aget_tuple(THREAD) is None
