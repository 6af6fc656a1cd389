"""``perdure serve`` benchmark: a 50-message history page through the HTTP stack.

Run: ``.venv/bin/python benchmarks/server.py [--quick] [--size 100000] [--requests 200]``

For the file and SQLite stores, a session of ``--size`` messages (a question, a tool
call, its result and an answer per turn) is built, then ``GET
/api/sessions/{id}/history?offset=…&limit=50`` is timed, ``--requests`` times for
each of two pages (the newest, which the page opens first, and one in the middle),
and ``GET /api/sessions/{id}`` (``show``: metadata, state summary, checkpoints):

- ``floor``: the library call the route makes (:func:`read_history_page`,
  :func:`perdure.cli.ops.describe_session`), in process;
- ``asgi``: the whole ASGI app (guard, routing, JSON) through ``httpx.ASGITransport``;
- ``http``: a real uvicorn on 127.0.0.1 and one keep-alive ``httpx`` client.

Prints p50 and p95 in milliseconds. Target (issue 21): the ``http`` p50 of a page at
100k messages <= 10 ms.

Then the session list at ``--sessions`` sessions (default 100,000): ``GET
/api/sessions?limit=50``, the first request (a full read of every session's metadata:
``store.list()``) and later ones, served from the server's copy: a page in the middle
in id order (``after`` an id) and by update time (``offset``); and the first request
again on a new server over the same store (``restart``: a file store lists from its
listing cache, which the first full read wrote). Beside them the floor,
one ``store.list(limit=51)`` page from the middle, as a client of the store would
page without the server's copy.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from perdure.cli import ops
from perdure.server import create_app
from perdure.session import SessionStore, open_store, read_history_page
from perdure.types import Message

PAGE = 50


def turn(n: int) -> list[Message]:
    """One turn of four messages, ~600 bytes as JSON."""
    return [
        {"role": "user", "content": [{"text": f"question {n}: " + "how much is it " * 4}]},
        {
            "role": "assistant",
            "content": [{"toolUse": {"toolUseId": f"t{n}", "name": "price", "input": {"n": n}}}],
        },
        {
            "role": "user",
            "content": [
                {
                    "toolResult": {
                        "toolUseId": f"t{n}",
                        "status": "success",
                        "content": [{"text": f"{n * 3} euros"}],
                    }
                }
            ],
        },
        {"role": "assistant", "content": [{"text": f"answer {n}: " + "it costs that much " * 4}]},
    ]


STATE = {
    "agent_id": "default",
    "state": {"customer": "c-42", "basket": ["tea"]},
    "conversation_manager_state": {"__name__": "SlidingWindowConversationManager"},
}
"""Agent state as a :class:`~perdure.session.Session` commits it with its messages."""


async def build(url: str, size: int) -> None:
    """The ``bench`` session with ``size`` messages and agent state, 1000 at a time."""
    store = open_store(url)
    await store.create("bench")
    history: list[Message] = []
    n = 0
    while len(history) < size:
        history.extend(turn(n))
        n += 1
        if len(history) % 1000 == 0 or len(history) >= size:
            await store.commit("bench", history[:size], agent_state=STATE)
    getattr(store, "close", lambda: None)()


async def timed(call: Callable[[], Awaitable[Any]], count: int) -> list[float]:
    await call()  # warm-up: caches, connection, first parse
    times = []
    for _ in range(count):
        start = time.perf_counter()
        await call()
        times.append(time.perf_counter() - start)
    return times


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class Served:
    """uvicorn serving ``app`` on a loopback port, in a thread of its own."""

    def __init__(self, app: Any) -> None:
        self.port = free_port()
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def ms(times: list[float], q: float) -> float:
    ordered = sorted(times)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


async def measure(kind: str, url: str, size: int, requests: int) -> list[dict[str, Any]]:
    rows = []
    store: SessionStore = open_store(url)
    app = create_app(store)
    tail = (await read_history_page(store, "bench", offset=max(0, size - PAGE), limit=PAGE)).offset
    history = "/api/sessions/bench/history"
    # (row, route, query, the library call the route makes)
    cases: list[tuple[str, str, dict[str, int], Callable[[], Awaitable[Any]]]] = [
        (
            name,
            history,
            {"offset": offset, "limit": PAGE},
            lambda o=offset: read_history_page(store, "bench", offset=o, limit=PAGE),
        )
        for name, offset in (("newest", tail), ("middle", size // 2))
    ]
    cases.append(
        (
            "show",
            "/api/sessions/bench",
            {},
            lambda: ops.describe_session(store, "bench", verify_history=False),
        )
    )
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1"
        ) as in_process:
            for name, path, params, library in cases:
                answer = await in_process.get(path, params=params)
                assert answer.status_code == 200, answer.text
                floor = await timed(library, requests)
                asgi = await timed(lambda p=path, q=params: in_process.get(p, params=q), requests)
                rows.append(
                    {"name": name, "floor": floor, "asgi": asgi, "bytes": len(answer.content)}
                )
        with Served(app) as base:
            async with httpx.AsyncClient(base_url=base) as client:
                for row, (_, path, params, _) in zip(rows, cases, strict=True):
                    row["http"] = await timed(
                        lambda p=path, q=params: client.get(p, params=q), requests
                    )
    finally:
        getattr(store, "close", lambda: None)()
    for row in rows:
        row["kind"] = kind
    return rows


async def first_page(url: str, count: int) -> float:
    """Seconds of the first ``GET /api/sessions?limit=50`` of a server just started."""
    store: SessionStore = open_store(url)
    app = create_app(store)
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1"
        ) as http:
            start = time.perf_counter()
            first = await http.get("/api/sessions?limit=50")
            took = time.perf_counter() - start
            assert first.json()["total"] == count, first.text
    finally:
        getattr(store, "close", lambda: None)()
    return took


async def listing(url: str, count: int, requests: int) -> dict[str, float]:
    """Milliseconds of the session list's cases at ``count`` sessions."""
    store: SessionStore = open_store(url + "?durability=none")
    for n in range(count):
        await store.create(f"session-{n:06d}")
    getattr(store, "close", lambda: None)()
    # A file store caches the rows of sessions whose files settled (2 s): let them.
    await asyncio.sleep(2.1)
    store = open_store(url)
    app = create_app(store)
    middle = f"session-{count // 2:06d}"
    try:
        floor = await timed(lambda: store.list(limit=51, after=middle), max(3, requests // 20))
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1"
        ) as http:
            start = time.perf_counter()
            first = await http.get("/api/sessions?limit=50")
            cold = time.perf_counter() - start
            assert first.json()["total"] == count, first.text
            by_id = await timed(
                lambda: http.get(f"/api/sessions?limit=50&after={middle}"), requests
            )
            by_updated = f"/api/sessions?limit=50&order=updated&offset={count // 2}"
            warm = await timed(lambda: http.get(by_updated), requests)
            assert len((await http.get(by_updated)).json()["sessions"]) == min(
                50, count - count // 2
            )
    finally:
        getattr(store, "close", lambda: None)()
    restart = await first_page(url, count)  # a file store: from its listing cache
    return {
        "floor": statistics.median(floor) * 1000,
        "first": cold * 1000,
        "restart": restart * 1000,
        "id": statistics.median(by_id) * 1000,
        "updated": statistics.median(warm) * 1000,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2,000 messages, 20 requests")
    parser.add_argument("--size", type=int, default=None, help="messages (default 100000)")
    parser.add_argument("--requests", type=int, default=None, help="timed requests per page")
    parser.add_argument("--sessions", type=int, default=None, help="sessions to list")
    parser.add_argument("--dir", help="where to write (default: a temp dir here)")
    args = parser.parse_args(argv)
    size = args.size or (2000 if args.quick else 100_000)
    sessions = args.sessions or (200 if args.quick else 100_000)
    requests = args.requests or (20 if args.quick else 200)
    base = Path(tempfile.mkdtemp(prefix="perdure-bench-serve-", dir=args.dir or "."))
    try:
        print(f"GET {PAGE}-message history pages of a {size}-message session, {requests} requests")
        print(
            f"{'store':<7}{'page':<8}{'bytes':>8}{'floor p50':>11}{'asgi p50':>10}"
            f"{'http p50':>10}{'http p95':>10}"
        )
        for kind, url in (("file", f"file:{base / 'file'}"), ("sqlite", f"sqlite:{base / 'p.db'}")):
            asyncio.run(build(url, size))
            for row in asyncio.run(measure(kind, url, size, requests)):
                print(
                    f"{row['kind']:<7}{row['name']:<8}{row['bytes']:>8}"
                    f"{statistics.median(row['floor']) * 1000:>11.2f}"
                    f"{statistics.median(row['asgi']) * 1000:>10.2f}"
                    f"{statistics.median(row['http']) * 1000:>10.2f}{ms(row['http'], 0.95):>10.2f}"
                )
        print("ms; target (issue 21): http p50 <= 10 ms at 100,000 messages")
        print()
        print(
            f"{'store':<7}{'sessions':>9}{'list() floor':>14}{'first':>10}{'restart':>10}"
            f"{'id p50':>9}{'updated p50':>13}"
        )
        for kind, url in (
            ("file", f"file:{base / 'list-file'}"),
            ("sqlite", f"sqlite:{base / 'list.db'}"),
        ):
            got = asyncio.run(listing(url, sessions, requests))
            print(
                f"{kind:<7}{sessions:>9}{got['floor']:>14.2f}{got['first']:>10.1f}"
                f"{got['restart']:>10.1f}"
                f"{got['id']:>9.2f}{got['updated']:>13.2f}"
            )
        print(
            "ms: GET /api/sessions?limit=50 through the ASGI app; first: the first request "
            "(a full read), restart: the same on a server started again"
        )
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
