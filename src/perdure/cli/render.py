"""Stored messages rendered for people: one readable line per block, binaries named.

Every command that shows a conversation uses these helpers, so a message looks the
same everywhere::

    #2 assistant
      Let me check the clock.
      ⚙ current_time()                    a toolUse: name and input (shortened)
    #3 user
      ↳ 2025-01-01T12:00:00+00:00         a successful toolResult
      ✗ no such city                      a failed toolResult
      [image png, 12.3 KiB]               an image: named, its bytes never shown
      [document pdf "report.pdf", 3.0 KiB]
      [reasoning] I should check first   reasoning text (``[reasoning, redacted]``)

Text blocks are shown whole; tool inputs and results are flattened to one line and
shortened to :data:`PREVIEW_CHARS`. Control characters (ESC, a carriage return, …)
are shown as ``\\x1b``, never sent to the terminal
(:func:`~perdure.cli.output.terminal_safe`). The functions are pure: they return
strings (or ``(text, style)`` lines for rich), and never raise on a block of an
unexpected shape — stored data may come from older versions or other tools.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, NamedTuple

from rich.console import Console
from rich.table import Table
from rich.text import Text

from perdure.cli import output
from perdure.types import Message

PREVIEW_CHARS = 200
"""Tool inputs and results longer than this are shortened on screen."""

INDENT = "  "
"""How far a message's blocks are indented under its header."""


class Line(NamedTuple):
    """One rendered line and the rich style it is shown in (``""`` for none)."""

    text: str
    style: str = ""


def human_size(size: int) -> str:
    """A byte count for people: ``512 B``, ``12.3 KiB``, ``4.0 MiB``."""
    if size < 1024:
        return f"{size} B"
    value = float(size)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if value < 1024 or unit == "GiB":
            break
    return f"{value:.1f} {unit}"


def shorten(text: str, limit: int = PREVIEW_CHARS) -> str:
    """``text`` on one line (whitespace runs folded), cut to ``limit`` with ``…``."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def preview(value: Any, limit: int = PREVIEW_CHARS) -> str:
    """A tool input on one line: ``""`` for ``{}``, strings as is, the rest as JSON."""
    if value == {}:
        return ""
    return shorten(value if isinstance(value, str) else _json(value), limit)


def format_time(iso: str) -> str:
    """An ISO-8601 time in UTC to the second with ``Z`` (see :mod:`perdure.cli.output`)."""
    return output.format_time(iso)


def describe_binary(kind: str, body: Any) -> str:
    """Name an ``image`` or ``document`` block without its bytes.

    ``[image png, 12.3 KiB]``, ``[document pdf "report.pdf", 3.0 KiB]``.
    """
    parts = [kind]
    if isinstance(body, Mapping):
        if isinstance(body.get("format"), str):
            parts.append(body["format"])
        if isinstance(body.get("name"), str):
            parts.append(json.dumps(body["name"], ensure_ascii=False))
        source = body.get("source")
        data = source.get("bytes") if isinstance(source, Mapping) else None
        if isinstance(data, bytes | bytearray):
            return f"[{' '.join(parts)}, {human_size(len(data))}]"
    return f"[{' '.join(parts)}]"


def tool_result_text(result: Any) -> str:
    """The content of a ``toolResult`` on one line (text, JSON, binaries named), shortened."""
    content = result.get("content") if isinstance(result, Mapping) else None
    if not isinstance(content, list):
        return ""
    return shorten(" ".join(_inline(block) for block in content))


def block_line(block: Any) -> Line:
    """One content block as a line: text whole, tool calls and results on one line."""
    if not isinstance(block, Mapping):
        return Line(f"[unknown block {type(block).__name__}]", "yellow")
    if isinstance(block.get("text"), str):
        return Line(block["text"])
    if "toolUse" in block:
        call = block["toolUse"]
        name = call.get("name", "?") if isinstance(call, Mapping) else "?"
        args = preview(call.get("input", {})) if isinstance(call, Mapping) else ""
        return Line(f"⚙ {name}({args})", "cyan")
    if "toolResult" in block:
        result = block["toolResult"]
        failed = isinstance(result, Mapping) and result.get("status") == "error"
        text = tool_result_text(result)
        return Line(f"✗ {text}", "red") if failed else Line(f"↳ {text}", "dim")
    if "reasoningContent" in block:
        return Line(_reasoning(block["reasoningContent"]), "dim")
    return Line(_inline(block), "")


def message_lines(message: Message | Mapping[str, Any]) -> list[Line]:
    """The lines of a message's content, one per block (text blocks keep their lines).

    Each line is :func:`~perdure.cli.output.terminal_safe` (a tab kept).
    """
    content = message.get("content")
    lines: list[Line] = []
    for block in content if isinstance(content, list) else []:
        line = block_line(block)
        lines.extend(
            Line(output.terminal_safe(part, "\t"), line.style)
            for part in (line.text.splitlines() or [""])
        )
    return lines


def _role(message: Message | Mapping[str, Any]) -> str:
    return output.terminal_safe(str(message.get("role", "?")), "")


def render_message(message: Message | Mapping[str, Any], index: int | None = None) -> str:
    """A message as plain text: a ``#index role`` header, then its blocks indented."""
    role = _role(message)
    header = role if index is None else f"#{index} {role}"
    return "\n".join([header, *(INDENT + line.text for line in message_lines(message))])


def rich_message(message: Message | Mapping[str, Any], index: int | None = None) -> Text:
    """:func:`render_message` styled for a rich console (no markup is interpreted)."""
    role = _role(message)
    text = Text()
    if index is not None:
        text.append(f"#{index} ", "dim")
    text.append(role, "bold green" if role == "user" else "bold blue")
    for line in message_lines(message):
        text.append("\n" + INDENT)
        text.append(line.text, line.style)
    return text


def print_table(out: Console, table: Table) -> None:
    """Print ``table`` by the output rules of :func:`perdure.cli.output.print_table`."""
    output.print_table(table, out)


def _inline(block: Any) -> str:
    """A block inside a tool result, or of a kind without its own line style."""
    if not isinstance(block, Mapping):
        return f"[unknown block {type(block).__name__}]"
    if isinstance(block.get("text"), str):
        return str(block["text"])
    if "json" in block:
        return _json(block["json"])
    for kind in ("image", "document"):
        if kind in block:
            return describe_binary(kind, block[kind])
    if "toolUse" in block or "toolResult" in block or "reasoningContent" in block:
        return block_line(block).text
    return f"[{', '.join(sorted(map(str, block)))}]"


def _reasoning(reasoning: Any) -> str:
    if isinstance(reasoning, Mapping):
        if reasoning.get("redactedContent"):
            return "[reasoning, redacted]"
        body = reasoning.get("reasoningText")
        if isinstance(body, Mapping) and isinstance(body.get("text"), str):
            return f"[reasoning] {shorten(body['text'])}"
    return "[reasoning]"


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=_named_bytes)


def _named_bytes(value: Any) -> str:
    """JSON fallback: bytes inside a tool input or JSON result are named, not dumped."""
    if isinstance(value, bytes | bytearray):
        return f"<{human_size(len(value))}>"
    return repr(value)
