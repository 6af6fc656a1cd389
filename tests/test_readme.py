"""The README stays true: its Quick start has the promised shape and every example runs.

An example that opens a Redis or PostgreSQL store runs against the test servers
(skipped when one is unreachable, failed under CI=true), under a Redis key prefix and
a PostgreSQL schema of its own (``APP_NAME``), deleted after it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import doc_examples

README = Path(__file__).resolve().parents[1] / "README.md"
TEXT = README.read_text(encoding="utf-8")
PYTHON_BLOCKS = doc_examples.blocks(TEXT, "python")


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


def test_the_production_layout_is_shown() -> None:
    assert len(SERVER_BLOCKS) == 1
    block = PYTHON_BLOCKS[SERVER_BLOCKS[0]]
    assert "RedisSessionStore(REDIS_URL" in block
    assert "ttl=1800" in block
    assert "checkpoints=checkpoints" in block


@pytest.mark.parametrize("index", [i for i in range(len(PYTHON_BLOCKS)) if i not in SERVER_BLOCKS])
def test_readme_example_runs(index: int) -> None:
    doc_examples.run_python(PYTHON_BLOCKS[index], f"README.md example {index + 1}")


@pytest.mark.parametrize("index", SERVER_BLOCKS)
def test_readme_server_example_runs(index: int, monkeypatch: pytest.MonkeyPatch) -> None:
    with doc_examples.server_env(monkeypatch):
        doc_examples.run_python(PYTHON_BLOCKS[index], f"README.md example {index + 1}")
