"""The ``perdure`` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from perdure import __version__
from perdure._runner import run_sync
from perdure.hooks import HookProvider


def _demo(args: argparse.Namespace) -> int:
    from perdure.cli.demo import run_demo

    color = True if args.color else (False if args.no_color else None)
    run_sync(run_demo(sys.stdout, color=color, data_dir=args.data_dir), async_name="run_demo()")
    return 0


def _chat_session(session_id: str) -> HookProvider:
    from perdure.session import FileSessionStore, Session

    return Session(FileSessionStore(".perdure"), session_id=session_id)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``perdure`` command."""
    parser = argparse.ArgumentParser(prog="perdure", description="perdure: agent state that lasts.")
    parser.add_argument("--version", action="version", version=f"perdure {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = commands.add_parser(
        "demo", help="run the gift-finder workflow on a scripted model, pausing at checkpoints"
    )
    demo.add_argument("--color", action="store_true", help="force coloured output")
    demo.add_argument("--no-color", action="store_true", help="disable coloured output")
    demo.add_argument(
        "--data-dir",
        type=Path,
        default=Path("perdure-demo-data"),
        help="where the demo stores its session (default: ./perdure-demo-data, reset each run)",
    )
    demo.set_defaults(handler=_demo)
    from perdure.cli.chat import add_chat_command

    add_chat_command(commands, session_factory=_chat_session)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    result: int = handler(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
