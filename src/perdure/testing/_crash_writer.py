"""The writer process of :mod:`perdure.testing.crash`; it runs until it is killed.

``python -m perdure.testing._crash_writer MODULE:FUNCTION LOCATION MODE SEED``
opens the store with ``FUNCTION(LOCATION, SEED, die)`` and commits the ops of
:func:`~perdure.testing.crash.crash_history` forever, printing ``start N`` once and
``ack N`` after each acknowledged commit. In ``inject`` mode ``die()`` SIGKILLs the
process with a chance of 8 % per call; in ``random`` mode it does nothing (the test
kills the writer at a random moment). It imports neither pytest nor hypothesis, so
that it starts fast and kills land in its work, not in its imports.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import random
import signal
import sys
from collections.abc import Callable
from typing import Any

from perdure.session.store import SessionStore
from perdure.types import Message


def crash_history(op: int) -> list[Message]:
    """The deterministic history after op ``op``: ``op % 5 == 0`` rewrites (compaction)."""
    messages: list[Message] = []
    for j in range(1, op + 1):
        if j % 5 == 0:
            summary: Message = {"role": "user", "content": [{"text": f"summary@{j}"}]}
            messages = [summary, *messages[-2:]]
        else:
            role = "user" if len(messages) % 2 == 0 else "assistant"
            messages.append({"role": role, "content": [{"text": f"op{j}"}]})  # type: ignore[typeddict-item]
    return messages


def _load(path: str) -> Callable[..., SessionStore]:
    module, _, name = path.partition(":")
    if not module or not name:
        raise ValueError(f"writer must be 'module:function', got {path!r}")
    factory: Callable[..., SessionStore] = getattr(importlib.import_module(module), name)
    return factory


async def _write_from(store: SessionStore, op: int, commits: int | None) -> int:
    while commits is None or commits > 0:
        op += 1
        messages = crash_history(op)
        await store.commit("c", messages, agent_state={"op": op}, rewritten=op % 5 == 0)
        print(f"ack {op}", flush=True)
        if commits is not None:
            commits -= 1
    return op


async def _main(store: SessionStore, seed: int) -> None:
    await store.create("c", exist_ok=True)
    record = await store.get("c")
    op: Any = record.agent_state.get("op", 0)
    print(f"start {op}", flush=True)
    # Half the writers run turns as a Session does, three commits under the writer
    # lock each: their appends take the stores' inline paths.
    if seed % 4 < 2:
        while True:
            async with store.writer_lock("c"):
                op = await _write_from(store, op, 3)
    else:
        await _write_from(store, op, None)


def main(argv: list[str]) -> None:
    """Run the writer described by ``argv`` (see the module docstring)."""
    writer, location, mode, seed_text = argv
    seed = int(seed_text)
    rng = random.Random(seed)

    def die() -> None:
        if mode == "inject" and rng.random() < 0.08:
            os.kill(os.getpid(), signal.SIGKILL)

    store = _load(writer)(location, seed, die)
    asyncio.run(_main(store, seed))


if __name__ == "__main__":
    main(sys.argv[1:])
