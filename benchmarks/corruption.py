"""Corruption matrix: flip bytes in every kind of file perdure writes, then read it all back.

Run: ``.venv/bin/python benchmarks/corruption.py [--flips 500] [--seed 14] [--kinds a,b]``

For each file kind it builds one small real fixture (through the public API: an
``Agent`` with a ``Session`` or a ``SnapshotSessionManager``), then, for every byte
of the kind's files (or a seeded sample of ``--flips`` offsets, always including
each file's first and last two bytes and the newline before the journal's torn
tail), XORs that byte with a seeded non-zero mask in a working copy of the fixture
(put back after each flip), and reads everything back through the public API:
``store.list``, ``store.get``, every history page, every checkpoint's ``get``
(session stores; SQLite's ``get`` again after the store was closed, which folds the
WAL into the database), ``restore_snapshot`` of ``latest`` and of every immutable
snapshot (snapshot manager), then :func:`~perdure.session.verify_store`. Each read
is compared with the same read of the undamaged fixture: the whole messages, agent
state, metadata, checkpoint payloads and restored snapshot data.

Kinds (the file flipped; what reads it):

========================  ==============================================================
``journal``               ``sessions/s/journal.jsonl`` of a ``FileSessionStore``, every
                          record acknowledged (a clean stop)
``journal-torn``          the same journal ending with a torn, never acknowledged
                          partial record (a writer killed in an append)
``segment``               the sealed ``segments/*.jsonl``
``manifest``              ``manifest.json`` (the sealed segments, their digests)
``meta``                  ``meta.json``
``checkpoint``            the session's ``checkpoints/*.json``
``attachment``            ``attachments/<sha256>`` (an image's bytes)
``session-other``         any other file in the session directory: today the
                          ``head`` file, two checksummed slots naming the journal's
                          end (a flip spoils one slot and the reader takes the
                          other, so its flips are harmless by design)
``snapshot-manifest``     ``latest`` and ``snapshots/<ULID>`` blobs of a
                          ``SnapshotSessionManager`` on ``LocalFileStorage``
``snapshot-chunk``        its ``chunks/<sha256>`` blobs (plain and zlib)
``sqlite-db``             a ``SQLiteSessionStore`` file closed cleanly (no WAL)
``sqlite-wal``            the ``-wal`` of one left by a SIGKILLed writer that never
                          folded it (database + WAL copied, no ``-shm``)
========================  ==============================================================

Outcomes of one flip (reads are compared one by one with the undamaged reads):

- ``detected``: some read raised a damage error (``SessionCorruptedError`` or
  ``SnapshotError``), every other read returned exactly the original, and
  ``verify_store`` reported damage (for the kinds it covers: all but the snapshot
  manager's); or every read was equal and only ``verify_store`` saw the damage.
  Listings (``list``, ``checkpoints.list``, ``list_snapshot_ids``) read metadata
  without verifying it, by design, so they may show stale figures for a session
  that the verified reads and ``verify_store`` report as damaged.
- ``healed``: every read equal, verify clean, and the flip lay in bytes a reader
  may drop: the torn, unacknowledged record at the end of the journal.
- ``harmless``: every read equal, verify clean, the flip elsewhere: bytes nothing
  reads (free SQLite pages, slack), or bytes whose change leaves the content equal.
- ``stamp``: the only difference is a ``created_at``/``updated_at`` timestamp of a
  session or checkpoint: metadata the store keeps for people, not content (SQLite
  keeps them in plain columns no hash covers). Allowed, counted apart.
- ``limit``: the flip lay in the last transaction of the SQLite WAL and the reads
  return exactly what they returned before that transaction: SQLite cannot tell a
  damaged last transaction from one a crash tore, so it drops it (the README says
  so). Anything else lost, or a flip earlier in the WAL losing anything, is silent.
- ``silent`` (forbidden): a read returned content that differs from what was
  written, without raising; a session or checkpoint that exists read as
  ``SessionNotFoundError``/``CheckpointNotFoundError``; a read raised a damage error
  while ``verify_store`` said clean (``perdure verify`` would miss it); or a listing
  differs while nothing reports damage.
- ``crash`` (forbidden): a read or ``verify_store`` raised anything else: an
  ``OSError``, ``UnicodeDecodeError``, ``sqlite3`` error, ``KeyError``,
  ``RecursionError``, or a ``PerdureError`` that is no damage error.
  ``verify_store`` must report, never raise.

In the fixtures every record, row, checkpoint and blob was acknowledged except the
journal's torn last record, so ``healed`` can only come from there, and a store that
drops an acknowledged record as a torn tail (the last journal line, the last WAL
frames beyond the ``limit`` rule) is counted ``silent``.

The test ``tests/session/test_corruption_matrix.py`` runs every kind and asserts
that none is ``silent`` or ``crash``; this script prints the same table.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from perdure import Agent, NullConversationManager
from perdure.agent import SnapshotField
from perdure.errors import (
    CheckpointNotFoundError,
    PerdureError,
    SessionCorruptedError,
    SessionNotFoundError,
    SnapshotError,
)
from perdure.models import ScriptedModel
from perdure.session import (
    FileSessionStore,
    Segmentation,
    Session,
    SessionStore,
    SnapshotSessionManager,
    verify_store,
)
from perdure.storage import LocalFileStorage
from perdure.stores.sqlite import SQLiteSessionStore

OUTCOMES = ("detected", "healed", "harmless", "stamp", "limit", "silent", "crash")
FORBIDDEN = ("silent", "crash")
SESSION = "s"
SNAPSHOT_SESSION = "snap"
PAGE = 3
DAMAGE_ERRORS = (SessionCorruptedError, SnapshotError)
LOST_ERRORS = (SessionNotFoundError, CheckpointNotFoundError)
# Timestamps a store keeps for people; their damage is counted apart ("stamp").
STAMPS = frozenset({"created_at", "updated_at"})
# Listings read metadata only and verify nothing (by design: they must stay cheap), so
# for a session whose verified reads report the damage they may show stale figures.
LISTINGS = frozenset({"list", "checkpoints.list", "list_snapshot_ids"})
IMAGE = bytes(range(256)) * 2  # stored as an attachment by the file store (threshold 64)
_WAL_CHILD = "--build-sqlite-wal"


# ----------------------------------------------------------------------------- fixtures


def _script() -> list[Any]:
    """What the scripted model answers, turn by turn."""
    return [
        "hello, I keep notes",
        "noted: pay 100 EUR to Ada",
        "I see a small grey square",
        "long answer " + "lorem ipsum dolor sit amet " * 30,
        "done",
    ]


def _play(session_manager: Any, on_turn: Callable[[Agent, int], None]) -> Agent:
    """Drive one agent through five turns; ``on_turn`` runs after each."""
    agent = Agent(
        model=ScriptedModel(_script()),
        session_manager=session_manager,
        conversation_manager=NullConversationManager(),
    )
    prompts: list[Any] = [
        "hi",
        "remember: pay 100 EUR to Ada",
        [{"text": "what is this?"}, {"image": {"format": "png", "source": {"bytes": IMAGE}}}],
        "tell me more " + "please " * 40,
        "thanks",
    ]
    for turn, prompt in enumerate(prompts):
        agent.state.set("turn", turn)
        agent.state.set("notes", {"payee": "Ada", "amount": 100, "turn": turn})
        agent(prompt)
        on_turn(agent, turn)
    return agent


def _session_fixture(store: SessionStore) -> None:
    """Five turns in session ``s`` with two checkpoints."""
    session = Session(store, SESSION)

    def checkpoint(agent: Agent, turn: int) -> None:
        if turn in (1, 3):
            asyncio.run(session.checkpoint(f"after turn {turn}"))

    _play(session, checkpoint)


def build_file_store(root: Path) -> None:
    """A file-store session with sealed segments, an attachment and checkpoints."""
    store = FileSessionStore(
        root, segmentation=Segmentation(max_records=6), attachment_threshold=64
    )
    _session_fixture(store)
    store.close()


def build_torn_file_store(root: Path) -> None:
    """The same, plus a torn, unacknowledged partial record at the end of the journal."""
    build_file_store(root)
    journal = _session_dir(root) / "journal.jsonl"
    clean = journal.read_bytes()
    # The record a killed writer was appending: the start of a real next record.
    scratch = root.parent / "torn-scratch"
    shutil.copytree(root, scratch)
    try:
        other = FileSessionStore(scratch, segmentation=False, attachment_threshold=64)
        record = asyncio.run(other.get(SESSION))
        extra = {"role": "user", "content": [{"text": "a message never acknowledged"}]}
        asyncio.run(other.commit(SESSION, [*record.messages, extra]))  # type: ignore[list-item]
        other.close()
        grown = (scratch / journal.relative_to(root)).read_bytes()
    finally:
        shutil.rmtree(scratch)
    if not grown.startswith(clean) or len(grown) <= len(clean):
        raise RuntimeError("the torn-tail fixture: the journal did not grow")
    appended = grown[len(clean) :]
    journal.write_bytes(clean + appended[: appended.index(b"\n") // 2])


def build_sqlite_db(path: Path) -> None:
    """A SQLite session store closed cleanly: everything folded into the database."""
    store = SQLiteSessionStore(path)
    _session_fixture(store)
    store.close()
    wal = Path(f"{path}-wal")
    if wal.exists() and wal.stat().st_size > 0:
        raise RuntimeError("closing the SQLite store left a WAL")


def build_sqlite_wal(path: Path) -> None:
    """A SQLite store whose writer was SIGKILLed before folding its WAL (in a child)."""
    child = subprocess.run(
        [sys.executable, __file__, _WAL_CHILD, str(path)],
        check=False,
        capture_output=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        timeout=120,
    )
    wal = Path(f"{path}-wal")
    if child.returncode != -signal.SIGKILL or not wal.exists() or wal.stat().st_size == 0:
        raise RuntimeError(f"the SQLite writer to kill failed: {child.stderr.decode()[-2000:]}")
    Path(f"{path}-shm").unlink(missing_ok=True)  # a copy carries no shared memory


def _wal_child(path: Path) -> None:
    store = SQLiteSessionStore(path)
    _session_fixture(store)
    os.kill(os.getpid(), signal.SIGKILL)  # no close: the WAL stays unfolded


def build_snapshots(root: Path) -> None:
    """A snapshot session: ``latest`` plus one immutable snapshot per turn."""
    manager = SnapshotSessionManager(
        SNAPSHOT_SESSION,
        storage=LocalFileStorage(root),
        snapshot_trigger=lambda **_: True,
    )
    _play(manager, lambda agent, turn: None)


# ----------------------------------------------------------------------------- reading


@dataclass
class Observation:
    """Each read's result (a value to compare) or the exception it raised."""

    reads: dict[str, Any] = field(default_factory=dict)
    verify: Any = None  # a VerifyReport, an exception, or None (not covered)


