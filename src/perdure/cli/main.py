"""The ``perdure`` command line: a thin click front end over the library."""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import click

from perdure import __version__
from perdure._runtime.loop import run_sync
from perdure.cli._common import (
    EXIT_INTERRUPTED,
    fail,
    remember_store,
    remembered_store,
    takes_remembered_store,
)
from perdure.cli.output import format_option

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
    ("perdure.cli.memory", "memory"),
    ("perdure.cli.keys", "rotate_keys"),
    ("perdure.cli.serve", "serve"),
]


class PerdureGroup(click.Group):
    """The root group: every error, click's included, is one ``error: …`` line.

    click prints a usage error as ``Usage: …`` / ``Try …`` / ``Error: …``; perdure's
    own errors are one line (``_common.fail``). Both now read ``error: MESSAGE`` with
    a pointer to ``--help`` for usage errors, and keep their exit status (2).
    """

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            status = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.exceptions.NoArgsIsHelpError as exc:  # bare `perdure` or a bare group
            exc.show()  # the help, as click shows it
            sys.exit(exc.exit_code)
        except click.UsageError as exc:
            where = exc.ctx.command_path if exc.ctx is not None else "perdure"
            message = one_line(exc.format_message()).rstrip(".")
            fail(f"{message} (see '{where} --help')", exc.exit_code)
        except click.ClickException as exc:
            fail(one_line(exc.format_message()), exc.exit_code)
        except click.Abort:
            fail("aborted", EXIT_INTERRUPTED)
        sys.exit(status if isinstance(status, int) else 0)

    def invoke(self, ctx: click.Context) -> Any:
        """Refuse a ``--store`` before a command that would not use it (``copy`` takes
        ``--from``/``--to``, ``migrate-schema`` its own ``--store``, the demo none)."""
        if remembered_store(ctx) is not None:
            leaf = self._leaf(ctx)
            if leaf is not None and not takes_remembered_store(leaf):
                raise click.UsageError(
                    f"--store before {leaf.name!r} would be ignored: that command names "
                    f"its stores with options of its own ('perdure … {leaf.name} --help')",
                    ctx=ctx,
                )
        return super().invoke(ctx)

    def _leaf(self, ctx: click.Context) -> click.Command | None:
        """The command the arguments name (through nested groups); None if unknown."""
        protected = ctx.__dict__.get("_protected_args")  # click >= 8.2: the name
        if protected is None:
            protected = ctx.protected_args
        command: click.Command = self
        args = [*protected, *ctx.args]
        if any(arg in ("-h", "--help") for arg in args):
            return None  # asking for help: shown as usual
        while isinstance(command, click.Group):
            names = [arg for arg in args if not arg.startswith("-")]
            if not names:
                return None
            found = command.get_command(ctx, names[0])
            if found is None:
                return None
            args = args[args.index(names[0]) + 1 :]
            command = found
        return command


def one_line(message: str) -> str:
    """click's message on one line (some of its messages wrap)."""
    return " ".join(message.split())


@click.group(cls=PerdureGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="perdure")
@click.option(
    "--store",
    "-s",
    "store_url",
    metavar="URL",
    default=None,
    expose_value=False,
    is_eager=True,
    callback=remember_store,
    help="The store for the command that follows (see its --help); it may also come after it.",
)
@format_option
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
    for _name, command in _walk(cli):
        _whole_short_help(command)


def _walk(command: click.Command) -> Iterator[tuple[str, click.Command]]:
    yield command.name or "", command
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            yield from _walk(sub)


def _whole_short_help(command: click.Command) -> None:
    """Give ``command`` its help's whole first paragraph as short help.

    click cuts a command's summary in a group's listing to fit one line (``Show a
    session: metadata, state,...``); the listing now shows the whole sentence,
    wrapped.
    """
    if command.short_help is None and command.help:
        first = inspect.cleandoc(command.help).split("\n\n")[0]
        command.short_help = " ".join(first.split())


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
