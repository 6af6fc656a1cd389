"""Every ``perdure`` command is documented: in its ``--help``, and in the README.

The README's ``## Command line`` section is written by hand; the tests below check
that it names every top-level command and that its shell session runs.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import doc_examples
from perdure.cli.main import cli

README = Path(__file__).resolve().parents[2] / "README.md"
SECTION = "## Command line"
MISSING_SECTION = (
    f"README.md has no {SECTION!r} section yet: it should show a short CLI session "
    "naming every top-level command (issue 8; the lead writes it)"
)


def walk(command: click.Command, path: tuple[str, ...] = ()) -> Iterator[tuple[str, click.Command]]:
    """Every command under ``command`` (itself included) with its full name."""
    yield " ".join(("perdure", *path)), command
    if isinstance(command, click.Group):
        for name, sub in sorted(command.commands.items()):
            yield from walk(sub, (*path, name))


COMMANDS = dict(walk(cli))


def test_the_tree_has_the_commands_of_issue_8() -> None:
    names = set(COMMANDS)
    assert {
        "perdure sessions list",
        "perdure sessions show",
        "perdure sessions history",
        "perdure sessions delete",
        "perdure checkpoints list",
        "perdure checkpoints create",
        "perdure checkpoints restore",
        "perdure checkpoints delete",
        "perdure checkpoints export",
        "perdure checkpoints import",
        "perdure fork",
        "perdure chat",
        "perdure demo",
    } <= names


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_and_option_has_help(name: str) -> None:
    command = COMMANDS[name]
    assert (command.help or "").strip(), f"{name} has no help text (its docstring)"
    assert command.get_short_help_str().strip()
    for param in command.params:
        if isinstance(param, click.Option):
            assert (param.help or "").strip(), f"{name} {param.opts[0]} has no help"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_runs(name: str) -> None:
    args = [*name.split()[1:], "--help"]
    result = CliRunner().invoke(cli, args, prog_name="perdure")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"Usage: {name}")


def readme_section() -> str:
    text = README.read_text(encoding="utf-8")
    assert f"\n{SECTION}\n" in text, MISSING_SECTION
    return text.split(f"\n{SECTION}\n", 1)[1].split("\n## ", 1)[0]


@pytest.mark.parametrize("name", sorted(cli.commands))
def test_every_top_level_command_is_in_the_readme(name: str) -> None:
    section = readme_section()
    assert re.search(rf"\bperdure {re.escape(name)}\b", section), (
        f"README.md's {SECTION!r} section does not mention `perdure {name}`"
    )


def test_the_readme_cli_session_runs(tmp_path: Path) -> None:
    """The section's ``bash`` blocks run in a fresh directory with this perdure."""
    blocks = doc_examples.blocks(readme_section(), "bash")
    assert blocks, f"README.md's {SECTION!r} section has no ```bash block"
    doc_examples.run_bash(blocks, tmp_path, label=f"README.md {SECTION!r}")
