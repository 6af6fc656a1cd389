"""Local fake provider servers that speak the real wire formats, for adapter tests.

A :class:`FakeServer` listens on 127.0.0.1 (an ephemeral port) in a thread, records
every request (path, headers, JSON body) and answers each with the next scripted
reply: an :class:`SSE` stream (HTTP/1.1, chunked, flushed event by event, as the
providers stream) or a :class:`JSONReply` (an error status with its real body and
headers). The helpers below build the providers' exact event sequences: OpenAI's
``data: {chunk}`` lines ending with ``data: [DONE]`` (a last usage chunk with empty
``choices``), and Anthropic's ``event: message_start`` … ``message_stop`` with a
``ping``.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# ----------------------------------------------------------------- the server


@dataclass
class Recorded:
    """One request the server received."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class SSE:
    """A 200 ``text/event-stream`` reply made of raw SSE event texts.

    ``hold_after``: after that many events, wait for ``release`` before sending the
    rest (proves the client streams instead of buffering). ``cut_after``: after that
    many events, drop the connection without finishing the body.
    """

    events: list[str]
    hold_after: int | None = None
    release: threading.Event = field(default_factory=threading.Event)
    cut_after: int | None = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class JSONReply:
    """A plain JSON reply, typically an error status with the provider's body."""

    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)


Reply = SSE | JSONReply


