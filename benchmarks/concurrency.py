"""Many agents, one store: aggregate durable throughput by the number of sessions.

Run: ``.venv/bin/python benchmarks/concurrency.py [--quick] [--sessions 1,4,16,64]``

One run prints one table. Each row runs N agents at once in one process and one
event loop, each with its own ``Session`` on one shared store (a
:class:`~perdure.session.FileSessionStore` directory or one
:class:`~perdure.stores.sqlite.SQLiteSessionStore` file), through the path users
run: ``await agent.invoke_async(...)`` turns with a model that answers at once (as
in ``agent_path.py``), two messages a turn. Every session runs the same number of
turns (``--messages`` in all, default 4,000; ``--quick`` 1,200, spread over the
sessions, at least 4 turns each).

For each store and N it prints, with ``durability="commit"`` (every message durable
before its commit returns) and with ``durability="none"`` (no fsync per message: the
rate the CPU allows, the limit group commit can approach on these cores):

- messages/s over all sessions (first turn start to last turn end);
- p50 / p99 of a turn's time (ms; a turn commits two messages);
- "x none" = durable rate / the no-fsync rate of the same sessions;
- "x one" = durable rate / one durable session's rate (the N = 1 row).

Issue 25's targets: with 16 and 64 sessions, durable >= 0.7x none and >= 3x one, on
the file and the SQLite store. The last lines say which rows meet them. The figures
are noisy on a shared machine: rows run interleaved by store, and a ratio is only
meaningful within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from perdure import Agent, NullConversationManager
from perdure.models import ModelResponse, ScriptedModel
from perdure.session import FileSessionStore, Session, SessionStore
from perdure.stores.sqlite import SQLiteSessionStore

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers import ANSWER, QUESTION

TARGET_NONE = 0.7
TARGET_ONE = 3.0
TARGET_SESSIONS = (16, 64)


@dataclass(frozen=True)
class Row:
    store: str
    sessions: int
    durability: str
    rate: float  # messages/s
    p50_ms: float
    p99_ms: float


def instant_model(turns: int) -> ScriptedModel:
    """Ready answers, recorded nowhere (see agent_path.instant_model)."""
    return ScriptedModel(
        [
            ModelResponse(
                message={"role": "assistant", "content": [{"text": ANSWER}]},
                stop_reason="end_turn",
            )
            for _ in range(turns)
        ],
        record="none",
    )


def open_store(kind: str, work: Path, durability: str) -> SessionStore:
    if kind == "file":
        return FileSessionStore(work / "file", durability=durability)  # type: ignore[arg-type]
    return SQLiteSessionStore(work / "sessions.db", durability=durability)  # type: ignore[arg-type]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def run(kind: str, sessions: int, durability: str, turns: int, work: Path) -> Row:
    store = open_store(kind, work, durability)
    agents = [
        await Agent.create(
            model=instant_model(turns + 1),
            conversation_manager=NullConversationManager(),
            session_manager=Session(store, f"s{i}"),
        )
        for i in range(sessions)
    ]
    for agent in agents:  # sessions created and files opened before the clock starts
        await agent.invoke_async(QUESTION)
    latencies: list[float] = []

    async def drive(agent: Agent) -> None:
        for _ in range(turns):
            start = time.perf_counter()
            await agent.invoke_async(QUESTION)
            latencies.append(time.perf_counter() - start)

    start = time.perf_counter()
    await asyncio.gather(*(drive(agent) for agent in agents))
    elapsed = time.perf_counter() - start
    close = getattr(store, "close", None)
    if close is not None:
        close()
    return Row(
        kind,
        sessions,
        durability,
        2 * turns * sessions / elapsed,
        statistics.median(latencies) * 1e3,
        percentile(latencies, 0.99) * 1e3,
    )


def table(rows: list[Row]) -> list[str]:
    by = {(r.store, r.sessions, r.durability): r for r in rows}
    out = [
        f"{'store':<8}{'sessions':>9}{'durable msg/s':>15}{'p50 ms':>8}{'p99 ms':>8}"
        f"{'none msg/s':>12}{'p50 ms':>8}{'p99 ms':>8}{'x none':>8}{'x one':>7}",
        "-" * 85,
    ]
    verdicts = []
    for store in dict.fromkeys(r.store for r in rows):
        one = by.get((store, 1, "commit"))
        for sessions in sorted({r.sessions for r in rows if r.store == store}):
            durable, none = by[(store, sessions, "commit")], by[(store, sessions, "none")]
            x_none = durable.rate / none.rate
            x_one = durable.rate / one.rate if one is not None else float("nan")
            out.append(
                f"{store:<8}{sessions:>9}{durable.rate:>15,.0f}{durable.p50_ms:>8.2f}"
                f"{durable.p99_ms:>8.2f}{none.rate:>12,.0f}{none.p50_ms:>8.2f}"
                f"{none.p99_ms:>8.2f}{x_none:>8.2f}{x_one:>7.2f}"
            )
            if sessions in TARGET_SESSIONS:
                met = x_none >= TARGET_NONE and x_one >= TARGET_ONE
                verdicts.append(
                    f"{store} x{sessions}: {x_none:.2f}x none (target {TARGET_NONE}), "
                    f"{x_one:.2f}x one (target {TARGET_ONE}): {'met' if met else 'NOT met'}"
                )
    return [*out, "", *verdicts]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1,200 messages a row")
    parser.add_argument("--messages", type=int, help="messages a row (default 4,000)")
    parser.add_argument("--sessions", default="1,4,16,64", help="session counts, comma-separated")
    parser.add_argument("--stores", default="file,sqlite", help="file, sqlite or both")
    parser.add_argument("--dir", help="where to write (default: a temp dir on the current disk)")
    args = parser.parse_args(argv)
    try:
        counts = sorted({int(n) for n in args.sessions.split(",")})
    except ValueError:
        parser.error(f"--sessions must be numbers separated by commas, got {args.sessions!r}")
    if not counts or min(counts) < 1:
        parser.error("--sessions needs numbers >= 1")
    stores = [s for s in args.stores.split(",") if s]
    if not stores or any(s not in ("file", "sqlite") for s in stores):
        parser.error(f"--stores takes file and sqlite, got {args.stores!r}")
    messages = args.messages or (1200 if args.quick else 4000)
    base = Path(tempfile.mkdtemp(prefix="perdure-concurrency-", dir=args.dir or "."))
    rows: list[Row] = []
    try:
        for sessions in counts:
            turns = max(4, messages // (2 * sessions))
            for store in stores:
                for durability in ("commit", "none"):
                    work = base / f"{store}-{sessions}-{durability}"
                    work.mkdir()
                    rows.append(asyncio.run(run(store, sessions, durability, turns, work)))
                    shutil.rmtree(work, ignore_errors=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"{messages:,} messages a row (or 8 a session, at least); one process, one loop")
    for line in table(rows):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
