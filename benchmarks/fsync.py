"""What a durable append costs by where its fsync runs.

Run: ``.venv/bin/python benchmarks/fsync.py [--n 500] [--dir DIR]``

Appends a 420-byte line and makes it durable, ``--n`` times each way, interleaved
so that a noisy neighbour slows every way alike, and prints the median per append:

- ``inline``: ``os.write`` + ``os.fsync`` on the calling thread (the floor; blocks
  an event loop for the whole fsync);
- ``executor``: the same in ``loop.run_in_executor`` (a hop to a worker thread and
  back);
- ``kernel``: ``os.write``, then :func:`perdure._runtime.fsync.start_fsync`, awaited
  (Linux native AIO; elsewhere this falls back to the executor);
- ``offload``: the same with ``offload=True`` (an io_uring worker, which leaves the
  loop's CPU alone: what the commit logs use for a sync behind which commits queued;
  a lone fsync pays for the wake-up on the other core).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from perdure._runtime.fsync import kernel_fsync_available, start_fsync

LINE = b"x" * 419 + b"\n"


async def measure(path: Path, n: int) -> dict[str, float]:
    loop = asyncio.get_running_loop()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    times: dict[str, list[float]] = {"inline": [], "executor": [], "kernel": [], "offload": []}

    def append_and_sync() -> None:
        os.write(fd, LINE)
        os.fsync(fd)

    try:
        with ThreadPoolExecutor(1) as executor:
            for _ in range(n):
                start = time.perf_counter()
                append_and_sync()
                times["inline"].append(time.perf_counter() - start)

                start = time.perf_counter()
                await loop.run_in_executor(executor, append_and_sync)
                times["executor"].append(time.perf_counter() - start)

                start = time.perf_counter()
                os.write(fd, LINE)
                await start_fsync(fd, executor)
                times["kernel"].append(time.perf_counter() - start)

                start = time.perf_counter()
                os.write(fd, LINE)
                await start_fsync(fd, executor, offload=True)
                times["offload"].append(time.perf_counter() - start)
    finally:
        os.close(fd)
    return {way: statistics.median(values) for way, values in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=500, help="appends per way (default 500)")
    parser.add_argument("--dir", help="where to write (default: a temp dir on the current disk)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="perdure-fsync-", dir=args.dir or ".") as work:
        result = asyncio.run(measure(Path(work) / "journal", args.n))
    where = "kernel (native AIO)" if kernel_fsync_available() else "executor (no native AIO)"
    print(f"start_fsync runs in: {where}")
    print(f"{'way':<10}{'us/append':>11}{'x inline':>10}")
    for way, seconds in result.items():
        print(f"{way:<10}{seconds * 1e6:>11.0f}{seconds / result['inline']:>10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
