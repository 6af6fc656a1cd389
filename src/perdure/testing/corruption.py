"""The corruption suite (SPEC §7): damage every file a store wrote, then read it back.

A store with on-disk state writes a small session (text, a tool round, bytes large
enough to be stored apart, agent state, a redaction and a rewrite), is closed, and
then, one damage at a time, each of its files is truncated (to nothing, to half,
by one byte) or has a byte flipped at its ends and at random places. After each
damage the store is reopened and read: ``get`` must raise
:class:`~perdure.errors.SessionCorruptedError` (code ``session_store_corrupted``)
or return exactly the acknowledged data; ``list`` must raise that error or list
the session (marked damaged or not). Never silently different data, never a
missing or empty session, never another exception. The store's files are restored
from a pristine copy between damages.

Subclass :class:`CorruptionSuite` in a ``Test*`` class and give it one fixture,
``corruption_target``: a :class:`CorruptionTarget` saying how to open the store
and where its files are::

    class TestMyStoreCorruption(CorruptionSuite):
        @pytest.fixture
        def corruption_target(self, tmp_path):
            return CorruptionTarget(
                open=lambda: MyStore(tmp_path / "data"), root=tmp_path / "data"
            )

perdure's own full matrix (every kind of file, 500 flips each, with
``perdure verify``) is ``benchmarks/corruption.py``; this is the lighter sweep any
store can run.
"""

from __future__ import annotations

import asyncio
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pytest

from perdure.errors import SessionCorruptedError
from perdure.session.store import SessionMeta, SessionRecord, SessionStore
from perdure.testing._support import close
from perdure.testing.messages import text, tool_round, tool_use
from perdure.types import Message

__all__ = ["CorruptionSuite", "CorruptionTarget", "Damage", "damages"]

SESSION = "precious"


@dataclass(frozen=True)
class CorruptionTarget:
    """A store with on-disk state, for :class:`CorruptionSuite`.

    Attributes:
        open: opens the store over ``root`` (a new instance each call; closed with
            ``close()`` after use, when it has one). It must not heal what it reads
            (a strict store): healing is a repair, tested apart.
        root: the directory holding everything the store writes.
        ignore: files under ``root`` that hold no data (lock files); not damaged.
    """

    open: Callable[[], SessionStore]
    root: Path
    ignore: Callable[[Path], bool] = field(default=lambda path: False)


@dataclass(frozen=True)
class Damage:
    """One damage: a file cut to ``truncate`` bytes, or its byte at ``offset`` xor ``mask``."""

    path: Path
    offset: int
    mask: int = 0
    truncate: bool = False

    def apply(self) -> None:
        """Damage the file in place."""
        data = self.path.read_bytes()
        if self.truncate:
            self.path.write_bytes(data[: self.offset])
        else:
            changed = bytearray(data)
            changed[self.offset] ^= self.mask
            self.path.write_bytes(bytes(changed))

    def __str__(self) -> str:
        if self.truncate:
            return f"{self.path.name} truncated to {self.offset} bytes"
        return f"{self.path.name} byte {self.offset} xor {self.mask:#04x}"


