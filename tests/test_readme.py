"""The README stays true: its Quick start has the promised shape and every example runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

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


@pytest.mark.parametrize("index", range(len(PYTHON_BLOCKS)))
def test_readme_example_runs(index: int) -> None:
    code = compile(PYTHON_BLOCKS[index], f"README.md example {index + 1}", "exec")
    exec(code, {"__name__": f"readme_example_{index}"})