async def _attempt(reads: dict[str, Any], name: str, read: Awaitable[Any]) -> Any:
    try:
        reads[name] = await read
    except Exception as exc:  # classified by the caller
        reads[name] = exc
    return reads[name]


async def _pages(store: Any) -> list[tuple[int, int, int, list[Any]]]:
    pages = []
    offset = 0
    while True:
        page = await store.history_page(SESSION, offset, PAGE)
        pages.append((page.offset, page.next_offset, page.total, page.messages))
        if page.next_offset >= page.total:
            return pages
        if page.next_offset <= offset or len(pages) > 1000:
            raise RuntimeError(f"history pages do not advance at offset {offset}")
        offset = page.next_offset


async def read_session_store(store: Any) -> Observation:
    """Every public read of session ``s`` and its checkpoints, then verify_store."""
    seen = Observation()
    reads = seen.reads
    await _attempt(reads, "list", _listing(store))
    await _attempt(reads, "get", _record(store))
    await _attempt(reads, "pages", _pages(store))
    metas = await _attempt(reads, "checkpoints.list", _checkpoint_list(store))
    if isinstance(metas, list):
        for meta in metas:
            name = f"checkpoints.get {meta['checkpoint_id']}"
            await _attempt(reads, name, _checkpoint(store, meta["checkpoint_id"]))
    try:
        seen.verify = await verify_store(store)
    except Exception as exc:
        seen.verify = exc
    return seen


