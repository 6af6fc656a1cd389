"""The ``BidiModel`` protocol (a bidirectional streaming model) and ``ScriptedBidiModel``.

A bidirectional model holds a connection open: the agent ``start``s it with the
history so far, ``send``s inputs (user text, tool results) whenever it likes, and
reads ``receive()`` — an open-ended stream of :data:`BidiEvent` dicts — until it
``stop``s it. :class:`~perdure.bidi.OpenAIRealtimeModel` implements these four
methods on OpenAI's Realtime API; :class:`ScriptedBidiModel` plays back canned
events for tests and demos.
"""

from __future__ import annotations

import asyncio
import copy
import re
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any, Literal, Protocol, TypedDict, runtime_checkable

from perdure.types import Message, ToolResult, ToolSpec, ToolUse

__all__ = ["BidiEvent", "BidiInput", "BidiModel", "ScriptedBidiModel"]


class BidiEvent(TypedDict, total=False):
    """One event a bidirectional model emits.

    ``type`` is one of:

    * ``"transcript"``: a finished transcript entry, ``role`` (``"user"`` or
      ``"assistant"``) and ``text``: the agent adds it to its history;
    * ``"text_delta"``: a piece of a transcript entry as it is made, ``role`` and
      ``text`` (the assistant's text or speech transcript, the user's transcribed
      speech), for a caller that shows the words as they come: passed on, never
      into the history, and no save point — the ``transcript`` that follows holds
      the whole text;
    * ``"tool_use"``: the model asks for a tool, ``toolUse``; the agent runs it and
      sends the result back;
    * ``"tool_result"``: emitted by the agent (not the model) once a tool ran;
    * ``"response_complete"``: the model finished responding (not a save point);
    * ``"restart_required"``: the provider ends the connection (a session time limit):
      the agent restarts it, with the history, and goes on;
    * ``"audio"``: a chunk of the model's speech, ``audio`` (bytes, in the format the
      session set): passed on to the caller, never into the history (the speech's
      transcript is what the history keeps).
    """

    type: Literal[
        "transcript",
        "text_delta",
        "tool_use",
        "tool_result",
        "response_complete",
        "restart_required",
        "audio",
    ]
    role: Literal["user", "assistant"]
    text: str
    toolUse: ToolUse
    toolResult: ToolResult
    audio: bytes


class BidiInput(TypedDict, total=False):
    """What the agent sends: ``{"type": "text", "text"}``, a tool's result,
    ``{"type": "tool_result", "toolResult"}``, or a chunk of the user's speech,
    ``{"type": "audio", "audio": bytes}`` (its transcript, when the model makes one,
    comes back as a user ``transcript`` event)."""

    type: Literal["text", "tool_result", "audio"]
    text: str
    toolResult: ToolResult
    audio: bytes


@runtime_checkable
class BidiModel(Protocol):
    """A model with a connection that stays open: start, send, receive, stop."""

    async def start(
        self,
        *,
        system_prompt: str | None,
        tool_specs: list[ToolSpec],
        messages: list[Message],
    ) -> None:
        """Open the connection; ``messages`` is the history to go on from."""
        ...

    async def send(self, event: BidiInput) -> None:
        """Send one input over the open connection."""
        ...

    def receive(self) -> AsyncIterator[BidiEvent]:
        """The model's events, as they come, until the connection stops."""
        ...

    async def stop(self) -> None:
        """Close the connection (idempotent)."""
        ...


class _Closed:
    pass


def _scripted(events: Any, where: str) -> list[str | BidiEvent]:
    """One scripted response, checked: a list of texts and event dicts with a ``type``.

    Raises:
        TypeError: ``events`` is not a list, or holds something else (named by index).
    """
    if isinstance(events, str | bytes | dict) or not isinstance(events, Iterable):
        raise TypeError(f"{where} must be a list of events, got {type(events).__name__}")
    out = list(events)
    for index, event in enumerate(out):
        if not isinstance(event, str) and not (
            isinstance(event, dict) and isinstance(event.get("type"), str)
        ):
            raise TypeError(
                f"{where}[{index}] must be a text or an event dict with a 'type', got {event!r}"
            )
    return out


