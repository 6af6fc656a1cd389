"""perdure messages ⇄ Anthropic Messages API wire format (pure; no SDK import).

Requests: :func:`to_anthropic_messages` and :func:`to_anthropic_tools` (the system
prompt is a top-level parameter, not a message). Streamed answers:
:class:`AnthropicStreamState` turns the raw stream events (as dicts) into perdure
stream events and the final :class:`~perdure.models.ModelResponse`.
:func:`from_anthropic_messages` reads a Messages API history back.

The Messages API is stricter than perdure's history, so the request mapping
normalises (on copies; the input is never mutated):

- roles must alternate: consecutive messages of one role are merged (a failed model
  call leaves the user's prompt in the history, and the next prompt follows it);
- in a user turn, ``tool_result`` blocks come first: they are moved ahead of text;
- empty text blocks (and whitespace-only assistant text) are refused by the API and
  dropped; a message left empty is dropped, and its neighbours merge;
- a tool input that is not a JSON object (raw text kept from a call cut off by
  ``max_tokens``) is sent as ``{}``;
- ``reasoningContent`` with a signature goes back as a ``thinking`` block (with
  ``redactedContent``: ``redacted_thinking``), as extended thinking requires; without
  one it is dropped.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from perdure.errors import ModelConnectionError
from perdure.models._content import (
    b64,
    block_as_text,
    document_text,
    image_format,
    image_media_type,
    parse_tool_input,
    source_bytes,
)
from perdure.models.stream import (
    ModelResponse,
    ModelStreamEvent,
    ReasoningDelta,
    TextDelta,
    ToolUseDelta,
)
from perdure.types import ContentBlock, Message, StopReason, ToolSpec, Usage

_STOP_REASONS: dict[str, StopReason] = {
    "end_turn": "end_turn",
    "tool_use": "tool_use",
    "max_tokens": "max_tokens",
    "stop_sequence": "stop_sequence",
    "pause_turn": "end_turn",
    "refusal": "content_filtered",
    "model_context_window_exceeded": "max_tokens",
}


def anthropic_stop_reason(stop_reason: str | None, *, has_tool_calls: bool) -> StopReason:
    """perdure's stop reason for an Anthropic ``stop_reason``.

    ``end_turn``, ``tool_use``, ``max_tokens`` and ``stop_sequence`` keep their
    names; ``refusal`` → ``content_filtered``; ``model_context_window_exceeded`` →
    ``max_tokens`` (the answer was cut off); ``pause_turn`` → ``end_turn``.
    """
    if stop_reason is None:
        return "tool_use" if has_tool_calls else "end_turn"
    return _STOP_REASONS.get(stop_reason, "end_turn")


# --------------------------------------------------------------------- requests


def to_anthropic_tools(tool_specs: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """Anthropic ``tools`` entries (``name``, ``description``, ``input_schema``)."""
    return [
        {
            "name": spec["name"],
            "description": spec.get("description", ""),
            "input_schema": spec["inputSchema"]["json"],
        }
        for spec in tool_specs
    ]


def to_anthropic_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """The Messages API ``messages`` for a perdure history (see the module docstring).

    Raises:
        ValueError: a block the API cannot carry (an unknown image format, an image in
            an assistant message, …); the message names where it is.
        TypeError: an image or document without bytes.
    """
    wire: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        role = message["role"]
        if role == "assistant":
            blocks = _assistant_blocks(message["content"], where)
        else:
            blocks = _user_blocks(message["content"], where)
        if not blocks:
            continue
        if wire and wire[-1]["role"] == role:
            wire[-1]["content"].extend(blocks)
        else:
            wire.append({"role": role, "content": blocks})
    for item in wire:
        if item["role"] == "user":
            # tool_result blocks must open the user turn (stable: call order is kept)
            item["content"].sort(key=lambda block: block["type"] != "tool_result")
    return wire


def _assistant_blocks(blocks: Sequence[ContentBlock], where: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        if "text" in block:
            if block["text"].strip():
                out.append({"type": "text", "text": block["text"]})
        elif "toolUse" in block:
            tool_use = block["toolUse"]
            value = tool_use["input"]
            out.append(
                {
                    "type": "tool_use",
                    "id": tool_use["toolUseId"],
                    "name": tool_use["name"],
                    "input": dict(value) if isinstance(value, Mapping) else {},
                }
            )
        elif "reasoningContent" in block:
            thinking = _thinking_block(block["reasoningContent"])
            if thinking is not None:
                out.append(thinking)
        else:
            raise ValueError(
                f"{where}.content[{j}]: an assistant message can carry text, toolUse and "
                f"reasoningContent blocks to Anthropic, not {sorted(block)}"
            )
    return out


def _thinking_block(reasoning: Any) -> dict[str, Any] | None:
    if not isinstance(reasoning, Mapping):
        return None
    redacted = reasoning.get("redactedContent")
    if isinstance(redacted, bytes | bytearray):
        redacted = bytes(redacted).decode("ascii")
    if isinstance(redacted, str) and redacted:
        return {"type": "redacted_thinking", "data": redacted}
    text = reasoning.get("reasoningText")
    if isinstance(text, Mapping) and text.get("signature"):
        return {
            "type": "thinking",
            "thinking": str(text.get("text", "")),
            "signature": str(text["signature"]),
        }
    return None


def _user_blocks(blocks: Sequence[ContentBlock], where: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        if "toolResult" in block:
            result = block["toolResult"]
            inner = [
                part
                for k, item in enumerate(result["content"])
                if (part := _content_block(item, f"{at}.toolResult.content[{k}]")) is not None
            ]
            wire: dict[str, Any] = {"type": "tool_result", "tool_use_id": result["toolUseId"]}
            if inner:
                wire["content"] = inner
            if result["status"] == "error":
                wire["is_error"] = True
            out.append(wire)
        else:
            part = _content_block(block, at)
            if part is not None:
                out.append(part)
    return out


def _content_block(block: ContentBlock, where: str) -> dict[str, Any] | None:
    text = block_as_text(block)
    if text is not None:
        return {"type": "text", "text": text} if text else None
    if "image" in block:
        image = block["image"]
        return {
            "type": "image",
            "source": {
                "type": "base64",
                "media_type": image_media_type(image, where),
                "data": b64(source_bytes(image, where)),
            },
        }
    if "document" in block:
        document = block["document"]
        if str(document.get("format", "")).lower() == "pdf":
            source = {
                "type": "base64",
                "media_type": "application/pdf",
                "data": b64(source_bytes(document, where)),
            }
            name = document.get("name")
        else:
            name, body = document_text(document, where)
            source = {"type": "text", "media_type": "text/plain", "data": body}
        wire: dict[str, Any] = {"type": "document", "source": source}
        if name:
            wire["title"] = str(name)
        return wire
    raise ValueError(f"{where}: Anthropic cannot carry a {sorted(block)} block in a user message")


# --------------------------------------------------------------- reverse mapping


def from_anthropic_messages(
    wire: Sequence[Mapping[str, Any]], system: str | Sequence[Mapping[str, Any]] | None = None
) -> tuple[list[Message], str | None]:
    """A perdure history and system prompt from Messages API ``messages`` and ``system``.

    The inverse of :func:`to_anthropic_messages` (up to its normalisation: merged
    turns stay merged, dropped empty text stays dropped).

    Raises:
        ValueError: a block this mapping cannot read (an image by URL, an unknown type).
    """
    messages: list[Message] = []
    for i, item in enumerate(wire):
        role = item.get("role")
        if role not in ("user", "assistant"):
            raise ValueError(f"wire[{i}]: unknown role {role!r}")
        content = item.get("content")
        if isinstance(content, str):
            blocks: list[ContentBlock] = [{"text": content}]
        else:
            blocks = [
                _from_wire_block(part, f"wire[{i}].content[{k}]")
                for k, part in enumerate(content or ())
            ]
        messages.append({"role": role, "content": blocks})
    if system is None or isinstance(system, str):
        return messages, system
    return messages, "\n\n".join(str(part.get("text", "")) for part in system)


def _from_wire_block(part: Mapping[str, Any], where: str) -> ContentBlock:
    kind = part.get("type")
    if kind == "text":
        return {"text": str(part.get("text", ""))}
    if kind == "tool_use":
        return {
            "toolUse": {
                "toolUseId": str(part.get("id")),
                "name": str(part.get("name")),
                "input": part.get("input", {}),
            }
        }
    if kind == "tool_result":
        content = part.get("content")
        inner: list[ContentBlock]
        if content is None:
            inner = []
        elif isinstance(content, str):
            inner = [{"text": content}]
        else:
            inner = [_from_wire_block(p, f"{where}.content[{k}]") for k, p in enumerate(content)]
        return {
            "toolResult": {
                "toolUseId": str(part.get("tool_use_id")),
                "status": "error" if part.get("is_error") else "success",
                "content": inner,
            }
        }
    if kind in ("image", "document"):
        source = part.get("source") or {}
        media = str(source.get("media_type", ""))
        if source.get("type") == "text":
            data = str(source.get("data", "")).encode("utf-8")
            name = str(part.get("title") or "document")
            return {"document": {"format": "txt", "name": name, "source": {"bytes": data}}}
        if source.get("type") != "base64":
            raise ValueError(f"{where}: only base64 {kind} sources can become perdure blocks")
        try:
            data = base64.b64decode(str(source.get("data", "")), validate=True)
        except binascii.Error as exc:
            raise ValueError(f"{where}: bad base64 data: {exc}") from exc
        if kind == "image":
            return {"image": {"format": image_format(media), "source": {"bytes": data}}}
        name = str(part.get("title") or "document")
        return {"document": {"format": "pdf", "name": name, "source": {"bytes": data}}}
    if kind == "thinking":
        return {
            "reasoningContent": {
                "reasoningText": {
                    "text": str(part.get("thinking", "")),
                    "signature": str(part.get("signature", "")),
                }
            }
        }
    if kind == "redacted_thinking":
        return {"reasoningContent": {"redactedContent": str(part.get("data", ""))}}
    raise ValueError(f"{where}: unsupported Anthropic block type {kind!r}")


# --------------------------------------------------------------------- streaming


@dataclass
class _Block:
    kind: str
    parts: list[str] = field(default_factory=list)
    tool_use_id: str = ""
    name: str = ""
    signature: str = ""
    data: str = ""


class AnthropicStreamState:
    """Assembles one streamed Messages API response into perdure events.

    Feed each raw stream event (``message_start``, ``content_block_start``,
    ``content_block_delta`` with ``text_delta`` / ``input_json_delta`` /
    ``thinking_delta`` / ``signature_delta``, ``content_block_stop``,
    ``message_delta``, ``message_stop``; as dicts) to :meth:`feed`, which returns the
    events to yield now; :meth:`finish` returns the final response. Input tokens
    count cache reads and writes too (the context the model saw); output tokens are
    the cumulative count of the last ``message_delta``. Block types perdure does not
    model (server tools, citations) are skipped.
    """

    def __init__(self) -> None:
        self.blocks: dict[int, _Block] = {}
        self.stop_reason: str | None = None
        self.finished = False
        self.input_tokens = 0
        self.output_tokens = 0

    def feed(self, event: Mapping[str, Any]) -> list[ModelStreamEvent]:
        """Take one stream event; return the deltas it carries."""
        kind = event.get("type")
        if kind == "message_start":
            message = event.get("message") or {}
            self._usage(message.get("usage") or {})
        elif kind == "content_block_start":
            return self._start(int(event.get("index", 0)), event.get("content_block") or {})
        elif kind == "content_block_delta":
            block = self.blocks.get(int(event.get("index", 0)))
            if block is not None:
                return self._delta(block, event.get("delta") or {})
        elif kind == "message_delta":
            delta = event.get("delta") or {}
            if delta.get("stop_reason"):
                self.stop_reason = str(delta["stop_reason"])
            self._usage(event.get("usage") or {})
        elif kind == "message_stop":
            self.finished = True
        return []

    def _usage(self, usage: Mapping[str, Any]) -> None:
        # Anthropic reports running totals: a later count replaces the earlier one.
        keys = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
        if any(usage.get(key) is not None for key in keys):
            self.input_tokens = sum(int(usage.get(key) or 0) for key in keys)
        if usage.get("output_tokens") is not None:
            self.output_tokens = int(usage["output_tokens"])

    def _start(self, index: int, wire: Mapping[str, Any]) -> list[ModelStreamEvent]:
        kind = str(wire.get("type"))
        if kind == "text":
            block = self.blocks[index] = _Block("text")
            text = str(wire.get("text") or "")
            if text:
                block.parts.append(text)
                return [TextDelta(text)]
        elif kind == "tool_use":
            block = _Block("tool_use", tool_use_id=str(wire.get("id")), name=str(wire.get("name")))
            self.blocks[index] = block
            return [ToolUseDelta(block.tool_use_id, block.name, "")]
        elif kind == "thinking":
            block = self.blocks[index] = _Block("thinking")
            text = str(wire.get("thinking") or "")
            if text:
                block.parts.append(text)
                return [ReasoningDelta(text)]
        elif kind == "redacted_thinking":
            self.blocks[index] = _Block("redacted_thinking", data=str(wire.get("data", "")))
        return []

    @staticmethod
    def _delta(block: _Block, delta: Mapping[str, Any]) -> list[ModelStreamEvent]:
        kind = delta.get("type")
        if kind == "text_delta" and block.kind == "text":
            text = str(delta.get("text", ""))
            block.parts.append(text)
            return [TextDelta(text)] if text else []
        if kind == "input_json_delta" and block.kind == "tool_use":
            fragment = str(delta.get("partial_json", ""))
            block.parts.append(fragment)
            return [ToolUseDelta(block.tool_use_id, block.name, fragment)] if fragment else []
        if kind == "thinking_delta" and block.kind == "thinking":
            text = str(delta.get("thinking", ""))
            block.parts.append(text)
            return [ReasoningDelta(text)] if text else []
        if kind == "signature_delta" and block.kind == "thinking":
            block.signature += str(delta.get("signature", ""))
        return []

    def finish(self) -> ModelResponse:
        """The assembled message, stop reason and usage.

        Raises:
            ModelConnectionError: the stream ended without ``message_stop`` (cut short).
        """
        if not self.finished:
            raise ModelConnectionError(
                "anthropic stream ended before message_stop: the connection was cut or "
                "the server broke off"
            )
        content: list[ContentBlock] = []
        for index in sorted(self.blocks):
            block = self.blocks[index]
            joined = "".join(block.parts)
            if block.kind == "text" and joined:
                content.append({"text": joined})
            elif block.kind == "tool_use":
                content.append(
                    {
                        "toolUse": {
                            "toolUseId": block.tool_use_id,
                            "name": block.name,
                            "input": parse_tool_input(joined),
                        }
                    }
                )
            elif block.kind == "thinking":
                reasoning: dict[str, Any] = {"text": joined}
                if block.signature:
                    reasoning["signature"] = block.signature
                content.append({"reasoningContent": {"reasoningText": reasoning}})
            elif block.kind == "redacted_thinking":
                content.append({"reasoningContent": {"redactedContent": block.data}})
        has_calls = any("toolUse" in block for block in content)
        usage: Usage = {
            "inputTokens": self.input_tokens,
            "outputTokens": self.output_tokens,
            "totalTokens": self.input_tokens + self.output_tokens,
        }
        return ModelResponse(
            message={"role": "assistant", "content": content},
            stop_reason=anthropic_stop_reason(self.stop_reason, has_tool_calls=has_calls),
            usage=usage,
        )
