"""perdure inside someone else's event loop (SPEC §7, STYLE 4).

Sync calls made in a running loop (a notebook cell, a web handler) run on perdure's
loop and block only the calling thread; constructors do no I/O there, so a running
loop is never stalled by building an agent on a long session; the restore and its
errors come with ``await agent.initialize()`` or the first call.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from perdure import Agent
from perdure._runtime.loop import run_sync
from perdure.errors import SessionNotFoundError
from perdure.models import ScriptedModel
from perdure.session import FileSessionStore, Session
from perdure.session.store import SessionStore
from perdure.stores.sqlite import SQLiteSessionStore


def _texts(messages: Any) -> list[str]:
    return [m["content"][0]["text"] for m in messages]


@pytest.fixture(params=["file", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> SessionStore:
    if request.param == "file":
        return FileSessionStore(tmp_path / "files")
    return SQLiteSessionStore(tmp_path / "sessions.db")


def test_sync_agent_call_and_session_resume_inside_asyncio_run(store: SessionStore) -> None:
    async def main() -> tuple[str, str, list[str]]:
        agent = Agent(model=ScriptedModel(["hello back"]), session_manager=Session(store, "s1"))
        first = agent("hi")  # sync, inside the running loop
        session = Session.resume(store, "s1")
        resumed = Agent(model=ScriptedModel(["second"]), session_manager=session)
        second = resumed("more")
        return str(first), str(second), _texts(resumed.messages)

    first, second, history = asyncio.run(main())
    assert (first, second) == ("hello back", "second")
    assert history == ["hi", "hello back", "more", "second"]
    assert _texts(asyncio.run(store.get("s1")).messages) == history


def test_resume_of_an_unknown_session_raises_at_a_defined_point(store: SessionStore) -> None:
    # No loop running: at Session.resume.
    with pytest.raises(SessionNotFoundError):
        Session.resume(store, "nope")

    async def main() -> None:
        # In a running loop: nothing is read until the agent initialises, which
        # raises — and raises again on every later call (nothing runs on a
        # session that could not be restored).
        agent = Agent(model=ScriptedModel(["never"]), session_manager=Session.resume(store, "nope"))
        with pytest.raises(SessionNotFoundError):
            await agent.initialize()
        with pytest.raises(SessionNotFoundError):
            agent("hi")
        with pytest.raises(SessionNotFoundError):
            await agent.invoke_async("hi")
        with pytest.raises(SessionNotFoundError):
            await Agent.create(
                model=ScriptedModel(["never"]), session_manager=Session.resume(store, "nope")
            )

    asyncio.run(main())
    assert [meta.session_id for meta in asyncio.run(store.list())] == []


def test_a_sync_call_inside_a_loop_logs_its_async_twin_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def answer() -> int:
        return 42

    async def main() -> list[int]:
        return [run_sync(answer(), async_name="the.twin_of_this_test()") for _ in range(3)]

    with caplog.at_level(logging.WARNING, logger="perdure"):
        assert asyncio.run(main()) == [42, 42, 42]
    named = [r for r in caplog.records if "the.twin_of_this_test()" in r.getMessage()]
    assert len(named) == 1
    assert named[0].levelno == logging.WARNING


async def _build_long_session(store: SessionStore, session_id: str, count: int) -> None:
    history: list[Any] = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": [{"text": f"m{i}"}]}
        for i in range(count)
    ]
    await store.create(session_id)
    for end in range(2000, count + 1, 2000):  # batches straight through the store
        await store.commit(session_id, history[:end])


async def _largest_gap_while(build: Any) -> tuple[float, Any]:
    """The loop's largest gap between 1 ms ticks while ``build()`` runs on it."""
    loop = asyncio.get_running_loop()
    gaps: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        last = loop.time()
        while not done.is_set():
            await asyncio.sleep(0.001)
            now = loop.time()
            gaps.append(now - last)
            last = now

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0.02)
    gaps.clear()
    built = build()
    await asyncio.sleep(0.02)
    done.set()
    await task
    return max(gaps), built


def test_building_an_agent_on_a_20k_session_never_blocks_a_running_loop(tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path / "files")
    asyncio.run(_build_long_session(store, "big", 20_000))

    async def main() -> tuple[float, list[str]]:
        # Best of three: a gap from the machine's scheduler is not perdure's doing;
        # the old constructor blocked the loop for the whole restore (~250 ms).
        best = float("inf")
        agent: Agent | None = None
        for _ in range(3):
            fresh = FileSessionStore(tmp_path / "files")  # nothing cached
            gap, agent = await _largest_gap_while(
                lambda fresh=fresh: Agent(
                    model=ScriptedModel(["ok"]), session_manager=Session(fresh, "big")
                )
            )
            best = min(best, gap)
        assert agent is not None
        assert agent.messages == []  # not restored yet: that is I/O
        await agent.initialize()
        return best, _texts(agent.messages)

    gap, history = asyncio.run(main())
    assert gap < 0.005, f"the loop was blocked for {gap * 1000:.1f} ms"
    assert len(history) > 0
    assert history[-1] == "m19999"
    stored = asyncio.run(store.get("big")).messages
    assert _texts(stored)[-len(history) :] == history  # what the agent's window keeps


async def test_agent_create_restores_without_blocking(tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path / "files")
    await _build_long_session(store, "s", 4000)
    agent = await Agent.create(model=ScriptedModel(["next"]), session_manager=Session(store, "s"))
    assert _texts(agent.messages)[-2:] == ["m3998", "m3999"]
    await agent.invoke_async("go on")
    assert _texts((await store.get("s")).messages)[-2:] == ["go on", "next"]


async def test_nothing_is_committed_for_an_agent_before_its_restore(tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path / "files")
    await _build_long_session(store, "s", 2000)
    session = Session(store, "s")
    agent = Agent(model=ScriptedModel(["next"]), session_manager=session)
    agent.state.set("k", "v")
    with pytest.raises(ValueError, match="not attached"):
        await session.save()  # would write the unrestored agent over the session
    assert len((await store.get("s")).messages) == 2000
    await agent.initialize()
    assert len(agent.messages) > 0


async def test_concurrent_initialize_calls_restore_once(tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path / "files")
    await _build_long_session(store, "s", 2000)
    session = Session(store, "s")
    agent = Agent(model=ScriptedModel(["next"]), session_manager=session)
    reads = 0
    get = store.get

    async def counting_get(*args: Any, **kwargs: Any) -> Any:
        nonlocal reads
        reads += 1
        return await get(*args, **kwargs)

    store.get = counting_get  # type: ignore[method-assign]
    await asyncio.gather(agent.initialize(), agent.initialize(), agent.invoke_async("more"))
    once = reads
    await agent.initialize()
    assert reads == once
    assert _texts((await get("s")).messages)[-3:] == ["m1999", "more", "next"]


def test_blocking_the_loop_is_measured(tmp_path: Path) -> None:
    """The gap measurement sees a constructor that blocks (so a pass means something)."""

    async def main() -> float:
        gap, _ = await _largest_gap_while(lambda: time.sleep(0.05))
        return gap

    assert asyncio.run(main()) >= 0.05
