"""Benchmark SnapshotSessionManager: save/restore time and bytes, beside the raw floors.

Run ``.venv/bin/python benchmarks/snapshots.py`` (about half a minute on 2 cores) or
with ``--quick`` (a few seconds). For agents of 100, 1k and 10k messages, each backend and each
``save_latest_on`` strategy, it prints:

* ``save ms``: mean wall time of one automatic save — per message added
  (``message``), per 4-message invocation (``invocation``), per trigger firing that
  writes ``latest`` and an immutable snapshot (``trigger``);
* ``floor ms``: the raw floor of a replace, measured in the same loop, in the same
  directory — ``open(O_EXCL) + write + fsync + rename + directory fsync`` of exactly
  the new message bytes of that save;
* ``fsync ms``: the fsync floor, measured there too — ``write + fsync`` of those bytes
  appended to one open file (what one durable append costs; ``save/fsync`` is the
  ratio issue 16 sets a target for);
* ``restore ms``: median time for a fresh manager to restore ``snapshot_latest``
  into a fresh agent;
* ``stored``: bytes the session occupies beside the history's own JSON bytes.

Then 1,000 immutable snapshots of an agent growing to 1k messages, and a verdict on
each target of issues 4 and 16. Times are wall-clock on this machine; nothing here
gates CI.

With ``--s3`` (needs ``obstore`` and ``moto[server]``) the ``s3`` backend joins: an
``S3Storage`` against moto's S3 server on loopback (started here, dummy credentials,
a bucket per cell; no AWS account), and the verdict on issue 19's target — the save's
cost stays flat in the history's length. Its ``floor``/``fsync`` columns are the local
disk's, printed for reference only.

With ``--s3 --peers`` a last table sets Strands' ``S3SessionManager`` beside the
``s3`` rows, on the same moto server (``benchmarks/peers_s3.py``, run in the peers'
virtual environment that ``agent_path.py --peers`` uses, created here the first
time): the cost of storing one more message (Strands: one object per message; perdure:
a per-message save of ``snapshot_latest``) and of restoring an agent (Strands lists the
session's prefix and reads every message object) at each size of 1,000 messages or
more, with the ratio Strands / perdure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from perdure import Agent, NullConversationManager
from perdure.models import ScriptedModel
from perdure.snapshots.manager import SaveLatestStrategy, SnapshotSessionManager
from perdure.storage import LocalFileStorage, MemoryStorage, SQLiteStorage, Storage
from perdure.types import Message

STRATEGIES = ("message", "invocation", "trigger")
BACKENDS = ("local", "sqlite", "memory")

_S3: dict[str, str] = {}  # "endpoint" once start_s3() ran


def start_s3() -> None:
    """Start moto's S3 server on a free loopback port, with dummy credentials."""
    import logging
    import socket

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    os.environ.update(
        {
            "AWS_ACCESS_KEY_ID": "perdure-bench",
            "AWS_SECRET_ACCESS_KEY": "perdure-bench-secret",
            "AWS_REGION": "us-east-1",
        }
    )
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False).start()
    _S3["endpoint"] = f"http://127.0.0.1:{port}"


def _s3_storage() -> Storage:
    """An S3Storage on a new bucket of the moto server."""
    import urllib.request

    from perdure.storage.s3 import S3Storage

    bucket = f"bench-{uuid.uuid4().hex[:20]}"
    request = urllib.request.Request(f"{_S3['endpoint']}/{bucket}", method="PUT")
    with urllib.request.urlopen(request, timeout=10):
        pass
    return S3Storage(bucket, prefix="bench", endpoint_url=_S3["endpoint"])


def _vocabulary(size: int = 5000) -> list[str]:
    """Pseudo-words from syllables: text about as compressible as English prose."""
    rng = random.Random(1)
    syllables = [a + b for a in "bcdfghjklmnprstvwz" for b in ("a", "e", "i", "o", "u", "ou")]
    words = {
        "".join(rng.choice(syllables) for _ in range(rng.choice((1, 1, 2, 2, 2, 3, 3, 4))))
        for _ in range(size)
    }
    return sorted(words)


