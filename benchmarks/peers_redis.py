"""The peer on Redis for ``benchmarks/redis_store.py``: the OpenAI Agents SDK's RedisSession.

This script runs in the peers' own virtual environment (their SDKs, not perdure);
``redis_store.py --peers`` creates that environment (``benchmarks/peers_venv.py``) and runs,
with the same sizes as its own side-by-side rows:

    VENV/bin/python benchmarks/peers_redis.py --url URL --prefix PREFIX \\
        --size N --turns T --out FILE

The peer's keys live under ``PREFIX`` (its ``key_prefix``; the floor's list is
``PREFIX:floor``), and every key under it is deleted at the end (never ``FLUSHDB``:
the server is shared). The peer:

1. stores a history of N messages the cheapest way its API allows, untimed (one
   ``add_items``), the items of a Runner turn with the same texts as perdure's rows
   (``peers_postgres.history_text``: ~340 characters, user and assistant in turn);
2. runs T turns over it through its full agent path — ``Runner.run(agent, QUESTION,
   session=session)`` with the stub subclass of the SDK's ``Model`` that ``peers.py``
   defines (it answers ``ANSWER`` at once), tracing disabled: the median turn / 2 is
   the cost per message (two items a turn); between two turns, untimed, one step of
   the Redis floor (``floors.RedisFloor``: one ``RPUSH`` on one connection), as
   perdure's rows step it;
3. resume: ``get_items()`` on a new ``RedisSession.from_url`` opened before the clock
   (N + 2T items), best of 3 (its first read also connects);
4. a tail page: ``get_items(limit=50)``, median of 20;
5. memory used: ``MEMORY USAGE key SAMPLES 0`` summed over every key under its prefix
   (``SCAN``), the floor's list deleted first.

It imports nothing from perdure, and the SDK only inside the function that uses it,
so perdure's own environment can import it (``redis_store.py`` and its tests do).
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
from floors import RedisFloor
from peers import ANSWER, QUESTION, openai_model
from peers_postgres import history_text

FORMAT = "perdure-peers-redis/1"
PEERS = ("openai",)
DISTRIBUTIONS = {"openai": "openai-agents"}
PAGE = 50
REPEATS = 3
PAGES = 20


def floor_body() -> str:
    """What the floor pushes: the JSON of the first stored message, as perdure stores it."""
    message = {"role": "user", "content": [{"text": history_text(0)}]}
    return json.dumps(message)


def glob_escape(text: str) -> str:
    """``text`` as a literal in a ``SCAN MATCH`` pattern."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def prefix_keys(url: str, prefix: str) -> list[bytes]:
    """Every key under ``prefix`` (``SCAN``)."""
    import redis

    with redis.Redis.from_url(url) as client:
        return list(client.scan_iter(match=glob_escape(prefix) + "*", count=1000))


def prefix_memory(url: str, prefix: str) -> dict[str, int]:
    """Each key under ``prefix`` and its ``MEMORY USAGE … SAMPLES 0`` (every element counted)."""
    import redis

    keys = prefix_keys(url, prefix)
    with redis.Redis.from_url(url) as client:
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.memory_usage(key, samples=0)
        sizes = pipe.execute()
    return {key.decode(): int(size or 0) for key, size in zip(keys, sizes, strict=True)}


def drop_prefix(url: str, prefix: str) -> int:
    """Delete every key under ``prefix``; how many there were."""
    import redis

    keys = prefix_keys(url, prefix)
    with redis.Redis.from_url(url) as client:
        for start in range(0, len(keys), 500):
            client.delete(*keys[start : start + 500])
    return len(keys)


def check_held(held: int, expected: int, doing: str) -> None:
    if held != expected:
        raise RuntimeError(f"{doing}: the peer holds {held} messages, expected {expected}")


# --- OpenAI Agents ---------------------------------------------------------------------


