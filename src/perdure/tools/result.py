"""Turn whatever a tool returned into a ``ToolResult``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, cast

from perdure.types import CONTENT_BLOCK_KEYS, ContentBlock, ToolResult

_TOOL_RESULT_KEYS = frozenset({"toolUseId", "status", "content"})


def to_tool_result(tool_use_id: str, value: object) -> ToolResult:
    """Normalise a tool's Python return value into a ``ToolResult`` for ``tool_use_id``.

    The rules, first match wins:

    - a ``str`` becomes one text block, verbatim;
    - a dict that already is a tool result (its keys are among ``toolUseId``,
      ``status``, ``content``; ``status`` is ``"success"`` or ``"error"``; ``content``
      is a list of content blocks) is kept — copied, with ``toolUseId`` forced to
      ``tool_use_id``;
    - a non-empty list of content blocks (dicts with exactly one key of
      ``CONTENT_BLOCK_KEYS``; a ``text`` block's value must be a str) is the content;
    - any other JSON-serializable value, ``None`` included (→ ``"null"``, because
      providers reject empty text blocks), becomes one text block holding
      ``json.dumps(value, ensure_ascii=False)``;
    - anything else becomes one text block holding ``repr(value)``.

    Every rule but the ToolResult one gives status ``"success"``. The input is never
    mutated and the result shares no list with it.

    Raises:
        TypeError: ``tool_use_id`` is not a string.
    """
    if not isinstance(tool_use_id, str):
        raise TypeError(f"tool_use_id must be a str, got {type(tool_use_id).__name__}")
    if isinstance(value, str):
        return _success(tool_use_id, [{"text": value}])
    if _looks_like_tool_result(value):
        result = cast(Mapping[str, Any], value)
        return {
            "toolUseId": tool_use_id,
            "status": result["status"],
            "content": list(result["content"]),
        }
    if isinstance(value, list) and value and all(_is_content_block(b) for b in value):
        return _success(tool_use_id, cast(list[ContentBlock], list(value)))
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        text = repr(value)
    return _success(tool_use_id, [{"text": text}])


def error_result(tool_use_id: str, message: str) -> ToolResult:
    """Build a ``ToolResult`` with status ``"error"`` and ``message`` as its only text block."""
    return {"toolUseId": tool_use_id, "status": "error", "content": [{"text": message}]}


def _success(tool_use_id: str, content: list[ContentBlock]) -> ToolResult:
    return {"toolUseId": tool_use_id, "status": "success", "content": content}


def _looks_like_tool_result(value: object) -> bool:
    if not isinstance(value, dict) or not _TOOL_RESULT_KEYS.issuperset(value):
        return False
    content = value.get("content")
    return (
        value.get("status") in ("success", "error")
        and isinstance(content, list)
        and all(_is_content_block(b) for b in content)
    )


def _is_content_block(block: object) -> bool:
    if not isinstance(block, dict) or len(block) != 1:
        return False
    ((key, inner),) = block.items()
    if key not in CONTENT_BLOCK_KEYS:
        return False
    return key != "text" or isinstance(inner, str)
