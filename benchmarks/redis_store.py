"""Redis session store benchmark: append, turn, agent path, resume, tail page, memory,
and the OpenAI Agents SDK's RedisSession side by side.

(Named ``redis_store.py``, not ``redis.py``: the benchmarks put their own directory
first on ``sys.path``, where a ``redis.py`` would shadow redis-py for every later
``import redis`` in the process — this script's, the peer's, and pytest's.)

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/redis_store.py [--quick] [--peers] [--url URL]``
(default URL ``redis://127.0.0.1:6379/0``, or ``PERDURE_TEST_REDIS``). The server may
be shared: every key of a run is under a prefix of its own
(``perdure-bench-<random>:``; each session size under ``…s<size>:``, the peer under
``…peer:``), and every key under it is deleted at the end — never ``FLUSHDB``.

For each session size it prints, next to the floor measured step by step between
the store's own appends and turns (so a noisy neighbour slows both alike) — one
``RPUSH`` of the same ~400-byte message on one synchronous redis-py connection
(``floors.RedisFloor``):

- the append as a Session makes it during a turn (writer lease held, tail checked:
  one script), in µs and in floors; beside it ``aio us``, one ``RPUSH`` of the same
  message through redis-py's asyncio client on one connection in the same loop —
  what the asyncio client alone costs, which the store (asyncio, SPEC §7) pays on
  every call;
- a whole turn at the store (take the lease, two appends, give it back);
- the agent path: a :class:`~perdure.Agent` (the instant model of ``agent_path.py``,
  ``NullConversationManager``: the whole history kept) over ``Session.resume`` of the
  session, answering ``--turns`` turns: µs per message (median turn / 2) through
  ``await agent.invoke_async(...)`` ("invoke us") and through ``agent(...)``
  ("agent() us");
- ``get`` of the whole session with its chain verified (``resume`` ms, best of 3),
  and a resume with the default window (the last 40 messages, ``get(offset=…)``);
- a tail page of 50 (``read_history_page``, median of 20);
- memory used (``MEMORY USAGE key SAMPLES 0`` summed over every key under the size's
  prefix) per raw message byte (``mem x``).

Then a line per target of issue 18 (append <= 2x the floor; resume of 10k <= 40 ms;
a tail page <= 1 ms at 100k), each met, missed, or not measured at these sizes.

Last, side by side at ``--peers-size`` stored messages (default 10,000; added to the
sizes when missing), on the same server: perdure's agent path of that size's row
(each face), and with ``--peers`` the OpenAI Agents SDK's ``RedisSession`` under
``Runner.run``, storing the same history and then answering the same number of
turns (``benchmarks/peers_redis.py`` says exactly how). Columns: µs per message
during the turns (median turn / 2), resume (the whole history read back, best of
3), a tail page of 50 (median of 20), and memory used by every key the system
created — in MB and per message held. A second table gives peer / perdure per column
(µs per message against perdure's ``invoke_async`` row, the Runner being async),
and a last line says whether perdure is ahead on every column (faster; smaller for
memory) and names each column where it is not. The peer's SDK lives in
``benchmarks/.peers-venv`` (``benchmarks/peers_venv.py``: created from
``benchmarks/peers-requirements.txt`` the first time); ``--peers-json FILE`` reads a
result of ``peers_redis.py`` written earlier instead.

Example: ``PYTHONPATH=src .venv/bin/python benchmarks/redis_store.py --quick --peers``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis
import redis.asyncio as aioredis

from perdure.stores.redis import RedisSessionStore
from perdure.types import Message

sys.path.insert(0, str(Path(__file__).resolve().parent))
import side_by_side as side
from floors import RedisFloor
from peers import ANSWER, QUESTION
from peers_postgres import history_text
from peers_redis import FORMAT as PEERS_FORMAT
from peers_redis import PAGE, drop_prefix, floor_body, prefix_memory
from peers_venv import PEERS_VENV, ensure_peers_venv, run_peers_script
from server_turns import agent_turns_async, agent_turns_sync, read_back
from side_by_side import Layout

BENCHMARKS = Path(__file__).resolve().parent
PEERS_SCRIPT = BENCHMARKS / "peers_redis.py"
URL = "redis://127.0.0.1:6379/0"
PEERS_SIZE = 10_000
# The targets of issue 18: (append / floor, resume ms at 10k, tail page ms at 100k).
APPEND_FLOORS = 2.0
RESUME_MS, RESUME_AT = 40.0, 10_000
PAGE_MS, PAGE_AT = 1.0, 100_000


def message(i: int) -> Message:
    """A ~400-byte message (as JSON), as benchmarks/sessions.py writes them."""
    role = "user" if i % 2 == 0 else "assistant"
    return {"role": role, "content": [{"text": history_text(i)}]}  # type: ignore[typeddict-item]


def raw_bytes(messages: list[Message]) -> int:
    return sum(len(json.dumps(m, separators=(",", ":"))) for m in messages)


def message_pair() -> list[Message]:
    """The two messages an agent turn of this benchmark stores."""
    return [
        {"role": "user", "content": [{"text": QUESTION}]},
        {"role": "assistant", "content": [{"text": ANSWER}]},
    ]


async def build(store: RedisSessionStore, session: str, history: list[Message]) -> None:
    """Store ``history`` as ``session``, a thousand messages a commit."""
    await store.create(session)
    for end in range(1000, len(history) + 1, 1000):
        await store.commit(session, history[:end])
    if len(history) % 1000:
        await store.commit(session, history)


async def store_turns(
    store: RedisSessionStore,
    session: str,
    history: list[Message],
    appends: int,
    floor: RedisFloor,
    url: str,
    aio_key: str,
) -> dict[str, list[float]]:
    """Appends under one lease, then whole turns at the store; ``history`` grows with them."""
    tail = (await store.get(session, offset=len(history))).tail
    aio = aioredis.Redis.from_url(url, single_connection_client=True)
    times, aios = [], []
    try:
        async with store.writer_lock(session):
            for _ in range(appends):
                floor.once()
                start = time.perf_counter()
                await aio.rpush(aio_key, floor.body)  # the asyncio client alone
                aios.append(time.perf_counter() - start)
                history.append(message(len(history)))
                start = time.perf_counter()
                tail = (await store.commit(session, history, expected_tail=tail)).tail
                times.append(time.perf_counter() - start)
        await aio.delete(aio_key)
    finally:
        await aio.aclose()
    turns = []
    for _ in range(max(10, appends // 4)):
        floor.once()
        start = time.perf_counter()
        async with store.writer_lock(session):
            for _ in range(2):
                history.append(message(len(history)))
                tail = (await store.commit(session, history, expected_tail=tail)).tail
        turns.append(time.perf_counter() - start)
    return {"append": times, "aio": aios, "turn": turns}


def measure(
    url: str, prefix: str, size: int, appends: int, turns: int, floor: RedisFloor
) -> dict[str, float]:
    """One row: a session of ``size`` messages under ``prefix`` (which holds nothing else)."""
    history = [message(i) for i in range(size)]
    session = f"bench-{size}"
    store = RedisSessionStore(url, prefix=prefix)
    start = len(floor.samples)
    try:
        asyncio.run(build(store, session, history))
        aio_key = f"{prefix}aio"
        store_times = asyncio.run(
            store_turns(store, session, history, appends, floor, url, aio_key)
        )
        invoke = asyncio.run(agent_turns_async(store, session, turns, floor))
        call, messages = agent_turns_sync(store, session, turns, floor)
    finally:
        store.close()
    expected = history + [m for _ in range(2 * turns) for m in message_pair()]
    assert messages == expected, "the agents' turns are not the stored history"
    reads = asyncio.run(read_back(RedisSessionStore(url, prefix=prefix), session, messages))
    memory = prefix_memory(url, prefix)
    return {
        "floor_us": statistics.median(floor.samples[start:]) * 1e6,
        "append_us": statistics.median(store_times["append"]) * 1e6,
        "aio_us": statistics.median(store_times["aio"]) * 1e6,
        "turn_us": statistics.median(store_times["turn"]) * 1e6,
        "invoke_us": statistics.median(invoke) / 2 * 1e6,
        "call_us": statistics.median(call) / 2 * 1e6,
        **reads,
        "memory_bytes": float(sum(memory.values())),
        "keys": float(len(memory)),
        "raw_bytes": float(raw_bytes(messages)),
        "messages": float(len(messages)),
    }


def targets(rows: dict[int, dict[str, float]]) -> list[str]:
    """A line per target of issue 18: met, missed, or not measured at these sizes."""

    def verdict(ok: bool) -> str:
        return "met" if ok else "MISSED"

    ratios = {size: r["append_us"] / r["floor_us"] for size, r in sorted(rows.items())}
    shown = ", ".join(f"{ratio:.2f}x at {size}" for size, ratio in ratios.items())
    lines = [
        f"target append <= {APPEND_FLOORS:g}x floor: {shown}: "
        + verdict(all(ratio <= APPEND_FLOORS for ratio in ratios.values()))
    ]
    for key, limit, at, what in (
        ("resume_ms", RESUME_MS, RESUME_AT, "resume"),
        ("page_ms", PAGE_MS, PAGE_AT, "tail50"),
    ):
        heading = f"target {what} of {at // 1000}k <= {limit:g} ms: "
        if at in rows:
            value = rows[at][key]
            lines.append(heading + f"{value:.2f} ms: " + verdict(value <= limit))
        else:
            lines.append(heading + f"not measured (no {at}-message row; --sizes adds it)")
    return lines


# --- the peer, side by side -------------------------------------------------------------

LAYOUT = Layout(
    peers_script="peers_redis.py",
    peers_format=PEERS_FORMAT,
    peer_rows=(("openai", "OpenAI Agents"),),
    size_key="memory_bytes",
    size_heading="mem MB",
    size_meaning="MEMORY USAGE of every key a system created",
    floor="one RPUSH on one connection",
    peers_run="the peer's run",
    perdure_label="perdure, Agent + Session, RedisSessionStore",
    perdure_note=(
        "RedisSessionStore: one script a message checks the writer's lease and the tail and "
        "appends the chained element; the server's own persistence (AOF/RDB) as configured"
    ),
    notes_heading="what each system keeps:",
    not_measured=(
        "peers: not measured. --peers adds the OpenAI Agents SDK's RedisSession beside these",
        "  rows (it installs the SDK once in benchmarks/.peers-venv; see "
        "benchmarks/peers_redis.py).",
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
        "memory_bytes": row["memory_bytes"],
        "messages": row["messages"],
    }


def check_peers(document: Any, size: int, turns: int) -> dict[str, Any]:
    """``document`` if it is a result of ``peers_redis.py`` for these sizes, else ValueError."""
    return side.check_peers(LAYOUT, document, size, turns)


def side_by_side(perdure: dict[str, Any], size: int, document: dict[str, Any] | None) -> list[str]:
    """The side-by-side table at ``size`` messages, the ratio table and the verdict."""
    return side.side_by_side(LAYOUT, perdure, size, document)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="sizes 1k and 10k, fewer turns")
    parser.add_argument("--url", default=os.environ.get("PERDURE_TEST_REDIS", URL))
    parser.add_argument("--sizes", help="comma-separated session sizes (default 10000,100000)")
    parser.add_argument(
        "--peers-size",
        type=int,
        default=PEERS_SIZE,
        help=f"session size of the side-by-side table (default {PEERS_SIZE}; added to the sizes)",
    )
    parser.add_argument("--appends", type=int, help="store appends a row (default 200, --quick 50)")
    parser.add_argument(
        "--turns", type=int, help="agent turns a row and the peer (default 50, --quick 20)"
    )
    parser.add_argument(
        "--peers",
        action="store_true",
        help="add OpenAI Agents' RedisSession (installs the SDK once in benchmarks/.peers-venv)",
    )
    parser.add_argument("--peers-venv", help="the peers' venv (implies --peers)")
    parser.add_argument(
        "--peers-json", help="a result of an earlier peers_redis.py run, instead of running it"
    )
    args = parser.parse_args(argv)
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
    base = f"perdure-bench-{uuid.uuid4().hex[:10]}:"
    with redis.Redis.from_url(args.url) as client:
        info = client.info()
    print(
        f"Redis {info.get('redis_version', '?')}, appendonly={info.get('aof_enabled', '?')}, "
        f"prefix {base}"
    )
    rows: dict[int, dict[str, float]] = {}
    floor = RedisFloor(args.url, f"{base}floor", floor_body())
    try:
        header = (
            f"{'msgs':>8}{'append us':>11}{'floor us':>10}{'x floor':>9}{'aio us':>8}"
            f"{'turn us':>9}{'turn x':>8}{'invoke us':>11}{'agent() us':>12}{'resume ms':>11}"
            f"{'window ms':>11}{'tail50 ms':>11}{'mem x':>7}"
        )
        print(header)
        print("-" * len(header))
        for size in sizes:
            r = rows[size] = measure(args.url, f"{base}s{size}:", size, appends, turns, floor)
            floor_us = r["floor_us"]
            print(
                f"{size:>8}{r['append_us']:>11.0f}{floor_us:>10.0f}"
                f"{r['append_us'] / floor_us:>9.2f}{r['aio_us']:>8.0f}{r['turn_us']:>9.0f}"
                f"{r['turn_us'] / floor_us:>8.2f}{r['invoke_us']:>11.0f}{r['call_us']:>12.0f}"
                f"{r['resume_ms']:>11.1f}{r['window_ms']:>11.2f}"
                f"{r['page_ms']:>11.2f}{r['memory_bytes'] / r['raw_bytes']:>7.2f}"
            )
            sys.stdout.flush()
        print()
        for line in targets(rows):
            print(line)
        sys.stdout.flush()
        if peers_python is not None:
            with tempfile.TemporaryDirectory(prefix="perdure-redis-peers-") as work:
                peer_args = ["--url", args.url, "--prefix", f"{base}peer:"]
                peer_args += ["--size", str(args.peers_size), "--turns", str(turns)]
                document = run_peers_script(
                    peers_python, PEERS_SCRIPT, peer_args, Path(work) / "peers.json"
                )
            peers_document = check_peers(document, args.peers_size, turns)
    finally:
        floor.close()
        drop_prefix(args.url, base)
    print()
    for line in side_by_side(
        perdure_side(rows[args.peers_size], turns), args.peers_size, peers_document
    ):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
