"""Shared by the LangGraph adapter tests: LangGraph (or a skip), storage URLs by kind."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import postgres_server
import redis_server
import s3_server

IN_CI = os.environ.get("CI") == "true"
STORAGE_KINDS = ["file", "sqlite", "memory", "postgres", "redis", "s3"]


def import_langgraph() -> Any:
    """LangGraph's checkpoint package; the module is skipped without it (failed under
    CI=true, where the ``dev`` extra installs it)."""
    try:
        import langgraph.checkpoint.base
    except ImportError:
        if IN_CI:
            raise
        pytest.skip(
            "LangGraph is not installed: pip install 'perdure[langgraph]'",
            allow_module_level=True,
        )
    return langgraph.checkpoint.base


def storage_url(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> str:
    """A fresh storage URL of ``kind`` (server kinds skip without a server, fail in CI)."""
    if kind == "file":
        return f"file:{tmp_path / 'blobs'}"
    if kind == "sqlite":
        return f"sqlite:{tmp_path / 'blobs.db'}"
    if kind == "memory":
        return "memory:"
    if kind == "postgres":
        return postgres_server.store_url(request)
    if kind == "redis":
        url = redis_server.require_server()
        prefix = redis_server.new_prefix()
        request.addfinalizer(lambda: redis_server.drop_prefix(prefix))
        return f"{url}?prefix={prefix}"
    if kind == "s3":
        endpoint = s3_server.endpoint()
        for name, value in s3_server.ENV.items():
            monkeypatch.setenv(name, value)
        bucket = s3_server.new_bucket()
        return f"s3://{bucket}/graphs?endpoint_url={endpoint}&region=us-east-1"
    raise ValueError(kind)