async def _listing(store: Any) -> list[dict[str, Any]]:
    return [asdict(meta) for meta in await store.list()]


async def _record(store: Any) -> dict[str, Any]:
    record = await store.get(SESSION)
    return {
        "meta": asdict(record.meta),
        "offset": record.offset,
        "messages": record.messages,
        "agent_state": record.agent_state,
    }


async def _checkpoint_list(store: Any) -> list[dict[str, Any]]:
    return [meta.to_dict() for meta in await store.checkpoints.list(SESSION)]


async def _checkpoint(store: Any, checkpoint_id: str) -> dict[str, Any]:
    record = await store.checkpoints.get(SESSION, checkpoint_id)
    return {
        "meta": record.meta.to_dict(),
        "messages": record.messages,
        "agent_state": record.agent_state,
    }


async def read_snapshots(root: Path) -> Observation:
    """``restore_snapshot`` of ``latest`` and of every immutable snapshot."""
    seen = Observation()
    manager = SnapshotSessionManager(SNAPSHOT_SESSION, storage=LocalFileStorage(root))
    probe = Agent(model=ScriptedModel([]), conversation_manager=NullConversationManager())
    ids = await _attempt(seen.reads, "list_snapshot_ids", manager.list_snapshot_ids(probe))
    for snapshot_id in [None, *(ids if isinstance(ids, list) else [])]:
        name = f"restore {snapshot_id or 'latest'}"
        await _attempt(seen.reads, name, _restored(manager, snapshot_id))
    return seen


