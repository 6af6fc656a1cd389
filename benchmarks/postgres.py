"""PostgreSQL session store benchmark: append, turn, agent path, resume, tail page, size,
concurrency, and the peers side by side.

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/postgres.py [--quick] [--peers] [--dsn DSN]``
(default DSN ``postgresql://postgres@127.0.0.1:5432/test``; each session size, the
concurrent writers and each peer work in a schema of their own, all dropped at the
end).

For each session size it prints, next to the floor measured step by step between
the store's own appends and turns (so a noisy neighbour slows both alike) — one
``INSERT`` of the same ~400-byte message and a ``COMMIT`` on one psycopg connection,
``synchronous_commit=on`` (``floors.PostgresFloor``):

- the durable append as a Session makes it during a turn (writer lease held, tail
  checked), in µs and in floors; beside it the hop alone (``asyncio.to_thread`` of
  nothing), which the store's other calls pay (psycopg's blocking calls run in
  worker threads) and its appends do not (they go on a connection the event loop
  drives itself, ``PostgresDatabase.loop_connection``);
- a whole turn at the store (take the lease, two appends, give it back);
- the agent path: a :class:`~perdure.Agent` (the instant model of ``agent_path.py``,
  ``NullConversationManager``: the whole history kept) over ``Session.resume`` of the
  session, answering ``--turns`` turns: µs per message (median turn / 2) through
  ``await agent.invoke_async(...)`` ("invoke us") and through ``agent(...)``
  ("agent() us");
- ``get`` of the whole session with its chain verified (``resume`` ms), and a
  resume with the default window (the last 40 messages, ``get(offset=…)``);
- a tail page of 50 (``read_history_page``);
- the table's bytes (heap, TOAST and indexes of the messages table) per raw
  message byte.

Then ``--writers`` (8) writer processes, each on its own session, append for a few
seconds durably, and again with ``synchronous_commit=off``: the rates and their ratio
(the server's group commit should carry the durable rate).

Last, side by side at ``--peers-size`` stored messages (default 10,000; added to the
sizes when missing), on the same server: perdure's agent path of that size's row
(each face), and with ``--peers`` LangGraph's ``PostgresSaver`` driving a messages
graph and the OpenAI Agents SDK's ``SQLAlchemySession`` on ``postgresql+psycopg``
under ``Runner.run``, each storing the same history and then answering the same
number of turns (``benchmarks/peers_postgres.py`` says exactly how each is driven).
Columns: µs per message during the turns (median turn / 2), resume (the whole
history read back, best of 3), a tail page of 50 (median of 20), and the bytes of
every table the system created in its schema (``pg_total_relation_size``) — in MB
and per message held. A second table gives each peer / perdure per column (µs per
message against perdure's row of the peer's face: LangGraph's ``graph.invoke``
against ``agent(...)``, the OpenAI ``Runner.run`` against ``invoke_async``; size per
message held), and a last line says whether perdure is ahead on every column (faster;
smaller for the size) and names each column where it is not. The peers' SDKs live in
``benchmarks/.peers-venv`` (``benchmarks/peers_venv.py``: created from
``benchmarks/peers-requirements.txt`` the first time); ``--peers-json FILE`` reads a
result of ``peers_postgres.py`` written earlier instead.

Targets (issue 17): durable append <= 1.3x the floor; eight durable writers >=
0.7x the rate of the same writers without fsync; resume of 10k <= 60 ms; a tail
page of 50 <= 2 ms at 100k; perdure ahead of both peers on every column.

Example: ``PYTHONPATH=src .venv/bin/python benchmarks/postgres.py --quick --peers``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg

from perdure.stores.postgres import PostgresSessionStore
from perdure.types import Message

sys.path.insert(0, str(Path(__file__).resolve().parent))
import side_by_side as side
from floors import PostgresFloor
from peers import ANSWER, QUESTION
from peers_postgres import FORMAT as PEERS_FORMAT
from peers_postgres import PAGE, floor_body, history_text, schema_names, schema_tables
from peers_venv import PEERS_VENV, ensure_peers_venv, run_peers_script
from server_turns import agent_turns_async, agent_turns_sync, read_back
from side_by_side import Layout

BENCHMARKS = Path(__file__).resolve().parent
PEERS_SCRIPT = BENCHMARKS / "peers_postgres.py"
DSN = "postgresql://postgres@127.0.0.1:5432/test"
PEERS_SIZE = 10_000


def message(i: int) -> Message:
    """A ~400-byte message (as JSON), as benchmarks/sessions.py writes them."""
    role = "user" if i % 2 == 0 else "assistant"
    return {"role": role, "content": [{"text": history_text(i)}]}  # type: ignore[typeddict-item]


def raw_bytes(messages: list[Message]) -> int:
    return sum(len(json.dumps(m, separators=(",", ":"))) for m in messages)


async def build(dsn: str, schema: str, session: str, history: list[Message]) -> None:
    """Store ``history`` as ``session``, a thousand messages a commit, without fsyncs."""
    bulk = PostgresSessionStore(dsn, schema=schema, durability="none")
    await bulk.create(session)
    for end in range(1000, len(history) + 1, 1000):
        await bulk.commit(session, history[:end])
    if len(history) % 1000:
        await bulk.commit(session, history)
    await bulk.flush(session)
    bulk.close()


async def store_turns(
    durable: PostgresSessionStore,
    session: str,
    history: list[Message],
    appends: int,
    floor: PostgresFloor,
) -> dict[str, list[float]]:
    """Appends under one lease, then whole turns at the store; ``history`` grows with them."""
    tail = (await durable.get(session, offset=len(history))).tail
    times, hops = [], []
    async with durable.writer_lock(session):
        for _ in range(appends):
            floor.once()
            start = time.perf_counter()
            await asyncio.to_thread(int)  # the hop to a worker thread and back, alone
            hops.append(time.perf_counter() - start)
            history.append(message(len(history)))
            start = time.perf_counter()
            tail = (await durable.commit(session, history, expected_tail=tail)).tail
            times.append(time.perf_counter() - start)
    turns = []
    for _ in range(max(10, appends // 4)):
        floor.once()
        start = time.perf_counter()
        async with durable.writer_lock(session):
            for _ in range(2):
                history.append(message(len(history)))
                tail = (await durable.commit(session, history, expected_tail=tail)).tail
        turns.append(time.perf_counter() - start)
    return {"append": times, "hop": hops, "turn": turns}


def measure(dsn: str, schema: str, size: int, appends: int, turns: int) -> dict[str, float]:
    """One row: a session of ``size`` messages in ``schema`` (which holds nothing else)."""
    history = [message(i) for i in range(size)]
    session = f"bench-{size}"
    asyncio.run(build(dsn, schema, session, history))
    durable = PostgresSessionStore(dsn, schema=schema)
    floor = PostgresFloor(dsn, schema, floor_body())
    try:
        store = asyncio.run(store_turns(durable, session, history, appends, floor))
        invoke = asyncio.run(agent_turns_async(durable, session, turns, floor))
        call, messages = agent_turns_sync(durable, session, turns, floor)
    finally:
        floor.close()  # its table dropped: the schema holds perdure's tables alone
        durable.close()
    expected = history + [m for _ in range(2 * turns) for m in message_pair()]
    assert messages == expected, "the agents' turns are not the stored history"
    reads = asyncio.run(read_back(PostgresSessionStore(dsn, schema=schema), session, messages))
    tables = schema_tables(dsn, schema)
    return {
        "floor_us": statistics.median(floor.samples) * 1e6,
        "append_us": statistics.median(store["append"]) * 1e6,
        "hop_us": statistics.median(store["hop"]) * 1e6,
        "turn_us": statistics.median(store["turn"]) * 1e6,
        "invoke_us": statistics.median(invoke) / 2 * 1e6,
        "call_us": statistics.median(call) / 2 * 1e6,
        **reads,
        "table_bytes": float(tables["perdure_messages"]),
        "raw_bytes": float(raw_bytes(messages)),
        "schema_bytes": float(sum(tables.values())),
        "messages": float(len(messages)),
    }


def message_pair() -> list[Message]:
    """The two messages an agent turn of this benchmark stores."""
    return [
        {"role": "user", "content": [{"text": QUESTION}]},
        {"role": "assistant", "content": [{"text": ANSWER}]},
    ]


async def write_for(dsn: str, schema: str, session: str, durability: str, seconds: float) -> int:
    """Append as a Session's turns do (lease, two appends, release) for ``seconds``."""
    store = PostgresSessionStore(dsn, schema=schema, durability=durability)  # type: ignore[arg-type]
    await store.create(session, exist_ok=True)
    record = await store.get(session)
    history, tail = list(record.messages), record.tail
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    sys.stdin.readline()
    count = 0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        async with store.writer_lock(session):
            for _ in range(2):
                history.append(message(len(history)))
                tail = (await store.commit(session, history, expected_tail=tail)).tail
                count += 1
    store.close()
    return count