def openai_peer(url: str, prefix: str, size: int, turns: int, floor: RedisFloor) -> dict[str, Any]:
    from agents import Agent, Runner, set_tracing_disabled
    from agents.extensions.memory import RedisSession

    set_tracing_disabled(True)
    key_prefix = f"{prefix}openai"

    def open_session(session_id: str) -> Any:
        return RedisSession.from_url(session_id, url=url, key_prefix=key_prefix)

    agent = Agent(name="bench", model=openai_model())
    held = size + 2 * turns

    async def write() -> list[float]:
        # The items a Runner turn stores, as the template of the stored history.
        template = open_session("template")
        await Runner.run(agent, QUESTION, session=template)
        pair = await template.get_items()
        await template.clear_session()
        await template.close()
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
        times = []
        for _ in range(turns):
            floor.once()
            start = time.perf_counter()
            await Runner.run(agent, QUESTION, session=session)
            times.append(time.perf_counter() - start)
        check_held(len(await session.get_items()), held, f"after {turns} turns")
        await session.close()
        return times

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
        await reader.close()
        return resume_s, page_s

    turn_s = asyncio.run(write())
    resume_s, page_s = asyncio.run(read())
    keys = prefix_memory(url, key_prefix)
    return {
        "turn_us": statistics.median(turn_s) / 2 * 1e6,
        "resume_ms": min(resume_s) * 1e3,
        "page_ms": statistics.median(page_s) * 1e3,
        "memory_bytes": sum(keys.values()),
        "keys": keys,
        "messages": held,
        "face": "async",
        "label": "OpenAI Agents {version}, RedisSession",
        "turn_how": (
            "Runner.run(agent, QUESTION, session=session), the stub Model subclass, "
            "RedisSession.from_url(id, url=URL, key_prefix=PREFIX)"
        ),
        "resume_how": "get_items() on a new RedisSession.from_url (no Agent, no Runner)",
        "page_how": "get_items(limit=50)",
        "note": (
            "RedisSession: the items in a list, as the server keeps them (no hash chain, "
            "no writer lease); the Runner reads the whole history back every turn"
        ),
    }


RUNNERS: dict[str, Callable[[str, str, int, int, RedisFloor], dict[str, Any]]] = {
    "openai": openai_peer,
}


def version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def main(argv: list[str] | None = None) -> int:
    """Measure the peer and write ``{"format", "size", "turns", "floor_us", "peers"}``.

    ``peers`` maps each peer's name to its ``version``, ``label``, ``face`` (perdure's
    face it is set against), ``turn_us`` (median per message), ``resume_ms``,
    ``page_ms``, ``memory_bytes`` (and ``keys``, by name), ``messages`` (held when
    measured), ``turn_how``, ``resume_how``, ``page_how`` and ``note``; or to
    ``{"version", "error"}`` when that peer failed. Every key under the prefix is
    deleted before it returns.
    """
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--url", required=True, help="redis://… URL of the server")
    parser.add_argument("--prefix", required=True, help="prefix of every key the run makes")
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
    if not args.prefix:
        parser.error("--prefix must not be empty (the run deletes every key under it)")

    import redis

    with redis.Redis.from_url(args.url) as client:
        server = client.info("server").get("redis_version", "?")
    floor: RedisFloor | None = None
    peers: dict[str, Any] = {}
    try:
        floor = RedisFloor(args.url, f"{args.prefix}floor", floor_body())
        for name in names:
            result: dict[str, Any] = {"version": version(DISTRIBUTIONS[name])}
            try:
                result.update(RUNNERS[name](args.url, args.prefix, args.size, args.turns, floor))
            except Exception as error:
                traceback.print_exc()
                result["error"] = f"{type(error).__name__}: {error}"
            peers[name] = result
        floor_us = statistics.median(floor.samples) * 1e6 if floor.samples else None
    finally:
        if floor is not None:
            floor.close()
        drop_prefix(args.url, args.prefix)
    document = {
        "format": FORMAT,
        "size": args.size,
        "turns": args.turns,
        "server": server,
        "python": sys.version.split()[0],
        "floor_us": floor_us,
        "peers": peers,
    }
    Path(args.out).write_text(json.dumps(document, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
