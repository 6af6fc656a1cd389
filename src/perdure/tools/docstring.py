"""Read a tool's description and its parameters' descriptions out of a docstring."""

from __future__ import annotations

import inspect
import re
from typing import NamedTuple

__all__ = ["Docstring", "parse_docstring"]

_PARAM_SECTIONS = frozenset(
    {
        "args",
        "arguments",
        "parameters",
        "params",
        "keyword args",
        "keyword arguments",
        "other parameters",
    }
)
_GOOGLE_SECTIONS = _PARAM_SECTIONS | {
    "attention",
    "caution",
    "danger",
    "example",
    "examples",
    "except",
    "exceptions",
    "hint",
    "important",
    "methods",
    "note",
    "notes",
    "raise",
    "raises",
    "references",
    "return",
    "returns",
    "see also",
    "tip",
    "todo",
    "warning",
    "warnings",
    "warns",
    "yield",
    "yields",
}
_GOOGLE_HEADER = re.compile(r"^(?P<title>[A-Za-z][A-Za-z ]*?)\s*:\s*$")
_NUMPY_UNDERLINE = re.compile(r"^\s*-{3,}\s*$")
_NAME = r"\*{0,2}(?P<name>[A-Za-z_]\w*)"
# ``name (type): text`` or ``name: text``; the type is matched lazily so that a
# colon in the text does not end up inside it.
_GOOGLE_ITEM = re.compile(rf"^{_NAME}\s*(?:\((?P<type>.*?)\))?\s*:(?:\s*(?P<text>.*))?$")
# ``name : type``, ``name``, or ``x, y : type``.
_NUMPY_ITEM = re.compile(
    r"^(?P<names>\*{0,2}[A-Za-z_]\w*(?:\s*,\s*\*{0,2}[A-Za-z_]\w*)*)\s*(?::.*)?$"
)


class Docstring(NamedTuple):
    """What a docstring says: the description, and a description per parameter."""

    description: str
    params: dict[str, str]


class _Section(NamedTuple):
    header: int  # index of the header's first line
    body: int  # index of the first body line
    title: str  # lower-cased
    numpy: bool


def parse_docstring(doc: str | None) -> Docstring:
    """Split a Google- or NumPy-style docstring into its description and parameter docs.

    The description is all text before the first section header, stripped, with its
    line breaks and paragraphs kept. Parameters come from ``Args:``/``Arguments:``/
    ``Parameters:`` (Google: ``name (type): text`` or ``name: text``, continuation
    lines indented) or from a ``Parameters`` section underlined with dashes (NumPy:
    ``name : type`` then the indented text). Continuation lines are joined with a
    space; a blank line inside a parameter's text starts a new paragraph. Every other
    section (Returns, Raises, Examples, …) is ignored. ``*args``/``**kwargs`` are
    recorded without their stars.
    """
    if not doc or not doc.strip():
        return Docstring("", {})
    lines = inspect.cleandoc(doc).splitlines()
    sections = _find_sections(lines)
    end = sections[0].header if sections else len(lines)
    description = "\n".join(line.rstrip() for line in lines[:end]).strip()
    params: dict[str, str] = {}
    for index, section in enumerate(sections):
        if section.title not in _PARAM_SECTIONS:
            continue
        stop = sections[index + 1].header if index + 1 < len(sections) else len(lines)
        body = lines[section.body : stop]
        params.update(_numpy_params(body) if section.numpy else _google_params(body))
    return Docstring(description, params)


def _find_sections(lines: list[str]) -> list[_Section]:
    sections: list[_Section] = []
    for index, line in enumerate(lines):
        if not line.strip() or line[0].isspace() or _NUMPY_UNDERLINE.match(line):
            continue
        following = lines[index + 1] if index + 1 < len(lines) else ""
        if _NUMPY_UNDERLINE.match(following):
            title = line.strip().rstrip(":").strip().lower()
            sections.append(_Section(index, index + 2, title, numpy=True))
            continue
        match = _GOOGLE_HEADER.match(line)
        if match and match["title"].lower() in _GOOGLE_SECTIONS:
            sections.append(_Section(index, index + 1, match["title"].lower(), numpy=False))
    return sections


def _google_params(body: list[str]) -> dict[str, str]:
    texts: dict[str, list[str]] = {}
    current: str | None = None
    item_indent: int | None = None
    for line in body:
        if not line.strip():
            if current is not None:
                texts[current].append("")
            continue
        indent = len(line) - len(line.lstrip())
        if indent == 0:
            break  # back at the margin: the section is over
        if item_indent is None:
            item_indent = indent
        match = _GOOGLE_ITEM.match(line.strip()) if indent <= item_indent else None
        if match:
            current = match["name"]
            texts[current] = [match["text"] or ""]
        elif current is not None:
            texts[current].append(line.strip())
    return {name: _paragraphs(text) for name, text in texts.items()}


def _numpy_params(body: list[str]) -> dict[str, str]:
    texts: dict[tuple[str, ...], list[str]] = {}
    current: tuple[str, ...] | None = None
    for line in body:
        if not line.strip():
            if current is not None:
                texts[current].append("")
            continue
        if not line[0].isspace():
            match = _NUMPY_ITEM.match(line.strip())
            current = (
                tuple(name.strip().lstrip("*") for name in match["names"].split(","))
                if match
                else None
            )
            if current is not None:
                texts[current] = []
        elif current is not None:
            texts[current].append(line.strip())
    return {name: _paragraphs(text) for names, text in texts.items() for name in names}


def _paragraphs(lines: list[str]) -> str:
    """Join wrapped lines with spaces; blank lines separate paragraphs."""
    paragraphs: list[list[str]] = [[]]
    for line in lines:
        if line:
            paragraphs[-1].append(line)
        elif paragraphs[-1]:
            paragraphs.append([])
    return "\n\n".join(" ".join(p) for p in paragraphs if p)
