"""perdure under other frameworks, against the frameworks' own persistence.

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/adapters.py [--items N] [--steps N]
[--postgres DSN] [--quick]`` (``--quick``: 1,000 items, 200 steps). Needs
``perdure[openai-agents]`` and ``perdure[langgraph]`` with ``langgraph-checkpoint-sqlite``
(the ``dev`` extra has them); the PostgreSQL rows also need
``langgraph-checkpoint-postgres`` and a server (``--postgres``, default
``$PERDURE_TEST_PG``; skipped with the reason when either is missing).

**OpenAI Agents: PerdureSession (on SQLite) against the SDK's own SQLiteSession.**

Both sessions get the same items — a cycle of what ``Runner.run`` stores: a user
message, a reasoning item, a function call, its output and an assistant message, each
~300 bytes of JSON — in a database of their own in one temporary directory, in the
same run, one after the other (the SDK first); at the end both must hold equal items.
Both commit durably: the SDK's
``SQLiteSession`` in WAL mode with SQLite's default ``synchronous=FULL``, perdure's
``SQLiteSessionStore`` with its default ``durability="commit"``. Rows:

- ``add µs/item``: ``add_items`` of one item per call, as a run adds them one turn at a
  time (median µs per call over the whole history; perdure takes the writer lock and
  checks the tail on each);
- ``add batch µs/item``: ``add_items`` of 100 items per call, per item (median of 5);
- ``get last 50 ms``: ``get_items(limit=50)`` at N + 500 items (median of 50);
- ``get all ms``: ``get_items()`` at N + 500 items, all items decoded (best of 3; perdure
  verifies the hash chain of every row on the way);
- ``pop ms``: ``pop_item()`` at N + 500 items (median of 5; perdure rewrites the history,
  the SDK deletes a row);
- ``disk KB``: the database file and its WAL after the run.

The last column is perdure / SDK (below 1: perdure is faster or smaller).

**LangGraph: PerdureSaver against LangGraph's own savers, on SQLite (SqliteSaver) and
on PostgreSQL (PostgresSaver).** One ``StateGraph(MessagesState)`` whose node appends
one ~300-byte message per super-step and loops until the thread holds ``--steps``
messages: one ``graph.invoke`` of N steps, N checkpoints, each saver in a database
of its own (SQLite: a file each, WAL, ``synchronous=FULL`` for perdure's storage and
SQLite's default (``FULL``) for ``SqliteSaver``; PostgreSQL: a schema each), the same
graph, run with ``durability="sync"`` (each step's checkpoint is saved before the next
step starts, so a step's time includes its saver's). Rows:

- ``ms/step``: the run's wall time / N;
- ``ms/step last 10%``: the mean of the last tenth of the steps (per step cost at
  about N messages; timed at each node call);
- ``get_state ms``: a new saver (its connection included) and compiled graph, then
  ``graph.get_state`` (cold);
- ``disk MB``: the database file and its WAL (SQLite), or ``pg_total_relation_size``
  of every table of the schema (PostgreSQL), after the first run.

Each saver runs the graph ``--repeats`` times (default 2) on new threads, the savers
taking turns, and the best of each time is kept (the machine is shared: the best is
the least disturbed); ``get_state`` is the best of 3.

Both savers must end with equal messages (type and text; ids are random per run). The
last column is perdure / LangGraph.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

try:
    from agents.memory import SQLiteSession
except ImportError:  # pragma: no cover - depends on the environment
    sys.exit(
        "benchmarks/adapters.py needs the OpenAI Agents SDK: pip install -e '.[openai-agents]'"
    )

from perdure.adapters.openai_agents import PerdureSession

try:
    from langchain_core.messages import AIMessage, HumanMessage
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import END, MessagesState, StateGraph

    from perdure.adapters.langgraph import PerdureSaver
except ImportError:  # pragma: no cover - depends on the environment
    sys.exit(
        "benchmarks/adapters.py needs LangGraph and its SQLite saver: "
        "pip install -e '.[langgraph]' langgraph-checkpoint-sqlite"
    )

FILLER = "lorem ipsum dolor sit amet " * 8


def item(i: int) -> dict[str, Any]:
    """The ``i``-th item of the cycle a run stores (~300 bytes of JSON)."""
    kind = i % 5
    text = f"{i} {FILLER}"
    if kind == 0:
        return {"role": "user", "content": text}
    if kind == 1:
        return {
            "type": "reasoning",
            "id": f"rs_{i}",
            "summary": [{"type": "summary_text", "text": text}],
        }
    if kind == 2:
        return {
            "type": "function_call",
            "id": f"fc_{i}",
            "call_id": f"call_{i}",
            "name": "lookup",
            "arguments": '{"q": "' + text + '"}',
            "status": "completed",
        }
    if kind == 3:
        return {"type": "function_call_output", "call_id": f"call_{i - 1}", "output": text}
    return {
        "type": "message",
        "id": f"msg_{i}",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


async def timed(call: Callable[[], Awaitable[Any]]) -> float:
    start = time.perf_counter()
    await call()
    return time.perf_counter() - start


def disk(path: Path) -> int:
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))


async def measure(session: Any, count: int) -> dict[str, float]:
    adds = [await timed(lambda i=i: session.add_items([item(i)])) for i in range(count)]
    batches = []
    for b in range(5):
        extra = [item(count + 100 * b + i) for i in range(100)]
        batches.append(await timed(lambda extra=extra: session.add_items(extra)) / len(extra))
    batch = statistics.median(batches)
    tail = [await timed(lambda: session.get_items(limit=50)) for _ in range(50)]
    everything = [await timed(lambda: session.get_items()) for _ in range(3)]
    pops = [await timed(session.pop_item) for _ in range(5)]
    return {
        "add µs/item": statistics.median(adds) * 1e6,
        "add batch µs/item": batch * 1e6,
        "get last 50 ms": statistics.median(tail) * 1e3,
        "get all ms": min(everything) * 1e3,
        "pop ms": statistics.median(pops) * 1e3,
    }


async def run(count: int, directory: Path) -> dict[str, dict[str, float]]:
    results: dict[str, dict[str, float]] = {}
    sdk_path, perdure_path = directory / "sdk.db", directory / "perdure.db"
    sdk = SQLiteSession("bench", sdk_path)
    perdure = PerdureSession("bench", f"sqlite:{perdure_path}")
    try:
        order = [("SQLiteSession", sdk), ("PerdureSession", perdure)]
        for name, session in order:
            results[name] = await measure(session, count)
        if await sdk.get_items() != await perdure.get_items():
            raise AssertionError("the two sessions ended with different items")
    finally:
        sdk.close()
        perdure.close()
    results["SQLiteSession"]["disk KB"] = disk(sdk_path) / 1024
    results["PerdureSession"]["disk KB"] = disk(perdure_path) / 1024
    return results


# --- LangGraph -------------------------------------------------------------------------


def step_message(i: int) -> Any:
    text = f"{i} {FILLER}{FILLER[:60]}"
    return HumanMessage(text) if i % 2 == 0 else AIMessage(text)


def messages_graph(steps: int, stamps: list[float]) -> Any:
    """A graph whose node appends one message per super-step until ``steps`` are held."""

    def chat(state: dict[str, Any]) -> dict[str, Any]:
        stamps.append(time.perf_counter())
        return {"messages": [step_message(len(state["messages"]))]}

    def more(state: dict[str, Any]) -> str:
        return "chat" if len(state["messages"]) < steps else END

    builder = StateGraph(MessagesState)
    builder.add_node("chat", chat)
    builder.set_entry_point("chat")
    builder.add_conditional_edges("chat", more)
    return builder


def run_graph(saver: Any, steps: int, thread: str) -> dict[str, float]:
    stamps: list[float] = []
    graph = messages_graph(steps, stamps).compile(checkpointer=saver)
    config = {"configurable": {"thread_id": thread}, "recursion_limit": steps + 10}
    start = time.perf_counter()
    graph.invoke({"messages": []}, config, durability="sync")
    total = time.perf_counter() - start
    stamps.append(start + total)
    tenth = max(1, steps // 10)
    last = (stamps[-1] - stamps[-1 - tenth]) / tenth
    return {"ms/step": total / steps * 1e3, "ms/step last 10%": last * 1e3}


def same(messages: list[Any]) -> list[tuple[str, Any]]:
    """What two runs must agree on (message ids are random per run)."""
    return [(type(m).__name__, m.content) for m in messages]


def close_saver(saver: Any) -> None:
    close = getattr(saver, "close", None)
    conn = getattr(saver, "conn", None)  # LangGraph's savers keep it there, unclosed
    for closing in (close, getattr(conn, "close", None)):
        if callable(closing):
            closing()


def cold_state_ms(open_saver: Callable[[], Any], steps: int) -> tuple[float, list[Any]]:
    start = time.perf_counter()  # opening counts: one saver connects at once, one lazily
    saver = open_saver()
    try:
        graph = messages_graph(steps, []).compile(checkpointer=saver)
        values = graph.get_state({"configurable": {"thread_id": "bench-0"}}).values
        return (time.perf_counter() - start) * 1e3, values["messages"]
    finally:
        close_saver(saver)


def compare(
    savers: dict[str, Callable[[], Any]],
    sizes: dict[str, Callable[[], int]],
    steps: int,
    repeats: int,
) -> dict[str, dict[str, float]]:
    """Each saver's rows: runs alternate between the savers, best of ``repeats``
    (thread ``bench-<r>``); disk after the first; ``get_state`` best of 3."""
    results: dict[str, dict[str, float]] = {name: {} for name in savers}
    for repeat in range(repeats):
        for name, open_saver in savers.items():
            saver = open_saver()
            try:
                found = run_graph(saver, steps, f"bench-{repeat}")
            finally:
                close_saver(saver)
            for key, value in found.items():
                results[name][key] = min(results[name].get(key, value), value)
        if repeat == 0:
            disk_mb = {name: size() / 1e6 for name, size in sizes.items()}
    held = {}
    for name, open_saver in savers.items():
        reads = [cold_state_ms(open_saver, steps) for _ in range(3)]
        results[name]["get_state ms"] = min(ms for ms, _ in reads)
        held[name] = same(reads[0][1])
        results[name]["disk MB"] = disk_mb[name]
    first, *others = held.values()
    if len(first) != steps or any(other != first for other in others):
        raise AssertionError("the savers ended with different messages")
    return results


def langgraph_sqlite(steps: int, directory: Path, repeats: int) -> dict[str, dict[str, float]]:
    import sqlite3

    peer_path, ours_path = directory / "lg-sqlite.db", directory / "lg-perdure.db"
    return compare(
        {
            "SqliteSaver": lambda: SqliteSaver(sqlite3.connect(peer_path, check_same_thread=False)),
            "PerdureSaver": lambda: PerdureSaver(f"sqlite:{ours_path}"),
        },
        {"SqliteSaver": lambda: disk(peer_path), "PerdureSaver": lambda: disk(ours_path)},
        steps,
        repeats,
    )


def postgres_reason(dsn: str | None) -> str | None:
    """Why the PostgreSQL rows cannot run (None: they can)."""
    if not dsn:
        return "no --postgres DSN (nor $PERDURE_TEST_PG)"
    try:
        import psycopg
        from langgraph.checkpoint.postgres import PostgresSaver  # noqa: F401
    except ImportError as exc:
        return f"{exc.name} is not installed (pip install langgraph-checkpoint-postgres)"
    try:
        with psycopg.connect(dsn, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        return f"no PostgreSQL server at {dsn}: {' '.join(str(exc).split())}"
    return None


def langgraph_postgres(steps: int, dsn: str, repeats: int) -> dict[str, dict[str, float]]:
    import uuid

    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg.rows import dict_row

    tag = uuid.uuid4().hex[:10]
    peer_schema, ours_schema = f"bench_lg_peer_{tag}", f"bench_lg_perdure_{tag}"

    def schema_bytes(schema: str) -> int:
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %s AND c.relkind IN ('r', 'p')",
                (schema,),
            ).fetchone()
        return int(row[0]) if row else 0

    def peer_conn() -> Any:
        return psycopg.connect(
            dsn,
            autocommit=True,
            prepare_threshold=0,
            row_factory=dict_row,
            options=f"-c search_path={peer_schema}",
        )

    ours_url = f"{dsn}?schema={ours_schema}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {peer_schema}")
    try:
        setup = PostgresSaver(peer_conn())
        setup.setup()
        close_saver(setup)
        results = compare(
            {
                "PostgresSaver": lambda: PostgresSaver(peer_conn()),
                "PerdureSaver": lambda: PerdureSaver(ours_url),
            },
            {
                "PostgresSaver": lambda: schema_bytes(peer_schema),
                "PerdureSaver": lambda: schema_bytes(ours_schema),
            },
            steps,
            repeats,
        )
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            for schema in (peer_schema, ours_schema):
                admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    return results


def table(title: str, peer: str, results: dict[str, dict[str, float]], unit: str) -> None:
    name = "PerdureSession" if peer == "SQLiteSession" else "PerdureSaver"
    theirs, ours = results[peer], results[name]
    print(title)
    print(f"{'measure':<20}{peer:>15}{name:>16}{'ratio':>8}")
    for key in theirs:
        ratio = ours[key] / theirs[key] if theirs[key] else float("nan")
        print(f"{key:<20}{theirs[key]:>15.{unit}f}{ours[key]:>16.{unit}f}{ratio:>8.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=10_000, help="items stored (default 10000)")
    parser.add_argument(
        "--steps", type=int, default=1000, help="LangGraph super-steps (default 1000)"
    )
    parser.add_argument(
        "--postgres",
        default=os.environ.get("PERDURE_TEST_PG"),
        metavar="DSN",
        help="PostgreSQL for the LangGraph rows (default $PERDURE_TEST_PG)",
    )
    parser.add_argument(
        "--repeats", type=int, default=2, help="LangGraph runs per saver, best kept (default 2)"
    )
    parser.add_argument("--quick", action="store_true", help="1000 items, 200 steps")
    parser.add_argument("--dir", type=Path, default=None, help="where the databases go (temp)")
    args = parser.parse_args(argv)
    count = 1000 if args.quick else args.items
    steps = 200 if args.quick else args.steps
    directory = Path(tempfile.mkdtemp(prefix="perdure-adapters-", dir=args.dir))
    try:
        results = asyncio.run(run(count, directory))
        graph_sqlite = langgraph_sqlite(steps, directory, args.repeats)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    reason = postgres_reason(args.postgres)
    graph_postgres = (
        langgraph_postgres(steps, args.postgres, args.repeats) if reason is None else None
    )
    table(
        f"PerdureSession (SQLite) vs the SDK's SQLiteSession at {count} items",
        "SQLiteSession",
        results,
        "1",
    )
    print()
    table(
        f"PerdureSaver (SQLite) vs LangGraph's SqliteSaver at {steps} steps",
        "SqliteSaver",
        graph_sqlite,
        "2",
    )
    print()
    if graph_postgres is None:
        print(f"PerdureSaver vs PostgresSaver: not measured ({reason})")
    else:
        table(
            f"PerdureSaver (PostgreSQL) vs LangGraph's PostgresSaver at {steps} steps",
            "PostgresSaver",
            graph_postgres,
            "2",
        )
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus; ratio = perdure / peer")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