_WORDS = _vocabulary()


def _text(rng: random.Random, low: int, high: int) -> str:
    size = rng.randint(low, high)
    words: list[str] = []
    length = 0
    while length < size:
        word = rng.choice(_WORDS) if rng.random() > 0.08 else str(rng.randint(0, 99999))
        words.append(word)
        length += len(word) + 1
    return " ".join(words)


def make_messages(count: int, seed: int = 7) -> list[Message]:
    """A realistic mix: user turn, tool call, tool result, assistant answer (repeat)."""
    rng = random.Random(seed)
    messages: list[dict[str, Any]] = []
    i = 0
    while len(messages) < count:
        kind = i % 4
        if kind == 0:
            messages.append({"role": "user", "content": [{"text": _text(rng, 80, 300)}]})
        elif kind == 1:
            messages.append(
                {
                    "role": "assistant",
                    "content": [
                        {"text": _text(rng, 20, 80)},
                        {
                            "toolUse": {
                                "toolUseId": f"t{i}",
                                "name": "lookup",
                                "input": {"query": _text(rng, 10, 40), "limit": 5},
                            }
                        },
                    ],
                }
            )
        elif kind == 2:
            messages.append(
                {
                    "role": "user",
                    "content": [
                        {
                            "toolResult": {
                                "toolUseId": f"t{i - 1}",
                                "status": "success",
                                "content": [{"text": _text(rng, 300, 1500)}],
                            }
                        }
                    ],
                }
            )
        else:
            messages.append({"role": "assistant", "content": [{"text": _text(rng, 200, 900)}]})
        i += 1
    return cast(list[Message], messages[:count])


def json_bytes(messages: list[Message]) -> int:
    """The history's own size: compact JSON of each message, summed."""
    return sum(len(json.dumps(m, separators=(",", ":"))) for m in messages)


def raw_floor(directory: Path, data: bytes) -> float:
    """Seconds for one atomic replace of ``data``: temp + write + fsync + rename + dir fsync."""
    start = time.perf_counter()
    target = directory / "floor.bin"
    tmp = directory / f".floor-{uuid.uuid4().hex}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.write(fd, data)
    os.fsync(fd)
    os.close(fd)
    os.replace(tmp, target)
    dfd = os.open(directory, os.O_RDONLY)
    os.fsync(dfd)
    os.close(dfd)
    return time.perf_counter() - start


def fsync_floor(fd: int, data: bytes) -> float:
    """Seconds for one durable append of ``data`` to the open file ``fd``: write + fsync."""
    start = time.perf_counter()
    os.write(fd, data)
    os.fsync(fd)
    return time.perf_counter() - start


@dataclass
class Row:
    """One line of the table."""

    backend: str
    strategy: str
    size: int
    save_ms: float
    save_p50_ms: float
    floor_ms: float
    fsync_ms: float
    restore_ms: float
    stored: int
    history: int


def open_backend(name: str, directory: Path) -> Storage:
    """Build a backend rooted in ``directory``."""
    if name == "local":
        return LocalFileStorage(directory / "blobs")
    if name == "sqlite":
        return SQLiteStorage(directory / "blobs.db")
    if name == "memory":
        return MemoryStorage()
    if name == "s3":
        return _s3_storage()
    raise ValueError(f"unknown backend {name!r}")


def close_backend(storage: Storage) -> None:
    """Release a backend's resources."""
    if isinstance(storage, SQLiteStorage):
        storage.close()


async def stored_bytes(storage: Storage) -> int:
    """Total size of every blob in ``storage``."""
    total = 0
    for key in await storage.list(""):
        blob = await storage.read(key)
        total += len(blob or b"")
    return total


def new_agent(manager: SnapshotSessionManager | None, messages: list[Message]) -> Agent:
    """An agent that keeps its whole history (no sliding window)."""
    return Agent(
        model=ScriptedModel([]),
        messages=messages,
        conversation_manager=NullConversationManager(),
        session_manager=manager,
    )


