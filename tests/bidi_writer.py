"""A writer process for the BidiAgent crash test: a conversation killed mid-stream.

Run as ``python bidi_writer.py DIR KILL_AFTER``: a BidiAgent (``agent_id="voice"``,
``bidi_agent_save_latest_on="message"``) on a ScriptedBidiModel starts (restored
from ``DIR``), prints how many messages it came back with, then says ``turn-<n>``
three times, reading each answer; the process SIGKILLs itself right after the
``KILL_AFTER``-th save of its ``snapshot_latest`` returned (``0``: never). It
prints ``done <count>`` at the end.

``python bidi_writer.py DIR tool-kill`` instead asks for a tool whose run notes
itself in ``DIR/tool-runs`` and SIGKILLs the process (its call saved, its result
never); ``python bidi_writer.py DIR tool-resume`` then starts the agent again and
prints, as JSON, the history its model's connection opened with.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys

from perdure import tool
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


def lookup_tool(where: str) -> object:
    @tool
    def lookup(key: str) -> str:
        """Look a key up.

        Args:
            key: the key.
        """
        with open(os.path.join(where, "tool-runs"), "a") as runs:
            runs.write(f"{key}\n")
        os.kill(os.getpid(), signal.SIGKILL)
        return key.upper()

    return lookup


async def tool_run(where: str, mode: str) -> None:
    manager = SnapshotSessionManager("call", storage=LocalFileStorage(where))
    call = {"toolUseId": "t1", "name": "lookup", "input": {"key": "a"}}
    script = [[{"type": "tool_use", "toolUse": call}]] if mode == "tool-kill" else [["ok"]]
    model = ScriptedBidiModel(script)
    agent = BidiAgent(model, tools=[lookup_tool(where)], agent_id="voice", session_manager=manager)
    await agent.start()
    if mode == "tool-kill":
        await agent.send("find a")
        async for _ in agent.receive():
            pass
        raise AssertionError("the tool should have killed this process")
    print(json.dumps(model.starts[0]["messages"]), flush=True)
    await agent.stop()


if __name__ == "__main__":
    if sys.argv[2].startswith("tool-"):
        asyncio.run(tool_run(sys.argv[1], sys.argv[2]))
    else:
        asyncio.run(main(sys.argv[1], int(sys.argv[2])))
