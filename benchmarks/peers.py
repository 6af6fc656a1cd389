"""The peers' full paths for ``benchmarks/agent_path.py``: Strands, OpenAI Agents, LangGraph.

This script runs in the peers' own virtual environment (their SDKs, not perdure);
``agent_path.py --peers`` creates that environment from
``benchmarks/peers-requirements.txt`` and runs, with the same sizes as its own rows:

    VENV/bin/python benchmarks/peers.py --turns N --resume-size N --dir DIR --out FILE

It writes one JSON object to ``FILE`` (see :func:`main`). Each peer is driven through
its own agent API by a stub subclass of that SDK's model class that answers every turn
at once with the same text as perdure's rows (``QUESTION`` and ``ANSWER`` below, which
``agent_path.py`` imports from here), keeps the whole history (no trimming) and
persists it the way it ships by default:

- Strands: ``Agent`` with ``FileSessionManager`` and ``NullConversationManager``;
  ``await agent.invoke_async(...)`` and ``agent(...)``; resume = a new ``Agent`` over
  the session's directory (it reads every message file); restart = that, then
  ``agent(QUESTION)``.
- OpenAI Agents: ``Runner.run`` / ``Runner.run_sync`` with an ``SQLiteSession`` on a
  file; tracing disabled (its default exporter posts to OpenAI's API). Resume = a new
  ``SQLiteSession`` and ``get_items()``: what ``Runner.run`` reads before every turn
  (the Runner keeps no history in memory), without running a turn and without an
  ``Agent``; restart = a new ``Agent`` and ``SQLiteSession``, then
  ``Runner.run_sync(agent, QUESTION, session=session)``.
- LangGraph: a ``StateGraph(MessagesState)`` whose one node calls the model, compiled
  with ``SqliteSaver`` on a file (``invoke``) and with ``AsyncSqliteSaver`` on a file
  (``ainvoke``, an async node); resume = a new connection, saver and compiled graph,
  then ``graph.get_state(config)`` (no turn); restart = a new connection, saver and
  compiled graph, then ``graph.invoke({"messages": [HumanMessage(QUESTION)]}, config)``.

"resume" is therefore not the same work for every peer (nor for perdure, whose
figure builds an agent); "restart" is: from a fresh object graph over the stored
history, the time to the first answer of one new turn through the sync face, the
whole history kept, the turn persisted as each peer ships it. Each restart starts
from a copy (made untimed) of the same stored history, so every repetition sees
exactly ``--resume-size`` messages before its turn; the clock stops when the answer
is back (closing the session is not timed), and the messages held afterwards are
checked (``--resume-size`` + 2).

Per turn it records the mean seconds per message (two messages a turn), and between
every two turns it steps the same floors as ``agent_path.py`` (``floors.py``), so the
table can show how loaded the machine was while the peers ran. The 10k history to
resume is written the cheapest way each SDK's own API allows (one ``Agent`` created
with the whole history for Strands, one ``add_items`` for OpenAI Agents, one
``update_state`` for LangGraph); only the resume and the restart are timed, best of 3
each. The stub model classes are defined once, as an application defines its own at
import, not in the timed part.

For the footnote it also reports what each peer makes durable: the SQLite
``synchronous`` and ``journal_mode`` of the connections the SDK opened, the commits a
turn issues (counted with SQLite's trace callback in a short untimed run), and the
``os.fsync`` calls of Strands' file writes.

It imports nothing from perdure, and the SDKs only inside the functions that use them,
so perdure's own environment can import it (``agent_path.py`` and its tests do).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import importlib.metadata
import json
import os
import shutil
import sqlite3
import statistics
import sys
import time
import traceback
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from floors import FileFloor, SQLiteFloor

FILLER = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor "
QUESTION = "question: " + (FILLER * 4)[:300]
# As long as the question, in one streamed piece: each row then measures the turn and
# its persistence, not the per-delta cost of a stream.
ANSWER = "answer:" + (FILLER * 4)[:300].replace(" ", "_")

FORMAT = "perdure-peers/2"
PEERS = ("strands", "openai", "langgraph")
DISTRIBUTIONS = {
    "strands": "strands-agents",
    "openai": "openai-agents",
    "langgraph": "langgraph",
}
SYNCHRONOUS = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
REPEATS = 3


class Floors:
    """The file and SQLite floors, stepped between turns; their samples."""

    def __init__(self, work: Path) -> None:
        line = json.dumps({"role": "user", "content": [{"text": QUESTION}]}).encode() + b"\n"
        self.file = FileFloor(work, line)
        self.sqlite = SQLiteFloor(work, line.decode())
        self.file_s: list[float] = []
        self.sqlite_s: list[float] = []

    def step(self) -> None:
        self.file_s.append(self.file.once())
        self.sqlite_s.append(self.sqlite.once())

    def close(self) -> None:
        self.file.close()
        self.sqlite.close()


def per_message(turn: Callable[[], object], turns: int, floors: Floors) -> float:
    """Mean seconds per message of ``turns`` calls of ``turn`` (two messages each)."""
    times = []
    for _ in range(turns):
        floors.step()
        start = time.perf_counter()
        turn()
        times.append(time.perf_counter() - start)
    return statistics.fmean(times) / 2


async def per_message_async(
    turn: Callable[[], Awaitable[object]], turns: int, floors: Floors
) -> float:
    """Mean seconds per message of ``turns`` awaited calls of ``turn``."""
    times = []
    for _ in range(turns):
        floors.step()
        start = time.perf_counter()
        await turn()
        times.append(time.perf_counter() - start)
    return statistics.fmean(times) / 2


def best_ms(resume: Callable[[], int], size: int) -> float:
    """Best of ``REPEATS`` milliseconds of ``resume``, which returns the messages it holds."""
    best = float("inf")
    for _ in range(REPEATS):
        start = time.perf_counter()
        held = resume()
        best = min(best, time.perf_counter() - start)
        if held != size:
            raise RuntimeError(f"resumed {held} messages, expected {size}")
    return best * 1e3


def best_restart_ms(
    history: Path, restart: Callable[[Path], Callable[[], int]], size: int
) -> float:
    """Best of ``REPEATS`` milliseconds of ``restart``, each on a fresh copy of ``history``.

    ``history`` is a directory holding the stored ``size`` messages; each repetition
    copies it (untimed) so that every restart starts from the same history, then times
    ``restart(copy)``: build everything over the copy and answer one turn. ``restart``
    returns a function, called untimed, that counts the messages held afterwards
    (``size`` + 2) and closes what it opened.
    """
    best = float("inf")
    for repeat in range(REPEATS):
        run = history.with_name(f"{history.name}-restart-{repeat}")
        shutil.copytree(history, run)
        start = time.perf_counter()
        held = restart(run)
        best = min(best, time.perf_counter() - start)
        count = held()
        if count != size + 2:
            raise RuntimeError(f"after restarting over {size} messages and one turn: {count}")
        shutil.rmtree(run, ignore_errors=True)
    return best * 1e3


def check_count(held: int, turns: int) -> None:
    if held != 2 * turns:
        raise RuntimeError(f"the peer holds {held} messages after {turns} turns")


@contextmanager
def counting_fsyncs() -> Iterator[list[int]]:
    """Count the ``os.fsync`` and ``os.fdatasync`` calls made in the block."""
    count = [0]
    real_fsync, real_fdatasync = os.fsync, os.fdatasync

    def fsync(fd: Any) -> None:
        count[0] += 1
        real_fsync(fd)

    def fdatasync(fd: Any) -> None:
        count[0] += 1
        real_fdatasync(fd)

    os.fsync, os.fdatasync = fsync, fdatasync  # type: ignore[assignment]
    try:
        yield count
    finally:
        os.fsync, os.fdatasync = real_fsync, real_fdatasync  # type: ignore[assignment]


class CommitCounter:
    """Counts the COMMITs SQLite runs on the connections it is attached to."""

    def __init__(self) -> None:
        self.commits = 0

    def __call__(self, statement: str) -> None:
        if statement.lstrip().upper().startswith(("COMMIT", "END")):
            self.commits += 1

    def attach(self, conn: sqlite3.Connection) -> None:
        conn.set_trace_callback(self)


def pragmas(conn: sqlite3.Connection) -> dict[str, str]:
    synchronous = conn.execute("PRAGMA synchronous").fetchone()[0]
    journal = conn.execute("PRAGMA journal_mode").fetchone()[0]
    return {"synchronous": SYNCHRONOUS.get(synchronous, str(synchronous)), "journal_mode": journal}


# --- Strands ---------------------------------------------------------------------------


def strands_model() -> Any:
    return _strands_model_class()()


@functools.cache
def _strands_model_class() -> type:
    from strands.models import Model

    class InstantStrandsModel(Model):  # type: ignore[misc]
        """A Strands model that streams ``ANSWER`` in one piece, at once."""

        def __init__(self) -> None:
            self.config: dict[str, Any] = {"model_id": "instant"}

        def update_config(self, **model_config: Any) -> None:
            self.config.update(model_config)

        def get_config(self) -> dict[str, Any]:
            return self.config

        def structured_output(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError("the benchmark asks for no structured output")

        async def stream(self, *args: Any, **kwargs: Any) -> Any:
            yield {"messageStart": {"role": "assistant"}}
            yield {"contentBlockDelta": {"delta": {"text": ANSWER}}}
            yield {"contentBlockStop": {}}
            yield {"messageStop": {"stopReason": "end_turn"}}
            yield {
                "metadata": {
                    "usage": {"inputTokens": 0, "outputTokens": 0, "totalTokens": 0},
                    "metrics": {"latencyMs": 0},
                }
            }

    return InstantStrandsModel


def strands_agent(work: Path, session_id: str, messages: list[Any] | None = None) -> Any:
    from strands import Agent
    from strands.agent.conversation_manager import NullConversationManager
    from strands.session import FileSessionManager

    return Agent(
        model=strands_model(),
        messages=messages,
        session_manager=FileSessionManager(session_id=session_id, storage_dir=str(work)),
        conversation_manager=NullConversationManager(),
        callback_handler=None,
    )


def strands_peer(turns: int, resume_size: int, work: Path, floors: Floors) -> dict[str, Any]:
    agent = strands_agent(work / "async", "bench")

    async def run_async() -> float:
        return await per_message_async(lambda: agent.invoke_async(QUESTION), turns, floors)

    async_s = asyncio.run(run_async())
    check_count(len(agent.messages), turns)

    agent = strands_agent(work / "sync", "bench")
    sync_s = per_message(lambda: agent(QUESTION), turns, floors)
    check_count(len(agent.messages), turns)

    # What the files make durable: the fsyncs of a few turns, untimed and without floors.
    agent = strands_agent(work / "count", "count")
    with counting_fsyncs() as counted:
        for _ in range(REPEATS):
            agent(QUESTION)
    fsyncs = counted[0] / REPEATS

    history = [
        {"role": "user", "content": [{"text": QUESTION}]}
        if i % 2 == 0
        else {"role": "assistant", "content": [{"text": ANSWER}]}
        for i in range(resume_size)
    ]
    strands_agent(work / "resume", "resume", messages=history)  # one file per message
    resume_ms = best_ms(lambda: len(strands_agent(work / "resume", "resume").messages), resume_size)

    def restart(run: Path) -> Callable[[], int]:
        agent = strands_agent(run, "resume")
        agent(QUESTION)
        return lambda: len(agent.messages)

    restart_ms = best_restart_ms(work / "resume", restart, resume_size)
    return {
        "async_us": async_s * 1e6,
        "sync_us": sync_s * 1e6,
        "resume_ms": resume_ms,
        "resume_how": "new Agent(session_manager=FileSessionManager(...)) built (no turn)",
        "restart_ms": restart_ms,
        "restart_how": "new Agent(session_manager=FileSessionManager(...)), agent(QUESTION)",
        "durability": {"fsyncs_per_turn": fsyncs},
        "note": (
            "FileSessionManager writes each message to its own JSON file (temp file + "
            "os.replace) and rewrites agent.json each turn; "
            f"{fsyncs:g} fsyncs a turn"
        ),
    }


# --- OpenAI Agents ---------------------------------------------------------------------


def openai_model() -> Any:
    return _openai_model_class()()


@functools.cache
def _openai_model_class() -> type:
    from agents.items import ModelResponse
    from agents.models.interface import Model
    from agents.usage import Usage
    from openai.types.responses import ResponseOutputMessage, ResponseOutputText

    class InstantOpenAIModel(Model):  # type: ignore[misc]
        """An OpenAI Agents model whose response is ``ANSWER``, at once."""

        async def get_response(self, *args: Any, **kwargs: Any) -> Any:
            text = ResponseOutputText(type="output_text", text=ANSWER, annotations=[])
            message = ResponseOutputMessage(
                id="msg_instant",
                type="message",
                role="assistant",
                status="completed",
                content=[text],
            )
            return ModelResponse(output=[message], usage=Usage(requests=1), response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError("the benchmark runs Runner.run, not Runner.run_streamed")

    return InstantOpenAIModel


def counted_sqlite_session(counter: CommitCounter, session_id: str, db_path: Path) -> Any:
    """An OpenAI Agents ``SQLiteSession`` whose every connection ``counter`` counts the commits of.

    The SDK configures each connection it opens (its own settings kept); ``counter`` is
    attached there too.
    """
    from agents import SQLiteSession

    class CountedSession(SQLiteSession):  # type: ignore[misc]
        @staticmethod
        def _configure_connection(conn: sqlite3.Connection) -> None:
            SQLiteSession._configure_connection(conn)
            counter.attach(conn)

    return CountedSession(session_id, db_path)


def openai_durability(agent: Any, db_path: Path) -> tuple[dict[str, str], float, list[Any]]:
    """What the OpenAI Agents SDK makes durable, untimed: the SQLite settings of the
    connections it opens, its commits a turn (over ``REPEATS`` turns of ``agent`` on a
    session at ``db_path``), and the items those turns stored."""
    from agents import Runner

    counter = CommitCounter()
    counted = counted_sqlite_session(counter, "count", db_path)

    async def count() -> tuple[dict[str, str], float, list[Any]]:
        settings = await asyncio.to_thread(lambda: pragmas(counted._get_connection()))
        counter.commits = 0
        for _ in range(REPEATS):
            await Runner.run(agent, QUESTION, session=counted)
        return settings, counter.commits / REPEATS, list(await counted.get_items())

    try:
        return asyncio.run(count())
    finally:
        counted.close()


def openai_peer(turns: int, resume_size: int, work: Path, floors: Floors) -> dict[str, Any]:
    from agents import Agent, Runner, SQLiteSession, set_tracing_disabled

    set_tracing_disabled(True)
    agent = Agent(name="bench", model=openai_model())

    async def run_async(session: Any) -> tuple[float, int]:
        async def turn() -> object:
            return await Runner.run(agent, QUESTION, session=session)

        mean = await per_message_async(turn, turns, floors)
        return mean, len(await session.get_items())

    session = SQLiteSession("bench", work / "async.db")
    async_s, held = asyncio.run(run_async(session))
    session.close()
    check_count(held, turns)

    session = SQLiteSession("bench", work / "sync.db")
    sync_s = per_message(lambda: Runner.run_sync(agent, QUESTION, session=session), turns, floors)
    check_count(len(asyncio.run(session.get_items())), turns)
    session.close()

    # What SQLite makes durable, and the items a Runner turn stores (for the history).
    settings, commits, template = openai_durability(agent, work / "count.db")

    pair = template[:2]
    history = [pair[i % 2] for i in range(resume_size)]
    (work / "resume").mkdir()
    bulk = SQLiteSession("resume", work / "resume" / "history.db")
    asyncio.run(bulk.add_items(history))
    bulk.close()

    def resume() -> int:
        async def load() -> int:
            session = SQLiteSession("resume", work / "resume" / "history.db")
            held = len(await session.get_items())
            session.close()
            return held

        return asyncio.run(load())

    resume_ms = best_ms(resume, resume_size)

    def restart(run: Path) -> Callable[[], int]:
        session = SQLiteSession("resume", run / "history.db")
        Runner.run_sync(Agent(name="bench", model=openai_model()), QUESTION, session=session)

        def held() -> int:
            count = len(asyncio.run(session.get_items()))
            session.close()
            return count

        return held

    restart_ms = best_restart_ms(work / "resume", restart, resume_size)
    return {
        "async_us": async_s * 1e6,
        "sync_us": sync_s * 1e6,
        "resume_ms": resume_ms,
        "resume_how": (
            "new SQLiteSession(...).get_items() only: no Agent, no Runner, no turn "
            "(what Runner.run reads before each turn)"
        ),
        "restart_ms": restart_ms,
        "restart_how": (
            "new Agent and SQLiteSession(...), Runner.run_sync(agent, QUESTION, session=session)"
        ),
        "durability": {**settings, "commits_per_turn": commits},
        "note": (
            f"SQLiteSession: journal_mode={settings['journal_mode']}, "
            f"synchronous={settings['synchronous']} (SQLite's default; the SDK sets none), "
            f"{commits:g} commits a turn; Runner reads the whole history back every turn"
        ),
    }


# --- LangGraph -------------------------------------------------------------------------


@functools.cache
def _langgraph_model_class() -> type:
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.outputs import ChatGeneration, ChatResult

    class InstantChatModel(BaseChatModel):  # type: ignore[misc]
        """A LangChain chat model whose reply is ``ANSWER``, at once."""

        @property
        def _llm_type(self) -> str:
            return "instant"

        def _generate(self, *args: Any, **kwargs: Any) -> Any:
            return ChatResult(generations=[ChatGeneration(message=AIMessage(ANSWER))])

        async def _agenerate(self, *args: Any, **kwargs: Any) -> Any:
            return ChatResult(generations=[ChatGeneration(message=AIMessage(ANSWER))])

    return InstantChatModel


def langgraph_builder(is_async: bool) -> Any:
    from langgraph.graph import END, START, MessagesState, StateGraph

    model = _langgraph_model_class()()
    builder = StateGraph(MessagesState)
    if is_async:

        async def call_model_async(state: Any) -> dict[str, Any]:
            return {"messages": [await model.ainvoke(state["messages"])]}

        builder.add_node("model", call_model_async)
    else:

        def call_model(state: Any) -> dict[str, Any]:
            return {"messages": [model.invoke(state["messages"])]}

        builder.add_node("model", call_model)
    builder.add_edge(START, "model")
    builder.add_edge("model", END)
    return builder


def langgraph_peer(turns: int, resume_size: int, work: Path, floors: Floors) -> dict[str, Any]:
    from langchain_core.messages import AIMessage, HumanMessage
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    config = {"configurable": {"thread_id": "bench"}}

    def question() -> dict[str, Any]:
        return {"messages": [HumanMessage(QUESTION)]}

    async def run_async() -> tuple[float, int]:
        async with AsyncSqliteSaver.from_conn_string(str(work / "async.db")) as saver:
            graph = langgraph_builder(is_async=True).compile(checkpointer=saver)
            mean = await per_message_async(lambda: graph.ainvoke(question(), config), turns, floors)
            state = await graph.aget_state(config)
            return mean, len(state.values["messages"])

    async_s, held = asyncio.run(run_async())
    check_count(held, turns)

    conn = sqlite3.connect(str(work / "sync.db"), check_same_thread=False)
    graph = langgraph_builder(is_async=False).compile(checkpointer=SqliteSaver(conn))
    sync_s = per_message(lambda: graph.invoke(question(), config), turns, floors)
    check_count(len(graph.get_state(config).values["messages"]), turns)
    conn.close()

    # What SQLite makes durable: the saver's connection settings and its commits a turn.
    conn = sqlite3.connect(str(work / "count.db"), check_same_thread=False)
    graph = langgraph_builder(is_async=False).compile(checkpointer=SqliteSaver(conn))
    graph.invoke(question(), config)  # the saver sets itself up (WAL) on first use
    settings = pragmas(conn)
    counter = CommitCounter()
    counter.attach(conn)
    for _ in range(REPEATS):
        graph.invoke(question(), config)
    commits = counter.commits / REPEATS
    conn.close()

    history = [
        HumanMessage(QUESTION) if i % 2 == 0 else AIMessage(ANSWER) for i in range(resume_size)
    ]
    resume_config = {"configurable": {"thread_id": "resume"}}
    (work / "resume").mkdir()
    conn = sqlite3.connect(str(work / "resume" / "history.db"), check_same_thread=False)
    graph = langgraph_builder(is_async=False).compile(checkpointer=SqliteSaver(conn))
    graph.update_state(resume_config, {"messages": history}, as_node="model")
    conn.close()

    def resume() -> int:
        conn = sqlite3.connect(str(work / "resume" / "history.db"), check_same_thread=False)
        graph = langgraph_builder(is_async=False).compile(checkpointer=SqliteSaver(conn))
        held = len(graph.get_state(resume_config).values["messages"])
        conn.close()
        return held

    resume_ms = best_ms(resume, resume_size)

    def restart(run: Path) -> Callable[[], int]:
        conn = sqlite3.connect(str(run / "history.db"), check_same_thread=False)
        graph = langgraph_builder(is_async=False).compile(checkpointer=SqliteSaver(conn))
        graph.invoke(question(), resume_config)

        def held() -> int:
            count = len(graph.get_state(resume_config).values["messages"])
            conn.close()
            return count

        return held

    restart_ms = best_restart_ms(work / "resume", restart, resume_size)
    return {
        "async_us": async_s * 1e6,
        "sync_us": sync_s * 1e6,
        "resume_ms": resume_ms,
        "resume_how": (
            "new connection, SqliteSaver and compiled graph, graph.get_state(config) only (no turn)"
        ),
        "restart_ms": restart_ms,
        "restart_how": (
            "new connection, SqliteSaver and compiled graph, "
            'graph.invoke({"messages": [HumanMessage(QUESTION)]}, config)'
        ),
        "durability": {**settings, "commits_per_turn": commits},
        "note": (
            f"SqliteSaver: journal_mode={settings['journal_mode']}, "
            f"synchronous={settings['synchronous']} (SQLite's default; the saver sets none), "
            f"{commits:g} commits a turn, each checkpoint holding the whole history"
        ),
    }


RUNNERS: dict[str, Callable[[int, int, Path, Floors], dict[str, Any]]] = {
    "strands": strands_peer,
    "openai": openai_peer,
    "langgraph": langgraph_peer,
}


def version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def main(argv: list[str] | None = None) -> int:
    """Measure the peers and write ``{"format", "turns", "resume_size", "floors_us", "peers"}``.

    ``peers`` maps each peer's name to its ``version``, ``async_us``, ``sync_us``
    (means per message), ``resume_ms``, ``resume_how`` (what its resume runs),
    ``restart_ms``, ``restart_how``, ``durability`` and ``note``, or
    to ``{"version", "error"}`` when that peer failed (the others still run).
    """
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--turns", type=int, required=True)
    parser.add_argument("--resume-size", type=int, required=True)
    parser.add_argument("--dir", required=True, help="an empty directory to work in")
    parser.add_argument("--out", required=True, help="where to write the JSON result")
    parser.add_argument("--only", help="comma-separated peers (default: all)")
    args = parser.parse_args(argv)
    names = args.only.split(",") if args.only else list(PEERS)
    unknown = sorted(set(names) - set(PEERS))
    if unknown:
        parser.error(f"unknown peers {unknown}; known: {', '.join(PEERS)}")
    base = Path(args.dir)
    base.mkdir(parents=True, exist_ok=True)
    floors = Floors(base)
    peers: dict[str, Any] = {}
    try:
        for name in names:
            work = base / name
            work.mkdir()
            result: dict[str, Any] = {"version": version(DISTRIBUTIONS[name])}
            try:
                result.update(RUNNERS[name](args.turns, args.resume_size, work, floors))
            except Exception as error:
                traceback.print_exc()
                result["error"] = f"{type(error).__name__}: {error}"
            peers[name] = result
    finally:
        floors.close()
    document = {
        "format": FORMAT,
        "turns": args.turns,
        "resume_size": args.resume_size,
        "python": sys.version.split()[0],
        "floors_us": {
            "file": statistics.fmean(floors.file_s) * 1e6 if floors.file_s else None,
            "sqlite": statistics.fmean(floors.sqlite_s) * 1e6 if floors.sqlite_s else None,
        },
        "peers": peers,
    }
    Path(args.out).write_text(json.dumps(document, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
