"""The ``perdure`` command line: a thin click front end over the library."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from pathlib import Path

import click

from perdure import __version__
from perdure._runtime.loop import run_sync
from perdure.cli._common import EXIT_INTERRUPTED

# (module, attribute) of each command, added to the group in this order.
COMMANDS: list[tuple[str, str]] = [
    ("perdure.cli.chat", "chat"),
    ("perdure.cli.sessions", "sessions"),
    ("perdure.cli.checkpoints", "checkpoints"),
    ("perdure.cli.checkpoints", "fork"),
    ("perdure.cli.verify", "verify"),
    ("perdure.cli.verify", "repair"),
    ("perdure.cli.gc", "gc"),
    ("perdure.cli.snapshots", "snapshots"),
    ("perdure.cli.migrate", "migrate"),
    ("perdure.cli.copy", "copy"),
    ("perdure.cli.schema", "migrate_schema"),
    ("perdure.cli.keys", "rotate_keys"),
    ("perdure.cli.serve", "serve"),
]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="perdure")
def cli() -> None:
    """perdure: agent state that lasts."""


@cli.command()
@click.option("--color", "color", flag_value=True, default=None, help="Force coloured output.")
@click.option("--no-color", "color", flag_value=False, help="Disable coloured output.")
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path),
    default=Path("perdure-demo-data"),
    show_default=True,
    help="Where the demo stores its session (reset on each run).",
)
def demo(color: bool | None, data_dir: Path) -> None:
    """Run the gift-finder workflow: killed mid-way, resumed, compacted, restored."""
    from perdure.cli.demo import run_demo

    run_sync(run_demo(sys.stdout, color=color, data_dir=data_dir), async_name="run_demo()")


def _register() -> None:
    for module_name, attribute in COMMANDS:
        command = getattr(importlib.import_module(module_name), attribute)
        if not isinstance(command, click.Command):
            raise TypeError(f"{module_name}.{attribute} is not a click command")
        cli.add_command(command)


_register()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the exit status."""
    try:
        cli.main(args=list(argv) if argv is not None else None, prog_name="perdure")
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return 0


if __name__ == "__main__":
    sys.exit(main())