def damages(files: list[Path], flips_per_file: int, seed: int) -> list[Damage]:
    """Truncations (to half, by one byte) and flips of each non-empty file: both ends
    always, the rest at random. (Cutting a file to nothing is tested apart.)"""
    rng = random.Random(seed)
    found: list[Damage] = []
    for path in files:
        size = path.stat().st_size
        if size == 0:
            continue
        for cut in sorted({size // 2, size - 1}):
            found.append(Damage(path, cut, truncate=True))
        spots = {0, size - 1}
        while len(spots) < min(flips_per_file, size):
            spots.add(rng.randrange(size))
        for offset in sorted(spots):
            found.append(Damage(path, offset, rng.choice((0x01, 0x20, 0x80, 0xFF))))
    return found


async def write_precious(store: SessionStore) -> tuple[list[Message], dict[str, Any]]:
    """Write the session the suite damages; return its acknowledged history and state."""
    blob = bytes(range(256)) * 40  # large enough to be stored apart (attachments)
    history: list[Message] = [text("user", "pay 100 EUR"), *tool_round(0)]
    await store.create(SESSION)
    await store.commit(SESSION, history, agent_state={"step": 1})
    history += [tool_use({"blob": blob}, "t9"), text("user", "é \u2713")]
    await store.commit(SESSION, history, agent_state={"step": 2, "raw": b"\x00\x01"})
    await store.commit(SESSION, history, redactions={0: text("user", "[redacted]")})
    history = [text("user", "summary"), *history[-2:]]
    await store.commit(SESSION, history, rewritten=True)
    history.append(text("assistant", "done"))
    await store.commit(SESSION, history)
    record = await store.get(SESSION)
    return record.messages, record.agent_state


class CorruptionSuite:
    """Every damaged file reads as a structured error or as the exact data.

    Needs one fixture, ``corruption_target`` (see the module docstring).

    Attributes:
        flips_per_file: byte positions flipped in each file (both ends included).
        corruption_seed: seeds the random positions and masks.
    """

    flips_per_file: ClassVar[int] = 12
    corruption_seed: ClassVar[int] = 15

    def read_back(
        self, target: CorruptionTarget
    ) -> tuple[list[SessionMeta] | Exception, SessionRecord | Exception]:
        """``list()`` and ``get()`` of a freshly opened store, or what each raised."""
        store = target.open()

        async def read() -> tuple[Any, Any]:
            results: list[Any] = []
            for call in (store.list, lambda: store.get(SESSION)):
                try:
                    results.append(await call())
                except Exception as exc:  # classified by the caller
                    results.append(exc)
            return results[0], results[1]

        try:
            return asyncio.run(read())
        finally:
            close(store)

    def sweep(
        self,
        target: CorruptionTarget,
        tmp_path_factory: pytest.TempPathFactory,
        plan: Callable[[list[Path]], list[Damage]],
    ) -> None:
        """Write the session, then apply each damage of ``plan(files)`` and read back."""
        store = target.open()
        try:
            messages, state = asyncio.run(write_precious(store))
        finally:
            close(store)
        files = sorted(p for p in target.root.rglob("*") if p.is_file() and not target.ignore(p))
        assert files, f"the store wrote no files under {target.root}"
        pristine = tmp_path_factory.mktemp("pristine") / "root"
        shutil.copytree(target.root, pristine)
        detected = 0
        for damage in plan(files):
            damage.apply()
            listed, got = self.read_back(target)
            shutil.rmtree(target.root)
            shutil.copytree(pristine, target.root)
            for result in (listed, got):
                if isinstance(result, Exception) and not isinstance(result, SessionCorruptedError):
                    raise AssertionError(f"{damage}: {type(result).__name__}: {result}")
            if isinstance(got, SessionCorruptedError):
                assert got.code == "session_store_corrupted", damage
                detected += 1
            else:
                assert isinstance(got, SessionRecord), damage
                assert (got.messages, got.agent_state) == (messages, state), (
                    f"{damage}: the session reads back silently different"
                )
            if not isinstance(listed, Exception):
                assert SESSION in [meta.session_id for meta in listed], (
                    f"{damage}: the damaged session is hidden from the listing"
                )
        # The sweep really damaged what the store reads.
        assert detected > 0, "no damage was ever detected: are these the store's files?"
        listed, got = self.read_back(target)  # and the restored copy reads cleanly
        assert not isinstance(got, Exception)
        assert (got.messages, got.agent_state) == (messages, state)

    def test_damage_is_reported_or_harmless_never_silent(
        self, corruption_target: CorruptionTarget, tmp_path_factory: pytest.TempPathFactory
    ) -> None:
        self.sweep(
            corruption_target,
            tmp_path_factory,
            lambda files: damages(files, self.flips_per_file, self.corruption_seed),
        )

    def test_a_file_cut_to_nothing_is_reported(
        self, corruption_target: CorruptionTarget, tmp_path_factory: pytest.TempPathFactory
    ) -> None:
        self.sweep(
            corruption_target,
            tmp_path_factory,
            lambda files: [Damage(p, 0, truncate=True) for p in files if p.stat().st_size],
        )