class FakeServer:
    """An HTTP server on loopback that plays scripted replies in order.

    Use as a context manager. ``url`` is ``http://127.0.0.1:PORT``. A request with no
    reply left gets a 500 whose body says so (so a test fails loudly).
    """

    def __init__(self, *replies: Reply) -> None:
        self.requests: list[Recorded] = []
        self._replies: deque[Reply] = deque(replies)
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length)
                try:
                    body: Any = json.loads(raw) if raw else None
                except ValueError:
                    body = raw.decode("utf-8", "replace")
                with server._lock:
                    server.requests.append(
                        Recorded(
                            "POST",
                            self.path,
                            {k.lower(): v for k, v in self.headers.items()},
                            body,
                        )
                    )
                    reply = server._replies.popleft() if server._replies else None
                if reply is None:
                    reply = JSONReply(500, {"error": {"message": "FakeServer: no reply scripted"}})
                try:
                    if isinstance(reply, JSONReply):
                        self._json(reply)
                    else:
                        self._sse(reply)
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True  # the client hung up mid-reply

            def _json(self, reply: JSONReply) -> None:
                data = (
                    reply.body.encode()
                    if isinstance(reply.body, str)
                    else json.dumps(reply.body).encode()
                )
                self.send_response(reply.status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for key, value in reply.headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)
                self.wfile.flush()

            def _sse(self, reply: SSE) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream; charset=utf-8")
                self.send_header("cache-control", "no-cache")
                self.send_header("transfer-encoding", "chunked")
                for key, value in reply.headers.items():
                    self.send_header(key, value)
                self.end_headers()
                for index, event in enumerate(reply.events):
                    if reply.cut_after is not None and index == reply.cut_after:
                        self.wfile.flush()
                        self.close_connection = True
                        return
                    if reply.hold_after is not None and index == reply.hold_after:
                        reply.release.wait(timeout=10)
                    data = event.encode("utf-8")
                    # Split each event over two chunks, as TCP may: the client must
                    # reassemble lines itself.
                    middle = max(1, len(data) // 2)
                    for piece in (data[:middle], data[middle:]):
                        if piece:
                            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def bodies(self) -> list[Any]:
        """The JSON bodies received, in order."""
        return [request.body for request in self.requests]

    def add(self, *replies: Reply) -> None:
        """Script more replies."""
        with self._lock:
            self._replies.extend(replies)

    def __enter__(self) -> FakeServer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def closed_port_url() -> str:
    """A loopback URL nobody listens on (connection refused)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


# ------------------------------------------------------------------- OpenAI


def openai_sse(chunks: list[dict[str, Any]], *, done: bool = True) -> list[str]:
    """``data: {chunk}`` events, then ``data: [DONE]``."""
    events = [f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n" for chunk in chunks]
    if done:
        events.append("data: [DONE]\n\n")
    return events


def openai_chunk(
    delta: dict[str, Any] | None = None,
    *,
    finish_reason: str | None = None,
    model: str = "gpt-4o-mini",
) -> dict[str, Any]:
    """One ``chat.completion.chunk`` with one choice, as OpenAI sends it."""
    return {
        "id": "chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT",
        "object": "chat.completion.chunk",
        "created": 1741570283,
        "model": model,
        "service_tier": "default",
        "system_fingerprint": "fp_06737a9306",
        "choices": [
            {
                "index": 0,
                "delta": delta if delta is not None else {},
                "logprobs": None,
                "finish_reason": finish_reason,
            }
        ],
        "usage": None,
    }


def openai_usage_chunk(
    prompt: int, completion: int, *, model: str = "gpt-4o-mini"
) -> dict[str, Any]:
    """The last chunk with ``stream_options.include_usage``: empty choices and the usage."""
    return {
        "id": "chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT",
        "object": "chat.completion.chunk",
        "created": 1741570283,
        "model": model,
        "service_tier": "default",
        "system_fingerprint": "fp_06737a9306",
        "choices": [],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": 0,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        },
    }


def openai_text_stream(
    *pieces: str, finish_reason: str = "stop", usage: tuple[int, int] = (19, 10)
) -> SSE:
    """A streamed text answer: role chunk, one chunk per piece, finish, usage, [DONE]."""
    chunks = [openai_chunk({"role": "assistant", "content": "", "refusal": None})]
    chunks += [openai_chunk({"content": piece}) for piece in pieces]
    chunks.append(openai_chunk({}, finish_reason=finish_reason))
    chunks.append(openai_usage_chunk(*usage))
    return SSE(openai_sse(chunks))


def openai_tool_stream(
    *calls: tuple[str, str, list[str]],
    text: str | None = None,
    interleave: bool = True,
    usage: tuple[int, int] = (82, 17),
    finish_reason: str = "tool_calls",
) -> SSE:
    """Streamed (parallel) tool calls: ``(id, name, argument fragments)`` each.

    The first fragment of a call carries its id, type and name with empty arguments;
    the argument fragments follow, interleaved between calls when ``interleave``.
    """
    first: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
    chunks = [openai_chunk(first)]
    for index, (call_id, name, _) in enumerate(calls):
        chunks.append(
            openai_chunk(
                {
                    "tool_calls": [
                        {
                            "index": index,
                            "id": call_id,
                            "type": "function",
                            "function": {"name": name, "arguments": ""},
                        }
                    ]
                }
            )
        )
    fragments: list[tuple[int, str]] = []
    if interleave:  # round robin: call 0's 1st piece, call 1's 1st piece, call 0's 2nd, …
        longest = max((len(pieces) for _, _, pieces in calls), default=0)
        for step in range(longest):
            for index, (_, _, pieces) in enumerate(calls):
                if step < len(pieces):
                    fragments.append((index, pieces[step]))
    else:
        for index, (_, _, pieces) in enumerate(calls):
            fragments.extend((index, piece) for piece in pieces)
    for index, fragment in fragments:
        chunks.append(
            openai_chunk({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]})
        )
    chunks.append(openai_chunk({}, finish_reason=finish_reason))
    chunks.append(openai_usage_chunk(*usage))
    return SSE(openai_sse(chunks))


def openai_error(
    status: int,
    message: str,
    *,
    type: str = "invalid_request_error",
    code: str | None = None,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONReply:
    """An OpenAI error response: ``{"error": {"message", "type", "param", "code"}}``."""
    body = {"error": {"message": message, "type": type, "param": param, "code": code}}
    return JSONReply(status, body, {"x-request-id": "req_0f1e2d3c4b5a", **(headers or {})})


# ---------------------------------------------------------------- Anthropic


def anthropic_sse(events: list[dict[str, Any]]) -> list[str]:
    """``event: <type>`` / ``data: {json}`` pairs, as Anthropic streams them."""
    return [f"event: {event['type']}\ndata: {json.dumps(event)}\n\n" for event in events]


def anthropic_message_start(
    input_tokens: int = 25, *, model: str = "claude-test"
) -> dict[str, Any]:
    return {
        "type": "message_start",
        "message": {
            "id": "msg_01XFDUDYJgAACzvnptvVoYEL",
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": model,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": input_tokens,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
                "output_tokens": 1,
            },
        },
    }


def anthropic_end(stop_reason: str, output_tokens: int) -> list[dict[str, Any]]:
    return [
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": output_tokens},
        },
        {"type": "message_stop"},
    ]


def anthropic_text_block(index: int, *pieces: str) -> list[dict[str, Any]]:
    return [
        {
            "type": "content_block_start",
            "index": index,
            "content_block": {"type": "text", "text": ""},
        },
        *(
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "text_delta", "text": p},
            }
            for p in pieces
        ),
        {"type": "content_block_stop", "index": index},
    ]


def anthropic_tool_block(
    index: int, tool_id: str, name: str, *fragments: str
) -> list[dict[str, Any]]:
    return [
        {
            "type": "content_block_start",
            "index": index,
            "content_block": {"type": "tool_use", "id": tool_id, "name": name, "input": {}},
        },
        {
            "type": "content_block_delta",
            "index": index,
            "delta": {"type": "input_json_delta", "partial_json": ""},
        },
        *(
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "input_json_delta", "partial_json": fragment},
            }
            for fragment in fragments
        ),
        {"type": "content_block_stop", "index": index},
    ]


PING = {"type": "ping"}


def anthropic_stream(
    *blocks: list[dict[str, Any]],
    stop_reason: str = "end_turn",
    input_tokens: int = 25,
    output_tokens: int = 15,
) -> SSE:
    """A whole Messages stream: message_start, ping, the blocks, message_delta, message_stop."""
    events = [anthropic_message_start(input_tokens), PING]
    for block in blocks:
        events.extend(block)
    events.extend(anthropic_end(stop_reason, output_tokens))
    return SSE(anthropic_sse(events))


def anthropic_error(
    status: int, type: str, message: str, *, headers: dict[str, str] | None = None
) -> JSONReply:
    """An Anthropic error response: ``{"type": "error", "error": {"type", "message"}}``."""
    body = {
        "type": "error",
        "error": {"type": type, "message": message},
        "request_id": "req_011CSHoEeqs5C35K2UUqR7Fy",
    }
    return JSONReply(
        status, body, {"request-id": "req_011CSHoEeqs5C35K2UUqR7Fy", **(headers or {})}
    )


# ------------------------------------------------------------------- helpers


def require_sdk(name: str) -> Any:
    """Import a provider SDK for a test module: skip when absent, fail under ``CI=true``."""
    import importlib
    import os

    import pytest

    try:
        return importlib.import_module(name)
    except ImportError:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(
            f"{name} is not installed (pip install 'perdure[{name}]')", allow_module_level=True
        )


class Sleeps:
    """An injectable ``sleep`` that records the delays instead of waiting."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
