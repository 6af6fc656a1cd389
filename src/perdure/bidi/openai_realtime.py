"""``OpenAIRealtimeModel``: a :class:`~perdure.bidi.BidiModel` on OpenAI's Realtime API.

One WebSocket a connection (``wss://api.openai.com/v1/realtime?model=…``, the key in
an ``Authorization: Bearer`` header), speaking the API's JSON events (the GA names;
the beta's ``response.text.done`` and ``response.audio_transcript.done`` are read
too). Text in, text out by default; ``session=`` adds session settings (audio
output, a voice, turn detection).

* ``start`` waits for ``session.created``, sends ``session.update`` (the system
  prompt as ``instructions``, the tools as ``function`` tools, ``output_modalities``)
  and then the history as ``conversation.item.create`` events: text as ``message``
  items, each ``toolUse`` as a ``function_call`` item and each ``toolResult`` as its
  ``function_call_output``, in the history's order.
* An ``audio`` input is appended to the input audio buffer (base64); the output
  audio's deltas (``response.output_audio.delta``) are ``audio`` events, bytes.
* The pieces of a transcript as it is made — the output text's and the output
  audio transcript's deltas (``response.output_text.delta``,
  ``response.output_audio_transcript.delta``) and the user's speech transcription's
  (``conversation.item.input_audio_transcription.delta``) — are ``text_delta``
  events, for a caller that shows the words as they come.
* ``send`` adds a user ``message`` item, or a tool's ``function_call_output``, then
  asks for a response (``response.create``) — one at a time, as the API wants: text
  sent while a response runs is answered once it is done, and after a response that
  called tools, the next is asked for once every call has its output.
* ``receive`` turns server events into :data:`~perdure.bidi.BidiEvent` s: a finished
  text or audio transcript (``response.output_text.done``,
  ``response.output_audio_transcript.done``) an assistant ``transcript``, a user's
  transcribed speech (``conversation.item.input_audio_transcription.completed``) a
  user ``transcript``, a finished ``function_call`` item a ``tool_use``, a
  ``response.done`` that called no tool ``response_complete``. The session's time
  limit (an ``error`` with code ``session_expired``) and a connection the server
  drops (not one closed by ``stop``) are ``restart_required``: the agent opens a
  new connection with the history. A connection closed before it sent any event
  after ``session.created`` raises :class:`~perdure.errors.ModelConnectionError`
  instead, so that a server that closes every connection at once is not
  reconnected to for ever. Any other ``error`` event, or a failed response,
  raises a :class:`~perdure.errors.ModelError` subclass (rate limit, server,
  authentication, …); so do a refused or failed connection at ``start``.

Needs the ``websockets`` package (``pip install 'perdure[openai]'``); it is
imported when a connection opens, never by importing perdure.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
from collections.abc import AsyncIterator, Mapping
from typing import Any, Literal
from urllib.parse import urlencode, urlsplit, urlunsplit

from perdure.bidi.model import BidiEvent, BidiInput
from perdure.errors import ModelAuthenticationError, ModelConnectionError, ModelError
from perdure.models._errors import classify_error
from perdure.types import Message, ToolSpec

__all__ = ["OpenAIRealtimeModel"]

DEFAULT_BASE_URL = "https://api.openai.com/v1"
_PROVIDER = "openai realtime"
_ASSISTANT_TEXT_DONE = frozenset({"response.output_text.done", "response.text.done"})
_ASSISTANT_AUDIO_DONE = frozenset(
    {"response.output_audio_transcript.done", "response.audio_transcript.done"}
)
_USER_SPEECH_DONE = "conversation.item.input_audio_transcription.completed"
_AUDIO_DELTA = frozenset({"response.output_audio.delta", "response.audio.delta"})
# Pieces of a transcript as it is made: text_delta events, by whose words they are.
_TEXT_DELTA: dict[str, Literal["user", "assistant"]] = {
    "response.output_text.delta": "assistant",
    "response.text.delta": "assistant",
    "response.output_audio_transcript.delta": "assistant",
    "response.audio_transcript.delta": "assistant",
    "conversation.item.input_audio_transcription.delta": "user",
}
_RESTART_CODES = frozenset({"session_expired"})


class OpenAIRealtimeModel:
    """OpenAI's Realtime API as a bidirectional model (see the module docstring).

    Args:
        model_id: the realtime model (``"gpt-realtime"``).
        api_key: the API key; default ``OPENAI_API_KEY``.
        base_url: the API root (``https://api.openai.com/v1``; a ``ws://`` or
            ``wss://`` one is used as it is); default ``OPENAI_BASE_URL``, else
            OpenAI's. The connection goes to ``<base_url>/realtime?model=<model_id>``.
        session: more session settings for ``session.update`` (``{"audio": …}``,
            ``"output_modalities": ["audio"]``); the adapter owns ``type``,
            ``instructions`` and ``tools``.
        open_timeout: seconds to connect and get ``session.created``.

    Raises:
        ModelAuthenticationError: no API key and no ``base_url`` (nothing to call).
        TypeError, ValueError: a bad argument (named in the message).
    """

    provider = "openai"

    def __init__(
        self,
        model_id: str = "gpt-realtime",
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        session: Mapping[str, Any] | None = None,
        open_timeout: float = 10.0,
    ) -> None:
        if not isinstance(model_id, str) or not model_id:
            raise ValueError(f"model_id must be a non-empty str, got {model_id!r}")
        if session is not None and not isinstance(session, Mapping):
            raise TypeError(f"session must be a mapping or None, got {type(session).__name__}")
        owned = sorted({"type", "instructions", "tools"} & set(session or {}))
        if owned:
            raise ValueError(f"session must not set {owned}: the adapter sends them")
        if isinstance(open_timeout, bool) or not isinstance(open_timeout, int | float):
            raise TypeError(f"open_timeout must be a number, got {open_timeout!r}")
        if open_timeout <= 0:
            raise ValueError(f"open_timeout must be > 0, got {open_timeout!r}")
        key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        root = base_url if base_url is not None else os.environ.get("OPENAI_BASE_URL")
        if not key and not root:
            raise ModelAuthenticationError(
                "no OpenAI API key: pass api_key= or set OPENAI_API_KEY (or give a "
                "base_url for a server that needs none)"
            )
        self.model_id = model_id
        self.url = _realtime_url(root or DEFAULT_BASE_URL, model_id)
        self._api_key = key or None
        self._session = dict(session or {})
        self._open_timeout = float(open_timeout)
        self._ws: Any = None
        # One response at a time (the API refuses a response.create while one runs):
        # ``_busy`` from our response.create (or the server's own response.created)
        # to its response.done; ``_wanted`` when another was asked for meanwhile. The
        # tool calls of the newest response, and those still without an output: once
        # it is done and all have outputs, one response.create asks for what follows.
        self._busy = False
        self._wanted = False
        self._calls: set[str] = set()
        self._unanswered: set[str] = set()
        self._heard = False

    @property
    def open(self) -> bool:
        """True between ``start`` and ``stop``."""
        return self._ws is not None

    # ------------------------------------------------------------ BidiModel

    async def start(
        self,
        *,
        system_prompt: str | None,
        tool_specs: list[ToolSpec],
        messages: list[Message],
    ) -> None:
        """Connect, configure the session, and send the history (see the module).

        Raises:
            RuntimeError: the connection is open already.
            ValueError: the history holds a block the API has no item for (only
                text, ``toolUse`` and ``toolResult`` are sent).
            ModelError: the server refused the connection or the session (its
                subclass says why), or could not be reached.
        """
        if self._ws is not None:
            raise RuntimeError("OpenAIRealtimeModel is started already")
        items = _history_items(messages)  # checked before anything is sent
        ws = await self._connect()
        self._ws = ws
        self._busy, self._wanted = False, False
        self._calls, self._unanswered = set(), set()
        self._heard = False  # an event on this connection after session.created
        try:
            first = await self._next_event(ws, "session.created")
            if first.get("type") == "error":
                raise _error(first)
            if first.get("type") != "session.created":
                raise ModelError(
                    f"{_PROVIDER}: the server's first event was {first.get('type')!r}, "
                    "not session.created"
                )
            session: dict[str, Any] = {"type": "realtime", "output_modalities": ["text"]}
            session.update(self._session)
            if system_prompt is not None:
                session["instructions"] = system_prompt
            session["tools"] = [_function_tool(spec) for spec in tool_specs]
            await self._send_json({"type": "session.update", "session": session})
            for item in items:
                await self._send_json({"type": "conversation.item.create", "item": item})
        except BaseException:
            await self.stop()
            raise

    async def send(self, event: BidiInput) -> None:
        """Send user text or a tool's result, then ask for a response when it is time.

        Raises:
            RuntimeError: the connection is not open.
            ValueError: an input of another type.
        """
        if self._ws is None:
            raise RuntimeError("OpenAIRealtimeModel: send before start (or after stop)")
        kind = event.get("type")
        if kind == "text":
            text = event.get("text")
            if not isinstance(text, str):
                raise ValueError(f"a text input needs a str text: {event!r}")
            item = {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": text}],
            }
            await self._send_json({"type": "conversation.item.create", "item": item})
            await self._ask()  # at once, or when the response running now is done
            return
        if kind == "tool_result":
            result = event.get("toolResult")
            if not isinstance(result, Mapping) or not isinstance(result.get("toolUseId"), str):
                raise ValueError(
                    f"a tool_result input needs a toolResult with a toolUseId: {event!r}"
                )
            call_id = result["toolUseId"]
            await self._send_json(
                {"type": "conversation.item.create", "item": _call_output(dict(result))}
            )
            self._unanswered.discard(call_id)
            if not self._busy and call_id in self._calls and not self._unanswered:
                await self._ask()
            return
        if kind == "audio":
            chunk = event.get("audio")
            if not isinstance(chunk, bytes):
                raise ValueError("an audio input needs bytes under 'audio'")
            # The server's turn detection (or an input_audio_buffer.commit, in a
            # session= without it) decides when the speech is a turn.
            await self._send_json(
                {"type": "input_audio_buffer.append", "audio": base64.b64encode(chunk).decode()}
            )
            return
        raise ValueError(f"OpenAIRealtimeModel cannot send an input of type {kind!r}: {event!r}")

    async def receive(self) -> AsyncIterator[BidiEvent]:
        """The server's events as :data:`~perdure.bidi.BidiEvent` s (see the module).

        Raises:
            RuntimeError: the connection is not open.
            ModelError: an ``error`` event or a failed response (its subclass says why).
        """
        ws = self._ws
        if ws is None:
            raise RuntimeError("OpenAIRealtimeModel: receive before start")
        from websockets.exceptions import ConnectionClosed

        while True:
            try:
                raw = await ws.recv()
            except ConnectionClosed as exc:
                if self._ws is not ws:
                    return  # closed by stop (or a restart), which let go of it first
                if not self._heard:
                    # Closed before it said anything: a new connection would most
                    # likely be closed too, and the agent would reconnect for ever.
                    raise ModelConnectionError(
                        f"{_PROVIDER}: the server closed the connection before any event ({exc})"
                    ) from exc
                yield {"type": "restart_required"}  # dropped: go on over a new one
                return
            self._heard = True
            event = _decode(raw)
            for out in await self._translate(event):
                yield out
                if out.get("type") == "restart_required":
                    return

    async def stop(self) -> None:
        """Close the connection (idempotent)."""
        ws, self._ws = self._ws, None
        if ws is None:
            return
        await ws.close()

    # ------------------------------------------------------------ internals

    async def _connect(self) -> Any:
        try:
            from websockets.asyncio.client import connect
            from websockets.exceptions import InvalidHandshake, InvalidStatus
        except ImportError as exc:  # pragma: no cover - the extra is missing
            raise ModelError(
                "OpenAIRealtimeModel needs the websockets package: pip install 'perdure[openai]'"
            ) from exc
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        try:
            return await connect(
                self.url,
                additional_headers=headers,
                open_timeout=self._open_timeout,
                max_size=None,  # a long transcript or a tool's arguments in one event
            )
        except InvalidStatus as exc:
            response = exc.response
            body: object = response.body.decode("utf-8", "replace") if response.body else ""
            with contextlib.suppress(ValueError):  # not JSON: the text as it is
                body = json.loads(body) if isinstance(body, str) and body else body
            raise classify_error(
                provider=_PROVIDER,
                status=response.status_code,
                body=body,
                headers=dict(response.headers.raw_items()),
                fallback=f"the server refused the connection to {self.url}",
            ) from exc
        except (OSError, TimeoutError, InvalidHandshake) as exc:
            raise ModelConnectionError(f"{_PROVIDER}: cannot connect to {self.url}: {exc}") from exc

    async def _next_event(self, ws: Any, waiting_for: str) -> dict[str, Any]:
        from websockets.exceptions import ConnectionClosed

        try:
            raw = await asyncio.wait_for(ws.recv(), self._open_timeout)
        except TimeoutError as exc:
            raise ModelConnectionError(
                f"{_PROVIDER}: no {waiting_for} within {self._open_timeout:g} s"
            ) from exc
        except ConnectionClosed as exc:
            raise ModelConnectionError(
                f"{_PROVIDER}: the server closed the connection before {waiting_for}"
            ) from exc
        return _decode(raw)

    async def _send_json(self, event: dict[str, Any]) -> None:
        from websockets.exceptions import ConnectionClosed

        ws = self._ws
        if ws is None:
            raise RuntimeError("OpenAIRealtimeModel: the connection is closed")
        try:
            await ws.send(json.dumps(event, ensure_ascii=False))
        except ConnectionClosed as exc:
            raise ModelConnectionError(
                f"{_PROVIDER}: the connection closed while sending {event.get('type')!r}"
            ) from exc

    async def _ask(self) -> None:
        """Ask for a response now, or once the one running is done."""
        if self._busy:
            self._wanted = True
            return
        self._busy, self._wanted, self._calls = True, False, set()
        await self._send_json({"type": "response.create"})

    async def _translate(self, event: dict[str, Any]) -> list[BidiEvent]:
        kind = event.get("type")
        if kind in _ASSISTANT_TEXT_DONE:
            return [_transcript("assistant", event.get("text"), event)]
        if kind in _ASSISTANT_AUDIO_DONE:
            return [_transcript("assistant", event.get("transcript"), event)]
        if kind == _USER_SPEECH_DONE:
            return [_transcript("user", event.get("transcript"), event)]
        role = _TEXT_DELTA.get(kind) if isinstance(kind, str) else None
        if role is not None:
            delta = event.get("delta")
            if not isinstance(delta, str):
                raise ModelError(f"{_PROVIDER}: {kind!r} without a text delta: {event!r}")
            return [{"type": "text_delta", "role": role, "text": delta}] if delta else []
        if kind in _AUDIO_DELTA:
            delta = event.get("delta")
            try:
                chunk = base64.b64decode(delta, validate=True) if isinstance(delta, str) else None
            except ValueError:
                chunk = None
            if chunk is None:
                raise ModelError(f"{_PROVIDER}: {kind!r} without base64 audio: {event!r}")
            return [{"type": "audio", "audio": chunk}]
        if kind == "response.created":
            self._busy, self._calls, self._unanswered = True, set(), set()
            return []
        if kind == "response.output_item.done":
            item = event.get("item")
            if isinstance(item, Mapping) and item.get("type") == "function_call":
                call = _tool_use(item)
                self._calls.add(call["toolUseId"])
                self._unanswered.add(call["toolUseId"])
                return [{"type": "tool_use", "toolUse": call}]
            return []
        if kind == "response.done":
            _check_response(event)
            self._busy = False
            if self._calls and self._unanswered:
                return []  # asked for once the last output is sent (see send)
            out: list[BidiEvent] = [] if self._calls else [{"type": "response_complete"}]
            if self._calls or self._wanted:  # calls answered while it ran, or text came
                await self._ask()
            return out
        if kind == "error":
            error = event.get("error")
            code = error.get("code") if isinstance(error, Mapping) else None
            if code in _RESTART_CODES:
                return [{"type": "restart_required"}]
            raise _error(event)
        return []  # acknowledgements, rate limits, other deltas: nothing to act on


def _check_response(event: Mapping[str, Any]) -> None:
    """Raise the error of a failed response (``response.done`` with status failed)."""
    response = event.get("response")
    if not isinstance(response, Mapping) or response.get("status") != "failed":
        return
    details = response.get("status_details")
    error = details.get("error") if isinstance(details, Mapping) else None
    raise classify_error(
        provider=_PROVIDER,
        status=None,
        body={"error": error} if isinstance(error, Mapping) else {},
        fallback="the response failed",
    )


def _realtime_url(root: str, model_id: str) -> str:
    parts = urlsplit(root)
    scheme = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}.get(parts.scheme)
    if scheme is None or not parts.netloc:
        raise ValueError(f"base_url must be an http(s):// or ws(s):// URL, got {root!r}")
    path = parts.path.rstrip("/") + "/realtime"
    query = "&".join(q for q in (parts.query, urlencode({"model": model_id})) if q)
    return urlunsplit((scheme, parts.netloc, path, query, ""))


def _decode(raw: str | bytes) -> dict[str, Any]:
    try:
        event = json.loads(raw)
    except ValueError as exc:
        raise ModelError(f"{_PROVIDER}: the server sent something that is not JSON: {exc}") from exc
    if not isinstance(event, dict):
        raise ModelError(f"{_PROVIDER}: the server sent {type(event).__name__}, not an event")
    return event


def _error(event: Mapping[str, Any]) -> ModelError:
    return classify_error(provider=_PROVIDER, status=None, body=event, fallback="an error event")


def _transcript(role: str, text: object, event: Mapping[str, Any]) -> BidiEvent:
    if not isinstance(text, str):
        raise ModelError(f"{_PROVIDER}: {event.get('type')!r} without its text: {event!r}")
    return {"type": "transcript", "role": role, "text": text}  # type: ignore[typeddict-item]


def _tool_use(item: Mapping[str, Any]) -> Any:
    call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
    if not isinstance(call_id, str) or not isinstance(name, str):
        raise ModelError(f"{_PROVIDER}: a function_call item without call_id or name: {item!r}")
    if arguments in (None, ""):
        given: Any = {}
    else:
        try:
            given = json.loads(arguments) if isinstance(arguments, str) else None
        except ValueError:
            given = None
        if not isinstance(given, dict):
            raise ModelError(
                f"{_PROVIDER}: the arguments of {name!r} ({call_id}) are not a JSON object: "
                f"{arguments!r}"
            )
    return {"toolUseId": call_id, "name": name, "input": given}


def _function_tool(spec: ToolSpec) -> dict[str, Any]:
    schema = spec.get("inputSchema", {})
    parameters = schema.get("json", schema) if isinstance(schema, Mapping) else {}
    return {
        "type": "function",
        "name": spec["name"],
        "description": spec.get("description", ""),
        "parameters": parameters,
    }


def _result_text(result: Mapping[str, Any]) -> str:
    parts: list[str] = []
    for block in result.get("content", []):
        if isinstance(block, Mapping) and isinstance(block.get("text"), str):
            parts.append(block["text"])
        elif isinstance(block, Mapping) and "json" in block:
            parts.append(json.dumps(block["json"], ensure_ascii=False))
    text = "\n".join(parts)
    return f"Error: {text}" if result.get("status") == "error" else text


def _call_output(result: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "type": "function_call_output",
        "call_id": result["toolUseId"],
        "output": _result_text(result),
    }


def _history_items(messages: list[Message]) -> list[dict[str, Any]]:
    """The history as conversation items, in order (see the module docstring).

    Raises:
        ValueError: a block that is not text, ``toolUse`` or ``toolResult`` (named).
    """
    items: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        role = message["role"]
        text_type = "input_text" if role == "user" else "output_text"
        texts: list[dict[str, str]] = []  # consecutive text blocks: one message item
        for block_index, block in enumerate([*message["content"], None]):
            if block is not None and "text" in block:
                texts.append({"type": text_type, "text": block["text"]})
                continue
            if texts:
                items.append({"type": "message", "role": role, "content": texts})
                texts = []
            if block is None:
                break
            if "toolUse" in block:
                use = block["toolUse"]
                items.append(
                    {
                        "type": "function_call",
                        "call_id": use["toolUseId"],
                        "name": use["name"],
                        "arguments": json.dumps(use.get("input", {}), ensure_ascii=False),
                    }
                )
            elif "toolResult" in block:
                items.append(_call_output(block["toolResult"]))
            else:
                kind = next(iter(block), "empty")
                raise ValueError(
                    f"messages[{index}].content[{block_index}] is a {kind!r} block: the "
                    "Realtime API history takes text, toolUse and toolResult only"
                )
    return items