class ScriptedBidiModel:
    """Plays back canned responses: each input sent makes it emit the next one.

    Args:
        responses: one list of events per input, in order. In a list, a ``str`` is an
            assistant transcript entry; a dict is an event as is. Each response ends
            with a ``response_complete`` event unless it ends with
            ``restart_required``.
        greeting: events emitted as soon as the connection starts (none by default).
        text_deltas: also stream each assistant ``str`` as ``text_delta`` events, one
            a word (its space kept), before its ``transcript``, as a provider streams
            text (off by default: the events are then exactly the script's).

    It records what it was given: ``starts`` (the history at each start), ``sent``
    (every input; an ``audio`` input is only recorded, it takes no response) and
    ``stops``. Running out of responses raises ``RuntimeError``
    naming ``ScriptedBidiModel`` from ``send``.
    """

    def __init__(
        self,
        responses: Iterable[Sequence[str | BidiEvent]] = (),
        *,
        greeting: Sequence[str | BidiEvent] = (),
        text_deltas: bool = False,
    ) -> None:
        if isinstance(responses, str | bytes | dict):
            raise TypeError(
                f"responses must be a list of responses (lists of events), "
                f"got {type(responses).__name__}"
            )
        self._responses = [
            _scripted(response, f"responses[{index}]") for index, response in enumerate(responses)
        ]
        self._greeting = _scripted(greeting, "greeting")
        self._text_deltas = text_deltas
        self._queue: asyncio.Queue[BidiEvent | _Closed] | None = None
        self.starts: list[dict[str, Any]] = []
        self.sent: list[BidiInput] = []
        self.stops = 0

    @property
    def open(self) -> bool:
        """True between ``start`` and ``stop``."""
        return self._queue is not None

    async def start(
        self,
        *,
        system_prompt: str | None,
        tool_specs: list[ToolSpec],
        messages: list[Message],
    ) -> None:
        if self._queue is not None:
            raise RuntimeError("ScriptedBidiModel is started already")
        self._queue = asyncio.Queue()
        self.starts.append(
            {
                "system_prompt": system_prompt,
                "tool_specs": copy.deepcopy(tool_specs),
                "messages": copy.deepcopy(messages),
            }
        )
        self._emit(self._greeting, complete=False)
        self._greeting = []

    async def send(self, event: BidiInput) -> None:
        if self._queue is None:
            raise RuntimeError("ScriptedBidiModel: send before start (or after stop)")
        self.sent.append(copy.deepcopy(event))
        if event.get("type") == "audio":
            return  # recorded only: speech is answered by the text or tool input after it
        if not self._responses:
            raise RuntimeError(
                f"ScriptedBidiModel ran out of responses (input {len(self.sent)}: {event!r})"
            )
        self._emit(self._responses.pop(0), complete=True)

    def _emit(self, events: Sequence[str | BidiEvent], *, complete: bool) -> None:
        assert self._queue is not None
        out: list[BidiEvent] = []
        for e in events:
            if not isinstance(e, str):
                out.append(e)
                continue
            if self._text_deltas:
                out.extend(
                    {"type": "text_delta", "role": "assistant", "text": word}
                    for word in re.findall(r"\S+\s*|\s+", e)
                )
            out.append({"type": "transcript", "role": "assistant", "text": e})
        if complete and not (out and out[-1].get("type") in ("restart_required", "tool_use")):
            out.append({"type": "response_complete"})
        for event in out:
            self._queue.put_nowait(copy.deepcopy(event))

    async def receive(self) -> AsyncIterator[BidiEvent]:
        queue = self._queue
        if queue is None:
            raise RuntimeError("ScriptedBidiModel: receive before start")
        while True:
            event = await queue.get()
            if isinstance(event, _Closed):
                return
            yield event

    async def stop(self) -> None:
        if self._queue is not None:
            self._queue.put_nowait(_Closed())
            self._queue = None
            self.stops += 1
