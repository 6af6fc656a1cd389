"""``perdure serve`` as users start it: a real uvicorn on a loopback port."""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from perdure.cli.main import cli


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def get(url: str, token: str | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def start(*args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], str]:
    """``perdure serve ARGS`` on a free port; returns once it answers."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "perdure", "serve", "--port", str(port), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            _, err = proc.communicate()
            raise AssertionError(f"perdure serve exited: {err}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc, base
        except OSError:
            time.sleep(0.1)
    stop(proc)
    raise AssertionError("perdure serve did not start in 30 s")


def stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    try:
        proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()


@pytest.fixture
def store_dir(tmp_path: Path) -> str:
    import asyncio

    from perdure.session import open_store
    from server_support import close, conversation, fill

    url = f"sqlite:{tmp_path / 'p.db'}"

    async def make() -> None:
        store = open_store(url)
        await fill(store, "s1", conversation(2))
        close(store)

    asyncio.run(make())
    return url


def test_serve_answers_the_api_and_the_page(store_dir: str) -> None:
    proc, base = start("--store", store_dir)
    try:
        status, body = get(f"{base}/api/sessions")
        assert status == 200
        assert [s["session_id"] for s in body["sessions"]] == ["s1"]
        with urllib.request.urlopen(f"{base}/", timeout=10) as page:
            html = page.read().decode()
            assert page.headers["Content-Security-Policy"].startswith("default-src 'self'")
        assert '<script src="/static/app.js"' in html
        assert get(f"{base}/openapi.json")[1]["openapi"] == "3.1.0"
    finally:
        stop(proc)


def test_serve_with_a_token_from_the_environment(store_dir: str) -> None:
    proc, base = start("--store", store_dir, env={"PERDURE_TOKEN": "tok"})
    try:
        status, body = get(f"{base}/api/sessions")
        assert (status, body["error"]["code"]) == (401, "unauthorized")
        assert get(f"{base}/api/sessions", token="tok")[0] == 200
    finally:
        stop(proc)


def test_serve_refuses_the_network_without_a_token(store_dir: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PERDURE_TOKEN"}
    result = CliRunner(env=env).invoke(
        cli, ["serve", "--store", store_dir, "--host", "0.0.0.0", "--port", "1"]
    )
    assert result.exit_code == 2, result.output
    assert "is not loopback: give a token (--token or PERDURE_TOKEN)" in result.stderr


def test_serve_refuses_a_store_that_does_not_exist(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["serve", "--store", f"sqlite:{tmp_path / 'none.db'}"])
    assert result.exit_code == 3
    assert "no store at" in result.stderr


def test_serve_refuses_a_memory_store_that_is_not_there(store_dir: str, tmp_path: Path) -> None:
    """Browsing memories must not create a memory store (as ``perdure memory`` does not)."""
    for target in (tmp_path / "none.db", tmp_path / "empty.db"):
        if target.name == "empty.db":
            target.touch()
        result = CliRunner().invoke(
            cli, ["serve", "--store", store_dir, "--memory", f"sqlite:{target}", "--port", "1"]
        )
        assert result.exit_code == 3, result.output
        assert result.stderr.startswith(f"error: no memory store at {target} (")
        assert result.stderr.count("\n") == 1
    assert not (tmp_path / "none.db").exists()
    assert (tmp_path / "empty.db").read_bytes() == b""


def test_the_readme_serve_example_runs(store_dir: str) -> None:
    """The README's ``perdure serve`` lines: the first serves, the curl line answers."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    block = readme.split("### A web inspector: `perdure serve`", 1)[1].split("```console\n")[1]
    lines = [line[2:] for line in block.split("```")[0].splitlines() if line.startswith("$ ")]
    serve, curl = shlex.split(lines[0]), shlex.split(lines[1])
    assert serve[:3] == ["perdure", "serve", "--store"]
    assert serve[3] == "sqlite:./perdure.db"
    proc, base = start("--store", store_dir)  # the same command on a free port
    try:
        url = curl[-1].replace("http://127.0.0.1:8765", base)
        status, body = get(url)
        assert status == 200
        assert (body["offset"], body["total"]) == (0, 10)
        assert len(body["messages"]) == 10
    finally:
        stop(proc)
    assert "--host 0.0.0.0" in lines[2]
    assert lines[2].startswith("PERDURE_TOKEN=")


def test_serve_signs_exports_with_the_key_file_of_the_cli(store_dir: str, tmp_path: Path) -> None:
    """--signing-key-file: the same key file as ``checkpoints export``; the server
    signs on request, and the CLI's import with that key accepts what it signed."""
    from perdure.checkpoints.export import import_checkpoint_bytes
    from perdure.errors import CheckpointImportError

    key_file = tmp_path / "export.key"
    key_file.write_bytes(b"team secret\n")
    created = CliRunner().invoke(cli, ["checkpoints", "create", "s1", "--store", store_dir, "-q"])
    assert created.exit_code == 0, created.output
    checkpoint_id = created.stdout.strip()
    proc, base = start("--store", store_dir, "--signing-key-file", str(key_file))
    try:
        assert get(f"{base}/api/info")[1]["signing"] is True
        url = f"{base}/api/sessions/s1/checkpoints/{checkpoint_id}/export?signed=true"
        with urllib.request.urlopen(url, timeout=10) as response:
            signed = response.read()
    finally:
        stop(proc)
    assert "hmac_sha256" in json.loads(signed)
    assert import_checkpoint_bytes(signed, verify_key=b"team secret").meta.checkpoint_id == (
        checkpoint_id
    )
    with pytest.raises(CheckpointImportError):
        import_checkpoint_bytes(signed, verify_key=b"another")
    export = tmp_path / "s1.checkpoint.json"
    export.write_bytes(signed)
    imported = CliRunner().invoke(
        cli,
        [
            "checkpoints",
            "import",
            "s1",
            str(export),
            "--verify-key-file",
            str(key_file),
            "--store",
            store_dir,
        ],
    )
    assert imported.exit_code == 0, imported.output


def test_serve_refuses_an_unreadable_key_file(store_dir: str, tmp_path: Path) -> None:
    missing = CliRunner().invoke(
        cli, ["serve", "--store", store_dir, "--signing-key-file", str(tmp_path / "nope")]
    )
    assert missing.exit_code == 2, missing.output
    assert "--signing-key-file: cannot read" in missing.stderr
    empty = tmp_path / "empty.key"
    empty.write_bytes(b"\n")
    result = CliRunner().invoke(
        cli, ["serve", "--store", store_dir, "--signing-key-file", str(empty)]
    )
    assert result.exit_code == 2, result.output
    assert "holds no key" in result.stderr
