"""The README stays true: its Quick start has the promised shape and every example runs.

An example that opens a Redis or PostgreSQL store runs against the test servers
(skipped when one is unreachable, failed under CI=true), under a Redis key prefix and
a PostgreSQL schema of its own (``APP_NAME``), deleted after it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import postgres_server
import redis_server

README = Path(__file__).resolve().parents[1] / "README.md"
TEXT = README.read_text(encoding="utf-8")
PYTHON_BLOCKS = re.findall(r"```python\n(.*?)```", TEXT, flags=re.S)


def test_quick_start_is_one_bash_block_of_two_self_contained_lines() -> None:
    section = TEXT.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(\w*)\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1
    language, body = blocks[0]
    assert language == "bash"
    lines = body.strip().splitlines()
    assert len(lines) == 2
    assert "python3 -m venv .venv" in lines[0]
    assert "perdure demo" in lines[0]
    assert "python3 -m venv .venv" in lines[1]
    assert "pytest" in lines[1]


def test_readme_has_examples() -> None:
    assert len(PYTHON_BLOCKS) >= 4


SERVER_BLOCKS = [i for i, block in enumerate(PYTHON_BLOCKS) if "REDIS_URL" in block]


@pytest.fixture
def servers(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The test servers in the environment an example reads, cleaned after it."""
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


def test_the_production_layout_is_shown() -> None:
    assert len(SERVER_BLOCKS) == 1
    block = PYTHON_BLOCKS[SERVER_BLOCKS[0]]
    assert "RedisSessionStore(REDIS_URL" in block
    assert "ttl=1800" in block
    assert "checkpoints=checkpoints" in block


def _require_openai_agents() -> None:
    """Skip an example of the ``[openai-agents]`` extra without it (fail under CI=true)."""
    try:
        import agents  # noqa: F401
    except ImportError:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip("the OpenAI Agents SDK is not installed: pip install 'perdure[openai-agents]'")


def _require_langgraph() -> None:
    """Skip an example of the ``[langgraph]`` extra without it (fail under CI=true)."""
    try:
        import langgraph.checkpoint.sqlite
        import langgraph.graph  # noqa: F401
    except ImportError:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip("LangGraph is not installed: pip install 'perdure[langgraph]'")


@pytest.mark.parametrize("index", [i for i in range(len(PYTHON_BLOCKS)) if i not in SERVER_BLOCKS])
def test_readme_example_runs(index: int) -> None:
    if "perdure.adapters.openai_agents" in PYTHON_BLOCKS[index]:
        _require_openai_agents()
    if "perdure.adapters.langgraph" in PYTHON_BLOCKS[index]:
        _require_langgraph()
    code = compile(PYTHON_BLOCKS[index], f"README.md example {index + 1}", "exec")
    exec(code, {"__name__": f"readme_example_{index}"})


@pytest.mark.parametrize("index", SERVER_BLOCKS)
def test_readme_server_example_runs(index: int, servers: None) -> None:
    code = compile(PYTHON_BLOCKS[index], f"README.md example {index + 1}", "exec")
    exec(code, {"__name__": f"readme_example_{index}"})
