"""PerdureSession (on SQLite) against the OpenAI Agents SDK's own SQLiteSession.

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/adapters.py [--items N] [--quick]``
(``--quick``: 1,000 items). Needs ``perdure[openai-agents]`` (the ``dev`` extra has it).

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=10_000, help="items stored (default 10000)")
    parser.add_argument("--quick", action="store_true", help="1000 items")
    parser.add_argument("--dir", type=Path, default=None, help="where the databases go (temp)")
    args = parser.parse_args(argv)
    count = 1000 if args.quick else args.items
    directory = Path(tempfile.mkdtemp(prefix="perdure-adapters-", dir=args.dir))
    try:
        results = asyncio.run(run(count, directory))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    sdk, ours = results["SQLiteSession"], results["PerdureSession"]
    print(f"PerdureSession (SQLite) vs the SDK's SQLiteSession at {count} items")
    print(f"{'measure':<20}{'SQLiteSession':>15}{'PerdureSession':>16}{'ratio':>8}")
    for key in sdk:
        ratio = ours[key] / sdk[key] if sdk[key] else float("nan")
        print(f"{key:<20}{sdk[key]:>15.1f}{ours[key]:>16.1f}{ratio:>8.2f}")
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus; ratio = perdure / SDK")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
