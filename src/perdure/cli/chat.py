"""``perdure chat``: talk to a model in the terminal, its answers streamed as they arrive.

::

    perdure chat --model openai:gpt-4o-mini --system "Be brief."
    OPENAI_BASE_URL=http://localhost:11434/v1 perdure chat --model openai:llama3.1:8b
    perdure chat --model scripted          # no key, no network: a smoke test
    perdure chat --model scripted --session s1 --store sqlite:./perdure.db

Each line read from standard input is one prompt; ``/exit`` (or ``/quit``) or end of
input ends the chat. The agent has one tool, ``current_time``, so tool calls can be
seen at work: they print on their own lines as ``⚙ name({input})`` followed by
``↳ result`` (``✗ error`` when the tool failed). A failed model call prints
``error [code]: message`` to standard error and the chat goes on with a history the
model accepts (the agent loop never leaves a tool call without its result). A turn
the session's store refuses — the session locked by another writer, its history
damaged or changed under us — ends the chat with the one ``error: message [code]``
line every command prints and that error's exit status.

With ``--session ID`` the conversation lives in session ``ID`` of the ``--store``
(default ``file:.perdure``): it is resumed when it exists, so a chat can stop and go
on in another process. Exit status: 0, 1 when a model call failed, 2 for a bad model
spec or store URL, 3–5 when the session cannot be opened or its store refuses a turn
(4 damaged, 5 locked by another writer or changed under us; see
:mod:`perdure.cli._common`), 6 another error of the store, 130 on Ctrl-C.

The turns run on perdure's one event loop (``perdure._runtime.loop.run_sync``), like every
sync entry point. :func:`run_chat` is the same chat for a caller that brings its own
model, tools, streams or session manager.
"""

from __future__ import annotations

import contextlib
import datetime
import sys
from collections.abc import Callable, Iterable
from typing import Any, TextIO

import click

from perdure._runtime.loop import run_sync
from perdure.agent import (
    Agent,
    ReasoningDeltaEvent,
    ResultEvent,
    TextDeltaEvent,
    ToolEndEvent,
    ToolStartEvent,
)
from perdure.cli._common import (
    EXIT_USAGE,
    error_line,
    exit_code_for,
    fail,
    handle_errors,
    perdure_error_message,
    session_store,
    store_option,
)
from perdure.cli.output import format_time, plural, terminal_safe
from perdure.cli.render import preview, tool_result_text
from perdure.cli.style import Style
from perdure.errors import ModelError, PerdureError
from perdure.hooks import HookProvider
from perdure.models import Model, from_string
from perdure.session import Session
from perdure.tools import AgentTool, tool

EXIT_COMMANDS = frozenset({"/exit", "/quit"})
"""Lines that end the chat."""


@tool
def current_time() -> str:
    """Return the current date and time in UTC, in ISO 8601 format (``…Z``)."""
    return format_time(datetime.datetime.now(datetime.UTC).isoformat())


CHAT_TOOLS: tuple[AgentTool, ...] = (current_time,)
"""The tools the chat's agent has."""


@click.command()
@click.option(
    "--model",
    "model_spec",
    required=True,
    metavar="SPEC",
    help="openai:MODEL, anthropic:MODEL, or scripted (a canned script, no network).",
)
@click.option("--system", metavar="TEXT", default=None, help="The system prompt.")
@click.option(
    "--session",
    "session_id",
    metavar="ID",
    default=None,
    help="Keep the conversation in session ID of --store (resumed when it exists).",
)
@store_option
@click.option("--color", "color", flag_value=True, default=None, help="Force coloured output.")
@click.option("--no-color", "color", flag_value=False, help="Disable coloured output.")
@click.pass_context
@handle_errors
def chat(
    ctx: click.Context,
    model_spec: str,
    system: str | None,
    session_id: str | None,
    store_url: str,
    color: bool | None,
) -> None:
    """Chat with a model in the terminal, streaming its answers.

    Each input line is a prompt; /exit or end of input quits. Keys and servers come
    from OPENAI_API_KEY / OPENAI_BASE_URL and ANTHROPIC_API_KEY / ANTHROPIC_BASE_URL.
    """
    try:
        model = from_string(model_spec)
    except (ValueError, ImportError, PerdureError) as exc:
        fail(str(exc), EXIT_USAGE)
        return
    with contextlib.ExitStack() as stack:
        session = None
        if session_id is not None:
            store = stack.enter_context(session_store(store_url, must_exist=False))
            session = Session(store, session_id)
        status = run_chat(
            model,
            system_prompt=system,
            session_manager=session,
            stdin=sys.stdin,
            stdout=sys.stdout,
            stderr=sys.stderr,
            style=Style.for_stream(sys.stdout, color),
        )
    ctx.exit(status)


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
        0, or 1 when at least one model call failed (the chat went on), or 130 on
        Ctrl-C; when the store refuses a turn (another error than the model's), the
        chat ends at once with that error's status (:func:`~perdure.cli._common.exit_code_for`:
        4 damaged, 5 locked, …).
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
        resumed = plural(len(agent.messages), "message")
        stdout.write(style(f"(resumed a conversation of {resumed})\n", "dim"))
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
            except ModelError as exc:
                failed = True
                screen.end_line()
                stderr.write(f"error [{exc.code}]: {terminal_safe(exc.message, chr(9))}\n")
                stderr.flush()
            except PerdureError as exc:  # the store refused the turn: going on cannot help
                screen.end_line()
                stderr.write(error_line(perdure_error_message(exc)) + "\n")
                stderr.flush()
                return exit_code_for(exc)
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
        text = terminal_safe(text)  # the model's text is shown, its controls never obeyed
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
            screen.line(f"  ⚙ {call['name']}({preview(call['input'])})", "cyan")
        elif isinstance(event, ToolEndEvent):
            result = event.result
            text = tool_result_text(result)
            if result["status"] == "error":
                screen.line(f"  ✗ {text}", "red")
            else:
                screen.line(f"  ↳ {text}", "dim")
        elif isinstance(event, ResultEvent):
            screen.end_line()
            stop = event.result.stop_reason
            if stop not in ("end_turn", "tool_use"):
                screen.line(f"[stopped: {stop}]", "yellow")