async def _restored(manager: SnapshotSessionManager, snapshot_id: str | None) -> dict[str, Any]:
    agent = Agent(model=ScriptedModel([]), conversation_manager=NullConversationManager())
    found = await manager.restore_snapshot(agent, snapshot_id=snapshot_id)
    data = agent.take_snapshot(preset="session", exclude=[SnapshotField.messages]).data
    return {"found": found, "messages": agent.messages, "fields": data}


# ----------------------------------------------------------------------------- kinds


@dataclass(frozen=True)
class Tail:
    """The bytes from ``start`` to the end of ``file``, which a reader may drop.

    ``acknowledged=False``: a torn record no caller was told was stored (a flip there
    may be healed). ``acknowledged=True``: the last transaction of a SQLite WAL, which
    SQLite cannot tell from one torn by a crash: a flip there may lose exactly that
    transaction (outcome ``limit``), never more and never anything else.
    """

    file: Path
    start: int
    acknowledged: bool


@dataclass(frozen=True)
class Kind:
    """One kind of file: where its files are in the fixture and how to read it back."""

    name: str
    fixture: str
    """The fixture's directory name under the run's work directory."""
    files: Callable[[Path], list[Path]]
    """The kind's files, given the fixture's directory."""
    read: Callable[[Path], Coroutine[Any, Any, Observation]]
    """Every read of a (damaged) copy of the fixture."""
    tail: Callable[[Path], Tail | None] = lambda _: None
    """Where the kind's file has a tail a reader may drop (see :class:`Tail`)."""


def _session_dir(root: Path) -> Path:
    return root / "sessions" / SESSION


def _file_store_reader(root: Path) -> Coroutine[Any, Any, Observation]:
    async def read() -> Observation:
        store = FileSessionStore(root)
        try:
            return await read_session_store(store)
        finally:
            store.close()

    return read()


def _sqlite_reader(root: Path) -> Coroutine[Any, Any, Observation]:
    async def read() -> Observation:
        store = SQLiteSessionStore(root / "sessions.db")
        try:
            seen = await read_session_store(store)
        finally:
            store.close()
        # Closing folds the WAL into the database: what the first reads found must
        # still be found, not folded away into a shorter history.
        again = SQLiteSessionStore(root / "sessions.db")
        try:
            await _attempt(seen.reads, "get after reopening", _record(again))
        finally:
            again.close()
        return seen

    return read()


