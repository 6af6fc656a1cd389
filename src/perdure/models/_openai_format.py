"""perdure messages ⇄ OpenAI Chat Completions wire format (pure; no SDK import).

Requests: :func:`to_openai_messages` and :func:`to_openai_tools`. Streamed answers:
:class:`OpenAIStreamState` turns ``chat.completion.chunk`` objects (as dicts) into
perdure stream events and the final :class:`~perdure.models.ModelResponse`. The
reverse of the request mapping, :func:`from_openai_messages`, reads a Chat
Completions history back into perdure messages.

Where the formats differ:

- A user message's ``toolResult`` blocks become ``role: "tool"`` messages, sent
  before the rest of that user message (OpenAI wants them right after the assistant
  message that asked). A tool message holds text only: its text blocks are joined
  with blank lines, and images or documents a tool returned follow in a user
  message that says which call they came from.
- OpenAI has no error flag on tool results: an error result's text starts with
  :data:`TOOL_ERROR_PREFIX`, which :func:`from_openai_messages` reads back.
- Images travel as ``data:`` URLs; PDF documents as ``file`` parts; text documents
  (txt, md, csv, html, json, xml) as text parts.
- ``reasoningContent`` blocks are not sent back (Chat Completions takes none).
"""

from __future__ import annotations

import base64
import binascii
import uuid
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
    tool_input_json,
)
from perdure.models.stream import (
    ModelResponse,
    ModelStreamEvent,
    ReasoningDelta,
    TextDelta,
    ToolUseDelta,
)
from perdure.types import ContentBlock, Message, StopReason, ToolSpec, Usage

TOOL_ERROR_PREFIX = "[tool error] "
"""Starts the content of a tool message whose perdure result had status ``error``."""

_FINISH_REASONS: dict[str, StopReason] = {
    "stop": "end_turn",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "length": "max_tokens",
    "content_filter": "content_filtered",
}


def openai_stop_reason(finish_reason: str | None, *, has_tool_calls: bool) -> StopReason:
    """perdure's stop reason for an OpenAI ``finish_reason``.

    ``stop``→``end_turn``, ``tool_calls``→``tool_use``, ``length``→``max_tokens``,
    ``content_filter``→``content_filtered``. Some OpenAI-compatible servers (Ollama,
    older vLLM) say ``stop`` beside tool calls: a message with calls that was not
    cut off is a ``tool_use`` turn whatever the server said.
    """
    reason = _FINISH_REASONS.get(finish_reason or "", "end_turn")
    if has_tool_calls and reason == "end_turn":
        return "tool_use"
    return reason


# --------------------------------------------------------------------- requests


