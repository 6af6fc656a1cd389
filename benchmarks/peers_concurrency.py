"""The peer of ``benchmarks/concurrency.py``: OpenAI Agents' SQLiteSession, many sessions at once.

This script runs in the peers' own virtual environment (their SDKs, not perdure);
``concurrency.py --peers`` creates that environment (``benchmarks/peers_venv.py``) and
runs, with the same sizes as its own rows:

    VENV/bin/python benchmarks/peers_concurrency.py --sessions 1,16 --messages M \\
        --dir DIR --out FILE

For each N of ``--sessions``, in one process and one event loop (one ``asyncio.run``
a row, as perdure's rows): N ``SQLiteSession(f"s{i}", DB)`` on ONE database file (a
new file a row), as the SDK's docs suggest for many sessions, and one ``Agent`` with
the stub subclass of the SDK's ``Model`` that ``peers.py`` defines (it answers
``ANSWER`` at once), tracing disabled. Each session first runs one turn, untimed
(sessions created, connections opened, as perdure's rows do), then all N run
:func:`turns_per_session` turns at once, each ``await Runner.run(agent, QUESTION,
session=session)``. A row reports messages/s over all sessions (first turn start to
last turn end; a turn stores two items) and p50 / p99 of a turn's time, and checks
afterwards that every session holds its 2 x (turns + 1) items.

Once, untimed, for the footnote: what the SDK makes durable, as ``peers.py`` reports
it: the SQLite ``synchronous`` and ``journal_mode`` of the connections the SDK opens
and the commits a turn issues (SQLite's trace callback over a few turns).

:func:`session_counts`, :func:`turns_per_session` and :func:`percentile` are the rules
``concurrency.py`` uses for its own rows (it imports them from here), so both sides
run and measure alike. It imports nothing from perdure, and the SDK only inside the
function that uses it, so perdure's own environment can import it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers import (
    DISTRIBUTIONS,
    QUESTION,
    openai_durability,
    openai_model,
    version,
)

FORMAT = "perdure-peers-concurrency/1"
PEERS = ("openai",)
MIN_TURNS = 4  # a session's turns in a row, at least


def session_counts(text: str) -> list[int]:
    """The session counts of ``--sessions`` (``"1,4,16"``), sorted; ValueError if bad."""
    try:
        counts = sorted({int(n) for n in text.split(",")})
    except ValueError:
        raise ValueError(f"--sessions must be numbers separated by commas, got {text!r}") from None
    if not counts or min(counts) < 1:
        raise ValueError("--sessions needs numbers >= 1")
    return counts


def turns_per_session(messages: int, sessions: int) -> int:
    """Each session's timed turns in a row of ``messages`` over ``sessions`` (two a turn)."""
    return max(MIN_TURNS, messages // (2 * sessions))


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


# --- OpenAI Agents ---------------------------------------------------------------------


def openai_peer(counts: list[int], messages: int, work: Path) -> dict[str, Any]:
    from agents import Agent, Runner, SQLiteSession, set_tracing_disabled

    set_tracing_disabled(True)
    agent = Agent(name="bench", model=openai_model())

    async def row(sessions: int, turns: int, db: Path) -> dict[str, Any]:
        opened = [SQLiteSession(f"s{i}", db) for i in range(sessions)]
        for session in opened:  # sessions created, connections opened before the clock
            await Runner.run(agent, QUESTION, session=session)
        latencies: list[float] = []

        async def drive(session: Any) -> None:
            for _ in range(turns):
                start = time.perf_counter()
                await Runner.run(agent, QUESTION, session=session)
                latencies.append(time.perf_counter() - start)

        start = time.perf_counter()
        await asyncio.gather(*(drive(session) for session in opened))
        elapsed = time.perf_counter() - start
        for session in opened:
            held = len(await session.get_items())
            if held != 2 * (turns + 1):
                raise RuntimeError(
                    f"{sessions} sessions: {session.session_id} holds {held} items "
                    f"after {turns + 1} turns"
                )
            session.close()
        return {
            "sessions": sessions,
            "turns": turns,
            "rate": 2 * turns * sessions / elapsed,
            "p50_ms": statistics.median(latencies) * 1e3,
            "p99_ms": percentile(latencies, 0.99) * 1e3,
        }

    rows = []
    for sessions in counts:
        db = work / f"sessions-{sessions}" / "agents.db"
        db.parent.mkdir()
        turns = turns_per_session(messages, sessions)
        rows.append(asyncio.run(row(sessions, turns, db)))

    # What SQLite makes durable: the SDK's own connection settings and its commits a turn.
    settings, commits, _ = openai_durability(agent, work / "count.db")
    return {
        "rows": rows,
        "durability": {**settings, "commits_per_turn": commits},
        "how": (
            'N SQLiteSession(f"s{i}", one_db_file) and one Agent; N tasks of '
            "Runner.run(agent, QUESTION, session=session) in one event loop"
        ),
        "note": (
            f"SQLiteSession: journal_mode={settings['journal_mode']}, "
            f"synchronous={settings['synchronous']} (SQLite's default; the SDK sets none), "
            f"{commits:g} commits a turn; the sessions of one file share one lock in the "
            "process, each operation in a worker thread; the Runner reads the session's whole "
            "history back every turn, so a turn costs more as the session grows (a row of "
            "fewer sessions runs longer ones)"
        ),
    }


RUNNERS: dict[str, Callable[[list[int], int, Path], dict[str, Any]]] = {"openai": openai_peer}


def main(argv: list[str] | None = None) -> int:
    """Measure the peer and write ``{"format", "messages", "sessions", "python", "peers"}``.

    ``peers`` maps each peer's name to its ``version``, ``rows`` (one a
    session count: ``sessions``, ``turns`` a session, ``rate`` in messages/s,
    ``p50_ms``, ``p99_ms`` of a turn), ``durability`` (``synchronous``,
    ``journal_mode``, ``commits_per_turn``), ``how`` and ``note``; or to
    ``{"version", "error"}`` when that peer failed.
    """
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--sessions", required=True, help="session counts, comma-separated")
    parser.add_argument("--messages", type=int, required=True, help="messages a row")
    parser.add_argument("--dir", required=True, help="an empty directory to work in")
    parser.add_argument("--out", required=True, help="where to write the JSON result")
    parser.add_argument("--only", help="comma-separated peers (default: all)")
    args = parser.parse_args(argv)
    try:
        counts = session_counts(args.sessions)
    except ValueError as error:
        parser.error(str(error))
    if args.messages < 1:
        parser.error(f"--messages must be at least 1, got {args.messages}")
    names = args.only.split(",") if args.only else list(PEERS)
    unknown = sorted(set(names) - set(PEERS))
    if unknown:
        parser.error(f"unknown peers {unknown}; known: {', '.join(PEERS)}")
    base = Path(args.dir)
    base.mkdir(parents=True, exist_ok=True)
    peers: dict[str, Any] = {}
    for name in names:
        work = base / name
        work.mkdir()
        result: dict[str, Any] = {"version": version(DISTRIBUTIONS[name])}
        try:
            result.update(RUNNERS[name](counts, args.messages, work))
        except Exception as error:
            traceback.print_exc()
            result["error"] = f"{type(error).__name__}: {error}"
        peers[name] = result
    document = {
        "format": FORMAT,
        "messages": args.messages,
        "sessions": counts,
        "python": sys.version.split()[0],
        "peers": peers,
    }
    Path(args.out).write_text(json.dumps(document, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
