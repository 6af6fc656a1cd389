"""Messages the suites commit: plain text turns and tool rounds (Converse-style dicts)."""

from __future__ import annotations

from typing import Any

from perdure.types import Message

__all__ = ["conversation", "text", "tool_round", "tool_use"]


def text(role: str, value: str) -> Message:
    """One message with one text block."""
    return {"role": role, "content": [{"text": value}]}  # type: ignore[typeddict-item]


def conversation(n: int) -> list[Message]:
    """``n`` alternating user/assistant text messages ``m0``, ``m1``, …"""
    return [text("user" if i % 2 == 0 else "assistant", f"m{i}") for i in range(n)]


def tool_use(tool_input: Any, tool_use_id: str = "t1") -> Message:
    """An assistant message calling the tool ``f`` with ``tool_input``."""
    return {
        "role": "assistant",
        "content": [{"toolUse": {"toolUseId": tool_use_id, "name": "f", "input": tool_input}}],
    }


def tool_round(i: int) -> list[Message]:
    """Four messages: a question, a tool call, its result, an answer."""
    return [
        text("user", f"q{i}"),
        tool_use({}, f"t{i}"),
        {
            "role": "user",
            "content": [
                {
                    "toolResult": {
                        "toolUseId": f"t{i}",
                        "status": "success",
                        "content": [{"text": "r"}],
                    }
                }
            ],
        },
        text("assistant", f"a{i}"),
    ]
