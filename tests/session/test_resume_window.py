"""Resume reads only what the conversation manager keeps (SPEC §7.1, issue 14 item 10).

Damage in old data that the window does not reach proves the window read never
touched it: the resume succeeds, while ``verify_store`` (which reads everything)
reports it. What a window read does return must equal the old full read + trim.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from session_stores import make_store

from helpers import assert_model_valid, tool_call
from perdure import Agent, NullConversationManager, SlidingWindowConversationManager, tool
from perdure.agent.conversation import repair_tool_pairs
from perdure.errors import SessionCorruptedError
from perdure.models import ScriptedModel
from perdure.session import (
    FileSessionStore,
    Segmentation,
    Session,
    SessionStore,
    read_history_page,
    verify_store,
)
from perdure.types import Message

TURNS = 24  # four messages each (prompt, tool call, tool result, answer)


@tool
def lookup(key: str) -> str:
    """Look a key up.

    Args:
        key: the key.
    """
    return key.upper()


def script(turns: int, first: int = 0) -> list[Any]:
    steps: list[Any] = []
    for i in range(first, first + turns):
        steps += [tool_call(f"t{i}", "lookup", key=f"k{i}"), f"answer {i}"]
    return steps


def agent_on(session: Session, steps: list[Any], manager: Any = None) -> Agent:
    return Agent(
        model=ScriptedModel(steps),
        tools=[lookup],
        session_manager=session,
        conversation_manager=manager or SlidingWindowConversationManager(window_size=6),
    )


def run_turns(store: SessionStore, session_id: str = "s", manager: Any = None) -> Agent:
    """A session of TURNS turns written by a real agent (state synced every turn)."""
    agent = agent_on(Session(store, session_id), script(TURNS), manager)
    for i in range(TURNS):
        agent(f"question {i}")
        agent.state.set("turn", i)
        agent.model_state["cursor"] = f"c{i}"
    asyncio.run(agent.session_manager.save())  # type: ignore[union-attr]
    return agent


def text(role: str, value: str) -> Message:
    return {"role": role, "content": [{"text": value}]}  # type: ignore[typeddict-item]


def manager_state(removed: int) -> dict[str, Any]:
    """The agent state a Session stores for a sliding window that removed ``removed``."""
    return {
        "format": "perdure-agent-state/1",
        "agent_id": "default",
        "state": {},
        "internal_state": {"interrupt_state": {}, "model_state": {}},
        "conversation_manager_state": {
            "__name__": "SlidingWindowConversationManager",
            "removed_message_count": removed,
        },
    }


def damage_old_data(store: SessionStore, kind: str, tmp_path: Path) -> None:
    """Change one early message where the window read never looks."""
    if kind == "file":
        assert isinstance(store, FileSessionStore)
        first = store.session_dir("s") / "segments" / "000001.jsonl"
        data = first.read_bytes()
        assert b"question 1" in data
        first.write_bytes(data.replace(b"question 1", b"question X", 1))
    else:
        conn = sqlite3.connect(tmp_path / "sessions.db", isolation_level=None)
        try:
            (sid,) = conn.execute("SELECT sid FROM perdure_sessions WHERE id = 's'").fetchone()
            changed = conn.execute(
                "UPDATE perdure_messages SET body = replace(body, 'question 1', 'question X') "
                "WHERE key = ?",
                ((sid << 32) + 4,),
            ).rowcount
            assert changed == 1
        finally:
            conn.close()


def open_store(kind: str, tmp_path: Path) -> SessionStore:
    if kind == "file":  # small segments, so old messages sit in sealed files
        return make_store(kind, tmp_path, segmentation=Segmentation(max_records=20))
    return make_store(kind, tmp_path)


@pytest.mark.parametrize("kind", ["file", "sqlite"])
def test_resume_does_not_read_what_the_window_dropped(kind: str, tmp_path: Path) -> None:
    store = open_store(kind, tmp_path)
    original = run_turns(store)
    assert original.conversation_manager.removed_message_count > 60
    damage_old_data(store, kind, tmp_path)

    fresh = open_store(kind, tmp_path)
    resumed = agent_on(Session.resume(fresh, "s"), ["done"])
    assert resumed.messages == original.messages
    assert resumed.state.get() == original.state.get()
    assert resumed.model_state == original.model_state
    manager = resumed.conversation_manager
    assert manager.removed_message_count == original.conversation_manager.removed_message_count
    opened = asyncio.run(Session.open(fresh, "s", must_exist=True))
    assert agent_on(opened, []).messages == original.messages

    # The damage is there, and a full read still finds it.
    report = asyncio.run(verify_store(fresh))
    assert report.damaged_sessions == ("s",)
    with pytest.raises(SessionCorruptedError):
        asyncio.run(fresh.get("s"))
    # A turn after the windowed resume appends where the store ends.
    resumed("one more")
    page = asyncio.run(read_history_page(fresh, "s", offset=4 * TURNS, limit=10))
    assert page.total == 4 * TURNS + 2
    assert page.messages == resumed.messages[-2:]
    assert manager.removed_message_count + len(resumed.messages) == page.total


def bytes_read() -> int:
    """Bytes this process has read through system calls so far (Linux)."""
    with open("/proc/self/io") as io:
        return next(int(line.split()[1]) for line in io if line.startswith("rchar:"))


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs Linux /proc/self/io")
def test_what_a_resume_reads_does_not_grow_with_the_history(tmp_path: Path) -> None:
    read: dict[int, int] = {}
    for size in (1000, 20000):
        root = tmp_path / str(size)
        store = FileSessionStore(root, durability="none")
        history = [
            text("user" if i % 2 == 0 else "assistant", f"m{i} " + "x" * 200) for i in range(size)
        ]
        asyncio.run(store.create("s"))
        for end in range(500, size + 1, 500):
            asyncio.run(store.commit("s", history[:end], agent_state=manager_state(end - 40)))
        fresh = FileSessionStore(root)
        Agent(model=ScriptedModel([]), session_manager=Session.resume(fresh, "s"))  # warm up
        before = bytes_read()
        agent = Agent(model=ScriptedModel([]), session_manager=Session.resume(fresh, "s"))
        read[size] = bytes_read() - before
        assert agent.messages == history[-40:]
    on_disk = sum(p.stat().st_size for p in (tmp_path / "20000").rglob("*") if p.is_file())
    assert on_disk > 4_000_000
    assert read[20000] < 200_000  # the window and its neighbourhood, not 4 MB
    assert read[20000] < 2 * read[1000]


def test_a_manager_that_keeps_everything_still_reads_everything(tmp_path: Path) -> None:
    store = open_store("file", tmp_path)
    run_turns(store, manager=NullConversationManager())
    damage_old_data(store, "file", tmp_path)
    with pytest.raises(SessionCorruptedError):
        Session.resume(open_store("file", tmp_path), "s")


def test_damage_inside_the_window_is_still_caught(tmp_path: Path) -> None:
    store = open_store("file", tmp_path)
    run_turns(store)
    journal = store.session_dir("s") / "journal.jsonl"  # type: ignore[attr-defined]
    data = journal.read_bytes()
    at = data.rindex(b"answer 23")
    assert data.count(b"\n", at) > 1  # not the last line (a torn tail is healed)
    journal.write_bytes(data[:at] + b"answer 99" + data[at + len(b"answer 23") :])
    with pytest.raises(SessionCorruptedError):
        Session.resume(open_store("file", tmp_path), "s")


def test_windowed_resume_equals_the_full_read_trimmed(store: SessionStore) -> None:
    original = run_turns(store)
    redacted = text("assistant", "[REDACTED]")
    asyncio.run(original.session_manager.redact_latest_message(redacted))  # type: ignore[union-attr]

    full = asyncio.run(store.get("s"))
    removed = full.agent_state["conversation_manager_state"]["removed_message_count"]
    resumed = agent_on(Session.resume(store, "s"), script(2, first=TURNS))
    assert resumed.messages == full.messages[removed:] == original.messages
    assert resumed.messages[-1] == redacted
    assert resumed.conversation_manager.removed_message_count == removed
    assert resumed.state.get() == full.agent_state["state"] == {"turn": TURNS - 1}
    assert resumed.model_state == {"cursor": f"c{TURNS - 1}"}

    resumed("next")
    resumed("and the last")
    after = asyncio.run(store.get("s"))
    assert after.messages[: len(full.messages)] == full.messages
    assert len(after.messages) == len(full.messages) + 8
    manager = resumed.conversation_manager
    assert after.messages[manager.removed_message_count :] == resumed.messages
    assert agent_on(Session.resume(store, "s"), []).messages == resumed.messages


def test_a_window_that_needs_repair_is_repaired_over_the_whole_history(
    store: SessionStore,
) -> None:
    history = [text("user" if i % 2 == 0 else "assistant", f"m{i}") for i in range(40)]
    history[33] = tool_call("lost", "lookup", key="x")  # its result was never stored
    asyncio.run(store.create("s"))
    asyncio.run(store.commit("s", history, agent_state=manager_state(30)))
    resumed = agent_on(Session.resume(store, "s"), [])
    repaired, changes = repair_tool_pairs(history)
    assert changes == 1
    assert resumed.messages == repaired[30:]
    assert_model_valid(resumed.messages)
    assert asyncio.run(store.get("s")).messages == repaired  # written back once


def test_the_message_before_the_window_is_looked_at(store: SessionStore) -> None:
    history = [text("user" if i % 2 == 0 else "assistant", f"m{i}") for i in range(40)]
    history[29] = tool_call("open", "lookup", key="x")  # answered by nothing in message 30
    asyncio.run(store.create("s"))
    asyncio.run(store.commit("s", history, agent_state=manager_state(30)))
    resumed = agent_on(Session.resume(store, "s"), [])
    repaired, _ = repair_tool_pairs(history)
    assert resumed.messages == repaired[30:]
    assert "toolResult" in resumed.messages[0]["content"][0]  # the placeholder


@pytest.mark.parametrize("offset", [0, 1, 5, 39, 40, 41, 10**6])
async def test_get_from_an_offset_is_the_full_read_sliced(store: SessionStore, offset: int) -> None:
    history = [text("user" if i % 2 == 0 else "assistant", f"m{i}") for i in range(40)]
    await store.create("s")
    await store.commit("s", history[:10], agent_state=manager_state(1))
    await store.commit("s", history[:25], redactions={3: text("user", "r3")})
    await store.commit("s", history, redactions={38: text("user", "r38")})
    full = await store.get("s")
    part = await store.get("s", offset=offset)
    assert part.messages == full.messages[offset:]
    assert part.offset == min(offset, 40)
    assert (part.agent_state, part.tail, part.meta.message_count) == (
        full.agent_state,
        full.tail,
        40,
    )


@pytest.mark.parametrize("max_records", [1, 2, 3, 7, 50])
async def test_file_store_end_reads_across_segments(tmp_path: Path, max_records: int) -> None:
    """The latest state may sit in an older segment than the window (read back to it)."""
    store = FileSessionStore(tmp_path, segmentation=Segmentation(max_records=max_records))
    history = [text("user" if i % 2 == 0 else "assistant", f"m{i}") for i in range(30)]
    await store.create("s")
    await store.commit("s", history[:2], agent_state=manager_state(2))
    for end in range(3, 31):
        redactions = {end - 3: text("user", f"r{end}")} if end % 5 == 0 else None
        await store.commit("s", history[:end], redactions=redactions)
    full = await store.get("s")
    assert full.agent_state == manager_state(2)
    for offset in [1, 2, 9, 17, 28, 29, 30, 31]:
        part = await FileSessionStore(tmp_path).get("s", offset=offset)
        assert part.messages == full.messages[offset:], offset
        assert (part.agent_state, part.tail, part.message_count) == (
            full.agent_state,
            full.tail,
            30,
        )


@pytest.mark.parametrize(
    ("field", "error"),
    [("count", "does not match the manifest"), ("first_count", "segments do not meet")],
)
async def test_file_store_end_read_checks_the_manifest_counts(
    tmp_path: Path, field: str, error: str
) -> None:
    store = FileSessionStore(tmp_path, segmentation=Segmentation(max_records=5))
    history = [text("user" if i % 2 == 0 else "assistant", f"m{i}") for i in range(22)]
    await store.create("s")
    await store.commit("s", history[:1], agent_state=manager_state(1))
    for end in range(2, 23):
        await store.commit("s", history[:end])
    assert (await store.get("s", offset=21)).agent_state == manager_state(1)  # read back to it
    manifest_path = store.session_dir("s") / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    assert len(manifest["segments"]) == 4
    manifest["segments"][2][field] += 1  # no longer what its records say
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(SessionCorruptedError, match=error):
        await FileSessionStore(tmp_path).get("s", offset=21)
