"""The peers on PostgreSQL for ``benchmarks/postgres.py``: LangGraph and OpenAI Agents.

This script runs in the peers' own virtual environment (their SDKs, not perdure);
``postgres.py --peers`` creates that environment (``benchmarks/peers_venv.py``) and
runs, with the same sizes as its own side-by-side rows:

    VENV/bin/python benchmarks/peers_postgres.py --dsn DSN --schema PREFIX \\
        --size N --turns T --out FILE

Each peer works on the same server in a schema of its own (``PREFIX_langgraph``,
``PREFIX_openai``; the floor's table in ``PREFIX_floor``), put first on the
``search_path`` of its connections (neither SDK takes a schema), and dropped at the
end. Each peer:

1. stores a history of N messages the cheapest way its own API allows, untimed (one
   ``update_state`` for LangGraph, one ``add_items`` for OpenAI Agents), with the same
   texts as perdure's rows (:func:`history_text`: ~340 characters, user and assistant
   in turn);
2. runs T turns over it through its full agent path, driven by the stub subclass of
   its SDK's model class that ``peers.py`` defines (it answers ``ANSWER`` at once):
   the median turn / 2 is the cost per message (two messages a turn); between two
   turns, untimed, one step of the PostgreSQL floor (``floors.PostgresFloor``: one
   ``INSERT`` + ``COMMIT``, ``synchronous_commit=on``), as perdure's rows step it;
3. resume: a reader opened before the clock reads the whole history back (N + 2T
   messages), best of 3 (its first read also connects);
4. a tail page of the last 50 messages, median of 20;
5. table size: ``pg_total_relation_size`` (heap, TOAST, indexes) summed over every
   table the SDK created in its schema.

How each peer is driven:

- LangGraph: a ``StateGraph(MessagesState)`` whose one node appends the stub chat
  model's ``AIMessage`` (``peers.langgraph_builder``), compiled with ``PostgresSaver``
  on one connection opened as ``PostgresSaver.from_conn_string`` opens it
  (autocommit, ``prepare_threshold=0``, ``dict_row``), ``setup()`` run once; a turn is
  ``graph.invoke({"messages": [HumanMessage(QUESTION)]}, config)`` (the sync face).
  Resume: ``graph.get_state(config)`` on another connection, saver and compiled graph.
  Tail page: LangGraph has no paged read of a thread's messages: ``get_state`` then
  ``values["messages"][-50:]``.
- OpenAI Agents: ``Runner.run(agent, QUESTION, session=session)`` (the async face; the
  Runner reads the whole history before each turn and adds the turn's items after it)
  with ``SQLAlchemySession.from_url(id, url="postgresql+psycopg://…",
  create_tables=True)``, tracing disabled. Resume: ``get_items()`` on a new
  ``SQLAlchemySession.from_url`` (a new engine). Tail page: ``get_items(limit=50)``.

It imports nothing from perdure, and the SDKs only inside the functions that use them,
so perdure's own environment can import it (``postgres.py`` and its tests do).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import importlib.metadata
import json
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from floors import PostgresFloor
from peers import ANSWER, QUESTION, langgraph_builder, openai_model

FORMAT = "perdure-peers-postgres/1"
PEERS = ("langgraph", "openai")
DISTRIBUTIONS = {"langgraph": "langgraph-checkpoint-postgres", "openai": "openai-agents"}
FILLER = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor "
PAGE = 50
REPEATS = 3
PAGES = 20


def history_text(i: int) -> str:
    """The text of the ``i``-th stored message, for perdure's rows and the peers alike."""
    return f"message {i}: " + (FILLER * 6)[: 400 - 60]


def floor_body() -> str:
    """What the floor inserts: the JSON of the first stored message, as perdure stores it."""
    message = {"role": "user", "content": [{"text": history_text(0)}]}
    return json.dumps(message)


def schema_names(prefix: str) -> dict[str, str]:
    """The schemas a run works in: one per peer, and the floor's."""
    return {name: f"{prefix}_{name}" for name in (*PEERS, "floor")}


