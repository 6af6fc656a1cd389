"""Many agents, one store: aggregate durable throughput by the number of sessions.

Run: ``.venv/bin/python benchmarks/concurrency.py [--quick] [--sessions 1,4,16,64]
[--repeat N] [--peers]``

One run prints one table; ``--repeat N`` makes N runs, interleaved (every row once,
then every row again), prints each run's table, and then each target's ratios over
the runs: median, range, how many runs met it, and met or not by the medians.

Each row runs N agents at once in one process and one event loop, each with its own
``Session`` on one shared store (a
:class:`~perdure.session.FileSessionStore` directory or one
:class:`~perdure.stores.sqlite.SQLiteSessionStore` file), through the path users
run: ``await agent.invoke_async(...)`` turns with a model that answers at once (as
in ``agent_path.py``), two messages a turn. Every session runs the same number of
turns (``--messages`` in all, default 4,000; ``--quick`` 1,200, spread over the
sessions, at least 4 turns each: ``peers_concurrency.turns_per_session``).

For each store and N it prints, with ``durability="commit"`` (every message durable
before its commit returns) and with ``durability="none"`` (no fsync per message: the
rate the CPU allows, the limit group commit can approach on these cores):

- messages/s over all sessions (first turn start to last turn end);
- p50 / p99 of a turn's time (ms; a turn commits two messages);
- "x none" = durable rate / the no-fsync rate of the same sessions;
- "x one" = durable rate / one durable session's rate (the N = 1 row).

``--stores postgres`` adds a :class:`~perdure.stores.postgres.PostgresSessionStore`
on ``--dsn`` (default ``$PERDURE_TEST_PG`` or the local test server; a schema of its
own a row, dropped after it), whose durable commits the server's own group commit
makes durable together.

Issue 25's targets: with 16 and 64 sessions, durable >= 0.7x none and >= 3x one, on
the file and the SQLite store. The last lines say which rows meet them. The figures
are noisy on a shared machine: rows run interleaved by store, and a ratio is only
meaningful within one run.

With ``--peers`` a second table sets the OpenAI Agents SDK's ``SQLiteSession`` beside
perdure's SQLite rows: for each N, N ``SQLiteSession(f"s{i}", one_db_file)`` (one
database file, as its docs suggest) in one process and one event loop, each running
``Runner.run(agent, QUESTION, session=session)`` turns at once with a stub model that
answers at once with the same text, the same number of turns a session as perdure's
row of that N (``benchmarks/peers_concurrency.py`` says exactly how). Columns: its
messages/s and p50 / p99 of a turn beside perdure's ``durability="commit"`` SQLite
row of the same N, and "x" = perdure / peer messages/s (above 1: perdure is faster);
a footnote says what the peer makes durable as it ships (its SQLite pragmas, its
commits a turn). Its SDK lives in a separate virtual environment, never in perdure's:
``--peers`` creates it at ``benchmarks/.peers-venv`` (git-ignored; ``--peers-venv
PATH`` for another place) from the pins in ``benchmarks/peers-requirements.txt`` the
first time (about a minute), then runs ``peers_concurrency.py`` in it as a subprocess,
after perdure's rows, and reads its JSON result (``--peers-json FILE`` reads one
written earlier, with the same ``--messages``, instead). ``--peers`` needs the sqlite
store among ``--stores``.

Example: ``.venv/bin/python benchmarks/concurrency.py --quick --peers --stores sqlite
--sessions 1,16``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perdure import Agent, NullConversationManager
from perdure.models import ModelResponse, ScriptedModel
from perdure.session import FileSessionStore, Session, SessionStore
from perdure.stores.sqlite import SQLiteSessionStore

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agent_path import wrapped
from peers import ANSWER, QUESTION
from peers_concurrency import FORMAT as PEERS_FORMAT
from peers_concurrency import percentile, session_counts, turns_per_session
from peers_venv import PEERS_VENV, ensure_peers_venv, measured_peers, run_peers_script

TARGET_NONE = 0.7
TARGET_ONE = 3.0
TARGET_SESSIONS = (16, 64)
TARGET_STORES = ("file", "sqlite")  # issue 25's targets; PostgreSQL rows are shown only
BENCHMARKS = Path(__file__).resolve().parent
PEERS_SCRIPT = BENCHMARKS / "peers_concurrency.py"
PEER_COLUMNS = ("rate", "p50_ms", "p99_ms")
PEER_LABELS = {"openai": "OpenAI Agents {version}, SQLiteSession"}


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


DSN = os.environ.get("PERDURE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
STORES = ("file", "sqlite", "postgres")


def open_store(kind: str, work: Path, durability: str, dsn: str = DSN) -> SessionStore:
    if kind == "file":
        return FileSessionStore(work / "file", durability=durability)  # type: ignore[arg-type]
    if kind == "postgres":
        from perdure.stores.postgres import PostgresSessionStore

        # A schema of its own a row (the row's work directory names it), dropped after.
        return PostgresSessionStore(dsn, schema=pg_schema(work), durability=durability)  # type: ignore[arg-type]
    return SQLiteSessionStore(work / "sessions.db", durability=durability)  # type: ignore[arg-type]


def pg_schema(work: Path) -> str:
    """A schema for the row that writes under ``work`` (two runs on one server never share one)."""
    return "bench_concurrency_" + hashlib.sha256(str(work.resolve()).encode()).hexdigest()[:16]


def drop_pg_schema(work: Path, dsn: str) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{pg_schema(work)}" CASCADE')


async def run(
    kind: str, sessions: int, durability: str, turns: int, work: Path, dsn: str = DSN
) -> Row:
    store = open_store(kind, work, durability, dsn)
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


def ratios(rows: list[Row]) -> dict[tuple[str, int], tuple[float, float]]:
    """(store, sessions) -> (x none, x one) of one run's rows."""
    by = {(r.store, r.sessions, r.durability): r for r in rows}
    out = {}
    for store, sessions, durability in by:
        if durability != "commit":
            continue
        durable, none = by[(store, sessions, "commit")], by[(store, sessions, "none")]
        one = by.get((store, 1, "commit"))
        x_one = durable.rate / one.rate if one is not None else float("nan")
        out[(store, sessions)] = (durable.rate / none.rate, x_one)
    return out


