"""Shared test helpers (import them as `from helpers import ...`)."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from perdure.types import Message

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(name: str) -> ModuleType:
    """Import ``benchmarks/<name>.py`` (the scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(
        f"perdure_benchmark_{name}", BENCHMARKS / f"{name}.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


def tool_call(
    tool_use_id: str, tool_name: str, /, narration: str | None = None, **tool_input: Any
) -> Message:
    """An assistant message asking for one tool call."""
    content: list[Any] = [] if narration is None else [{"text": narration}]
    content.append({"toolUse": {"toolUseId": tool_use_id, "name": tool_name, "input": tool_input}})
    return {"role": "assistant", "content": content}


def tool_calls(*calls: tuple[str, str, dict[str, Any]]) -> Message:
    """An assistant message asking for several tool calls at once."""
    return {
        "role": "assistant",
        "content": [
            {"toolUse": {"toolUseId": tid, "name": name, "input": inp}} for tid, name, inp in calls
        ],
    }


def assert_model_valid(messages: list[Message], *, allow_pending_last: bool = False) -> None:
    """Every toolUse has its toolResult in the next message; no orphan results."""
    for i, message in enumerate(messages):
        uses = [b["toolUse"]["toolUseId"] for b in message["content"] if "toolUse" in b]
        results = [b["toolResult"]["toolUseId"] for b in message["content"] if "toolResult" in b]
        if results:
            assert message["role"] == "user", f"message {i}: toolResult outside a user message"
            previous = messages[i - 1] if i else None
            assert previous is not None, f"message {i}: toolResult with no preceding message"
            asked = [b["toolUse"]["toolUseId"] for b in previous["content"] if "toolUse" in b]
            assert set(results) <= set(asked), (
                f"message {i}: orphan toolResult {results} vs {asked}"
            )
        if uses:
            assert message["role"] == "assistant"
            if i == len(messages) - 1:
                assert allow_pending_last, f"last message {i} has pending toolUse {uses}"
                continue
            nxt = messages[i + 1]
            answered = [b["toolResult"]["toolUseId"] for b in nxt["content"] if "toolResult" in b]
            assert set(uses) <= set(answered), f"message {i}: toolUse {uses} unanswered"


def fork_child(body: Callable[[], object], timeout: int = 20) -> int:
    """Fork; the child runs ``body`` and exits 0 when it returns, 1 when it raises.

    A child still running after ``timeout`` seconds dies by SIGALRM, so a hang
    fails the test instead of stalling the run. Returns the child's pid.
    """
    pid = os.fork()
    if pid == 0:  # the child: never return into the test runner
        code = 1
        try:
            signal.alarm(timeout)
            body()
            code = 0
        finally:
            os._exit(code)
    return pid


def exit_code(pid: int) -> int:
    """Wait for child ``pid``; its exit code (minus the signal that killed it)."""
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def set_created_at(sdir: Path, created_at: str) -> None:
    """Make a file-store session look created at ``created_at``, as a store writes it
    (``meta.json`` carries a sha256 of its fields, so it is rewritten whole)."""
    from perdure.stores.file.layout import meta_bytes

    meta = json.loads((sdir / "meta.json").read_bytes())
    data = meta_bytes(meta["session_id"], created_at, head="head" in meta)
    (sdir / "meta.json").write_bytes(data)


PEER_SDKS = ("agents", "strands", "langgraph", "langchain_core", "sqlalchemy")
"""The top-level modules of the peers' SDKs (benchmarks/peers-requirements.txt)."""


def hide_peer_sdks(monkeypatch: Any) -> None:
    """Make the peers' SDKs unimportable for the test, installed or not.

    perdure's dev environment has some of them (openai-agents, for the adapter); the
    benchmarks' tests of a peers script run without them need them gone, and must not
    run an SDK in-process (one leaves its own event loop unclosed).
    """
    for name in PEER_SDKS:
        for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            monkeypatch.delitem(sys.modules, loaded)
        monkeypatch.setitem(sys.modules, name, None)
