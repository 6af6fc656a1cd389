"""Two processes on one session: the second writer is locked out during a turn."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from session_stores import make_store

from perdure import Agent
from perdure.errors import SessionLockedError
from perdure.models import ScriptedModel
from perdure.session import Session

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


@pytest.mark.parametrize("kind", ["file", "sqlite"])
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
