"""A writer process for the concurrent crash test: many sessions commit at once.

Run as ``python concurrent_writer.py KIND LOCATION SESSIONS``; each session's task
reads where its history stands, then commits one message more at a time and prints
``ack <session> <count>`` once the commit returned — until the process is killed.
"""

from __future__ import annotations

import asyncio
import sys

from perdure.errors import SessionNotFoundError
from perdure.session import FileSessionStore, SessionStore
from perdure.stores.sqlite import SQLiteSessionStore
from perdure.types import Message


def history(n: int, session_id: str) -> list[Message]:
    return [
        {
            "role": "user" if i % 2 == 0 else "assistant",
            "content": [{"text": f"{session_id}-{i}"}],
        }
        for i in range(n)
    ]


def open_kind(kind: str, location: str) -> SessionStore:
    if kind == "file":
        return FileSessionStore(location)
    durability = "none" if kind == "sqlite-none" else "commit"
    return SQLiteSessionStore(location, durability=durability)  # type: ignore[arg-type]


async def count_or_create(store: SessionStore, session_id: str) -> int:
    """How many messages the session holds; a missing one is created (0)."""
    try:
        return len((await store.get(session_id)).messages)
    except SessionNotFoundError:
        await store.create(session_id)
        return 0


async def write(store: SessionStore, session_id: str) -> None:
    count = await count_or_create(store, session_id)
    while True:
        count += 1
        await store.commit(session_id, history(count, session_id))
        print(f"ack {session_id} {count}", flush=True)


async def main(kind: str, location: str, sessions: int) -> None:
    store = open_kind(kind, location)
    print("ready", flush=True)
    await asyncio.gather(*(write(store, f"s{i}") for i in range(sessions)))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
