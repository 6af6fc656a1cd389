"""``perdure chat``: talk to a model in the terminal, its answers streamed as they arrive.

::

    perdure chat --model openai:gpt-4o-mini --system "Be brief."
    OPENAI_BASE_URL=http://localhost:11434/v1 perdure chat --model openai:llama3.1:8b
    perdure chat --model scripted          # no key, no network: a smoke test

Each line read from standard input is one prompt; ``/exit`` (or ``/quit``) or end of
input ends the chat. The agent has one tool, ``current_time``, so tool calls can be
seen at work: they print on their own lines as ``⚙ name({input})`` followed by
``↳ result`` (``✗ error`` when the tool failed). A failed model call prints
``error [code]: message`` to standard error and the chat goes on with a history the
model accepts (the agent loop never leaves a tool call without its result).

The turns run on perdure's one event loop (``perdure._runner.run_sync``), like every
sync entry point. :func:`run_chat` is the same chat for a caller that brings its own
model, tools, streams or session manager.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import sys
from collections.abc import Callable, Iterable
from typing import Any, TextIO

from perdure._runner import run_sync
from perdure.agent import (
    Agent,
    ReasoningDeltaEvent,
    ResultEvent,
    TextDeltaEvent,
    ToolEndEvent,
    ToolStartEvent,
)
from perdure.cli.style import Style
from perdure.errors import PerdureError
from perdure.hooks import HookProvider
from perdure.models import Model, from_string
from perdure.tools import AgentTool, tool

EXIT_COMMANDS = frozenset({"/exit", "/quit"})
"""Lines that end the chat."""

PREVIEW_CHARS = 200
"""Tool inputs and results longer than this are shortened on screen."""

SessionFactory = Callable[[str], HookProvider]
"""Builds the session manager for a ``--session ID`` (see :func:`add_chat_command`)."""


@tool
def current_time() -> str:
    """Return the current date and time in UTC, in ISO 8601 format."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


CHAT_TOOLS: tuple[AgentTool, ...] = (current_time,)
"""The tools the chat's agent has."""


def add_chat_command(
    subparsers: Any, *, session_factory: SessionFactory | None = None
) -> argparse.ArgumentParser:
    """Register ``perdure chat`` on the ``add_subparsers()`` object of the CLI.

    With a ``session_factory``, the command also takes ``--session ID``: the factory
    builds the agent's session manager for that id (resuming the conversation when
    it exists), e.g. ``lambda sid: Session(FileSessionStore(".perdure"), session_id=sid)``.

    Returns:
        The ``chat`` sub-parser (to add options to).
    """
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "chat",
        help="chat with a model in the terminal, streaming its answers",
        description=(
            "Chat with a model. Each input line is a prompt; /exit or end of input quits. "
            "Keys and servers come from OPENAI_API_KEY / OPENAI_BASE_URL and "
            "ANTHROPIC_API_KEY / ANTHROPIC_BASE_URL."
        ),
    )
    parser.add_argument(
        "--model",
        required=True,
        metavar="SPEC",
        help="openai:MODEL, anthropic:MODEL, or scripted (a canned script, no network)",
    )
    parser.add_argument("--system", metavar="TEXT", default=None, help="the system prompt")
    parser.add_argument("--color", action="store_true", help="force coloured output")
    parser.add_argument("--no-color", action="store_true", help="disable coloured output")
    if session_factory is not None:
        parser.add_argument(
            "--session",
            metavar="ID",
            default=None,
            help="keep the conversation in session ID (resumed when it exists)",
        )
    parser.set_defaults(handler=functools.partial(chat_command, session_factory=session_factory))
    return parser