def to_openai_tools(tool_specs: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """OpenAI ``tools`` entries (``{"type": "function", "function": {...}}``) for perdure specs."""
    return [
        {
            "type": "function",
            "function": {
                "name": spec["name"],
                "description": spec.get("description", ""),
                "parameters": spec["inputSchema"]["json"],
            },
        }
        for spec in tool_specs
    ]


def to_openai_messages(
    messages: Sequence[Message], system_prompt: str | None = None
) -> list[dict[str, Any]]:
    """The Chat Completions ``messages`` for a perdure history (the input is not mutated).

    Raises:
        ValueError: a block the format cannot carry (an unknown image format, an
            image in an assistant message, …); the message names where it is.
        TypeError: an image or document without bytes.
    """
    wire: list[dict[str, Any]] = []
    if system_prompt:
        wire.append({"role": "system", "content": system_prompt})
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if message["role"] == "assistant":
            wire.append(_assistant_to_openai(message["content"], where))
        else:
            wire.extend(_user_to_openai(message["content"], where))
    return wire


def _assistant_to_openai(blocks: Sequence[ContentBlock], where: str) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        if "text" in block:
            texts.append(block["text"])
        elif "toolUse" in block:
            tool_use = block["toolUse"]
            calls.append(
                {
                    "id": tool_use["toolUseId"],
                    "type": "function",
                    "function": {
                        "name": tool_use["name"],
                        "arguments": tool_input_json(tool_use["input"]),
                    },
                }
            )
        elif "reasoningContent" in block:
            continue  # Chat Completions takes no reasoning back
        else:
            raise ValueError(
                f"{where}.content[{j}]: an assistant message can carry text and toolUse "
                f"blocks to OpenAI, not {sorted(block)}"
            )
    out: dict[str, Any] = {"role": "assistant"}
    if len(texts) == 1:
        out["content"] = texts[0]
    elif texts:
        out["content"] = [{"type": "text", "text": text} for text in texts]
    else:
        out["content"] = None if calls else ""
    if calls:
        out["tool_calls"] = calls
    return out


def _user_to_openai(blocks: Sequence[ContentBlock], where: str) -> list[dict[str, Any]]:
    tool_messages: list[dict[str, Any]] = []
    tool_attachments: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        if "toolResult" in block:
            result = block["toolResult"]
            texts: list[str] = []
            attachments: list[dict[str, Any]] = []
            for k, inner in enumerate(result["content"]):
                text = block_as_text(inner)
                if text is not None:
                    texts.append(text)
                else:
                    attachments.append(_part(inner, f"{at}.toolResult.content[{k}]"))
            content = "\n\n".join(texts)
            if result["status"] == "error":
                content = TOOL_ERROR_PREFIX + content
            tool_messages.append(
                {"role": "tool", "tool_call_id": result["toolUseId"], "content": content}
            )
            if attachments:
                tool_attachments.append(
                    {
                        "type": "text",
                        "text": f"Attachments returned by tool call {result['toolUseId']}:",
                    }
                )
                tool_attachments.extend(attachments)
        else:
            parts.append(_part(block, at))
    out = list(tool_messages)
    if tool_attachments:
        out.append({"role": "user", "content": tool_attachments})
    if parts:
        if len(parts) == 1 and parts[0]["type"] == "text":
            out.append({"role": "user", "content": parts[0]["text"]})
        else:
            out.append({"role": "user", "content": parts})
    elif not tool_messages:
        out.append({"role": "user", "content": ""})
    return out


def _part(block: ContentBlock, where: str) -> dict[str, Any]:
    text = block_as_text(block)
    if text is not None:
        return {"type": "text", "text": text}
    if "image" in block:
        image = block["image"]
        media = image_media_type(image, where)
        url = f"data:{media};base64,{b64(source_bytes(image, where))}"
        return {"type": "image_url", "image_url": {"url": url}}
    if "document" in block:
        document = block["document"]
        if str(document.get("format", "")).lower() == "pdf":
            data = b64(source_bytes(document, where))
            return {
                "type": "file",
                "file": {
                    "filename": f"{document.get('name') or 'document'}.pdf",
                    "file_data": f"data:application/pdf;base64,{data}",
                },
            }
        name, body = document_text(document, where)
        return {"type": "text", "text": f"[document: {name}]\n{body}"}
    raise ValueError(f"{where}: OpenAI cannot carry a {sorted(block)} block in a user message")


# --------------------------------------------------------------- reverse mapping


def from_openai_messages(wire: Sequence[Mapping[str, Any]]) -> tuple[list[Message], str | None]:
    """A perdure history and system prompt from Chat Completions ``messages``.

    The inverse of :func:`to_openai_messages`: tool messages (and a user message
    right after them) fold back into one user message of ``toolResult`` blocks; a
    content starting with :data:`TOOL_ERROR_PREFIX` becomes status ``error``;
    ``data:`` URL images become image blocks with bytes. ``system``/``developer``
    messages make the system prompt (joined by blank lines).

    Raises:
        ValueError: a message this mapping cannot read (an unknown role, an image
            given by http URL — perdure images hold bytes).
    """
    messages: list[Message] = []
    system: list[str] = []
    after_tools = False
    for i, item in enumerate(wire):
        role = item.get("role")
        where = f"wire[{i}]"
        if role in ("system", "developer"):
            system.extend(_wire_texts(item.get("content"), where))
            after_tools = False
        elif role == "assistant":
            content: list[ContentBlock] = [
                {"text": text} for text in _wire_texts(item.get("content"), where)
            ]
            for call in item.get("tool_calls") or ():
                function = call.get("function") or {}
                content.append(
                    {
                        "toolUse": {
                            "toolUseId": str(call.get("id")),
                            "name": str(function.get("name")),
                            "input": parse_tool_input(str(function.get("arguments") or "")),
                        }
                    }
                )
            messages.append({"role": "assistant", "content": content})
            after_tools = False
        elif role == "tool":
            text = "".join(_wire_texts(item.get("content"), where))
            status: Any = "success"
            if text.startswith(TOOL_ERROR_PREFIX):
                status, text = "error", text[len(TOOL_ERROR_PREFIX) :]
            block: ContentBlock = {
                "toolResult": {
                    "toolUseId": str(item.get("tool_call_id")),
                    "status": status,
                    "content": [{"text": text}] if text else [],
                }
            }
            if after_tools:
                messages[-1]["content"].append(block)
            else:
                messages.append({"role": "user", "content": [block]})
            after_tools = True
        elif role == "user":
            blocks = _wire_user_blocks(item.get("content"), where)
            if after_tools:
                messages[-1]["content"].extend(blocks)
            else:
                messages.append({"role": "user", "content": blocks})
            after_tools = False
        else:
            raise ValueError(f"{where}: unknown role {role!r}")
    return messages, ("\n\n".join(system) if system else None)


def _wire_texts(content: Any, where: str) -> list[str]:
    if content is None:
        return []
    if isinstance(content, str):
        return [content]
    texts = []
    for part in content:
        if part.get("type") not in ("text", "refusal"):
            raise ValueError(f"{where}: expected text parts, got {part.get('type')!r}")
        texts.append(str(part.get("text", part.get("refusal", ""))))
    return texts


def _wire_user_blocks(content: Any, where: str) -> list[ContentBlock]:
    if isinstance(content, str):
        return [{"text": content}]
    blocks: list[ContentBlock] = []
    for k, part in enumerate(content or ()):
        kind = part.get("type")
        if kind == "text":
            blocks.append({"text": str(part.get("text", ""))})
        elif kind == "image_url":
            media, data = _decode_data_url(str(part["image_url"]["url"]), f"{where}[{k}]")
            blocks.append({"image": {"format": image_format(media), "source": {"bytes": data}}})
        elif kind == "file":
            file = part.get("file") or {}
            _, data = _decode_data_url(str(file.get("file_data", "")), f"{where}[{k}]")
            name = str(file.get("filename") or "document").removesuffix(".pdf")
            blocks.append({"document": {"format": "pdf", "name": name, "source": {"bytes": data}}})
        else:
            raise ValueError(f"{where}[{k}]: unsupported user content part {kind!r}")
    return blocks


def _decode_data_url(url: str, where: str) -> tuple[str, bytes]:
    head, sep, payload = url.partition(",")
    if not url.startswith("data:") or not sep or not head.endswith(";base64"):
        raise ValueError(
            f"{where}: only base64 data: URLs can become perdure blocks, got {url[:40]!r}"
        )
    try:
        return head[len("data:") : -len(";base64")], base64.b64decode(payload, validate=True)
    except binascii.Error as exc:
        raise ValueError(f"{where}: bad base64 in data URL: {exc}") from exc


# --------------------------------------------------------------------- streaming


@dataclass
class _ToolCall:
    tool_use_id: str
    name: str
    arguments: list[str] = field(default_factory=list)


class OpenAIStreamState:
    """Assembles one streamed Chat Completion into perdure events.

    Feed each ``chat.completion.chunk`` (as a dict) to :meth:`feed`, which returns
    the events to yield now; :meth:`finish` returns the final response. Only
    choice 0 is read. Tool calls are assembled by their ``index`` (parallel calls
    interleave; arguments arrive in fragments); a call without an ``id`` gets a
    generated one. Reasoning arrives as ``reasoning_content`` (vLLM, llama.cpp,
    DeepSeek) or ``reasoning`` (Ollama, OpenRouter). Usage comes from whichever
    chunk carries it (with ``stream_options.include_usage``, a last chunk with no
    choices).
    """

    def __init__(self) -> None:
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, _ToolCall] = {}
        self.finish_reason: str | None = None
        self.finished = False
        self.usage: Usage | None = None

    def feed(self, chunk: Mapping[str, Any]) -> list[ModelStreamEvent]:
        """Take one chunk; return the deltas it carries."""
        events: list[ModelStreamEvent] = []
        usage = chunk.get("usage")
        if isinstance(usage, Mapping):
            self.usage = _usage(usage)
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            for key in ("reasoning_content", "reasoning"):
                piece = delta.get(key)
                if isinstance(piece, str) and piece:
                    self.reasoning.append(piece)
                    events.append(ReasoningDelta(piece))
            for key in ("content", "refusal"):
                piece = delta.get(key)
                if isinstance(piece, str) and piece:
                    self.text.append(piece)
                    events.append(TextDelta(piece))
            for position, fragment in enumerate(delta.get("tool_calls") or ()):
                events.append(self._tool_fragment(position, fragment))
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])
                self.finished = True
        return events

    def _tool_fragment(self, position: int, fragment: Mapping[str, Any]) -> ToolUseDelta:
        index = fragment.get("index")
        if not isinstance(index, int):
            index = position
        function = fragment.get("function") or {}
        call_id = fragment.get("id")
        call = self.calls.get(index)
        if call is not None and call_id and call_id != call.tool_use_id and call.arguments:
            # A server that reuses one index for a second call: give it its own slot.
            index = max(self.calls) + 1
            call = None
        if call is None:
            call = _ToolCall(str(call_id or f"call_{uuid.uuid4().hex[:24]}"), "")
            self.calls[index] = call
        if function.get("name") and not call.name:
            call.name = str(function["name"])
        piece = str(function.get("arguments") or "")
        if piece:
            call.arguments.append(piece)
        return ToolUseDelta(call.tool_use_id, call.name, piece)

    def finish(self) -> ModelResponse:
        """The assembled message, stop reason and usage.

        Raises:
            ModelConnectionError: no chunk carried a ``finish_reason`` (the stream
                was cut short).
        """
        if not self.finished:
            raise ModelConnectionError(
                "openai stream ended before the model finished (no finish_reason): "
                "the connection was cut or the server broke off"
            )
        content: list[ContentBlock] = []
        if self.reasoning:
            content.append(
                {"reasoningContent": {"reasoningText": {"text": "".join(self.reasoning)}}}
            )
        text = "".join(self.text)
        if text:
            content.append({"text": text})
        for index in sorted(self.calls):
            call = self.calls[index]
            content.append(
                {
                    "toolUse": {
                        "toolUseId": call.tool_use_id,
                        "name": call.name,
                        "input": parse_tool_input("".join(call.arguments)),
                    }
                }
            )
        stop = openai_stop_reason(self.finish_reason, has_tool_calls=bool(self.calls))
        return ModelResponse(
            message={"role": "assistant", "content": content},
            stop_reason=stop,
            usage=self.usage or {"inputTokens": 0, "outputTokens": 0, "totalTokens": 0},
        )


def _usage(usage: Mapping[str, Any]) -> Usage:
    prompt = int(usage.get("prompt_tokens") or 0)
    completion = int(usage.get("completion_tokens") or 0)
    total = int(usage.get("total_tokens") or prompt + completion)
    return {"inputTokens": prompt, "outputTokens": completion, "totalTokens": total}