def concurrent_rate(dsn: str, schema: str, durability: str, writers: int, seconds: float) -> float:
    """Messages per second of ``writers`` processes appending at once."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--writer",
                dsn,
                schema,
                f"w{i}-{durability}",
                durability,
                str(seconds),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(writers)
    ]
    for proc in procs:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
    for proc in procs:  # all start at once
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    total = 0
    for proc in procs:
        out, _ = proc.communicate(timeout=seconds + 60)
        total += int(out.split()[-1])
    return total / seconds


# --- the peers, side by side ------------------------------------------------------------

LAYOUT = Layout(
    peers_script="peers_postgres.py",
    peers_format=PEERS_FORMAT,
    peer_rows=(("langgraph", "LangGraph"), ("openai", "OpenAI Agents")),
    size_key="table_bytes",
    size_heading="table MB",
    size_meaning="bytes of all the tables a system created",
    floor="INSERT + COMMIT, synchronous_commit=on",
    peers_run="the peers' run",
    perdure_label="perdure, Agent + Session, PostgresSessionStore",
    perdure_note=(
        "PostgresSessionStore, durability='commit': one statement a message, "
        "synchronous_commit=on on its connections (the writer's lease taken and given back "
        "each turn)"
    ),
    notes_heading="durability as each ships it:",
    not_measured=(
        "peers: not measured. --peers adds LangGraph's PostgresSaver and the OpenAI Agents "
        "SDK's SQLAlchemySession",
        "  beside these rows (it installs their SDKs once in benchmarks/.peers-venv; see "
        "benchmarks/peers_postgres.py).",
    ),
)


def perdure_side(row: dict[str, float], turns: int) -> dict[str, Any]:
    """perdure's figures for the side-by-side table, from its row of that size."""
    return {
        "turns": turns,
        "floor_us": row["floor_us"],
        "faces": {"async": row["invoke_us"], "sync": row["call_us"]},
        "resume_ms": row["resume_ms"],
        "page_ms": row["page_ms"],
        "table_bytes": row["schema_bytes"],
        "messages": row["messages"],
    }


