"""Helpers of the ``perdure serve`` tests: PNG bytes, conversations, filled stores, a client.

A module of its own (not ``conftest``): several test folders have a ``conftest.py``,
so ``from conftest import ...`` finds whichever was imported first.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any

import pytest

from perdure.session import SessionStore
from perdure.types import Message

httpx = pytest.importorskip("httpx", reason="the server tests need httpx")


def png(width: int = 48, height: int = 32) -> bytes:
    """A real PNG (a colour gradient), so a browser can decode and show it."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    rows = b"".join(
        b"\x00" + b"".join(bytes((x * 5 % 256, y * 8 % 256, 160)) for x in range(width))
        for y in range(height)
    )
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


PNG = png()


def conversation(turns: int) -> list[Message]:
    """``turns`` turns: a question, a tool call, its result, an answer; an image first."""
    messages: list[Message] = [
        {
            "role": "user",
            "content": [{"text": "look"}, {"image": {"format": "png", "source": {"bytes": PNG}}}],
        },
        {"role": "assistant", "content": [{"text": "a picture"}]},
    ]
    for n in range(turns):
        messages += [
            {"role": "user", "content": [{"text": f"q{n}"}]},
            {
                "role": "assistant",
                "content": [{"toolUse": {"toolUseId": f"t{n}", "name": "add", "input": {"n": n}}}],
            },
            {
                "role": "user",
                "content": [
                    {
                        "toolResult": {
                            "toolUseId": f"t{n}",
                            "status": "success",
                            "content": [{"text": f"r{n}"}],
                        }
                    }
                ],
            },
            {"role": "assistant", "content": [{"text": f"a{n}"}]},
        ]
    return messages


async def fill(store: SessionStore, session_id: str, messages: list[Message]) -> None:
    """Store a session with ``messages`` as its history."""
    await store.create(session_id)
    await store.commit(session_id, messages)


def close(store: SessionStore) -> None:
    """Close a store opened by URL (the protocol has no ``close``; the stores do)."""
    getattr(store, "close", lambda: None)()


def client(app: Any, token: str | None = None) -> Any:
    """An ``httpx.AsyncClient`` over the ASGI app (no socket), as loopback."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1", headers=headers
    )
