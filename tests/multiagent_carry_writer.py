"""A writer process for the node-agent crash test: a graph invoked again and again.

Run as ``python multiagent_carry_writer.py DIR TASKS KILL_AT``: a graph of two agent
nodes (``w1`` then ``w2``, each answering ``ans:<first line of its prompt>``) on a
``SnapshotSessionManager`` over ``LocalFileStorage`` at ``DIR``, with ``CARRY_MAX``
set to 4 so that agents move into their own ``latest`` every few invocations. It
reads the stored run to see how far it got, then invokes the graph with ``t<k>`` for
each task ``k`` not completed yet, up to ``TASKS``, and prints ``done``.

``KILL_AT``: the process SIGKILLs itself at the ``|KILL_AT|``-th storage write of
this process — just before it when negative, just after it when positive (``0``:
never). ``check`` instead: invoke the graph once with ``check`` (the agents are
restored from what is stored) and print one line of JSON: each agent's history.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from typing import Any

import perdure.multiagent.persist as persist
from perdure import Agent, NullConversationManager
from perdure.models import ScriptedModel
from perdure.multiagent import GraphBuilder
from perdure.multiagent.run import replay
from perdure.session import SnapshotSessionManager
from perdure.storage import LocalFileStorage
from perdure.types import Message

persist.CARRY_MAX = 4
KILL_AT = 0
WRITES = 0


def write_step(after: bool) -> None:
    global WRITES
    if not after:
        WRITES += 1
    if KILL_AT and abs(KILL_AT) == WRITES and (KILL_AT > 0) == after:
        os.kill(os.getpid(), signal.SIGKILL)


class KillingStorage(LocalFileStorage):
    """Dies before or after one of its writes, as ``KILL_AT`` says."""

    async def append(self, key: str, data: bytes, *, size: int, tail: bytes) -> None:
        write_step(False)
        await super().append(key, data, size=size, tail=tail)
        write_step(True)

    async def replace(self, key: str, data: bytes, *, size: int | None, tail: bytes) -> None:
        write_step(False)
        await super().replace(key, data, size=size, tail=tail)
        write_step(True)

    async def write(self, key: str, data: bytes) -> None:
        write_step(False)
        await super().write(key, data)
        write_step(True)


def echo(messages: list[Message]) -> str:
    return "ans:" + messages[-1]["content"][0]["text"].split("\n")[0]


def build(storage: LocalFileStorage) -> tuple[Any, list[Agent]]:
    agents = [
        Agent(
            ScriptedModel([echo] * 100),
            agent_id=name,
            conversation_manager=NullConversationManager(),
        )
        for name in ("w1", "w2")
    ]
    b = GraphBuilder()
    b.add_node(agents[0], "w1")
    b.add_node(agents[1], "w2")
    b.add_edge("w1", "w2")
    return b.build(session_manager=SnapshotSessionManager("run", storage=storage)), agents


async def main() -> None:
    global KILL_AT
    where, tasks, kill_at = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    storage = KillingStorage(where)
    graph, agents = build(storage)
    if kill_at == "check":
        await graph.invoke_async("check")
        texts = {a.agent_id: [m["content"][0]["text"] for m in a.messages] for a in agents}
        print(json.dumps(texts))
        return
    run = await SnapshotSessionManager("run", storage=storage).restore_multi_agent("graph")
    start = 0
    if run:
        state = replay(run, "graph")
        start = int(state.task[1:]) + (state.status != "running")
    KILL_AT = int(kill_at)  # the read above is not counted
    for k in range(start, tasks):
        result = await graph.invoke_async(f"t{k}")
        assert result.status == "completed", result.error
    print("done")


if __name__ == "__main__":
    asyncio.run(main())