def _other_files(root: Path) -> list[Path]:
    """Files of the session no other kind covers (a head file, say), if any."""
    sdir = _session_dir(root)
    covered = {"journal.jsonl", "manifest.json", "meta.json"}
    folders = {"segments", "checkpoints", "attachments"}
    return sorted(
        path
        for path in sdir.rglob("*")
        if path.is_file()
        and path.relative_to(sdir).parts[0] not in folders
        and path.name not in covered
    )


def _journal_tail(root: Path) -> Tail:
    journal = _session_dir(root) / "journal.jsonl"
    data = journal.read_bytes()
    return Tail(journal, data.rindex(b"\n") + 1, acknowledged=False)


def _wal_tail(root: Path) -> Tail:
    """The frames of the WAL's last transaction (after the last commit frame but one)."""
    wal = root / "sessions.db-wal"
    data = wal.read_bytes()
    page_size = int.from_bytes(data[8:12], "big")
    frame = 24 + page_size
    commits = [
        offset + frame
        for offset in range(32, len(data) - frame + 1, frame)
        if int.from_bytes(data[offset + 4 : offset + 8], "big") != 0  # db size: a commit
    ]
    return Tail(wal, commits[-2] if len(commits) > 1 else 32, acknowledged=True)


def _snapshot_dir(root: Path) -> Path:
    return root / "sessions" / SNAPSHOT_SESSION / "agents" / "default"


def _sorted_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.is_file())


KINDS: tuple[Kind, ...] = (
    Kind(
        "journal", "file", lambda root: [_session_dir(root) / "journal.jsonl"], _file_store_reader
    ),
    Kind(
        "journal-torn",
        "file-torn",
        lambda root: [_session_dir(root) / "journal.jsonl"],
        _file_store_reader,
        _journal_tail,
    ),
    Kind(
        "segment",
        "file",
        lambda root: _sorted_files(_session_dir(root) / "segments"),
        _file_store_reader,
    ),
    Kind(
        "manifest", "file", lambda root: [_session_dir(root) / "manifest.json"], _file_store_reader
    ),
    Kind("meta", "file", lambda root: [_session_dir(root) / "meta.json"], _file_store_reader),
    Kind(
        "checkpoint",
        "file",
        lambda root: _sorted_files(_session_dir(root) / "checkpoints"),
        _file_store_reader,
    ),
    Kind(
        "attachment",
        "file",
        lambda root: _sorted_files(_session_dir(root) / "attachments"),
        _file_store_reader,
    ),
    Kind("session-other", "file", _other_files, _file_store_reader),
    Kind(
        "snapshot-manifest",
        "snapshots",
        lambda root: [
            _snapshot_dir(root) / "latest.blob",
            *_sorted_files(_snapshot_dir(root) / "snapshots"),
        ],
        read_snapshots,
    ),
    Kind(
        "snapshot-chunk",
        "snapshots",
        lambda root: _sorted_files(_snapshot_dir(root) / "chunks"),
        read_snapshots,
    ),
    Kind("sqlite-db", "sqlite", lambda root: [root / "sessions.db"], _sqlite_reader),
    Kind(
        "sqlite-wal",
        "sqlite-wal",
        lambda root: [root / "sessions.db-wal"],
        _sqlite_reader,
        _wal_tail,
    ),
)
KIND_NAMES = tuple(kind.name for kind in KINDS)

_BUILDERS: dict[str, Callable[[Path], None]] = {
    "file": build_file_store,
    "file-torn": build_torn_file_store,
    "sqlite": lambda root: build_sqlite_db(root / "sessions.db"),
    "sqlite-wal": lambda root: build_sqlite_wal(root / "sessions.db"),
    "snapshots": build_snapshots,
}


# ----------------------------------------------------------------------------- classify


@dataclass(frozen=True)
class Flip:
    """One damaged byte: which file, where, and the XOR mask."""

    file: str
    offset: int
    mask: int

    def __str__(self) -> str:
        return f"{self.file} byte {self.offset} ^0x{self.mask:02x}"


@dataclass(frozen=True)
class Cut:
    """A file cut short at ``size`` (to read what a lost tail leaves)."""

    file: str
    size: int