def meets(x_none: float, x_one: float) -> bool:
    return x_none >= TARGET_NONE and x_one >= TARGET_ONE


def targeted(key: tuple[str, int]) -> bool:
    return key[1] in TARGET_SESSIONS and key[0] in TARGET_STORES


def table(rows: list[Row]) -> list[str]:
    by = {(r.store, r.sessions, r.durability): r for r in rows}
    each = ratios(rows)
    out = [
        f"{'store':<8}{'sessions':>9}{'durable msg/s':>15}{'p50 ms':>8}{'p99 ms':>8}"
        f"{'none msg/s':>12}{'p50 ms':>8}{'p99 ms':>8}{'x none':>8}{'x one':>7}",
        "-" * 85,
    ]
    verdicts = []
    for store in dict.fromkeys(r.store for r in rows):
        for sessions in sorted({r.sessions for r in rows if r.store == store}):
            durable, none = by[(store, sessions, "commit")], by[(store, sessions, "none")]
            x_none, x_one = each[(store, sessions)]
            out.append(
                f"{store:<8}{sessions:>9}{durable.rate:>15,.0f}{durable.p50_ms:>8.2f}"
                f"{durable.p99_ms:>8.2f}{none.rate:>12,.0f}{none.p50_ms:>8.2f}"
                f"{none.p99_ms:>8.2f}{x_none:>8.2f}{x_one:>7.2f}"
            )
            if targeted((store, sessions)):
                verdicts.append(
                    f"{store} x{sessions}: {x_none:.2f}x none (target {TARGET_NONE}), "
                    f"{x_one:.2f}x one (target {TARGET_ONE}): "
                    f"{'met' if meets(x_none, x_one) else 'NOT met'}"
                )
    return [*out, "", *verdicts]