def search_path(schema: str) -> str:
    """libpq ``options`` that put ``schema`` (a plain lowercase name) first."""
    if not schema.replace("_", "").isalnum() or schema.lower() != schema:
        raise ValueError(f"schema names here are lowercase letters, digits and _: {schema!r}")
    return f"-c search_path={schema}"


def timed_turns(turn: Callable[[], object], turns: int, floor: PostgresFloor) -> list[float]:
    times = []
    for _ in range(turns):
        floor.once()
        start = time.perf_counter()
        turn()
        times.append(time.perf_counter() - start)
    return times


def check_held(held: int, expected: int, doing: str) -> None:
    if held != expected:
        raise RuntimeError(f"{doing}: the peer holds {held} messages, expected {expected}")


def schema_tables(dsn: str, schema: str) -> dict[str, int]:
    """Each table of ``schema`` and its ``pg_total_relation_size`` (heap, TOAST, indexes)."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relkind IN ('r', 'p') ORDER BY c.relname",
            (schema,),
        ).fetchall()
    return {name: int(size) for name, size in rows}


def figures(
    turn_s: list[float], resume_s: list[float], page_s: list[float], tables: dict[str, int]
) -> dict[str, Any]:
    return {
        "turn_us": statistics.median(turn_s) / 2 * 1e6,
        "resume_ms": min(resume_s) * 1e3,
        "page_ms": statistics.median(page_s) * 1e3,
        "table_bytes": sum(tables.values()),
        "tables": tables,
    }


# --- LangGraph -------------------------------------------------------------------------


def langgraph_peer(
    dsn: str, schema: str, size: int, turns: int, floor: PostgresFloor
) -> dict[str, Any]:
    import psycopg
    from langchain_core.messages import AIMessage, HumanMessage
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg.rows import dict_row

    def connect() -> Any:
        # As PostgresSaver.from_conn_string opens its connection, in the peer's schema.
        return psycopg.connect(
            dsn,
            autocommit=True,
            prepare_threshold=0,
            row_factory=dict_row,
            options=search_path(schema),
        )

    config = {"configurable": {"thread_id": "bench"}}
    conn = connect()
    saver = PostgresSaver(conn)
    saver.setup()
    graph = langgraph_builder(is_async=False).compile(checkpointer=saver)
    history = [
        HumanMessage(history_text(i)) if i % 2 == 0 else AIMessage(history_text(i))
        for i in range(size)
    ]
    graph.update_state(config, {"messages": history}, as_node="model")
    del history
    setting = conn.execute("SHOW synchronous_commit").fetchone()["synchronous_commit"]
    count_checkpoints = "SELECT count(*) AS n FROM checkpoints"
    count_blobs = "SELECT count(*) AS n FROM checkpoint_blobs WHERE channel = 'messages'"
    checkpoints_before = conn.execute(count_checkpoints).fetchone()["n"]
    blobs_before = conn.execute(count_blobs).fetchone()["n"]

    def turn() -> object:
        return graph.invoke({"messages": [HumanMessage(QUESTION)]}, config)

    turn_s = timed_turns(turn, turns, floor)
    held = size + 2 * turns
    check_held(len(graph.get_state(config).values["messages"]), held, f"after {turns} turns")
    checkpoints_per_turn = (
        conn.execute(count_checkpoints).fetchone()["n"] - checkpoints_before
    ) / turns
    blobs = conn.execute(count_blobs).fetchone()["n"]
    blobs_per_turn = (blobs - blobs_before) / turns
    conn.close()

    reader = connect()
    read_graph = langgraph_builder(is_async=False).compile(checkpointer=PostgresSaver(reader))
    resume_s, page_s = [], []
    for _ in range(REPEATS):
        start = time.perf_counter()
        messages = read_graph.get_state(config).values["messages"]
        resume_s.append(time.perf_counter() - start)
        check_held(len(messages), held, "resume")
    for _ in range(PAGES):
        start = time.perf_counter()
        page = read_graph.get_state(config).values["messages"][-PAGE:]
        page_s.append(time.perf_counter() - start)
    if len(page) != PAGE or page[-1].content != ANSWER:
        raise RuntimeError("the tail page is not the last 50 messages")
    reader.close()
    return {
        **figures(turn_s, resume_s, page_s, schema_tables(dsn, schema)),
        "messages": held,
        "face": "sync",
        "label": "LangGraph {version}, PostgresSaver",
        "turn_how": (
            "StateGraph(MessagesState), one node appending the stub model's AIMessage, "
            "compiled with PostgresSaver on one connection; "
            'graph.invoke({"messages": [HumanMessage(QUESTION)]}, config)'
        ),
        "resume_how": (
            "graph.get_state(config).values['messages'] on another connection, saver and "
            "compiled graph (no turn)"
        ),
        "page_how": (
            "no paged read of a thread's messages: graph.get_state(config), then "
            "values['messages'][-50:] (the whole history read and decoded)"
        ),
        "durability": {
            "synchronous_commit": setting,
            "checkpoints_per_turn": checkpoints_per_turn,
            "message_blobs_per_turn": blobs_per_turn,
            "message_blobs": blobs,
        },
        "note": (
            f"PostgresSaver: autocommit, synchronous_commit={setting}; "
            f"{checkpoints_per_turn:g} checkpoints a turn, {blobs_per_turn:g} of them writing "
            f"the whole message list as a new blob, all kept ({blobs} blobs of the messages "
            "channel; the history was stored as one checkpoint, where a thread grown turn by "
            "turn would keep a blob per step)"
        ),
    }


# --- OpenAI Agents ---------------------------------------------------------------------


def openai_peer(
    dsn: str, schema: str, size: int, turns: int, floor: PostgresFloor
) -> dict[str, Any]:
    from agents import Agent, Runner, set_tracing_disabled
    from agents.extensions.memory import SQLAlchemySession
    from sqlalchemy import text
    from sqlalchemy.engine import make_url

    set_tracing_disabled(True)
    url = make_url(dsn).set(drivername="postgresql+psycopg").render_as_string(hide_password=False)

    writes = [0]

    class CountedSession(SQLAlchemySession):  # type: ignore[misc]
        """Counts the ``add_items`` calls (one transaction each) of the template turn."""

        async def add_items(self, items: list[Any]) -> None:
            writes[0] += 1
            await super().add_items(items)

    def open_session(session_id: str, kind: Any = SQLAlchemySession) -> Any:
        return kind.from_url(
            session_id,
            url=url,
            create_tables=True,
            engine_kwargs={"connect_args": {"options": search_path(schema)}},
        )

    agent = Agent(name="bench", model=openai_model())
    held = size + 2 * turns

    async def write() -> tuple[list[float], str]:
        # The items a Runner turn stores, as the template of the stored history.
        template = open_session("template", CountedSession)
        await Runner.run(agent, QUESTION, session=template)
        pair = await template.get_items()
        await template.clear_session()
        await template.engine.dispose()
        if len(pair) != 2:
            raise RuntimeError(f"a Runner turn stored {len(pair)} items, expected 2")
        history = []
        for i in range(size):
            item = copy.deepcopy(pair[i % 2])
            if i % 2 == 0:
                item["content"] = history_text(i)
            else:
                item["content"][0]["text"] = history_text(i)
            history.append(item)
        session = open_session("bench")
        await session.add_items(history)
        async with session.engine.connect() as conn:
            setting = (await conn.execute(text("SHOW synchronous_commit"))).scalar_one()
        times = []
        for _ in range(turns):
            floor.once()
            start = time.perf_counter()
            await Runner.run(agent, QUESTION, session=session)
            times.append(time.perf_counter() - start)
        check_held(len(await session.get_items()), held, f"after {turns} turns")
        await session.engine.dispose()
        return times, str(setting)

    async def read() -> tuple[list[float], list[float]]:
        reader = open_session("bench")
        resume_s, page_s = [], []
        for _ in range(REPEATS):
            start = time.perf_counter()
            items = await reader.get_items()
            resume_s.append(time.perf_counter() - start)
            check_held(len(items), held, "resume")
        for _ in range(PAGES):
            start = time.perf_counter()
            page = await reader.get_items(limit=PAGE)
            page_s.append(time.perf_counter() - start)
        if len(page) != PAGE or page[-1]["content"][0]["text"] != ANSWER:
            raise RuntimeError("the tail page is not the last 50 items")
        await reader.engine.dispose()
        return resume_s, page_s

    turn_s, setting = asyncio.run(write())
    resume_s, page_s = asyncio.run(read())
    return {
        **figures(turn_s, resume_s, page_s, schema_tables(dsn, schema)),
        "messages": held,
        "face": "async",
        "label": "OpenAI Agents {version}, SQLAlchemySession",
        "turn_how": (
            "Runner.run(agent, QUESTION, session=session), the stub Model subclass, "
            "SQLAlchemySession.from_url(id, url='postgresql+psycopg://…', create_tables=True)"
        ),
        "resume_how": "get_items() on a new SQLAlchemySession.from_url (no Agent, no Runner)",
        "page_how": "get_items(limit=50)",
        "durability": {"synchronous_commit": setting, "add_items_per_turn": writes[0]},
        "note": (
            f"SQLAlchemySession: one transaction per add_items, {writes[0]} a turn, "
            f"synchronous_commit={setting}; the Runner reads the whole history back every turn"
        ),
    }


RUNNERS: dict[str, Callable[[str, str, int, int, PostgresFloor], dict[str, Any]]] = {
    "langgraph": langgraph_peer,
    "openai": openai_peer,
}


def version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def main(argv: list[str] | None = None) -> int:
    """Measure the peers and write ``{"format", "size", "turns", "floor_us", "peers"}``.

    ``peers`` maps each peer's name to its ``version``, ``label``, ``face`` (``sync``
    or ``async``: perdure's face it is set against), ``turn_us`` (median per message),
    ``resume_ms``, ``page_ms``, ``table_bytes`` (and ``tables``, by name),
    ``messages`` (held when measured), ``turn_how``, ``resume_how``, ``page_how``,
    ``durability`` and ``note``; or to ``{"version", "error"}`` when that peer failed
    (the others still run). Every schema the run made is dropped before it returns.
    """
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--dsn", required=True, help="postgresql://… URL of the server")
    parser.add_argument("--schema", required=True, help="prefix of the schemas to work in")
    parser.add_argument("--size", type=int, required=True, help="messages stored before turns")
    parser.add_argument("--turns", type=int, required=True)
    parser.add_argument("--out", required=True, help="where to write the JSON result")
    parser.add_argument("--only", help="comma-separated peers (default: all)")
    args = parser.parse_args(argv)
    names = args.only.split(",") if args.only else list(PEERS)
    unknown = sorted(set(names) - set(PEERS))
    if unknown:
        parser.error(f"unknown peers {unknown}; known: {', '.join(PEERS)}")
    if args.size < PAGE or args.turns < 1:
        parser.error(f"--size must be at least {PAGE} and --turns at least 1")
    schemas = schema_names(args.schema)
    for schema in schemas.values():
        search_path(schema)  # refuse a name that would need quoting, before anything

    import psycopg

    with psycopg.connect(args.dsn, autocommit=True) as conn:
        server = conn.execute("SHOW server_version").fetchone()
        for schema in schemas.values():
            conn.execute(f'CREATE SCHEMA "{schema}"')
    floor: PostgresFloor | None = None
    peers: dict[str, Any] = {}
    try:
        floor = PostgresFloor(args.dsn, schemas["floor"], floor_body())
        for name in names:
            result: dict[str, Any] = {"version": version(DISTRIBUTIONS[name])}
            try:
                result.update(RUNNERS[name](args.dsn, schemas[name], args.size, args.turns, floor))
            except Exception as error:
                traceback.print_exc()
                result["error"] = f"{type(error).__name__}: {error}"
            peers[name] = result
        floor_us = statistics.median(floor.samples) * 1e6 if floor.samples else None
    finally:
        if floor is not None:
            floor.close()
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            for schema in schemas.values():
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    document = {
        "format": FORMAT,
        "size": args.size,
        "turns": args.turns,
        "server": server[0] if server else "?",
        "python": sys.version.split()[0],
        "floor_us": floor_us,
        "peers": peers,
    }
    Path(args.out).write_text(json.dumps(document, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