@dataclass
class Tally:
    """The outcomes of one kind."""

    kind: str
    files: int = 0
    size: int = 0
    counts: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def flips(self) -> int:
        return sum(self.counts.values())

    def add(self, outcome: str, flip: Flip, why: str) -> None:
        self.counts[outcome] += 1
        if why:
            self.examples.setdefault(outcome, []).append(f"{flip}: {why}")


def _short(value: Any) -> str:
    text = f"{type(value).__name__}: {value}" if isinstance(value, BaseException) else repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


def _difference(read: str, got: Any, want: Any) -> str:
    """Where a read differs from the original, for people: the first differing path."""
    path = ""
    while True:
        if isinstance(got, dict) and isinstance(want, dict) and got.keys() == want.keys():
            differ = [k for k in want if got[k] != want[k]]
            # Name a difference in content before one in a timestamp.
            key = next((k for k in differ if k not in STAMPS), differ[0])
            path, got, want = f"{path}[{key!r}]", got[key], want[key]
        elif isinstance(got, list) and isinstance(want, list) and len(got) == len(want):
            index = next(i for i, (g, w) in enumerate(zip(got, want, strict=True)) if g != w)
            path, got, want = f"{path}[{index}]", got[index], want[index]
        else:
            break
    if isinstance(got, list) and isinstance(want, list):
        return f"{read}{path} has {len(got)} items instead of {len(want)}"
    return f"{read}{path} is {_short(got)[:90]} instead of {_short(want)[:90]}"


def _without_stamps(read: Any) -> Any:
    """A read with the ``created_at``/``updated_at`` of its session and checkpoint metas
    blanked (message content is left alone, whatever its keys)."""
    if isinstance(read, list):
        return [_without_stamps(item) for item in read]
    if not isinstance(read, dict):
        return read
    if "meta" in read:
        return {**read, "meta": _without_stamps(read["meta"])}
    if "session_id" in read:  # a SessionMeta or CheckpointMeta
        return {k: v for k, v in read.items() if k not in STAMPS}
    return read


def classify(seen: Observation, original: Observation, *, healable: bool) -> tuple[str, str]:
    """The outcome of one flip and a one-line reason (see the module docstring)."""
    crash = silent = listing = stamp = ""
    damaged = False
    for name, want in original.reads.items():
        got = seen.reads.get(name, want)  # a read the damage made impossible: judged by others
        if isinstance(got, DAMAGE_ERRORS):
            damaged = True
        elif isinstance(got, LOST_ERRORS):
            silent = silent or f"{name}: {_short(got)} (the data exists)"
        elif isinstance(got, BaseException):
            crash = crash or f"{name}: {_short(got)}"
        elif got == want:
            continue
        elif _without_stamps(got) == _without_stamps(want):
            stamp = stamp or _difference(name, got, want)
        elif name in LISTINGS:
            listing = listing or _difference(name, got, want)
        else:
            silent = silent or _difference(name, got, want)
    for name in sorted(set(seen.reads) - set(original.reads)):
        # A read of something a damaged listing named that was never written.
        got = seen.reads[name]
        if isinstance(got, DAMAGE_ERRORS):
            damaged = True
        elif isinstance(got, BaseException) and not isinstance(got, PerdureError):
            crash = crash or f"{name}: {_short(got)}"
        else:
            listing = listing or f"{name}: a listing named something never written"
    verified = seen.verify is not None
    if isinstance(seen.verify, BaseException):
        crash = crash or f"verify_store raised {_short(seen.verify)}"
    reported = verified and not isinstance(seen.verify, BaseException) and not seen.verify.clean
    if crash:
        return "crash", crash
    if silent:
        return "silent", silent
    if damaged and verified and not reported:
        first = next(n for n, v in seen.reads.items() if isinstance(v, DAMAGE_ERRORS))
        return "silent", f"{first} raised damage but verify_store reported none"
    if listing and not (damaged and (reported or not verified)):
        return "silent", listing
    if damaged or reported:
        return "detected", ""
    if stamp:
        return "stamp", stamp
    return ("healed" if healable else "harmless"), ""


