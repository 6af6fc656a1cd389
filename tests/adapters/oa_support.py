"""Shared by the OpenAI Agents adapter tests: the SDK (or a skip), stores by kind, items."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import postgres_server
import redis_server
from perdure.session import SessionStore, open_store

IN_CI = os.environ.get("CI") == "true"
STORE_KINDS = ["file", "sqlite", "memory", "postgres", "redis"]


def import_agents() -> Any:
    """The OpenAI Agents SDK; the module is skipped without it (failed under CI=true,
    where the ``dev`` extra installs it)."""
    try:
        import agents
    except ImportError:
        if IN_CI:
            raise
        pytest.skip(
            "the OpenAI Agents SDK is not installed: pip install 'perdure[openai-agents]'",
            allow_module_level=True,
        )
    return agents


def store_url(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A fresh store URL of ``kind`` (server kinds skip without a server, fail in CI)."""
    if kind == "file":
        return f"file:{tmp_path / 'file-store'}"
    if kind == "sqlite":
        return f"sqlite:{tmp_path / 'sessions.db'}"
    if kind == "memory":
        return "memory:"
    if kind == "postgres":
        return postgres_server.store_url(request)
    if kind == "redis":
        url = redis_server.require_server()
        prefix = redis_server.new_prefix()
        request.addfinalizer(lambda: redis_server.drop_prefix(prefix))
        return f"{url}?prefix={prefix}"
    raise ValueError(kind)


def opened(url: str, request: pytest.FixtureRequest) -> SessionStore:
    """``open_store(url)``, closed after the test."""
    store = open_store(url)
    close = getattr(store, "close", None)
    if callable(close):
        request.addfinalizer(close)
    return store


def items() -> Iterator[dict[str, Any]]:
    """Input items of every kind a run stores, endlessly (each one different)."""
    n = 0
    while True:
        n += 1
        yield {"role": "user", "content": f"question {n} — ünïcode ✓"}
        yield {
            "type": "reasoning",
            "id": f"rs_{n}",
            "summary": [{"type": "summary_text", "text": f"thinking {n}"}],
            "encrypted_content": None,
        }
        yield {
            "type": "function_call",
            "id": f"fc_{n}",
            "call_id": f"call_{n}",
            "name": "lookup",
            "arguments": '{"q": "x", "n": ' + str(n) + "}",
            "status": "completed",
        }
        yield {
            "type": "function_call_output",
            "call_id": f"call_{n}",
            # shaped like perdure's own markers: content is data
            "output": {"__bytes_encoded__": True, "data": "AAEC"},
        }
        yield {
            "type": "message",
            "id": f"msg_{n}",
            "role": "assistant",
            "status": "completed",
            "content": [
                {"type": "output_text", "text": f"answer {n}", "annotations": [], "logprobs": []}
            ],
        }
        yield {"role": "developer", "content": [{"type": "input_text", "text": "be brief"}]}
        yield {"type": "computer_call_output", "call_id": f"cc_{n}", "output": {"n": [1, 2.5]}}
