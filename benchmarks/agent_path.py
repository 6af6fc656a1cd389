"""Agent-path benchmark: what a user's ``agent(...)`` turn with a ``Session`` costs.

Run: ``.venv/bin/python benchmarks/agent_path.py [--quick] [--turns N] [--resume-size N]``

One run prints one table. Each row drives an :class:`~perdure.Agent` through N
user/assistant turns (default 1,000; ``--quick`` 200) with a model that answers at
once (a :class:`~perdure.models.ScriptedModel` of ready answers that records nothing
and reads nothing of the request: no per-call work, as the peers' stubs) and
:class:`~perdure.NullConversationManager`, so the whole history is kept, and reports
the cost per message (two messages a turn), through ``await agent.invoke_async(...)``
and through the sync ``agent(...)``:

- perdure with no session (the loop alone);
- with a ``Session`` on a ``FileSessionStore`` and on a ``SQLiteSessionStore``, each
  with ``durability="commit"``, ``"invocation"`` and ``"none"``;
- "added" = that row minus the no-session row of the same face: what persistence costs;
- "x fsync" = added / (the fsyncs the design needs per message x the floor): one per
  message with ``durability="commit"``, one per turn (half a floor per message) with
  ``"invocation"``, none with ``"none"`` (its added cost is the session layer's CPU).
  With ``"invocation"`` the file store also fsyncs its head file once per turn (the
  end of log of issue 9), which issue 16 allows on top: 1 fsync a message. With
  ``"commit"`` its appends wait for an fdatasync of the commit log instead of the
  journal, and the head is synced by the log's checkpoint: 1 a message.
- "x off" = the same against the floor of an fsync that does not block the event
  loop (STYLE.md: blocking file I/O never runs on a loop thread): the inline floor
  plus what ``benchmarks/fsync.py`` measures a kernel fsync (native AIO, as both
  stores run it from the loop; a hop to a worker thread where there is none) to cost
  over an inline one (medians, at the start of the run).

The floors are measured in the same run, one step between every two turns of every
row, so a noisy neighbour slows floor and agent alike: append + fsync of a message
line to one file (the file store's), and one SQLite insert per transaction with
``synchronous=FULL`` in WAL mode (the SQLite store's). Each row's figures are means
over its turns; each floor is the mean of its steps in the whole run.

Below the table: the sync/async ratio of a bare turn (no session); the time to
resume a session of ``--resume-size`` messages (default 10,000) through
``Agent(session_manager=Session.resume(store, id))`` with the whole history kept, the
store already open (best of 3, in this process); and the time from nothing to the
first answer over that history ("restart to first answer"): open the store
(``durability="commit"``), build ``Agent(session_manager=Session.resume(store, id))``
with the instant model and ``NullConversationManager``, then ``agent(QUESTION)`` —
best of 3, each on an untimed copy of the same stored history, so each starts from
exactly ``--resume-size`` messages.

A last row drives a :class:`~perdure.SnapshotSessionManager` with
``save_latest_on="message"`` on a ``LocalFileStorage``, against the file floor, and
below the table the time for an agent to come back from a snapshot of 1,000 and of
``--resume-size`` messages (best of 3).

Targets (issue 16): added <= 1.3x the fsyncs the design needs (file and SQLite, every
durability that syncs); ``agent(...)`` <= 1.2x ``invoke_async`` for a bare turn;
resume of 10k with the full history <= 100 ms (the restart to first answer has no
target of its own: it is resume + store open + one turn); the snapshot manager's
per-message save <= 3x the floor, its restore of 1,000 messages <= 25 ms and of
10,000 <= 150 ms.

With ``--peers`` a second table sets the peers' full paths beside perdure's durable
rows, at the same number of turns and the same resume size: a Strands ``Agent`` with
``FileSessionManager``, an OpenAI Agents ``Runner`` with ``SQLiteSession`` and a
LangGraph messages graph with ``SqliteSaver`` (``AsyncSqliteSaver`` for ``ainvoke``),
each driven by a stub subclass of its SDK's model class that answers at once with the
same text (``benchmarks/peers.py`` says how each is driven and what it measures).
Their SDKs live in a separate virtual environment, never in perdure's: ``--peers``
creates it at ``benchmarks/.peers-venv`` (git-ignored; ``--peers-venv PATH`` for
another place) from the pins in ``benchmarks/peers-requirements.txt`` the first time
(about a minute), then runs ``peers.py`` in it as a subprocess and reads its JSON
result (``--peers-json FILE`` reads one written earlier instead). Each column (us per
message through the async and the sync face; ms to resume ``--resume-size`` messages;
ms from nothing to the first answer over them) sets each peer against perdure's row
on the same kind of store with ``durability="commit"`` (one fsync per message: as
durable as any peer, or more), as the ratio peer / perdure, and a last line says
whether perdure is the fastest on every column, and names each column where it is
not. Issue 16's target: it is.

"resume" is not the same work for everyone, and the table says what each runs:
perdure builds an agent (read, hash chain verified, restored into an ``Agent``),
Strands builds an ``Agent``, OpenAI Agents only reads ``SQLiteSession.get_items()``
(no agent, no ``Runner``), LangGraph only runs ``get_state``. "restart" is the same
for everyone and is what a user waits for after a restart: a fresh object graph over
the same stored history, then one new turn answered by the instant model, through
each SDK's sync face (perdure ``agent(...)``, Strands ``agent(...)``, OpenAI Agents
``Runner.run_sync``, LangGraph ``graph.invoke``).

Example: ``.venv/bin/python benchmarks/agent_path.py --quick --peers``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perdure import Agent, LocalFileStorage, NullConversationManager, SnapshotSessionManager
from perdure.models import ModelResponse, ScriptedModel
from perdure.session import FileSessionStore, Session, SessionStore
from perdure.stores.sqlite import SQLiteSessionStore
from perdure.types import Message

sys.path.insert(0, str(Path(__file__).resolve().parent))
from floors import FileFloor, SQLiteFloor
from fsync import measure as measure_fsync

# The question and the answer every row and every peer exchanges. The answer is as
# long as the question, in one streamed piece (ScriptedModel streams a text word by
# word; the answer has no space): each row then measures the turn and its persistence,
# not the per-delta cost of a stream, which is the same with a session or without.
from peers import ANSWER, QUESTION
from peers_venv import PEERS_VENV, ensure_peers_venv, measured_peers, run_peers_script

from perdure._runtime.fsync import kernel_fsync_available

BENCHMARKS = Path(__file__).resolve().parent
PEERS_SCRIPT = BENCHMARKS / "peers.py"
PEERS_FORMAT = "perdure-peers/2"
SESSION_ID = "resume"


def instant_model(turns: int) -> ScriptedModel:
    """A model that answers every turn at once, doing no work per call, as the peers' stubs.

    Each answer is a ready :class:`~perdure.models.ModelResponse` (zero usage, as the
    Strands stub reports), which ScriptedModel returns as it is. Given a text instead,
    ScriptedModel estimates the request's input tokens from its JSON size: cheap turn
    after turn (it encodes only what is new), but the first call after a resume
    encodes the whole history — 50 to 130 ms at 10k messages, a cost of the test model
    that no real model and no peer's stub has. It records nothing (no copy per call).
    """
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


@dataclass
class Floors:
    """Both floors, stepped between turns; their samples for the whole run."""

    file: FileFloor
    sqlite: SQLiteFloor
    file_s: list[float] = field(default_factory=list)
    sqlite_s: list[float] = field(default_factory=list)

    def step(self) -> None:
        self.file_s.append(self.file.once())
        self.sqlite_s.append(self.sqlite.once())

    def close(self) -> None:
        self.file.close()
        self.sqlite.close()


@dataclass(frozen=True)
class Config:
    """One row: a store (or none) and its durability."""

    label: str
    store: str | None  # "file", "sqlite", "snapshot" (a SnapshotSessionManager) or None
    durability: str = "commit"

    @property
    def fsyncs_per_message(self) -> float:
        if self.store is None:
            return 0.0
        if self.store == "snapshot":
            return 1.0  # save_latest_on="message": one snapshot write per message
        # The file store's head (issue 9's end of log): one fsync a turn on top, but
        # with "commit" the commit log's checkpoint syncs it (perdure.stores.file.wal).
        head = 0.5 if self.store == "file" and self.durability == "invocation" else 0.0
        if self.durability == "commit":
            return 1.0 + head
        if self.durability == "invocation":
            return 0.5 + head
        return 0.0


CONFIGS = [
    Config("no session", None),
    Config("file commit", "file", "commit"),
    Config("file invocation", "file", "invocation"),
    Config("file none", "file", "none"),
    Config("sqlite commit", "sqlite", "commit"),
    Config("sqlite invocation", "sqlite", "invocation"),
    Config("sqlite none", "sqlite", "none"),
    Config("snapshot message", "snapshot", "message"),
]


def make_store(kind: str, work: Path, durability: str) -> SessionStore:
    if kind == "file":
        return FileSessionStore(work / "file", durability=durability)  # type: ignore[arg-type]
    return SQLiteSessionStore(work / "sessions.db", durability=durability)  # type: ignore[arg-type]


def make_manager(config: Config, work: Path) -> tuple[Any, SessionStore | None]:
    """(the agent's session manager, the store to close) for one row."""
    if config.store is None:
        return None, None
    if config.store == "snapshot":
        manager = SnapshotSessionManager(
            "bench", storage=LocalFileStorage(work / "snapshots"), save_latest_on=config.durability
        )
        return manager, None
    store = make_store(config.store, work, config.durability)
    return Session(store, "bench"), store


def close_store(store: SessionStore | None) -> None:
    close = getattr(store, "close", None)
    if close is not None:
        close()


def agent_kwargs(turns: int) -> dict[str, Any]:
    return {"model": instant_model(turns), "conversation_manager": NullConversationManager()}


async def run_async(config: Config, turns: int, work: Path, floors: Floors) -> float:
    """Mean seconds per message of ``turns`` turns through ``invoke_async``."""
    session, store = make_manager(config, work)
    agent = await Agent.create(**agent_kwargs(turns), session_manager=session)
    times = []
    for _ in range(turns):
        floors.step()
        start = time.perf_counter()
        await agent.invoke_async(QUESTION)
        times.append(time.perf_counter() - start)
    assert len(agent.messages) == 2 * turns
    close_store(store)
    return statistics.fmean(times) / 2


def run_sync(config: Config, turns: int, work: Path, floors: Floors) -> float:
    """Mean seconds per message of ``turns`` turns through ``agent(...)``."""
    session, store = make_manager(config, work)
    agent = Agent(**agent_kwargs(turns), session_manager=session)
    times = []
    for _ in range(turns):
        floors.step()
        start = time.perf_counter()
        agent(QUESTION)
        times.append(time.perf_counter() - start)
    assert len(agent.messages) == 2 * turns
    close_store(store)
    return statistics.fmean(times) / 2


def message(i: int) -> Message:
    text = QUESTION if i % 2 == 0 else ANSWER
    return {"role": "user" if i % 2 == 0 else "assistant", "content": [{"text": text}]}


def build_history(kind: str, work: Path, size: int) -> None:
    """Store a session of ``size`` messages in ``work``, for the resume and the restart."""
    bulk = make_store(kind, work, "none")
    state = {
        "format": "perdure-agent-state/1",
        "agent_id": "default",
        "state": {},
        "internal_state": {"interrupt_state": {}, "model_state": {}},
        "conversation_manager_state": NullConversationManager().get_state(),
    }
    history = [message(i) for i in range(size)]

    async def build() -> None:
        await bulk.create(SESSION_ID)
        for end in range(min(1000, size), size + 1000, 1000):
            await bulk.commit(SESSION_ID, history[: min(end, size)], agent_state=state)

    asyncio.run(build())
    close_store(bulk)


def measure_resume(kind: str, history: Path, size: int) -> float:
    """Best-of-3 milliseconds to resume ``size`` messages into an agent keeping them all.

    The store is opened before the clock starts; no turn runs.
    """
    store = make_store(kind, history, "commit")
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        agent = Agent(
            model=instant_model(0),
            conversation_manager=NullConversationManager(),
            session_manager=Session.resume(store, SESSION_ID),
        )
        best = min(best, time.perf_counter() - start)
        assert len(agent.messages) == size
    close_store(store)
    return best * 1e3


def measure_restart(kind: str, history: Path, size: int) -> float:
    """Best-of-3 milliseconds from nothing to the first answer over ``size`` stored messages.

    Each repetition copies ``history`` (untimed), so each starts from the same
    ``size`` messages, then times: open the store (``durability="commit"``), build the
    agent over ``Session.resume`` with the whole history kept, answer one turn through
    ``agent(...)``. The clock stops when the answer is back; closing is not timed.
    """
    best = float("inf")
    for repeat in range(3):
        run = history.with_name(f"{history.name}-restart-{repeat}")
        shutil.copytree(history, run)
        start = time.perf_counter()
        store = make_store(kind, run, "commit")
        agent = Agent(
            model=instant_model(1),
            conversation_manager=NullConversationManager(),
            session_manager=Session.resume(store, SESSION_ID),
        )
        agent(QUESTION)
        best = min(best, time.perf_counter() - start)
        assert len(agent.messages) == size + 2
        close_store(store)
        shutil.rmtree(run)
    return best * 1e3


def measure_snapshot_restore(work: Path, size: int) -> float:
    """Best-of-3 milliseconds for an agent to come back from a snapshot of ``size`` messages."""
    storage = LocalFileStorage(work / "snapshots")
    writer = SnapshotSessionManager("restore", storage=storage, save_latest_on="trigger")
    agent = Agent(
        model=instant_model(0),
        conversation_manager=NullConversationManager(),
        messages=[message(i) for i in range(size)],
        session_manager=writer,
    )
    asyncio.run(writer.save_snapshot(agent, is_latest=True))
    best = float("inf")
    for _ in range(3):
        manager = SnapshotSessionManager("restore", storage=LocalFileStorage(work / "snapshots"))
        start = time.perf_counter()
        again = Agent(
            model=instant_model(0),
            conversation_manager=NullConversationManager(),
            session_manager=manager,
        )
        best = min(best, time.perf_counter() - start)
        assert len(again.messages) == size
    return best * 1e3


@dataclass(frozen=True)
class Peer:
    """One peer of the second table, and perdure's store it is set against."""

    name: str  # its key in peers.py's result
    label: str
    store: str  # perdure's row with durability="commit" on this store: "file" or "sqlite"


PEER_ROWS = (
    Peer("strands", "Strands {version}, FileSessionManager", "file"),
    Peer("openai", "OpenAI Agents {version}, SQLiteSession", "sqlite"),
    Peer("langgraph", "LangGraph {version}, SqliteSaver", "sqlite"),
)
# (column, its heading, the peer's key in peers.py's result, its format)
PEER_COLUMNS = (
    ("async", "async us", "async_us", "{:.0f}"),
    ("sync", "sync us", "sync_us", "{:.0f}"),
    ("resume", "resume ms", "resume_ms", "{:.1f}"),
    ("restart", "restart ms", "restart_ms", "{:.1f}"),
)
# What perdure's resume and restart columns run (the peers say theirs in their result).
PERDURE_RESUME_HOW = (
    "Agent(session_manager=Session.resume(store, id)) built over a store already open "
    "(read, hash chain verified, restored into the agent; no turn)"
)
PERDURE_RESTART_HOW = (
    "store opened (durability='commit'), Agent(model=instant, conversation_manager="
    "NullConversationManager(), session_manager=Session.resume(store, id)), agent(QUESTION)"
)


def run_peers(python: Path, turns: int, resume_size: int, work: Path) -> Any:
    """Run ``peers.py`` with ``python`` (the peers' venv) and return its JSON result."""
    args = ["--turns", str(turns), "--resume-size", str(resume_size), "--dir", str(work / "run")]
    return run_peers_script(python, PEERS_SCRIPT, args, work / "peers.json")


def check_peers(document: Any, turns: int, resume_size: int) -> dict[str, Any]:
    """``document`` if it is a result of ``peers.py`` for these sizes, else ValueError."""
    if not isinstance(document, dict) or document.get("format") != PEERS_FORMAT:
        raise ValueError(f"not a result of benchmarks/peers.py (format {PEERS_FORMAT!r})")
    if (document.get("turns"), document.get("resume_size")) != (turns, resume_size):
        raise ValueError(
            f"the peers ran {document.get('turns')} turns and resumed "
            f"{document.get('resume_size')} messages; this run: {turns} and {resume_size}"
        )
    for name, peer in measured_peers(document):
        for _, _, key, _ in PEER_COLUMNS:
            value = peer.get(key)
            if value is not None and not (isinstance(value, int | float) and value > 0):
                raise ValueError(f"peer {name!r}: {key} must be a positive number, got {value!r}")
    return document


def perdure_columns(
    results: dict[str, dict[str, float]], resume: dict[str, float], restart: dict[str, float]
) -> dict[str, dict[str, float]]:
    """Perdure's figures per store for the peers' table: its ``commit`` rows, in us and ms."""
    return {
        kind: {
            "async": results[f"{kind} commit"]["async"] * 1e6,
            "sync": results[f"{kind} commit"]["sync"] * 1e6,
            "resume": resume[kind],
            "restart": restart[kind],
        }
        for kind in ("file", "sqlite")
    }


def wrapped(text: str, indent: str) -> list[str]:
    return textwrap.wrap(text, 100, initial_indent=indent, subsequent_indent=indent + "    ")


def peers_table(perdure: dict[str, dict[str, float]], document: dict[str, Any]) -> list[str]:
    """The second table: each peer, each column, and the ratio peer / perdure."""
    turns, size = document["turns"], document["resume_size"]
    floors = document.get("floors_us") or {}
    lines = [
        f"peers' full paths, {turns} turns a row ({2 * turns} messages): us per message "
        f"(mean); resume and restart over {size} stored messages: ms (best of 3)",
        "floors in the peers' process: "
        + ", ".join(
            f"{name} {floors[key]:.0f} us"
            for key, name in (("file", "file append+fsync"), ("sqlite", "sqlite insert+commit"))
            if isinstance(floors.get(key), int | float)
        ),
    ]
    width = 40
    header = f"{'path':<{width}}" + "".join(
        f"{heading:>11}{'x':>8}" for _, heading, _, _ in PEER_COLUMNS
    )
    lines += [header, "-" * len(header)]
    for kind in ("file", "sqlite"):
        cells = "".join(
            f"{fmt.format(perdure[kind][column]):>11}{'':>8}" for column, _, _, fmt in PEER_COLUMNS
        )
        lines.append(f"{'perdure ' + kind + ' commit':<{width}}{cells}")
    ratios: list[tuple[float, str]] = []
    missing: list[str] = []
    notes: list[str] = []
    resume_how = [("perdure", PERDURE_RESUME_HOW)]
    restart_how = [("perdure", PERDURE_RESTART_HOW)]
    for peer in PEER_ROWS:
        result = document["peers"].get(peer.name)
        name = peer.label.split(" {")[0]
        if result is None:
            missing.append(f"{name} not measured")
            lines.append(f"{name:<{width}}not measured")
            continue
        label = peer.label.format(version=result.get("version", "?"))
        if "error" in result:
            missing.append(f"{name} failed")
            lines.append(f"{label:<{width}}failed: {result['error']}"[:200])
            continue
        cells = ""
        for column, _, key, fmt in PEER_COLUMNS:
            value = result.get(key)
            if value is None:
                missing.append(f"{name} {column}")
                cells += f"{'-':>11}{'-':>8}"
                continue
            ratio = value / perdure[peer.store][column]
            ratios.append((ratio, f"{name} {column}"))
            cells += f"{fmt.format(value):>11}{ratio:>7.2f}x"
        lines.append(f"{label:<{width}}{cells}")
        notes += wrapped(f"{name}: {result.get('note', '')}", "  ")
        resume_how.append((name, result.get("resume_how", "?")))
        restart_how.append((name, result.get("restart_how", "?")))
    lines.append("")
    lines += wrapped(
        f"resume = reading the {size} stored messages back; NOT the same work for each, "
        "compare with care:",
        "",
    )
    for name, how in resume_how:
        lines += wrapped(f"{name}: {how}", "  ")
    lines += wrapped(
        f"restart = to first answer, the same work for each: a fresh object graph over a copy "
        f"of the same {size} stored messages, then one new turn (instant model, whole history "
        "kept, the turn persisted); the clock stops at the answer:",
        "",
    )
    for name, how in restart_how:
        lines += wrapped(f"{name}: {how}", "  ")
    lines.append(
        "x = peer / perdure's row with durability='commit' on the same kind of store "
        "(Strands: file; OpenAI Agents,\n  LangGraph: sqlite); above 1: perdure is faster. "
        "Perdure syncs every message (the file store\n  its commit log; "
        "SQLite: synchronous=FULL in WAL mode)."
    )
    lines.append("durability as each peer ships it:")
    lines += notes
    slower = [f"{where} ({ratio:.2f}x)" for ratio, where in ratios if ratio <= 1]
    if missing:
        verdict = "not established: " + ", ".join(missing)
    elif slower:
        verdict = "no: perdure is not faster on " + ", ".join(slower)
    else:
        ratio, where = min(ratios)
        verdict = f"yes (closest: {where}, {ratio:.2f}x)"
    lines.append(f"perdure fastest on every column: {verdict}")
    return lines


def fresh(base: Path, name: str) -> Path:
    work = base / name
    work.mkdir()
    return work


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="200 turns a row")
    parser.add_argument("--turns", type=int, help="turns a row (default 1000, --quick 200)")
    parser.add_argument("--resume-size", type=int, default=10_000, help="messages to resume")
    parser.add_argument("--dir", help="where to write (default: a temp dir on the current disk)")
    parser.add_argument(
        "--peers",
        action="store_true",
        help="add the peers' table (creates benchmarks/.peers-venv with their SDKs once)",
    )
    parser.add_argument("--peers-venv", help="the peers' venv (implies --peers)")
    parser.add_argument(
        "--peers-json", help="the peers' result of an earlier peers.py run, instead of running it"
    )
    args = parser.parse_args(argv)
    turns = args.turns or (200 if args.quick else 1000)
    peers_document: Any = None
    peers_python: Path | None = None
    if args.peers_json:
        try:
            peers_document = check_peers(
                json.loads(Path(args.peers_json).read_text()), turns, args.resume_size
            )
        except (OSError, ValueError) as error:
            parser.error(f"--peers-json {args.peers_json}: {error}")
    elif args.peers or args.peers_venv:
        # Before perdure's rows: an install does not run while they are measured.
        peers_python = ensure_peers_venv(Path(args.peers_venv or PEERS_VENV).resolve())
    base = Path(tempfile.mkdtemp(prefix="perdure-agent-bench-", dir=args.dir or "."))
    # What an fsync that leaves the event loop free costs over an inline one.
    ways = asyncio.run(measure_fsync(base / "fsync-ways", max(20, min(200, turns))))
    # Both stores sync from the loop through start_fsync (the SQLite store since its
    # durable commits and flushes are made on the loop): the kernel's way where it
    # can, else a worker thread.
    off_loop = ways["kernel" if kernel_fsync_available() else "executor"] - ways["inline"]
    off_loop_extra = {"file": off_loop, "sqlite": off_loop}
    line = json.dumps(message(0)).encode() + b"\n"
    floors = Floors(FileFloor(base, line), SQLiteFloor(base, line.decode()))
    try:
        results: dict[str, dict[str, float]] = {}
        for config in CONFIGS:
            name = config.label.replace(" ", "-")
            results[config.label] = {
                "async": asyncio.run(run_async(config, turns, fresh(base, name + "-a"), floors)),
                "sync": run_sync(config, turns, fresh(base, name + "-s"), floors),
            }
        resume: dict[str, float] = {}
        restart: dict[str, float] = {}
        for kind in ("file", "sqlite"):
            history = fresh(base, f"history-{kind}")
            build_history(kind, history, args.resume_size)
            # The restart first: it copies the history as built, before a resume opens it.
            restart[kind] = measure_restart(kind, history, args.resume_size)
            resume[kind] = measure_resume(kind, history, args.resume_size)
        snapshot_sizes = sorted({min(1000, args.resume_size), args.resume_size})
        snapshot_restore = {
            size: measure_snapshot_restore(fresh(base, f"snapshot-restore-{size}"), size)
            for size in snapshot_sizes
        }
        if peers_python is not None:
            peers_document = check_peers(
                run_peers(peers_python, turns, args.resume_size, fresh(base, "peers")),
                turns,
                args.resume_size,
            )
    finally:
        floors.close()
        shutil.rmtree(base, ignore_errors=True)
    floor = {
        "file": statistics.fmean(floors.file_s),
        "sqlite": statistics.fmean(floors.sqlite_s),
    }
    print(f"{turns} turns a row ({2 * turns} messages), us per message (mean)")
    print(
        f"floors, same run: file append+fsync {floor['file'] * 1e6:.0f} us, "
        f"sqlite insert+commit {floor['sqlite'] * 1e6:.0f} us"
    )
    print(
        "off-loop floors (an fsync that leaves the event loop free): file "
        f"{(floor['file'] + off_loop_extra['file']) * 1e6:.0f} us, sqlite "
        f"{(floor['sqlite'] + off_loop_extra['sqlite']) * 1e6:.0f} us"
    )
    header = (
        f"{'path':<18}{'fsync/msg':>10}{'async us':>10}{'added':>8}{'x fsync':>9}{'x off':>7}"
        f"{'sync us':>10}{'added':>8}{'x fsync':>9}{'x off':>7}"
    )
    print(header)
    print("-" * len(header))
    bare = results["no session"]
    for config in CONFIGS:
        row = results[config.label]
        cells = f"{config.label:<18}{config.fsyncs_per_message:>10.1f}"
        for face in ("async", "sync"):
            us = row[face] * 1e6
            if config.store is None:
                cells += f"{us:>10.0f}{'-':>8}{'-':>9}{'-':>7}"
                continue
            added = (row[face] - bare[face]) * 1e6
            kind = "file" if config.store == "snapshot" else config.store
            need = config.fsyncs_per_message * floor[kind] * 1e6
            need_off = config.fsyncs_per_message * (floor[kind] + off_loop_extra[kind]) * 1e6
            ratio = f"{added / need:.2f}" if need else "-"
            ratio_off = f"{added / need_off:.2f}" if need_off else "-"
            cells += f"{us:>10.0f}{added:>8.0f}{ratio:>9}{ratio_off:>7}"
        print(cells)
    print()
    print(
        "x fsync = added / (fsyncs per message x that store's floor), for a design of one "
        "fsync per message\n  (durability='commit') or one per turn ('invocation'). The "
        "file store with 'invocation' also fsyncs its\n  head file once per turn (issue 9's "
        "end of log), which issue 16 allows on top: 1 a message.\n"
        "  x off = the same against the off-loop floors: no store blocks its event loop "
        "for an fsync (STYLE.md).\n  'snapshot message' is a SnapshotSessionManager "
        "(save_latest_on='message', LocalFileStorage)\n  against the file floor; issue "
        "16's target there is 3x."
    )
    print(f"sync/async, bare turn: {bare['sync'] / bare['async']:.2f}x")
    for kind, ms in resume.items():
        print(
            f"resume {args.resume_size} messages, {kind}, full history kept: {ms:.1f} ms "
            "(agent built over Session.resume, store already open, no turn)"
        )
    for kind, ms in restart.items():
        print(
            f"restart to first answer over {args.resume_size} messages, {kind}, commit: "
            f"{ms:.1f} ms (store opened, agent built, one turn answered)"
        )
    for size, ms in snapshot_restore.items():
        print(f"restore {size} messages from a snapshot (SnapshotSessionManager): {ms:.1f} ms")
    print()
    if peers_document is None:
        print(
            "peers: not measured. --peers adds Strands, OpenAI Agents and LangGraph beside "
            "these rows\n  (it installs their SDKs once in benchmarks/.peers-venv; see "
            "benchmarks/peers.py)."
        )
    else:
        for line in peers_table(perdure_columns(results, resume, restart), peers_document):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
