"""Run the code blocks of a Markdown page: the README's and every page under ``docs/``.

One machinery for every page (``tests/test_readme.py``, ``tests/test_docs.py`` and the
README's command-line session in ``tests/cli/test_cli_docs.py``):

- :func:`blocks` finds a page's fenced blocks of one language;
- :func:`run_python` runs a ``python`` block with ``exec``, after skipping (with the
  reason, failing under ``CI=true``) one that imports an optional SDK not installed;
- :func:`server_env` gives a block that reads ``REDIS_URL`` / ``DATABASE_URL`` the test
  servers, under a Redis key prefix and a PostgreSQL schema of its own (``APP_NAME``),
  deleted after it;
- :func:`run_bash` runs ``bash`` blocks in a fresh directory, with ``perdure`` on the
  ``PATH`` meaning this checkout's perdure.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import types
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

import postgres_server
import redis_server

IN_CI = os.environ.get("CI") == "true"

# What a block imports -> the module that must import, and the install line to name.
OPTIONAL = {
    "perdure.adapters.openai_agents": (
        "agents",
        "the OpenAI Agents SDK is not installed: pip install 'perdure[openai-agents]'",
    ),
    "perdure.adapters.langgraph": (
        "langgraph.checkpoint.sqlite",
        "LangGraph is not installed: pip install 'perdure[langgraph]'",
    ),
    "perdure.migrate.langgraph": (
        "langgraph.checkpoint.sqlite",
        "LangGraph is not installed: pip install 'perdure[langgraph]'",
    ),
    "agents.memory": (
        "agents",
        "the OpenAI Agents SDK is not installed: pip install 'perdure[openai-agents]'",
    ),
}


def blocks(text: str, language: str) -> list[str]:
    """The bodies of ``text``'s fenced blocks of ``language``, in order."""
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.S | re.M)


def fence_languages(text: str) -> list[str]:
    """The language of every block ``text`` opens (``""`` for a bare fence)."""
    languages: list[str] = []
    inside = False
    for line in text.splitlines():
        if line.startswith("```"):
            if not inside:
                languages.append(line[3:].strip())
            inside = not inside
    return languages


def needs_servers(block: str) -> bool:
    """Whether a block reads the test servers' URLs from the environment."""
    return "REDIS_URL" in block or "DATABASE_URL" in block


def require_optional(block: str) -> None:
    """Skip a block importing an optional SDK that is missing (fail under CI=true)."""
    for marker, (module, reason) in OPTIONAL.items():
        if marker not in block:
            continue
        try:
            __import__(module)
        except ImportError:
            if IN_CI:
                raise
            pytest.skip(reason)


@contextmanager
def server_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The test servers in the environment a block reads, cleaned after it."""
    redis_url = redis_server.require_server()
    postgres_server.require_server()
    app = postgres_server.new_schema_name()
    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("DATABASE_URL", postgres_server.DSN)
    monkeypatch.setenv("APP_NAME", app)
    try:
        yield
    finally:
        redis_server.drop_prefix(f"{app}:")
        postgres_server.drop_schema(app)


def run_python(block: str, name: str) -> None:
    """Run one ``python`` block as a fresh module named after its page."""
    require_optional(block)
    code = compile(block, name, "exec")
    # A real module in sys.modules: dataclasses and pickling look their class up there.
    module = types.ModuleType(re.sub(r"\W", "_", name))
    sys.modules[module.__name__] = module
    try:
        exec(code, module.__dict__)
    finally:
        del sys.modules[module.__name__]


def run_bash(blocks: Sequence[str], tmp_path: Path, *, label: str) -> None:
    """Run ``bash`` blocks one after another in one fresh directory, ``perdure`` on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    launcher = bin_dir / "perdure"
    launcher.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m perdure "$@"\n')
    launcher.chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "NO_COLOR": "1",
    }
    env.pop("PERDURE_STORE", None)
    for block in blocks:
        proc = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", block],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 0, (
            f"{label}:\n{block}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
        )
