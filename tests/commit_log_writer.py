"""A writer process for the commit-log crash test: many sessions' turns at once.

Run as ``python commit_log_writer.py LOCATION SESSIONS``. Each session's task holds
its writer lock (as an ``Agent`` turn does, so its appends go through the store's
commit log) and commits one message more at a time, printing ``ack <session>
<count>`` once the commit returned, until the process is killed. ``ready`` is
printed once the log is in use (the commits before it synced their journals).
"""

from __future__ import annotations

import asyncio
import sys

from concurrent_writer import count_or_create, history
from perdure.session import FileSessionStore


async def write(store: FileSessionStore, session_id: str) -> None:
    async with store.writer_lock(session_id):
        count = await count_or_create(store, session_id)
        while True:
            count += 1
            await store.commit(session_id, history(count, session_id))
            print(f"ack {session_id} {count}", flush=True)


async def main(location: str, sessions: int) -> None:
    store = FileSessionStore(location)
    tasks = [asyncio.ensure_future(write(store, f"s{i}")) for i in range(sessions)]
    log = store._commit_log
    assert log is not None
    while log._state != "ready":  # noqa: ASYNC110 (the writer thread makes it)
        await asyncio.sleep(0.005)
    print("ready", flush=True)
    await asyncio.gather(*tasks)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