def summary(runs: list[list[Row]]) -> list[str]:
    """The targets over several runs: each ratio's median and range, and how often met.

    This VM's disk and CPU move a ratio by a third between runs, so one run says little;
    a target counts as met here when the medians of both its ratios meet it.
    """
    each = [ratios(rows) for rows in runs]
    out = [f"over {len(runs)} runs (median, min-max; met: both medians meet the target):"]
    for key in sorted(each[0]):
        if not targeted(key):
            continue
        nones = [r[key][0] for r in each]
        ones = [r[key][1] for r in each]
        mid_none, mid_one = statistics.median(nones), statistics.median(ones)
        times = sum(meets(n, o) for n, o in zip(nones, ones, strict=True))
        store, sessions = key
        out.append(
            f"{store} x{sessions}: {mid_none:.2f}x none ({min(nones):.2f}-{max(nones):.2f}), "
            f"{mid_one:.2f}x one ({min(ones):.2f}-{max(ones):.2f}); "
            f"met in {times} of {len(runs)} runs; "
            f"{'met' if meets(mid_none, mid_one) else 'NOT met'}"
        )
    return out


def run_peers(python: Path, counts: list[int], messages: int, work: Path) -> Any:
    """Run ``peers_concurrency.py`` with ``python`` (the peers' venv); its JSON result."""
    args = ["--sessions", ",".join(map(str, counts)), "--messages", str(messages)]
    return run_peers_script(
        python, PEERS_SCRIPT, [*args, "--dir", str(work / "run")], work / "peers.json"
    )


def check_peers(document: Any, messages: int) -> dict[str, Any]:
    """``document`` if it is a peers_concurrency.py result for ``messages``, else ValueError."""
    if not isinstance(document, dict) or document.get("format") != PEERS_FORMAT:
        raise ValueError(
            f"not a result of benchmarks/peers_concurrency.py (format {PEERS_FORMAT!r})"
        )
    if document.get("messages") != messages:
        raise ValueError(
            f"the peers ran {document.get('messages')} messages a row; this run: {messages}"
        )
    for name, peer in measured_peers(document):
        rows = peer.get("rows")
        if not isinstance(rows, list) or not rows:
            raise ValueError(f"peer {name!r}: no 'rows'")
        seen: set[int] = set()
        for row in rows:
            sessions = row.get("sessions") if isinstance(row, dict) else None
            if not isinstance(sessions, int) or sessions < 1 or sessions in seen:
                raise ValueError(
                    f"peer {name!r}: a row's sessions must be a new count >= 1: {row!r}"
                )
            seen.add(sessions)
            turns = turns_per_session(messages, sessions)
            if row.get("turns") != turns:
                raise ValueError(
                    f"peer {name!r}: {sessions} sessions ran {row.get('turns')} turns each; "
                    f"this run: {turns}"
                )
            for key in PEER_COLUMNS:
                value = row.get(key)
                if not (isinstance(value, int | float) and value > 0):
                    raise ValueError(
                        f"peer {name!r}, {sessions} sessions: {key} must be a positive number, "
                        f"got {value!r}"
                    )
    return document