async def bench_strategy(
    backend: str,
    strategy: str,
    sizes: tuple[int, ...],
    saves: int,
    restores: int,
    directory: Path,
) -> list[Row]:
    """Measure one (backend, strategy) for every history size, interleaved.

    The sizes take turns save by save (and each turn also measures the raw floor),
    so that a noisy neighbour on the machine slows every size alike.
    """
    step = 1 if strategy == "message" else 4
    cells = []
    for size in sizes:
        cell_dir = directory / f"n{size}"
        cell_dir.mkdir()
        storage = open_backend(backend, cell_dir)
        pool = make_messages(size + saves * step + 8)
        manager = SnapshotSessionManager(
            f"bench-{strategy}", storage=storage, save_latest_on=cast(SaveLatestStrategy, strategy)
        )
        agent = new_agent(None, pool[:size])
        await manager.save_snapshot(agent, is_latest=True)  # the history already stored
        cells.append((size, storage, pool, manager, agent))
    save_times: dict[int, list[float]] = {size: [] for size in sizes}
    floor_times: list[float] = []
    fsync_times: list[float] = []
    floor_dir = directory / "floor"
    floor_dir.mkdir()
    log_fd = os.open(floor_dir / "append.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for turn in range(saves):
        for size, _storage, pool, manager, agent in cells:
            new = pool[size + turn * step : size + (turn + 1) * step]
            agent.messages.extend(new)
            start = time.perf_counter()
            await manager.save_snapshot(agent, is_latest=True)
            if strategy == "trigger":
                await manager.save_snapshot(agent, is_latest=False)
            save_times[size].append(time.perf_counter() - start)
            data = b"".join(json.dumps(m, separators=(",", ":")).encode() for m in new)
            floor_times.append(raw_floor(floor_dir, data))
            fsync_times.append(fsync_floor(log_fd, data))
    os.close(log_fd)
    floor_ms = statistics.fmean(floor_times) * 1000
    fsync_ms = statistics.fmean(fsync_times) * 1000
    rows = []
    for size, storage, _pool, _manager, agent in cells:
        restore_times: list[float] = []
        for _ in range(restores):
            fresh_manager = SnapshotSessionManager(f"bench-{strategy}", storage=storage)
            fresh = new_agent(None, [])
            start = time.perf_counter()
            found = await fresh_manager.restore_snapshot(fresh)
            restore_times.append(time.perf_counter() - start)
            assert found
            assert fresh.messages == agent.messages
        rows.append(
            Row(
                backend=backend,
                strategy=strategy,
                size=size,
                save_ms=statistics.fmean(save_times[size]) * 1000,
                save_p50_ms=statistics.median(save_times[size]) * 1000,
                floor_ms=floor_ms,
                fsync_ms=fsync_ms,
                restore_ms=statistics.median(restore_times) * 1000,
                stored=await stored_bytes(storage),
                history=json_bytes(agent.messages),
            )
        )
        close_backend(storage)
    return rows


async def bench_snapshots(
    count: int, directory: Path, backend: str = "local"
) -> tuple[int, int, float]:
    """``count`` immutable snapshots of an agent growing by one message each.

    Returns (bytes stored, bytes of the final history's JSON, seconds taken).
    """
    storage = open_backend(backend, directory)
    manager = SnapshotSessionManager("bench-growing", storage=storage)
    pool = make_messages(count)
    agent = new_agent(None, [])
    start = time.perf_counter()
    for message in pool:
        agent.messages.append(message)
        await manager.save_snapshot(agent, is_latest=False)
    elapsed = time.perf_counter() - start
    ids = await manager.list_snapshot_ids(agent)
    assert len(ids) == count
    check = new_agent(None, [])
    assert await manager.restore_snapshot(check, snapshot_id=ids[count // 2])
    assert check.messages == pool[: count // 2 + 1]
    stored = await stored_bytes(storage)
    close_backend(storage)
    return stored, json_bytes(pool), elapsed


def _kib(value: int) -> str:
    return f"{value / 1024:,.0f} KiB"


def run(
    sizes: tuple[int, ...],
    backends: tuple[str, ...],
    strategies: tuple[str, ...],
    saves: int,
    restores: int,
    snapshots: int,
    base: Path,
    out: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run the benchmark, print the tables, and return the numbers."""
    rows: list[Row] = []
    header = (
        f"{'backend':<7} {'strategy':<10} {'msgs':>6} {'save ms':>8} {'p50 ms':>7} "
        f"{'floor ms':>8} {'save/floor':>10} {'fsync ms':>8} {'save/fsync':>10} "
        f"{'restore ms':>10} {'stored':>11} {'history':>11}"
    )
    out(header)
    out("-" * len(header))
    for backend in backends:
        for strategy in strategies:
            directory = Path(tempfile.mkdtemp(dir=base))
            count = saves if strategy == "message" else max(3, saves // 4)
            cell_rows = asyncio.run(
                bench_strategy(backend, strategy, sizes, count, restores, directory)
            )
            shutil.rmtree(directory, ignore_errors=True)
            for row in cell_rows:
                rows.append(row)
                out(
                    f"{row.backend:<7} {row.strategy:<10} {row.size:>6} {row.save_ms:>8.3f} "
                    f"{row.save_p50_ms:>7.3f} {row.floor_ms:>8.3f} "
                    f"{row.save_ms / row.floor_ms:>10.2f} {row.fsync_ms:>8.3f} "
                    f"{row.save_ms / row.fsync_ms:>10.2f} {row.restore_ms:>10.1f} "
                    f"{_kib(row.stored):>11} {_kib(row.history):>11}"
                )
    result: dict[str, Any] = {"rows": rows}
    if snapshots:
        directory = Path(tempfile.mkdtemp(dir=base))
        stored, history, elapsed = asyncio.run(bench_snapshots(snapshots, directory))
        shutil.rmtree(directory, ignore_errors=True)
        result["snapshots"] = (stored, history, elapsed)
        out("")
        out(
            f"{snapshots} immutable snapshots of an agent growing to {snapshots} messages "
            f"(local): stored {_kib(stored)} for a {_kib(history)} history = "
            f"{stored / history:.2f}x, {elapsed * 1000 / snapshots:.2f} ms per snapshot"
        )
    out("")
    out("targets (issue 4):")
    by = {(r.backend, r.strategy, r.size): r for r in rows}
    small, large = min(sizes), max(sizes)
    for backend in backends:
        lo, hi = by.get((backend, "message", small)), by.get((backend, "message", large))
        if lo is None or hi is None or backend in ("memory", "s3"):
            continue
        ratio = hi.save_ms / lo.save_ms
        out(
            f"  [{'ok' if ratio <= 1.5 else 'MISSED'}] {backend}: message save at {large} "
            f"msgs / at {small} msgs = {ratio:.2f} (target <= 1.5)"
        )
        floor = hi.save_ms / hi.floor_ms
        out(
            f"  [{'ok' if floor <= 2.5 else 'MISSED'}] {backend}: message save at {large} "
            f"msgs / raw floor = {floor:.2f} (target <= 2.5)"
        )
    if "snapshots" in result:
        stored, history, _ = result["snapshots"]
        out(
            f"  [{'ok' if stored <= 3 * history else 'MISSED'}] {snapshots} snapshots: "
            f"{stored / history:.2f}x the final history (target <= 3)"
        )
    local = [r for r in rows if r.backend == "local" and r.size == large]
    if local:
        worst = max(r.restore_ms for r in local)
        out(
            f"  [{'ok' if worst <= 100 else 'MISSED'}] local restore of {large} messages: "
            f"{worst:.1f} ms at worst (target <= 100)"
        )
    if "s3" in backends:
        out("targets (issue 19):")
        base_size = 1000 if 1000 in sizes else small
        lo, hi = by.get(("s3", "message", base_size)), by.get(("s3", "message", large))
        if lo is not None and hi is not None and large > base_size:
            ratio = hi.save_ms / lo.save_ms
            out(
                f"  [{'ok' if ratio <= 1.5 else 'MISSED'}] s3: message save at {large} msgs "
                f"/ at {base_size} msgs = {ratio:.2f} (target <= 1.5; moto on loopback)"
            )
    out("targets (issue 16):")
    for size in sizes:
        row = by.get(("local", "message", size))
        if row is None or size < 1000:
            continue
        ratio = row.save_ms / row.fsync_ms
        out(
            f"  [{'ok' if ratio <= 3 else 'MISSED'}] local: message save at {size} msgs / "
            f"fsync floor = {ratio:.2f} (target <= 3)"
        )
    return result


def peers_table(rows: list[Row], document: dict[str, Any]) -> list[str]:
    """perdure's ``s3`` message rows beside Strands' ``S3SessionManager`` (peers_s3.py)."""
    by = {r.size: r for r in rows if r.backend == "s3" and r.strategy == "message"}
    lines = [
        f"side by side on the same moto server: perdure S3Storage + SnapshotSessionManager "
        f"(save_latest_on='message') vs {document.get('sdk', 'Strands')} S3SessionManager",
        f"{'msgs':>6} {'perdure save ms':>16} {'Strands save ms':>16} {'x':>6} "
        f"{'perdure restore ms':>19} {'Strands restore ms':>19} {'x':>6}",
    ]
    for size_text, peer in sorted(document["sizes"].items(), key=lambda item: int(item[0])):
        mine = by.get(int(size_text))
        if mine is None:
            continue
        lines.append(
            f"{int(size_text):>6} {mine.save_ms:>16.2f} {peer['save_ms']:>16.2f} "
            f"{peer['save_ms'] / mine.save_ms:>6.2f} {mine.restore_ms:>19.1f} "
            f"{peer['restore_ms']:>19.1f} {peer['restore_ms'] / mine.restore_ms:>6.2f}"
        )
    return lines


def run_s3_peers(sizes: tuple[int, ...], saves: int, restores: int, base: Path) -> Any:
    """Strands' S3SessionManager on the moto server this process runs (peers_s3.py)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from peers_venv import PEERS_VENV, ensure_peers_venv, run_peers_script

    python = ensure_peers_venv(PEERS_VENV.resolve())
    args = [
        "--endpoint",
        _S3["endpoint"],
        "--sizes",
        ",".join(str(size) for size in sizes),
        "--saves",
        str(saves),
        "--restores",
        str(restores),
    ]
    script = Path(__file__).resolve().parent / "peers_s3.py"
    return run_peers_script(python, script, args, base / "peers-s3.json")


def main(argv: list[str] | None = None) -> int:
    """Parse arguments and run (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller and faster run")
    parser.add_argument("--dir", type=Path, default=None, help="where to put temp data")
    parser.add_argument(
        "--s3", action="store_true", help="add S3Storage on moto's server on loopback"
    )
    parser.add_argument(
        "--peers",
        action="store_true",
        help="with --s3: Strands' S3SessionManager beside the s3 rows (benchmarks/.peers-venv)",
    )
    args = parser.parse_args(argv)
    if args.peers and not args.s3:
        parser.error("--peers compares on S3: give --s3 too")
    backends = BACKENDS
    if args.s3:
        start_s3()
        backends = (*BACKENDS, "s3")
    base = Path(tempfile.mkdtemp(prefix="perdure-bench-", dir=args.dir))
    try:
        sizes, saves, restores = (
            ((100, 1000), 40, 3) if args.quick else ((100, 1000, 10_000), 400, 9)
        )
        result = run(
            sizes, backends, STRATEGIES, saves, restores, 200 if args.quick else 1000, base
        )
        if args.peers:
            peer_sizes = tuple(size for size in sizes if size >= 1000)
            document = run_s3_peers(peer_sizes, min(saves, 100), restores, base)
            print()
            for line in peers_table(result["rows"], document):
                print(line)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
