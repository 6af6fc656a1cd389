"""Minimal terminal styling for the CLI: ANSI colours, off when NO_COLOR or not a TTY."""

from __future__ import annotations

import os
import sys
from typing import TextIO

_CODES = {
    "bold": "1",
    "dim": "2",
    "red": "31",
    "green": "32",
    "yellow": "33",
    "blue": "34",
    "magenta": "35",
    "cyan": "36",
}


class Style:
    """Wraps text in ANSI codes when colour is enabled."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    @classmethod
    def for_stream(cls, stream: TextIO, force: bool | None = None) -> Style:
        """Colour when ``force`` says so, else when ``stream`` is a TTY and NO_COLOR is unset."""
        if force is not None:
            return cls(force)
        if os.environ.get("NO_COLOR"):
            return cls(False)
        if os.environ.get("FORCE_COLOR"):
            return cls(True)
        isatty = getattr(stream, "isatty", None)
        return cls(bool(isatty and isatty()))

    @property
    def bar(self) -> str:
        """A column separator: a box-drawing bar in colour (a terminal), ``|`` in plain
        text (piped output never holds box-drawing characters)."""
        return "│" if self.enabled else "|"

    def __call__(self, text: str, *styles: str) -> str:
        if not self.enabled or not styles:
            return text
        codes = ";".join(_CODES[s] for s in styles)
        return f"\x1b[{codes}m{text}\x1b[0m"


def default_style() -> Style:
    """The style for standard output."""
    return Style.for_stream(sys.stdout)
