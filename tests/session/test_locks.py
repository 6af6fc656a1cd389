"""Writer locks taken on the caller's thread still exclude other processes."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from session_stores import make_store

from perdure.errors import SessionLockedError
from perdure.session import SessionStore

# Holds the session's writer lock until told to let go.
HOLDER = textwrap.dedent(
    """
    import asyncio, sys
    sys.path.insert(0, sys.argv[3])
    from pathlib import Path
    from session_stores import make_store

    async def main() -> None:
        store = make_store(sys.argv[1], Path(sys.argv[2]))
        async with store.writer_lock("shared"):
            print("holding", flush=True)
            await asyncio.to_thread(sys.stdin.readline)

    asyncio.run(main())
    """
)


async def hold_once(store: SessionStore) -> None:
    async with store.writer_lock("shared"):
        pass


@pytest.mark.parametrize("kind", ["file", "sqlite", "postgres", "redis"])
def test_a_lock_taken_again_in_process_is_refused_while_another_process_holds_it(
    tmp_path: Path, kind: str
) -> None:
    store = make_store(kind, tmp_path)
    asyncio.run(store.create("shared"))
    asyncio.run(hold_once(store))  # the lock file exists now: later holds are taken inline
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    with subprocess.Popen(
        [sys.executable, str(script), kind, str(tmp_path), str(Path(__file__).parent)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as child:
        assert child.stdin is not None
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "holding"
        with pytest.raises(SessionLockedError) as info:
            asyncio.run(hold_once(store))
        assert info.value.code == "session_locked"
        child.stdin.write("go\n")
        child.stdin.flush()
        _, err = child.communicate(timeout=30)
    assert child.returncode == 0, err
    asyncio.run(hold_once(store))  # free again


@pytest.mark.parametrize("kind", ["file", "sqlite"])
def test_a_lock_directory_removed_between_holds_is_made_again(tmp_path: Path, kind: str) -> None:
    store = make_store(kind, tmp_path)
    asyncio.run(store.create("shared"))
    asyncio.run(hold_once(store))
    locks = next(tmp_path.rglob("*.locks")) if kind == "sqlite" else tmp_path / "file-store/.locks"
    shutil.rmtree(locks)
    asyncio.run(hold_once(store))
    assert (locks / "shared.lock").exists()


@pytest.mark.parametrize("url", ["sqlite:project/perdure.db", "file:project/.perdure"])
def test_lock_folders_stay_out_of_git(tmp_path: Path, url: str) -> None:
    """Issue 23: the ``*.locks/`` folder a store leaves beside a database is never in
    ``git status``; the database or store itself is."""
    from perdure import Agent
    from perdure.models import ScriptedModel
    from perdure.session import Session, open_store

    project = tmp_path / "project"
    project.mkdir()
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    scheme, _, path = url.partition(":")
    store = open_store(f"{scheme}:{tmp_path / path}")
    Agent(model=ScriptedModel(["hi"]), session_manager=Session(store, "s1"))("hello")
    getattr(store, "close", lambda: None)()
    locks = project / "perdure.db.locks" if scheme == "sqlite" else project / ".perdure" / ".locks"
    assert (locks / "s1.lock").exists()
    assert (locks / ".gitignore").read_text().splitlines()[-1] == "*"
    status = subprocess.run(
        ["git", "-C", str(project), "status", "--porcelain", "--untracked-files=all"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert ".locks" not in status, status
    assert ("perdure.db" if scheme == "sqlite" else ".perdure/") in status
