"""ScriptedModel: a model that plays back canned responses, for tests and demos."""

from __future__ import annotations

import asyncio
import copy
import json
import re
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Any, Literal, TypeAlias

from perdure.errors import ModelError
from perdure.models.stream import ModelResponse, ModelStreamEvent, TextDelta, ToolUseDelta
from perdure.types import Message, ToolSpec, Usage

ScriptedResponse: TypeAlias = (
    str | Message | ModelResponse | BaseException | Callable[[list[Message]], Any]
)


def _estimate_tokens(obj: Any) -> int:
    return max(1, _json_chars(obj) // 4)


def _json_chars(obj: Any) -> int:
    return len(json.dumps(obj, default=str))


class _RequestSize:
    """The JSON size of the request messages, kept across calls.

    A turn's request is the previous one plus the messages added since, so only those
    are encoded: a long run is not quadratic in the model. A request that does not
    start with the previous one (the same first message, the previous last message at
    the same place) is measured again from scratch.
    """

    def __init__(self) -> None:
        self._first: Message | None = None
        self._last: Message | None = None
        self._count = 0
        self._chars = 0

    def chars(self, messages: Sequence[Message]) -> int:
        """``len(json.dumps(list(messages), default=str))``, in time linear in what is new."""
        count = len(messages)
        extends = (
            0 < self._count <= count
            and messages[0] is self._first
            and messages[self._count - 1] is self._last
        )
        if not extends:
            self._count, self._chars = 0, 0
        # A list's JSON is "[" + its items joined by ", " + "]": the new items are
        # encoded in one call (a first call after a resume has the whole history).
        new = len(messages) - self._count
        if new > 0:
            self._chars += _json_chars(list(messages[self._count :])) - 2 - 2 * (new - 1)
        self._count = count
        self._first = messages[0] if count else None
        self._last = messages[-1] if count else None
        return 2 + self._chars + 2 * max(0, count - 1)


class ScriptedModel:
    """Plays back ``responses`` in order, one per model call.

    Each response is one of:

    - a ``str``: an assistant text message that ends the turn;
    - a message dict (``{"role": "assistant", "content": [...]}``): returned as is;
      a ``toolUse`` block in it makes it a tool-use turn;
    - a :class:`~perdure.models.stream.ModelResponse`: returned as is (to script a
      ``max_tokens`` stop, say);
    - an exception instance: raised by the call (to script a model failure);
    - a callable: receives the request messages and returns any of the above.

    With ``record="copy"`` (the default) every request is recorded in
    :attr:`requests` as ``{"messages", "tool_specs", "system_prompt"}`` (deep copies,
    so a test sees each request as it was sent). That costs a copy of the whole
    history per call, quadratic over a long run: benchmarks and demos pass
    ``record="none"``, which records nothing (:attr:`requests` stays empty;
    :attr:`calls` still counts the calls). When the script runs out, the call raises
    :class:`~perdure.errors.ModelError` naming ``ScriptedModel``.
    """

    def __init__(
        self,
        responses: Iterable[ScriptedResponse] = (),
        *,
        delay: float = 0.0,
        record: Literal["copy", "none"] = "copy",
    ) -> None:
        if isinstance(responses, str | dict):
            raise TypeError("responses must be a list of responses, not a single response")
        if not isinstance(responses, Iterable):
            raise TypeError(
                f"responses must be a list of responses, got {type(responses).__name__}"
            )
        if record not in ("copy", "none"):
            raise ValueError(f"record must be 'copy' or 'none', got {record!r}")
        self._responses: list[ScriptedResponse] = list(responses)
        self._index = 0
        self.delay = delay
        self.record: Literal["copy", "none"] = record
        self.requests: list[dict[str, Any]] = []
        self.calls = 0
        self._request_size = _RequestSize()

    @property
    def remaining(self) -> int:
        """How many scripted responses are left."""
        return len(self._responses) - self._index

    def add(self, *responses: ScriptedResponse) -> None:
        """Append more responses to the script."""
        self._responses.extend(responses)

    async def stream(
        self,
        messages: list[Message],
        *,
        tool_specs: list[ToolSpec],
        system_prompt: str | None,
    ) -> AsyncIterator[ModelStreamEvent]:
        """Yield the next scripted response as text deltas and a final response."""
        self.calls += 1
        if self.record == "copy":
            self.requests.append(
                {
                    "messages": copy.deepcopy(messages),
                    "tool_specs": copy.deepcopy(tool_specs),
                    "system_prompt": system_prompt,
                }
            )
        if self._index >= len(self._responses):
            raise ModelError(
                f"ScriptedModel ran out of responses: call {self.calls} but only "
                f"{len(self._responses)} responses were scripted"
            )
        item = self._responses[self._index]
        self._index += 1
        if callable(item) and not isinstance(item, BaseException):
            item = item(copy.deepcopy(messages))
        response = self._to_response(item, messages)
        for event in self._deltas(response.message):
            if self.delay:
                await asyncio.sleep(self.delay)
            yield event
        yield response

    def _to_response(self, item: Any, messages: Sequence[Message]) -> ModelResponse:
        if isinstance(item, BaseException):
            raise item
        if isinstance(item, ModelResponse):
            return item
        if isinstance(item, str):
            message: Message = {"role": "assistant", "content": [{"text": item}]}
        elif isinstance(item, dict) and item.get("role") == "assistant":
            if not isinstance(item.get("content"), list):
                raise ModelError("ScriptedModel response message needs a 'content' list")
            message = copy.deepcopy(item)  # type: ignore[assignment]
        else:
            raise ModelError(
                f"ScriptedModel response {self._index} is not a str, an assistant message, "
                f"a ModelResponse or an exception: {item!r}"
            )
        has_tool_use = any("toolUse" in block for block in message["content"])
        usage: Usage = {
            "inputTokens": max(1, self._request_size.chars(messages) // 4),
            "outputTokens": _estimate_tokens(message),
            "totalTokens": 0,
        }
        usage["totalTokens"] = usage["inputTokens"] + usage["outputTokens"]
        return ModelResponse(
            message=message, stop_reason="tool_use" if has_tool_use else "end_turn", usage=usage
        )

    @staticmethod
    def _deltas(message: Message) -> list[ModelStreamEvent]:
        events: list[ModelStreamEvent] = []
        for block in message["content"]:
            if "text" in block:
                events.extend(
                    TextDelta(piece) for piece in re.findall(r"\S+\s*|\s+", block["text"])
                )
            elif "toolUse" in block:
                tool_use = block["toolUse"]
                events.append(
                    ToolUseDelta(
                        tool_use["toolUseId"], tool_use["name"], json.dumps(tool_use["input"])
                    )
                )
        return events