def peers_table(rows: list[Row], document: dict[str, Any]) -> list[str]:
    """The second table: each peer's rows beside perdure's durable SQLite row of the same N."""
    mine = {r.sessions: r for r in rows if r.store == "sqlite" and r.durability == "commit"}
    lines = [
        f"beside a peer: N sessions on one SQLite database file, one process, one loop; "
        f"{document['messages']:,} messages a row"
    ]
    notes: list[str] = []
    for name, result in document["peers"].items():
        label = PEER_LABELS.get(name, name).format(version=result.get("version", "?"))
        if "error" in result:
            lines.append(f"{label}: failed: {result['error']}"[:200])
            continue
        header = (
            f"{'sessions':>8}{'perdure msg/s':>15}{'p50 ms':>8}{'p99 ms':>8}"
            f"{'peer msg/s':>12}{'p50 ms':>8}{'p99 ms':>8}{'x':>8}"
        )
        lines += ["", f"perdure sqlite commit | {label}", header, "-" * len(header)]
        for peer in sorted(result["rows"], key=lambda r: r["sessions"]):
            n = peer["sessions"]
            ours = mine.get(n)
            cells = (
                f"{ours.rate:>15,.0f}{ours.p50_ms:>8.2f}{ours.p99_ms:>8.2f}"
                if ours is not None
                else f"{'-':>15}{'-':>8}{'-':>8}"
            )
            ratio = f"{ours.rate / peer['rate']:>7.2f}x" if ours is not None else f"{'-':>8}"
            lines.append(
                f"{n:>8}{cells}{peer['rate']:>12,.0f}{peer['p50_ms']:>8.2f}"
                f"{peer['p99_ms']:>8.2f}{ratio}"
            )
        notes += wrapped(f"{label}: {result.get('how', '?')}", "")
        notes += wrapped(f"durability as it ships: {result.get('note', '?')}", "  ")
    lines += wrapped(
        "x = perdure / peer messages/s (above 1: perdure is faster); '-': no such row in "
        "this run. perdure: SQLiteSessionStore(durability='commit'), every message durable "
        "before its commit returns (synchronous=FULL in WAL mode), one Agent a session",
        "",
    )
    return [*lines, *notes]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1,200 messages a row")
    parser.add_argument("--messages", type=int, help="messages a row (default 4,000)")
    parser.add_argument("--sessions", default="1,4,16,64", help="session counts, comma-separated")
    parser.add_argument(
        "--stores",
        default="file,sqlite",
        help="comma-separated: file, sqlite, postgres (default file,sqlite)",
    )
    parser.add_argument("--dsn", default=DSN, help="the PostgreSQL server for --stores postgres")
    parser.add_argument("--dir", help="where to write (default: a temp dir on the current disk)")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run every row this many times, interleaved; adds the medians (default 1)",
    )
    parser.add_argument(
        "--peers",
        action="store_true",
        help="add OpenAI Agents' SQLiteSession (installs the SDK once in benchmarks/.peers-venv)",
    )
    parser.add_argument("--peers-venv", help="the peers' venv (implies --peers)")
    parser.add_argument(
        "--peers-json",
        help="a result of an earlier peers_concurrency.py run, instead of running it",
    )
    args = parser.parse_args(argv)
    try:
        counts = session_counts(args.sessions)
    except ValueError as error:
        parser.error(str(error))
    stores = [s for s in args.stores.split(",") if s]
    if not stores or any(s not in STORES for s in stores):
        parser.error(f"--stores takes {', '.join(STORES)}, got {args.stores!r}")
    messages = args.messages or (1200 if args.quick else 4000)
    if args.repeat < 1:
        parser.error(f"--repeat must be at least 1, got {args.repeat}")
    if (args.peers or args.peers_venv or args.peers_json) and "sqlite" not in stores:
        parser.error("the peers are set beside perdure's SQLite rows: --stores must include sqlite")
    peers_document: Any = None
    peers_python: Path | None = None
    if args.peers_json:
        try:
            peers_document = check_peers(json.loads(Path(args.peers_json).read_text()), messages)
        except (OSError, ValueError) as error:
            parser.error(f"--peers-json {args.peers_json}: {error}")
    elif args.peers or args.peers_venv:
        # Before perdure's rows: an install does not run while they are measured.
        peers_python = ensure_peers_venv(Path(args.peers_venv or PEERS_VENV).resolve())
    base = Path(tempfile.mkdtemp(prefix="perdure-concurrency-", dir=args.dir or "."))
    runs: list[list[Row]] = []
    try:
        for _ in range(args.repeat):
            rows: list[Row] = []
            for sessions in counts:
                turns = turns_per_session(messages, sessions)
                for store in stores:
                    for durability in ("commit", "none"):
                        work = base / f"{store}-{sessions}-{durability}"
                        work.mkdir()
                        try:
                            row = asyncio.run(
                                run(store, sessions, durability, turns, work, args.dsn)
                            )
                        finally:
                            if store == "postgres":
                                drop_pg_schema(work, args.dsn)
                        rows.append(row)
                        shutil.rmtree(work, ignore_errors=True)
            runs.append(rows)
        if peers_python is not None:
            work = base / "peers"
            work.mkdir()
            peers_document = check_peers(run_peers(peers_python, counts, messages, work), messages)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"{messages:,} messages a row (or 8 a session, at least); one process, one loop")
    for number, rows in enumerate(runs, 1):
        if len(runs) > 1:
            print(f"run {number} of {len(runs)}")
        for line in table(rows):
            print(line)
        print()
    if len(runs) > 1:
        for line in summary(runs):
            print(line)
        print()
    if peers_document is None:
        print(
            "peers: not measured. --peers adds the OpenAI Agents SDK's SQLiteSession (N sessions "
            "on one file)\n  beside the SQLite rows (it installs the SDK once in "
            "benchmarks/.peers-venv; see benchmarks/peers_concurrency.py)."
        )
    else:
        for line in peers_table(runs[-1], peers_document):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