def choose(
    files: list[Path], flips: int, rng: random.Random, tail: Tail | None = None
) -> list[tuple[Path, int]]:
    """Every byte of ``files``, or ``flips`` of them, in file order.

    A sample always holds each file's first and last two bytes and the last byte
    before a tail (the newline that ends the last acknowledged journal record).
    """
    every = [(path, offset) for path in files for offset in range(path.stat().st_size)]
    if len(every) <= flips:
        return every
    landmarks = {
        (path, offset)
        for path in files
        for offset in (0, path.stat().st_size - 2, path.stat().st_size - 1)
        if offset >= 0
    }
    if tail is not None and tail.start > 0:
        landmarks.add((tail.file, tail.start - 1))
    rest = [spot for spot in every if spot not in landmarks]
    picked = landmarks | set(rng.sample(rest, max(0, flips - len(landmarks))))
    return [spot for spot in every if spot in picked]


def run_kind(
    kind: Kind, fixture: Path, work: Path, *, flips: int, seed: int, runner: asyncio.Runner
) -> Tally:
    """Flip the chosen bytes of one kind, one copy of the fixture per flip."""
    started = time.perf_counter()
    rng = random.Random(f"{seed}-{kind.name}")
    files = kind.files(fixture)
    tally = Tally(kind.name, files=len(files), size=sum(p.stat().st_size for p in files))
    if not files:
        return tally  # nothing of this kind in this version of the store
    scratch = Scratch(fixture, work / f"trial-{kind.name}")
    original = scratch.trial(kind, runner, None)
    broken = [n for n, v in original.reads.items() if isinstance(v, BaseException)]
    if broken or (original.verify is not None and not original.verify.clean):
        raise RuntimeError(f"the undamaged {kind.name} fixture does not read back: {broken}")
    tail = kind.tail(fixture)
    previous = None
    if tail is not None and tail.acknowledged:
        # What the reads return once the tail is gone: the one loss a flip there may cause.
        previous = scratch.trial(kind, runner, Cut(str(tail.file.relative_to(fixture)), tail.start))
    for path, offset in choose(files, flips, rng, tail):
        flip = Flip(str(path.relative_to(fixture)), offset, rng.randrange(1, 256))
        seen = scratch.trial(kind, runner, flip)
        in_tail = tail is not None and tail.file == path and offset >= tail.start
        outcome, why = classify(seen, original, healable=in_tail and previous is None)
        if (
            outcome == "silent"
            and in_tail
            and previous is not None
            and classify(seen, previous, healable=False)[0] == "harmless"
        ):
            outcome, why = "limit", ""
        tally.add(outcome, flip, why)
    tally.seconds = time.perf_counter() - started
    return tally


