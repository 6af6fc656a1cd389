"""What the server benchmarks (``postgres.py``, ``redis_store.py``) time on any store:
agent turns through both faces over a stored session, and its read-back (resume,
windowed resume, tail page). Each floor is stepped between turns by the caller's
``floor.once()``.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Protocol

from agent_path import instant_model
from peers import QUESTION
from peers_postgres import PAGE  # the peers' tail page too (peers_redis.PAGE is the same)

from perdure import Agent, NullConversationManager
from perdure.session import Session, SessionStore, read_history_page
from perdure.types import Message

WINDOW = 40  # messages a windowed resume reads


class Floor(Protocol):
    def once(self) -> float: ...


def agent_kwargs(turns: int) -> dict[str, Any]:
    return {"model": instant_model(turns), "conversation_manager": NullConversationManager()}


async def agent_turns_async(
    store: SessionStore, session: str, turns: int, floor: Floor
) -> list[float]:
    """Seconds of each of ``turns`` turns of ``await agent.invoke_async`` over the session."""
    agent = await Agent.create(
        **agent_kwargs(turns), session_manager=Session.resume(store, session)
    )
    times = []
    for _ in range(turns):
        floor.once()
        start = time.perf_counter()
        await agent.invoke_async(QUESTION)
        times.append(time.perf_counter() - start)
    return times


def agent_turns_sync(
    store: SessionStore, session: str, turns: int, floor: Floor
) -> tuple[list[float], list[Message]]:
    """Seconds of each of ``turns`` turns of ``agent(...)`` over the session; its messages."""
    agent = Agent(**agent_kwargs(turns), session_manager=Session.resume(store, session))
    times = []
    for _ in range(turns):
        floor.once()
        start = time.perf_counter()
        agent(QUESTION)
        times.append(time.perf_counter() - start)
    return times, list(agent.messages)


async def read_back(reader: SessionStore, session: str, history: list[Message]) -> dict[str, float]:
    """Resume, windowed resume and tail page of ``session`` (which holds ``history``),
    through ``reader``, a store opened for it (closed after)."""
    resume = []
    for _ in range(3):
        start = time.perf_counter()
        record = await reader.get(session)
        resume.append(time.perf_counter() - start)
    assert record.messages == history
    window = []
    for _ in range(5):
        start = time.perf_counter()
        record = await reader.get(session, offset=len(history) - WINDOW)
        window.append(time.perf_counter() - start)
    assert len(record.messages) == WINDOW
    pages = []
    for _ in range(20):
        start = time.perf_counter()
        page = await read_history_page(reader, session, offset=len(history) - PAGE, limit=PAGE)
        pages.append(time.perf_counter() - start)
    assert page.messages == history[-PAGE:]
    close = getattr(reader, "close", None)  # not part of SessionStore
    if close is not None:
        close()
    return {
        "resume_ms": min(resume) * 1e3,
        "window_ms": min(window) * 1e3,
        "page_ms": statistics.median(pages) * 1e3,
    }
