"""A writer process for the BidiAgent crash test: a conversation killed mid-stream.

Run as ``python bidi_writer.py DIR KILL_AFTER``: a BidiAgent (``agent_id="voice"``,
``bidi_agent_save_latest_on="message"``) on a ScriptedBidiModel starts (restored
from ``DIR``), prints how many messages it came back with, then says ``turn-<n>``
three times, reading each answer; the process SIGKILLs itself right after the
``KILL_AFTER``-th save of its ``snapshot_latest`` returned (``0``: never). It
prints ``done <count>`` at the end.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from perdure.bidi import BidiAgent, ScriptedBidiModel
from perdure.session import SnapshotSessionManager
from perdure.storage import LocalFileStorage

SAVES = 0


class KillingStorage(LocalFileStorage):
    def __init__(self, root: str, kill_after: int) -> None:
        super().__init__(root)
        self.kill_after = kill_after

    def saved(self, key: str) -> None:
        global SAVES
        if key.endswith("/agents/voice/latest"):
            SAVES += 1
            if self.kill_after == SAVES:
                os.kill(os.getpid(), signal.SIGKILL)

    async def append(self, key: str, data: bytes, *, size: int, tail: bytes) -> None:
        await super().append(key, data, size=size, tail=tail)
        self.saved(key)

    async def replace(self, key: str, data: bytes, *, size: int | None, tail: bytes) -> None:
        await super().replace(key, data, size=size, tail=tail)
        self.saved(key)


async def main(where: str, kill_after: int) -> None:
    manager = SnapshotSessionManager("call", storage=KillingStorage(where, kill_after))
    model = ScriptedBidiModel([[f"answer-{i}"] for i in range(3)])
    agent = BidiAgent(model, agent_id="voice", session_manager=manager)
    await agent.start()
    print(f"restored {[m['content'][0]['text'] for m in agent.messages]}", flush=True)
    for i in range(3):
        await agent.send(f"turn-{i}")
        async for event in agent.receive():
            if event["type"] == "response_complete":
                break
    await agent.stop()
    print(f"done {len(agent.messages)}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
