"""Two processes on one session: the second writer is locked out during a turn."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from session_stores import make_store

from perdure import Agent
from perdure.errors import SessionLockedError
from perdure.models import ScriptedModel
from perdure.session import Session, read_history_page

CHILD = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, sys.argv[3])
    from session_stores import make_store
    from pathlib import Path
    from perdure import Agent, tool
    from perdure.models import ScriptedModel
    from perdure.session import Session

    store = make_store(sys.argv[1], Path(sys.argv[2]))

    @tool
    def slow() -> str:
        '''Hold the turn open for a while.'''
        print("in-tool", flush=True)
        time.sleep(1.5)
        return "slow done"

    script = [{"role": "assistant", "content": [
        {"toolUse": {"toolUseId": "t1", "name": "slow", "input": {}}}]}, "child done"]
    session = Session(store, "shared")
    agent = Agent(model=ScriptedModel(script), tools=[slow], session_manager=session)
    agent("child turn")
    print("finished", flush=True)
    """
)


@pytest.mark.parametrize("kind", ["file", "sqlite", "postgres", "redis"])
def test_second_writer_gets_session_locked_during_a_turn(tmp_path: Path, kind: str) -> None:
    store = make_store(kind, tmp_path)
    asyncio.run(store.create("shared"))
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    with subprocess.Popen(
        [sys.executable, str(script), kind, str(tmp_path), str(Path(__file__).parent)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as child:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "in-tool"
        # the child is mid-turn: every write from here is refused at once
        with pytest.raises(SessionLockedError) as info:
            asyncio.run(store.commit("shared", [{"role": "user", "content": [{"text": "x"}]}]))
        assert info.value.code == "session_locked"
        intruder = Agent(model=ScriptedModel(["never"]), session_manager=Session(store, "shared"))
        with pytest.raises(SessionLockedError):
            intruder("intrude")
        with pytest.raises(SessionLockedError):
            asyncio.run(store.delete("shared"))
        out, err = child.communicate(timeout=30)
    assert child.returncode == 0, err
    assert "finished" in out
    # after the turn, the lock is free and the journal holds only the child's turn
    messages = asyncio.run(store.get("shared")).messages
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]
    assert messages[0]["content"][0]["text"] == "child turn"
    resumed = Agent(
        model=ScriptedModel(["parent"]), session_manager=Session.resume(store, "shared")
    )
    resumed("parent turn")
    assert len(asyncio.run(store.get("shared")).messages) == 6


WRITER = textwrap.dedent(
    """
    import asyncio, sys, time
    sys.path.insert(0, sys.argv[3])
    from pathlib import Path
    from session_stores import make_store

    options = {} if sys.argv[1] == "redis" else {"durability": "none"}
    if sys.argv[1] == "file":
        from perdure.stores.file.store import Segmentation
        options["segmentation"] = Segmentation(max_records=7)  # a seal every few commits
    store = make_store(sys.argv[1], Path(sys.argv[2]), **options)

    def message(i):
        content = [{"text": f"m{i}"}]
        if i % 3 == 0:  # an attachment, which a rewrite that drops it deletes
            image = i.to_bytes(4, "big") * 512
            content.append({"image": {"format": "png", "source": {"bytes": image}}})
        return {"role": "user" if i % 2 == 0 else "assistant", "content": content}

    async def main():
        history, i, seals_and_rewrites = [], 0, 0
        deadline = time.monotonic() + float(sys.argv[4])
        while time.monotonic() < deadline:
            history.append(message(i))
            i += 1
            rewrite = i % 40 == 0
            if rewrite:
                history = history[-10:]  # a compaction: the segments go away
                seals_and_rewrites += 1
            await store.commit("busy", history, rewritten=rewrite)
        print(i, seals_and_rewrites, flush=True)

    asyncio.run(main())
    """
)


def consecutive(messages: list[Any]) -> bool:
    """True for a run of the writer's messages: m<i>, m<i+1>, … (roles, images and all)."""
    numbers = [int(m["content"][0]["text"][1:]) for m in messages]
    roles = ["user" if n % 2 == 0 else "assistant" for n in numbers]
    images = [
        m["content"][1]["image"]["source"]["bytes"] if len(m["content"]) > 1 else None
        for m in messages
    ]
    return (
        numbers == list(range(numbers[0], numbers[0] + len(numbers)))
        and roles == [m["role"] for m in messages]
        and images == [n.to_bytes(4, "big") * 512 if n % 3 == 0 else None for n in numbers]
    )


@pytest.mark.parametrize("kind", ["file", "sqlite", "postgres", "redis"])
def test_readers_never_see_damage_while_another_process_seals_and_rewrites(
    tmp_path: Path, kind: str
) -> None:
    store = make_store(kind, tmp_path)
    asyncio.run(store.create("busy"))
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    reads = 0

    async def read_until_done(writer: subprocess.Popen[str]) -> None:
        nonlocal reads
        while writer.poll() is None:
            record = await store.get("busy")
            page = await read_history_page(store, "busy", offset=0, limit=5)
            [meta] = await store.list()
            for messages in (record.messages, page.messages):
                assert not messages or consecutive(messages), messages
            assert meta.session_id == "busy"
            reads += 1

    with subprocess.Popen(
        [sys.executable, str(script), kind, str(tmp_path), str(Path(__file__).parent), "2.5"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as writer:
        asyncio.run(read_until_done(writer))
        out, err = writer.communicate(timeout=30)
    assert writer.returncode == 0, err
    commits, rewrites = map(int, out.split())
    assert rewrites >= 3, "the writer did too little to race the readers"
    assert reads >= 20, "the readers did too little to race the writer"
    final = asyncio.run(store.get("busy")).messages
    assert consecutive(final)
    assert int(final[-1]["content"][0]["text"][1:]) == commits - 1
    if kind == "file":  # every rewrite deleted the images it dropped, under the readers
        attachments = tmp_path / "file-store" / "sessions" / "busy" / "attachments"
        assert len(list(attachments.iterdir())) == sum(len(m["content"]) > 1 for m in final)
