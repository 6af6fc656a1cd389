"""Progress bars on long work: drawn when stderr is a terminal, silent when piped.

Each command runs as a real process (``python -m perdure``). For the terminal case
its stderr is the slave end of a pseudo-terminal and the test reads the master end;
for the piped case both streams are pipes and stderr must stay empty.
"""

from __future__ import annotations

import base64
import json
import os
import pty
import select
import subprocess
import sys
from pathlib import Path

import pytest

from perdure import Agent
from perdure.models import ScriptedModel
from perdure.session import Session, open_store

ROOT = Path(__file__).resolve().parents[2]
BAR = "━"  # rich's bar segment


def env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT / "src"),
        "TERM": "xterm-256color",
        "COLUMNS": "100",
        "NO_COLOR": "1",
    }


def on_a_terminal(args: list[str]) -> tuple[int, str, str]:
    """Run ``perdure ARGS`` with stderr on a pty; return status, stdout, terminal text."""
    master, slave = pty.openpty()
    with subprocess.Popen(
        [sys.executable, "-m", "perdure", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=slave,
        env=env(),
    ) as proc:
        os.close(slave)
        seen = bytearray()
        try:
            while True:
                ready, _, _ = select.select([master], [], [], 60)
                if not ready:
                    proc.kill()
                    raise AssertionError(f"no output for 60 s from {args}")
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the process closed the terminal
                    break
                if not chunk:
                    break
                seen.extend(chunk)
        finally:
            os.close(master)
        assert proc.stdout is not None
        stdout = proc.stdout.read().decode()
        status = proc.wait(timeout=60)
    return status, stdout, seen.decode(errors="replace")


def piped(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "perdure", *args],
        capture_output=True,
        text=True,
        env=env(),
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"file:{tmp_path_factory.mktemp('progress') / 'store'}"
    store = open_store(url)
    for i in range(3):
        agent = Agent(model=ScriptedModel(["hi"]), session_manager=Session(store, f"s{i}"))
        agent("hello")
    getattr(store, "close", lambda: None)()
    return url


def copy_store(source: str, target: str) -> None:
    """A plain copy of the module's store, for a command that rewrites it."""
    from click.testing import CliRunner

    from perdure.cli.main import cli

    done = CliRunner().invoke(cli, ["copy", "--from", source, "--to", target])
    assert done.exit_code == 0, done.stderr


def strands_source(root: Path) -> Path:
    """Three Strands FileSessionManager sessions of two messages each."""
    for n in range(3):
        agent_dir = root / f"session_s{n}" / "agents" / "agent_default"
        (agent_dir / "messages").mkdir(parents=True)
        (agent_dir / "agent.json").write_text(json.dumps({"agent_id": "default", "state": {}}))
        for i, role in enumerate(("user", "assistant")):
            record = {"message": {"role": role, "content": [{"text": f"m{i}"}]}, "message_id": i}
            (agent_dir / "messages" / f"message_{i}.json").write_text(json.dumps(record))
    return root


def commands(url: str, target: Path) -> dict[str, tuple[list[str], str]]:
    strands = strands_source(target.parent / "strands")
    keys = target.parent / "keys.json"
    keys.write_text(json.dumps({"keys": {"k1": base64.b64encode(bytes(range(32))).decode()}}))
    plain = f"file:{target.parent / 'plain'}"
    copy_store(url, plain)
    return {
        "rotate-keys": (
            ["rotate-keys", "--store", plain, "--to", "k1", "--keys-file", str(keys), "--force"],
            "re-encrypting",
        ),
        "migrate": (["migrate", "strands", str(strands), "--to", f"file:{target}"], "migrating"),
        "verify": (["verify", "--store", url], "verifying"),
        "repair": (["repair", "--store", url], "checking"),
        "gc": (["gc", "--store", url, "--ttl", "30d"], "collecting"),
        "copy": (["copy", "--from", url, "--to", f"file:{target}", "--dry-run"], "copying"),
    }


@pytest.mark.parametrize("name", ["verify", "repair", "gc", "copy", "migrate", "rotate-keys"])
def test_a_bar_on_a_terminal_nothing_in_a_pipe(url: str, tmp_path: Path, name: str) -> None:
    args, label = commands(url, tmp_path / "copy")[name]
    status, stdout, terminal = on_a_terminal(args)
    assert status == 0, (stdout, terminal)
    assert label in terminal, terminal
    assert "3/3" in terminal, terminal
    assert BAR in terminal
    assert BAR not in stdout  # the bar never reaches stdout

    done = piped(args)
    assert done.returncode == 0, done.stderr
    # No bar in a pipe: stderr holds only the summary lines (the notes), no bar.
    assert label not in done.stdout + done.stderr
    assert BAR not in done.stdout + done.stderr
    assert "\r" not in done.stderr


def test_no_bar_with_json_even_on_a_terminal(url: str) -> None:
    status, stdout, terminal = on_a_terminal(["verify", "--store", url, "--json"])
    assert status == 0
    assert "verifying" not in terminal
    assert stdout.lstrip().startswith("{")


def test_checkpoints_import_draws_the_checks_of_the_export(url: str, tmp_path: Path) -> None:
    """The steps of an import's checks (the parse, the hashes, each message, the agent
    state: 5 for a two-message checkpoint), then the one line it prints."""
    import asyncio

    from perdure.cli import ops

    store = open_store(url)
    try:
        mark = asyncio.run(ops.create_checkpoint(store, "s0", "for the bar"))
        data = asyncio.run(ops.export_checkpoint(store, "s0", mark.checkpoint_id))
    finally:
        getattr(store, "close", lambda: None)()
    export = tmp_path / "s0.checkpoint.json"
    export.write_bytes(data)
    args = ["checkpoints", "import", "s0", str(export), "--store", url]
    status, stdout, terminal = on_a_terminal(args)
    assert status == 0, (stdout, terminal)
    assert "verifying" in terminal, terminal
    assert "5/5" in terminal, terminal
    assert stdout.startswith("imported checkpoint ")

    done = piped(args)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert done.stdout.startswith("imported checkpoint ")
