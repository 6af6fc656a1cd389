"""A local stand-in for OpenAI's Realtime API: a WebSocket server speaking its events.

It accepts connections on ``/v1/realtime?model=…`` (``url`` is the ``base_url`` to
give the adapter), checks the ``Authorization`` header, greets each connection with
``session.created``, records every client event (``connections[i]`` for the i-th
connection) and answers each ``response.create`` with the next scripted response:

* a ``str``: an assistant text (``response.output_text.delta`` then ``…done``);
* ``call(name, call_id, **args)``: a finished ``function_call`` output item;
* ``audio(chunk)``: a ``response.output_audio.delta`` of the model's speech;
* a dict with a ``type``: sent as it is (an ``error`` event, say);
* ``{"pause": seconds}``: a wait, the response still running;
* :data:`DROP`: the connection is cut (no close handshake), as a network does;
* :data:`EXPIRE`: an ``error`` with code ``session_expired``, then a close.

With ``close_at_once`` every connection is closed, without a word, at its first
``response.create``.

Every response starts with ``response.created`` and, unless cut, ends with
``response.done`` (status ``completed``, its output the function calls), or what
``failed=`` makes of it. As the API does, a ``response.create`` while a response is
running gets an ``error`` (``conversation_already_has_active_response``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

DROP = "<drop the connection>"
EXPIRE = "<the session expires>"
KEY = "sk-test-realtime"


def audio(chunk: bytes) -> dict[str, Any]:
    """A scripted part: a delta of the model's speech."""
    return {"type": "response.output_audio.delta", "delta": base64.b64encode(chunk).decode()}


def call(name: str, call_id: str, **arguments: Any) -> dict[str, Any]:
    return {
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": json.dumps(arguments),
    }


class RealtimeServer:
    def __init__(
        self,
        responses: list[list[Any]],
        *,
        failed: dict[int, Any] | None = None,
        close_at_once: bool = False,
    ) -> None:
        self.responses = list(responses)
        self.close_at_once = close_at_once  # closed when asked for a response, saying nothing
        self.failed = failed or {}  # response number -> its status_details.error
        self.connections: list[list[dict[str, Any]]] = []
        self.requests: list[tuple[str, str | None]] = []  # (path, Authorization)
        self.answered = 0
        self.refused = 0  # response.create events refused: a response was running
        self.url = ""

    def events(self, kind: str, connection: int = -1) -> list[dict[str, Any]]:
        return [e for e in self.connections[connection] if e.get("type") == kind]

    def _check(self, connection: ServerConnection, request: Request) -> Response | None:
        self.requests.append((request.path, request.headers.get("Authorization")))
        if request.headers.get("Authorization") != f"Bearer {KEY}":
            body = {
                "error": {
                    "type": "invalid_request_error",
                    "code": "invalid_api_key",
                    "message": "Incorrect API key provided.",
                }
            }
            response = connection.respond(401, json.dumps(body))
            response.headers["Content-Type"] = "application/json"
            return response
        return None

    async def _handle(self, ws: ServerConnection) -> None:
        received: list[dict[str, Any]] = []
        self.connections.append(received)
        await ws.send(json.dumps({"type": "session.created", "session": {"type": "realtime"}}))
        responding: asyncio.Task[bool] | None = None
        try:
            async for raw in ws:
                event = json.loads(raw)
                received.append(event)
                if event.get("type") != "response.create":
                    continue
                if self.close_at_once:
                    await ws.close(1011, "internal error")
                    return
                if responding is not None and not responding.done():
                    # As the API does: one response at a time.
                    self.refused += 1
                    await ws.send(
                        json.dumps(
                            {
                                "type": "error",
                                "error": {
                                    "type": "invalid_request_error",
                                    "code": "conversation_already_has_active_response",
                                    "message": "Conversation already has an active response.",
                                },
                            }
                        )
                    )
                    continue
                responding = asyncio.create_task(self._respond(ws))
        finally:
            if responding is not None and not responding.done():
                responding.cancel()
                with contextlib.suppress(asyncio.CancelledError, ConnectionClosed):
                    await responding

    async def _respond(self, ws: ServerConnection) -> bool:
        """Send the next scripted response; False once the connection is cut or closed."""
        number = self.answered
        self.answered += 1
        script = self.responses.pop(0) if self.responses else ["(no more scripted responses)"]
        rid = f"resp_{number}"
        await ws.send(json.dumps({"type": "response.created", "response": {"id": rid}}))
        output: list[dict[str, Any]] = []
        for part in script:
            if part == DROP:
                ws.transport.abort()
                return False
            if part == EXPIRE:
                await ws.send(
                    json.dumps(
                        {
                            "type": "error",
                            "error": {
                                "type": "invalid_request_error",
                                "code": "session_expired",
                                "message": "Your session hit the maximum duration of 60 minutes.",
                            },
                        }
                    )
                )
                await ws.close()
                return False
            if isinstance(part, dict) and "pause" in part:
                await asyncio.sleep(part["pause"])  # the response stays active meanwhile
            elif isinstance(part, str):
                for piece in (part[: len(part) // 2], part[len(part) // 2 :]):
                    await ws.send(
                        json.dumps(
                            {
                                "type": "response.output_text.delta",
                                "response_id": rid,
                                "delta": piece,
                            }
                        )
                    )
                await ws.send(
                    json.dumps(
                        {"type": "response.output_text.done", "response_id": rid, "text": part}
                    )
                )
            elif part.get("type") == "function_call":
                output.append(part)
                await ws.send(
                    json.dumps(
                        {"type": "response.output_item.done", "response_id": rid, "item": part}
                    )
                )
            else:
                await ws.send(json.dumps(part))
        response: dict[str, Any] = {"id": rid, "status": "completed", "output": output}
        if number in self.failed:
            response["status"] = "failed"
            response["status_details"] = {"type": "failed", "error": self.failed[number]}
        await ws.send(json.dumps({"type": "response.done", "response": response}))
        return True


@asynccontextmanager
async def realtime_server(
    responses: list[list[Any]], *, failed: dict[int, Any] | None = None, close_at_once: bool = False
) -> AsyncIterator[RealtimeServer]:
    fake = RealtimeServer(responses, failed=failed, close_at_once=close_at_once)
    async with serve(fake._handle, "127.0.0.1", 0, process_request=fake._check) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        fake.url = f"http://127.0.0.1:{port}/v1"
        yield fake
        await asyncio.sleep(0)