def check_peers(document: Any, size: int, turns: int) -> dict[str, Any]:
    """``document`` if it is a result of ``peers_postgres.py`` for these sizes, else ValueError."""
    return side.check_peers(LAYOUT, document, size, turns)


def side_by_side(perdure: dict[str, Any], size: int, document: dict[str, Any] | None) -> list[str]:
    """The side-by-side table at ``size`` messages, the ratio table and the verdict."""
    return side.side_by_side(LAYOUT, perdure, size, document)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="sizes 1k and 10k, fewer turns")
    parser.add_argument("--dsn", default=os.environ.get("PERDURE_TEST_PG", DSN))
    parser.add_argument("--sizes", help="comma-separated session sizes (default 10000,100000)")
    parser.add_argument(
        "--peers-size",
        type=int,
        default=PEERS_SIZE,
        help=f"session size of the side-by-side table (default {PEERS_SIZE}; added to the sizes)",
    )
    parser.add_argument("--appends", type=int, help="store appends a row (default 200, --quick 50)")
    parser.add_argument(
        "--turns", type=int, help="agent turns a row and a peer (default 50, --quick 20)"
    )
    parser.add_argument("--writers", type=int, default=8, help="concurrent writer processes")
    parser.add_argument("--seconds", type=float, help="each writer's run (default 5, --quick 2)")
    parser.add_argument(
        "--peers",
        action="store_true",
        help="add LangGraph and OpenAI Agents (installs their SDKs once in benchmarks/.peers-venv)",
    )
    parser.add_argument("--peers-venv", help="the peers' venv (implies --peers)")
    parser.add_argument(
        "--peers-json", help="a result of an earlier peers_postgres.py run, instead of running it"
    )
    parser.add_argument("--writer", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.writer:
        dsn, schema, session, durability, seconds = args.writer
        print(asyncio.run(write_for(dsn, schema, session, durability, float(seconds))))
        return 0
    sizes = (
        [int(s) for s in args.sizes.split(",")]
        if args.sizes
        else ([1000, 10000] if args.quick else [10000, 100000])
    )
    sizes = sorted({*sizes, args.peers_size})
    if sizes[0] < PAGE:
        parser.error(f"sizes must be at least {PAGE} (a tail page)")
    appends = args.appends or (50 if args.quick else 200)
    turns = args.turns or (20 if args.quick else 50)
    seconds = args.seconds or (2.0 if args.quick else 5.0)
    peers_document: Any = None
    peers_python: Path | None = None
    if args.peers_json:
        try:
            peers_document = check_peers(
                json.loads(Path(args.peers_json).read_text()), args.peers_size, turns
            )
        except (OSError, ValueError) as error:
            parser.error(f"--peers-json {args.peers_json}: {error}")
    elif args.peers or args.peers_venv:
        # Before perdure's rows: an install does not run while they are measured.
        peers_python = ensure_peers_venv(Path(args.peers_venv or PEERS_VENV).resolve())
    base = f"perdure_bench_{uuid.uuid4().hex[:10]}"
    schemas = {size: f"{base}_s{size}" for size in sizes}
    writers_schema = f"{base}_w"
    peers_prefix = f"{base}_peer"
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        version = conn.execute("SHOW server_version").fetchone()
        sync = conn.execute("SHOW synchronous_commit").fetchone()
        for schema in (*schemas.values(), writers_schema):
            conn.execute(f'CREATE SCHEMA "{schema}"')
    shown = (version[0] if version else "?", sync[0] if sync else "?")
    print(f"PostgreSQL {shown[0]}, synchronous_commit={shown[1]}")
    rows: dict[int, dict[str, float]] = {}
    try:
        header = (
            f"{'msgs':>8}{'append us':>11}{'floor us':>10}{'x floor':>9}{'hop us':>8}{'turn us':>9}"
            f"{'turn x':>8}{'invoke us':>11}{'agent() us':>12}{'resume ms':>11}{'window ms':>11}"
            f"{'tail50 ms':>11}{'table x':>9}"
        )
        print(header)
        print("-" * len(header))
        for size in sizes:
            r = rows[size] = measure(args.dsn, schemas[size], size, appends, turns)
            floor_us = r["floor_us"]
            print(
                f"{size:>8}{r['append_us']:>11.0f}{floor_us:>10.0f}"
                f"{r['append_us'] / floor_us:>9.2f}{r['hop_us']:>8.0f}{r['turn_us']:>9.0f}"
                f"{r['turn_us'] / floor_us:>8.2f}{r['invoke_us']:>11.0f}{r['call_us']:>12.0f}"
                f"{r['resume_ms']:>11.1f}{r['window_ms']:>11.2f}"
                f"{r['page_ms']:>11.2f}{r['table_bytes'] / r['raw_bytes']:>9.2f}"
            )
            sys.stdout.flush()
        durable = concurrent_rate(args.dsn, writers_schema, "commit", args.writers, seconds)
        unsynced = concurrent_rate(args.dsn, writers_schema, "none", args.writers, seconds)
        print(
            f"\n{args.writers} writers, {seconds:g} s each, own sessions: durable {durable:.0f} "
            f"msg/s, synchronous_commit=off {unsynced:.0f} msg/s, ratio {durable / unsynced:.2f}"
        )
        sys.stdout.flush()
        if peers_python is not None:
            with tempfile.TemporaryDirectory(prefix="perdure-pg-peers-") as work:
                peer_args = ["--dsn", args.dsn, "--schema", peers_prefix]
                peer_args += ["--size", str(args.peers_size), "--turns", str(turns)]
                document = run_peers_script(
                    peers_python, PEERS_SCRIPT, peer_args, Path(work) / "peers.json"
                )
            peers_document = check_peers(document, args.peers_size, turns)
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            leftovers = (*schemas.values(), writers_schema, *schema_names(peers_prefix).values())
            for schema in leftovers:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    print()
    for line in side_by_side(
        perdure_side(rows[args.peers_size], turns), args.peers_size, peers_document
    ):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
