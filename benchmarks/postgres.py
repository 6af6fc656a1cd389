"""PostgreSQL session store benchmark: append, turn, resume, tail page, size, concurrency.

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/postgres.py [--quick] [--dsn DSN]``
(default DSN ``postgresql://postgres@127.0.0.1:5432/test``; each run works in a
schema of its own, dropped at the end).

For each session size it prints, next to the floor measured step by step between
the store's own appends (so a noisy neighbour slows both alike) — one ``INSERT`` of
the same ~400-byte message and a ``COMMIT`` on one psycopg connection,
``synchronous_commit=on``:

- the durable append as a Session makes it during a turn (writer lease held, tail
  checked), in µs and in floors; beside it the hop alone (``asyncio.to_thread`` of
  nothing), which every append pays because psycopg's blocking call never runs on
  the event loop;
- a whole turn (take the lease, two appends, give it back);
- ``get`` of the whole session with its chain verified (``resume`` ms), and a
  resume with the default window (the last 40 messages, ``get(offset=…)``);
- a tail page of 50 (``read_history_page``);
- the table's bytes (heap, TOAST and indexes of the messages table) per raw
  message byte.

Then eight writer processes, each on its own session, append for a few seconds
durably, and again with ``synchronous_commit=off``: the rates and their ratio (the
server's group commit should carry the durable rate).

Targets (issue 17): durable append <= 1.3x the floor; eight durable writers >=
0.7x the rate of the same writers without fsync; resume of 10k <= 60 ms; a tail
page of 50 <= 2 ms at 100k. (The side-by-side with LangGraph's ``PostgresSaver``
and the OpenAI Agents SDK's ``SQLAlchemySession`` the issue asks for is not here:
neither package is installed in this environment.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import uuid

import psycopg

from perdure.session import read_history_page
from perdure.stores.postgres import PostgresSessionStore
from perdure.types import Message

DSN = "postgresql://postgres@127.0.0.1:5432/test"
FILLER = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor "
WINDOW = 40


def message(i: int) -> Message:
    """A ~400-byte message (as JSON), as benchmarks/sessions.py writes them."""
    role = "user" if i % 2 == 0 else "assistant"
    text = f"message {i}: " + (FILLER * 6)[: 400 - 60]
    return {"role": role, "content": [{"text": text}]}  # type: ignore[typeddict-item]


def raw_bytes(messages: list[Message]) -> int:
    return sum(len(json.dumps(m, separators=(",", ":"))) for m in messages)


class Floor:
    """One INSERT + COMMIT per step on one psycopg connection (synchronous_commit=on)."""

    def __init__(self, dsn: str, schema: str, body: str) -> None:
        self.conn = psycopg.connect(dsn)
        self.conn.execute("SET synchronous_commit TO on")
        self.table = f'"{schema}".floor'
        self.conn.execute(f"DROP TABLE IF EXISTS {self.table}")
        self.conn.execute(f"CREATE TABLE {self.table} (id bigserial PRIMARY KEY, body text)")
        self.conn.commit()
        self.body = body

    def once(self) -> float:
        start = time.perf_counter()
        self.conn.execute(f"INSERT INTO {self.table} (body) VALUES (%s)", (self.body,))
        self.conn.commit()
        return time.perf_counter() - start

    def close(self) -> None:
        self.conn.close()


async def measure(dsn: str, schema: str, size: int, appends: int) -> dict[str, float]:
    history = [message(i) for i in range(size)]
    bulk = PostgresSessionStore(dsn, schema=schema, durability="none")
    session = f"bench-{size}"
    await bulk.create(session)
    for end in range(1000, size + 1, 1000):
        await bulk.commit(session, history[:end])
    if size % 1000:
        await bulk.commit(session, history)
    await bulk.flush(session)
    bulk.close()

    durable = PostgresSessionStore(dsn, schema=schema)
    floor = Floor(dsn, schema, json.dumps(message(0)))
    tail = (await durable.get(session, offset=size)).tail
    times, floor_times, hops = [], [], []
    async with durable.writer_lock(session):
        for _ in range(appends):
            floor_times.append(floor.once())
            start = time.perf_counter()
            await asyncio.to_thread(int)  # the hop to a worker thread and back, alone
            hops.append(time.perf_counter() - start)
            history.append(message(len(history)))
            start = time.perf_counter()
            tail = (await durable.commit(session, history, expected_tail=tail)).tail
            times.append(time.perf_counter() - start)
    turns = []
    for _ in range(max(10, appends // 4)):
        floor_times.append(floor.once())
        start = time.perf_counter()
        async with durable.writer_lock(session):
            for _ in range(2):
                history.append(message(len(history)))
                tail = (await durable.commit(session, history, expected_tail=tail)).tail
        turns.append(time.perf_counter() - start)
    floor.close()

    reader = PostgresSessionStore(dsn, schema=schema)
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
        page = await read_history_page(reader, session, offset=len(history) - 50, limit=50)
        pages.append(time.perf_counter() - start)
    assert page.messages == history[-50:]
    size_bytes = await reader.db.run(
        lambda conn: conn.execute(
            "SELECT pg_total_relation_size(%s::regclass)", (f'"{schema}".perdure_messages',)
        ).fetchone(),
        doing="measuring",
    )
    durable.close()
    reader.close()
    return {
        "floor_us": statistics.median(floor_times) * 1e6,
        "append_us": statistics.median(times) * 1e6,
        "hop_us": statistics.median(hops) * 1e6,
        "turn_us": statistics.median(turns) * 1e6,
        "resume_ms": min(resume) * 1e3,
        "window_ms": min(window) * 1e3,
        "page_ms": statistics.median(pages) * 1e3,
        "table_bytes": float(size_bytes[0]) if size_bytes else 0.0,
        "raw_bytes": float(raw_bytes(history)),
    }


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="sizes 1k and 10k, fewer appends")
    parser.add_argument("--dsn", default=os.environ.get("PERDURE_TEST_PG", DSN))
    parser.add_argument("--sizes", help="comma-separated session sizes (default 10000,100000)")
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
    appends = 50 if args.quick else 200
    seconds = 2.0 if args.quick else 5.0
    schema = f"perdure_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        version = conn.execute("SHOW server_version").fetchone()
        sync = conn.execute("SHOW synchronous_commit").fetchone()
        conn.execute(f'CREATE SCHEMA "{schema}"')
    shown = (version[0] if version else "?", sync[0] if sync else "?")
    print(f"PostgreSQL {shown[0]}, synchronous_commit={shown[1]}")
    try:
        header = (
            f"{'msgs':>8}{'append us':>11}{'floor us':>10}{'x floor':>9}{'hop us':>8}{'turn us':>9}"
            f"{'turn x':>8}{'resume ms':>11}{'window ms':>11}{'tail50 ms':>11}{'table x':>9}"
        )
        print(header)
        print("-" * len(header))
        for size in sizes:
            r = asyncio.run(measure(args.dsn, schema, size, appends))
            floor_us = r["floor_us"]
            print(
                f"{size:>8}{r['append_us']:>11.0f}{floor_us:>10.0f}"
                f"{r['append_us'] / floor_us:>9.2f}{r['hop_us']:>8.0f}{r['turn_us']:>9.0f}"
                f"{r['turn_us'] / floor_us:>8.2f}{r['resume_ms']:>11.1f}{r['window_ms']:>11.2f}"
                f"{r['page_ms']:>11.2f}{r['table_bytes'] / r['raw_bytes']:>9.2f}"
            )
            sys.stdout.flush()
        durable = concurrent_rate(args.dsn, schema, "commit", 8, seconds)
        unsynced = concurrent_rate(args.dsn, schema, "none", 8, seconds)
        print(
            f"\n8 writers, {seconds:g} s each, own sessions: durable {durable:.0f} msg/s, "
            f"synchronous_commit=off {unsynced:.0f} msg/s, ratio {durable / unsynced:.2f}"
        )
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    return 0


if __name__ == "__main__":
    sys.exit(main())
