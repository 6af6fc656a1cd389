"""Converse-style messages and content blocks (SPEC §2).

A message is ``{"role": "user" | "assistant", "content": [block, ...]}``; a block is a
dict with exactly one of the keys below. These are ``TypedDict``s because they go on
the wire and to disk as plain JSON-compatible dicts.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypeAlias, TypedDict

Role: TypeAlias = Literal["user", "assistant"]
ToolResultStatus: TypeAlias = Literal["success", "error"]
StopReason: TypeAlias = Literal[
    "end_turn",
    "tool_use",
    "max_tokens",
    "stop_sequence",
    "content_filtered",
    "guardrail_intervened",
    "checkpoint",
    "interrupt",
    "cancelled",
    "max_cycles",
]


class ToolUse(TypedDict):
    """The model asks to run a tool."""

    toolUseId: str
    name: str
    input: Any


class ToolResult(TypedDict):
    """The outcome of one tool call, paired with its ``toolUse`` by ``toolUseId``."""

    toolUseId: str
    status: ToolResultStatus
    content: list[ContentBlock]


class ImageSource(TypedDict):
    bytes: bytes


class Image(TypedDict):
    format: str
    source: ImageSource


class Document(TypedDict):
    format: str
    name: str
    source: ImageSource


class ContentBlock(TypedDict, total=False):
    """One block of a message; exactly one key is set."""

    text: str
    toolUse: ToolUse
    toolResult: ToolResult
    image: Image
    document: Document
    reasoningContent: dict[str, Any]
    json: Any


class Message(TypedDict):
    """One turn of the conversation."""

    role: Role
    content: list[ContentBlock]


class Usage(TypedDict):
    """Token counts of one model call (or summed over an invocation)."""

    inputTokens: int
    outputTokens: int
    totalTokens: int


class ToolSpecInputSchema(TypedDict):
    json: dict[str, Any]


class ToolSpec(TypedDict):
    """What the model is told about a tool: name, description and JSON schema of its input."""

    name: str
    description: str
    inputSchema: ToolSpecInputSchema
    outputSchema: NotRequired[dict[str, Any]]


CONTENT_BLOCK_KEYS: frozenset[str] = frozenset(ContentBlock.__annotations__)
"""The keys a content block may carry."""
