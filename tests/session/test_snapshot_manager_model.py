"""Property test: any sequence of edits, saves and restores round-trips exactly.

Small seal thresholds make sealing, tree nodes, tail chains, trims and re-seals
happen within a few dozen messages.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perdure import Agent, NullConversationManager
from perdure.models import ScriptedModel
from perdure.snapshots import layout as layout_module
from perdure.snapshots.manager import SnapshotSessionManager
from perdure.storage import MemoryStorage


@contextmanager
def small_chunks() -> Iterator[None]:
    saved = (
        layout_module.SEAL_BYTES,
        layout_module.SEAL_MESSAGES,
        layout_module.CHAIN_DEPTH,
        layout_module.FANOUT,
    )
    layout_module.SEAL_BYTES, layout_module.SEAL_MESSAGES = 300, 4
    layout_module.CHAIN_DEPTH, layout_module.FANOUT = 3, 2
    try:
        yield
    finally:
        (
            layout_module.SEAL_BYTES,
            layout_module.SEAL_MESSAGES,
            layout_module.CHAIN_DEPTH,
            layout_module.FANOUT,
        ) = saved


def message(i: int, size: int) -> dict[str, Any]:
    return {
        "role": "user" if i % 2 == 0 else "assistant",
        "content": [{"text": f"{i}:" + "x" * size}],
    }


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 5), st.integers(0, 120)),
        st.tuples(st.just("trim"), st.integers(1, 6), st.just(0)),
        st.tuples(st.just("replace"), st.integers(0, 40), st.just(0)),
        st.tuples(st.just("edit_last"), st.just(0), st.just(0)),
        st.tuples(st.just("truncate"), st.integers(0, 3), st.just(0)),
        st.tuples(st.just("latest"), st.just(0), st.just(0)),
        st.tuples(st.just("snapshot"), st.just(0), st.just(0)),
        st.tuples(st.just("restart"), st.just(0), st.just(0)),
        st.tuples(st.just("collect"), st.just(0), st.just(0)),
    ),
    min_size=1,
    max_size=40,
)


def new_agent() -> Agent:
    return Agent(model=ScriptedModel([]), conversation_manager=NullConversationManager())


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OPS)
def test_saves_and_restores_round_trip(ops: list[tuple[str, int, int]]) -> None:
    with small_chunks():
        asyncio.run(_run(ops))


async def _run(ops: list[tuple[str, int, int]]) -> None:
    storage = MemoryStorage()
    manager = SnapshotSessionManager("p", storage=storage)
    agent = new_agent()
    counter = 0
    latest: list[Any] | None = None
    snapshots: dict[str, list[Any]] = {}
    for op, a, b in ops:
        if op == "append":
            for _ in range(a):
                agent.messages.append(message(counter, b))  # type: ignore[arg-type]
                counter += 1
        elif op == "trim":
            del agent.messages[:a]
        elif op == "replace" and agent.messages:
            index = a % len(agent.messages)
            replaced = copy.deepcopy(agent.messages[index])
            replaced["content"][0]["text"] += "!"
            agent.messages[index] = replaced
        elif op == "edit_last" and agent.messages:
            # In-place edits are only tracked in the open tail (documented in
            # _snapshot_layout); perdure's own code replaces a message instead.
            edited = copy.deepcopy(agent.messages[-1])
            edited["content"].append({"text": "edited"})
            agent.messages[-1] = edited
        elif op == "truncate" and agent.messages:
            del agent.messages[len(agent.messages) - min(a, len(agent.messages)) :]
        elif op == "latest":
            await manager.save_snapshot(agent, is_latest=True)
            latest = copy.deepcopy(agent.messages)
        elif op == "snapshot":
            snapshot_id = await manager.save_snapshot(agent, is_latest=False)
            assert snapshot_id is not None
            snapshots[snapshot_id] = copy.deepcopy(agent.messages)
        elif op == "restart":
            manager = SnapshotSessionManager("p", storage=storage)
            agent = new_agent()
            found = await manager.restore_snapshot(agent)
            assert found == (latest is not None)
            assert agent.messages == (latest or [])
        elif op == "collect":
            await manager.collect_garbage(agent)
        # Everything stored so far reads back exactly, from a fresh manager.
        reader = SnapshotSessionManager("p", storage=storage)
        probe = new_agent()
        assert await reader.restore_snapshot(probe) == (latest is not None)
        if latest is not None:
            assert probe.messages == latest
        for snapshot_id, expected in snapshots.items():
            probe = new_agent()
            assert await reader.restore_snapshot(probe, snapshot_id=snapshot_id)
            assert probe.messages == expected
