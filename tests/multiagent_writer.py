"""A writer process for the orchestrator crash tests: a graph or a swarm that dies mid-run.

Run as ``python multiagent_writer.py KIND BACKEND DIR COUNTER KILL_AFTER``:

* ``KIND``: ``graph`` (five nodes: ``a`` fans out to ``b`` and ``c``, which join at
  the agent node ``d``, then ``e``; an edge ``a -> skipped`` whose condition is false),
  ``graph-parallel`` (the same, built with ``parallel=True``)
  or ``swarm`` (agents ``a`` -> ``b`` -> ``c`` handing off, ``a`` adding to the
  shared context);
* ``BACKEND``: ``snapshot`` (a SnapshotSessionManager on LocalFileStorage) or
  ``session`` (a Session on a FileSessionStore);
* every node appends its name to the file ``COUNTER`` when it runs (an agent node:
  when its model is called), so the parent counts the runs across processes;
* the process SIGKILLs itself right after the ``KILL_AFTER``-th save of the run
  returned (``0``: never), i.e. after that node's record is durable.

It prints one line of JSON at the end: the result, and what the agents hold.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

from perdure import Agent
from perdure.models import ScriptedModel
from perdure.multiagent import GraphBuilder, Swarm
from perdure.session import FileSessionStore, Session, SnapshotSessionManager
from perdure.storage import LocalFileStorage
from perdure.types import Message

KILL_AFTER = 0
SAVES = 0


def saved() -> None:
    """One save of the run returned: die now if it is the one to die after."""
    global SAVES
    SAVES += 1
    if SAVES == KILL_AFTER:
        os.kill(os.getpid(), signal.SIGKILL)


class KillingStorage(LocalFileStorage):
    def __init__(self, root: str, run_key: str) -> None:
        super().__init__(root)
        self.run_key = run_key

    async def append(self, key: str, data: bytes, *, size: int, tail: bytes) -> None:
        await super().append(key, data, size=size, tail=tail)
        if key == self.run_key:
            saved()

    async def replace(self, key: str, data: bytes, *, size: int | None, tail: bytes) -> None:
        await super().replace(key, data, size=size, tail=tail)
        if key == self.run_key:
            saved()


class KillingStore(FileSessionStore):
    async def commit(self, session_id: str, messages: Any, **kwargs: Any) -> Any:
        done = await super().commit(session_id, messages, **kwargs)
        if session_id == "run":
            saved()
        return done


def count(counter: str, name: str) -> None:
    fd = os.open(counter, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, f"{name}\n".encode())
    finally:
        os.close(fd)


def counting(counter: str, name: str, answer: Message | str) -> Any:
    def respond(messages: list[Message]) -> Message | str:
        count(counter, name)
        return answer

    return respond


def handoff(to: str, message: str, context: dict[str, Any] | None = None) -> Message:
    given: dict[str, Any] = {"agent": to, "message": message}
    if context:
        given["context"] = context
    return {
        "role": "assistant",
        "content": [
            {"text": f"passing to {to}"},
            {"toolUse": {"toolUseId": f"h-{to}", "name": "handoff", "input": given}},
        ],
    }


def node(counter: str, name: str) -> Any:
    def run(task: str, upstream: dict[str, str]) -> str:
        count(counter, name)
        return f"{name}({','.join(sorted(upstream))})"

    run.__name__ = name
    return run


def main() -> None:
    global KILL_AFTER
    kind, backend, where, counter, kill_after = sys.argv[1:6]
    KILL_AFTER = int(kill_after)
    orchestrator = "flow"
    manager: object
    if backend == "snapshot":
        storage = KillingStorage(where, f"sessions/run/multi_agents/{orchestrator}/latest")
        manager = SnapshotSessionManager("run", storage=storage)
        agent_manager = None  # the orchestrator saves its agents through its manager
    else:
        store = KillingStore(where)
        manager = Session(store, "run")
        agent_manager = store
    if kind.startswith("graph"):

        def agent_session(name: str) -> Session | None:
            return None if agent_manager is None else Session(agent_manager, f"agent-{name}")

        writer = Agent(
            ScriptedModel([counting(counter, "d", "d-says")]),
            agent_id="d",
            session_manager=agent_session("d"),
        )
        b = GraphBuilder()
        b.add_node(node(counter, "a"), "a")
        b.add_node(node(counter, "b"), "b")
        b.add_node(node(counter, "c"), "c")
        b.add_node(writer, "d")
        b.add_node(node(counter, "e"), "e")
        b.add_node(node(counter, "skipped"), "skipped")
        b.add_edge("a", "b")
        b.add_edge("a", "c", condition=lambda s: s["results"]["a"].startswith("a"))
        b.add_edge("a", "skipped", condition=lambda s: "never" in s["results"]["a"])
        b.add_edge("b", "d")
        b.add_edge("c", "d")
        b.add_edge("d", "e")
        b.set_entry_point("a")
        graph = b.build(
            session_manager=manager, graph_id=orchestrator, parallel=kind == "graph-parallel"
        )
        result = graph("write a report")
        print(
            json.dumps(
                {
                    "status": result.status,
                    "order": result.execution_order,
                    "results": result.results,
                    "d_messages": writer.messages,
                }
            ),
            flush=True,
        )
        return

    def agent(name: str, answer: Message | str) -> Agent:
        session = None if agent_manager is None else Session(agent_manager, f"agent-{name}")
        return Agent(
            ScriptedModel([counting(counter, name, answer)]),
            agent_id=name,
            name=name,
            session_manager=session,
        )

    a = agent("a", handoff("b", "research the market", {"budget": 100}))
    b_ = agent("b", handoff("c", "write it up"))
    c = agent("c", "the final report")
    swarm = Swarm([a, b_, c], session_manager=manager, swarm_id=orchestrator)
    result = swarm("write a report")
    assert isinstance(c.model, ScriptedModel)
    print(
        json.dumps(
            {
                "status": result.status,
                "order": result.node_history,
                "results": result.results,
                "context": result.context,
                "c_prompt": c.model.requests[-1]["messages"][-1] if c.model.requests else None,
                "messages": {x.name: len(x.messages) for x in (a, b_, c)},
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
