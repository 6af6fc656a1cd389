"""Shape checks for messages and content blocks coming from users or storage."""

from __future__ import annotations

from typing import Any

from perdure.types.json import validate_storable
from perdure.types.messages import CONTENT_BLOCK_KEYS, ContentBlock, Message


def validate_content_block(block: Any, where: str) -> ContentBlock:
    """Check that ``block`` is a content block; return it.

    Raises:
        TypeError: ``block`` is not a dict.
        ValueError: it has no known block key, or a known block is malformed. The
            message starts with ``where`` (e.g. ``"prompt[2]"``).
    """
    if not isinstance(block, dict):
        raise TypeError(f"{where}: a content block must be a dict, got {type(block).__name__}")
    if not CONTENT_BLOCK_KEYS.intersection(block):
        raise ValueError(
            f"{where}: unknown content block with keys {sorted(block)}; "
            f"expected one of {sorted(CONTENT_BLOCK_KEYS)}"
        )
    if "text" in block and not isinstance(block["text"], str):
        raise ValueError(f"{where}: 'text' must be a str, got {type(block['text']).__name__}")
    if "toolUse" in block:
        tool_use = block["toolUse"]
        if (
            not isinstance(tool_use, dict)
            or not isinstance(tool_use.get("toolUseId"), str)
            or not isinstance(tool_use.get("name"), str)
            or "input" not in tool_use
        ):
            raise ValueError(f"{where}: 'toolUse' needs string toolUseId and name, and an input")
    if "toolResult" in block:
        result = block["toolResult"]
        if (
            not isinstance(result, dict)
            or not isinstance(result.get("toolUseId"), str)
            or result.get("status") not in ("success", "error")
            or not isinstance(result.get("content"), list)
        ):
            raise ValueError(
                f"{where}: 'toolResult' needs a string toolUseId, status 'success' or "
                "'error', and a content list"
            )
        for i, inner in enumerate(result["content"]):
            validate_content_block(inner, f"{where}.toolResult.content[{i}]")
    return block  # type: ignore[return-value]


def validate_message(message: Any, where: str) -> Message:
    """Check that ``message`` is a user/assistant message with valid blocks; return it.

    Raises:
        TypeError: ``message`` or its content has the wrong type.
        ValueError: the role is not ``user``/``assistant`` or a block is malformed.
    """
    if not isinstance(message, dict):
        raise TypeError(f"{where}: a message must be a dict, got {type(message).__name__}")
    role = message.get("role")
    if role not in ("user", "assistant"):
        raise ValueError(f"{where}: role must be 'user' or 'assistant', got {role!r}")
    content = message.get("content")
    if not isinstance(content, list):
        raise TypeError(f"{where}: 'content' must be a list, got {type(content).__name__}")
    for i, block in enumerate(content):
        validate_content_block(block, f"{where}.content[{i}]")
    return message  # type: ignore[return-value]


def is_text_only(message: Message) -> bool:
    """True for a validated message of a role and text blocks only.

    Such a message holds no ``bytes``, no dict a user shaped and nothing nested: the
    stores and the agent skip walking it (most messages are text).
    """
    if len(message) != 2:
        return False
    for block in message["content"]:  # noqa: SIM110 (a loop: cheaper than all() here)
        if len(block) != 1 or "text" not in block:
            return False
    return True


def validate_storable_message(message: Any, where: str) -> Message:
    """Check that ``message`` is a message every store can keep and give back equal.

    :func:`validate_message`, then :func:`~perdure.types.json.validate_storable`
    (NaN, infinity, nesting deeper than 200, non-``str`` keys) unless the message is
    text only. The agent runs it before a message enters its history, the stores
    before they write one, so what is stored is what the agent holds.

    Raises:
        TypeError: ``message`` or its content has the wrong type.
        ValueError: a malformed message, or a value that cannot be stored; the
            message names its path (``messages[3].content[0].toolUse.input.x``).
    """
    validate_message(message, where)
    if not is_text_only(message):
        validate_storable(message, where)
    return message  # type: ignore[no-any-return]