def chat_command(
    args: argparse.Namespace,
    *,
    session_factory: SessionFactory | None = None,
    stdin: TextIO | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """The handler of ``perdure chat``; returns the exit status.

    0 when the chat ended normally, 1 when a turn failed, 2 when the model spec or
    its configuration is wrong (the reason goes to standard error), 130 on Ctrl-C.
    """
    stdin = stdin if stdin is not None else sys.stdin
    stdout = stdout if stdout is not None else sys.stdout
    stderr = stderr if stderr is not None else sys.stderr
    try:
        model = from_string(args.model)
    except (ValueError, ImportError, PerdureError) as exc:
        stderr.write(f"perdure chat: {exc}\n")
        return 2
    session_id = getattr(args, "session", None)
    session = session_factory(session_id) if session_factory and session_id else None
    color = True if args.color else (False if args.no_color else None)
    return run_chat(
        model,
        system_prompt=args.system,
        session_manager=session,
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        style=Style.for_stream(stdout, color),
    )


def run_chat(
    model: Model,
    *,
    system_prompt: str | None = None,
    tools: Iterable[AgentTool | Callable[..., Any]] = CHAT_TOOLS,
    session_manager: HookProvider | None = None,
    stdin: TextIO,
    stdout: TextIO,
    stderr: TextIO,
    style: Style | None = None,
) -> int:
    """Chat on ``stdin``/``stdout`` until end of input or ``/exit``; return the exit status.

    Each turn streams through ``agent.stream_async`` on perdure's event loop. The
    model is closed at the end when it has an ``aclose`` coroutine method.

    Returns:
        0, or 1 when at least one turn failed, or 130 on Ctrl-C.
    """
    style = style or Style(False)
    agent = Agent(
        model=model,
        tools=list(tools),
        system_prompt=system_prompt,
        session_manager=session_manager,
    )
    interactive = bool(getattr(stdin, "isatty", lambda: False)())
    failed = False
    if agent.messages:
        stdout.write(style(f"(resumed a conversation of {len(agent.messages)} messages)\n", "dim"))
    try:
        while True:
            if interactive:
                stdout.write(style("you> ", "bold", "green"))
                stdout.flush()
            line = stdin.readline()
            if not line:
                break
            prompt = line.strip()
            if not prompt:
                continue
            if prompt in EXIT_COMMANDS:
                break
            screen = _Screen(stdout, style)
            try:
                run_sync(_turn(agent, prompt, screen), async_name="agent.stream_async(prompt)")
            except PerdureError as exc:
                failed = True
                screen.end_line()
                stderr.write(f"error [{exc.code}]: {exc.message}\n")
                stderr.flush()
    except KeyboardInterrupt:
        stdout.write("\n")
        return 130
    finally:
        close = getattr(model, "aclose", None)
        if close is not None:
            run_sync(close(), async_name="model.aclose()")
    return 1 if failed else 0


class _Screen:
    """Writes a turn to the terminal, keeping track of whether a line is open."""

    def __init__(self, out: TextIO, style: Style) -> None:
        self.out = out
        self.style = style
        self.line_open = False

    def write(self, text: str, *styles: str) -> None:
        if text:
            self.out.write(self.style(text, *styles))
            self.out.flush()
            self.line_open = not text.endswith("\n")

    def end_line(self) -> None:
        if self.line_open:
            self.write("\n")

    def line(self, text: str, *styles: str) -> None:
        self.end_line()
        self.write(text, *styles)
        self.write("\n")


async def _turn(agent: Agent, prompt: str, screen: _Screen) -> None:
    async for event in agent.stream_async(prompt):
        if isinstance(event, TextDeltaEvent):
            screen.write(event.text)
        elif isinstance(event, ReasoningDeltaEvent):
            screen.write(event.text, "dim")
        elif isinstance(event, ToolStartEvent):
            call = event.tool_use
            screen.line(f"  ⚙ {call['name']}({_preview(call['input'])})", "cyan")
        elif isinstance(event, ToolEndEvent):
            result = event.result
            text = " ".join(
                block["text"] if "text" in block else json.dumps(block.get("json"))
                for block in result["content"]
                if "text" in block or "json" in block
            )
            if result["status"] == "error":
                screen.line(f"  ✗ {_shorten(text)}", "red")
            else:
                screen.line(f"  ↳ {_shorten(text)}", "dim")
        elif isinstance(event, ResultEvent):
            screen.end_line()
            stop = event.result.stop_reason
            if stop not in ("end_turn", "tool_use"):
                screen.line(f"[stopped: {stop}]", "yellow")


def _preview(value: Any) -> str:
    if value == {}:
        return ""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return _shorten(text)


def _shorten(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= PREVIEW_CHARS else flat[: PREVIEW_CHARS - 1] + "…"