class Scratch:
    """A working copy of a fixture, put back as it was after each trial.

    Cheaper than a fresh copy per flip: only what a trial changed is copied again
    (the flipped file, and whatever the reads wrote: SQLite folds its WAL on close).
    """

    def __init__(self, fixture: Path, path: Path) -> None:
        self.fixture = fixture
        self.path = path
        shutil.copytree(fixture, path)
        self.files = self._files()

    def _files(self) -> dict[str, tuple[bool, int, int]]:
        found = {}
        for directory, dirs, names in os.walk(self.path):
            for name in dirs + names:
                path = Path(directory, name)
                info = path.lstat()
                found[str(path.relative_to(self.path))] = (
                    path.is_dir(),
                    0 if path.is_dir() else info.st_size,
                    0 if path.is_dir() else info.st_mtime_ns,
                )
        return found

    def trial(self, kind: Kind, runner: asyncio.Runner, flip: Flip | Cut | None) -> Observation:
        """Read the copy with ``flip`` applied, then put the copy back."""
        try:
            if isinstance(flip, Cut):
                os.truncate(self.path / flip.file, flip.size)
            elif flip is not None:
                target = self.path / flip.file
                data = bytearray(target.read_bytes())
                data[flip.offset] ^= flip.mask
                before = target.stat()
                target.write_bytes(bytes(data))
                # Keep the times: a store may show a file's mtime as updated_at.
                os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
            return runner.run(kind.read(self.path))
        finally:
            self._restore(None if flip is None else flip.file)

    def _restore(self, flipped: str | None) -> None:
        now = self._files()
        for name in sorted(set(now) - set(self.files), reverse=True):
            path = self.path / name
            if now[name][0]:
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        for name, (is_dir, _, _) in self.files.items():
            if is_dir or (name != flipped and now.get(name) == self.files[name]):
                continue
            (self.path / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(self.fixture / name, self.path / name)


def build_fixtures(work: Path, kinds: list[Kind]) -> dict[str, Path]:
    """Build each fixture the kinds need, once, under ``work``."""
    built: dict[str, Path] = {}
    for kind in kinds:
        if kind.fixture not in built:
            root = work / "fixtures" / kind.fixture
            root.mkdir(parents=True)
            _BUILDERS[kind.fixture](root)
            built[kind.fixture] = root
    return built


def run_matrix(
    kinds: list[Kind], *, flips: int = 500, seed: int = 14, work: Path | None = None
) -> list[Tally]:
    """Build the fixtures and flip every kind; the tallies in ``kinds`` order."""
    with tempfile.TemporaryDirectory(prefix="perdure-corruption-", dir=work) as scratch:
        root = Path(scratch)
        fixtures = build_fixtures(root, kinds)
        with asyncio.Runner() as runner:
            return [
                run_kind(k, fixtures[k.fixture], root, flips=flips, seed=seed, runner=runner)
                for k in kinds
            ]


def table(tallies: list[Tally]) -> str:
    """The counts, one row per kind."""
    head = (
        f"{'kind':<18} {'files':>5} {'bytes':>7} {'flips':>5} "
        + " ".join(f"{name:>8}" for name in OUTCOMES)
        + f" {'seconds':>7}"
    )
    rows = [head, "-" * len(head)]
    for t in tallies:
        rows.append(
            f"{t.kind:<18} {t.files:>5} {t.size:>7} {t.flips:>5} "
            + " ".join(f"{t.counts[name]:>8}" for name in OUTCOMES)
            + f" {t.seconds:>7.1f}"
        )
    total = Counter[str]()
    for t in tallies:
        total.update(t.counts)
    rows.append("-" * len(head))
    rows.append(
        f"{'total':<18} {'':>5} {'':>7} {sum(t.flips for t in tallies):>5} "
        + " ".join(f"{total[name]:>8}" for name in OUTCOMES)
        + f" {sum(t.seconds for t in tallies):>7.1f}"
    )
    return "\n".join(rows)


def examples(tallies: list[Tally], limit: int = 3) -> str:
    """A few forbidden (and ``stamp``) outcomes per kind: where the flip was, what was read."""
    lines = []
    for t in tallies:
        for outcome in ("stamp", *FORBIDDEN):
            found = t.examples.get(outcome, [])
            # Spread over the file: the first, the last and some in between.
            step = max(1, (len(found) - 1) // max(1, limit - 1))
            shown = found[::step][: limit - 1] + found[-1:] if len(found) > limit else found
            for line in shown:
                lines.append(f"{t.kind} {outcome}: {line}")
            if len(found) > limit:
                lines.append(f"{t.kind} {outcome}: ({len(found) - len(shown)} more)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flips", type=int, default=500, help="flips per kind (default 500)")
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument("--kinds", default=",".join(KIND_NAMES), help="comma-separated kinds")
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory")
    parser.add_argument(_WAL_CHILD, type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.build_sqlite_wal is not None:
        _wal_child(args.build_sqlite_wal)
        return 1  # unreachable: the child kills itself
    wanted = [name.strip() for name in args.kinds.split(",") if name.strip()]
    unknown = sorted(set(wanted) - set(KIND_NAMES))
    if unknown:
        parser.error(f"unknown kinds {unknown}; known: {', '.join(KIND_NAMES)}")
    kinds = [kind for kind in KINDS if kind.name in wanted]
    started = time.perf_counter()
    tallies = run_matrix(kinds, flips=args.flips, seed=args.seed, work=args.dir)
    print(table(tallies))
    found = examples(tallies)
    if found:
        print()
        print(found)
    print(f"\n{sum(t.flips for t in tallies)} flips in {time.perf_counter() - started:.1f} s")
    return 1 if any(t.counts[name] for t in tallies for name in FORBIDDEN) else 0


if __name__ == "__main__":
    sys.exit(main())
