"""Nothing perdure logs carries message content (SPEC §9), at any level, by default.

An agent run with tools (one of which fails), loop checkpoints, a session with
checkpoints, an export, a compaction and a restore, a snapshot manager, memory
injection and extraction (which fails once) — every message full of an email, a
phone number, a card and an IBAN — with every logger at DEBUG; then the whole log
output, tracebacks included, is searched for those values.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from perdure import Agent, SlidingWindowConversationManager, SnapshotSessionManager, tool
from perdure.hygiene import PersistedItem
from perdure.memory import ExtractionConfig, LocalMemoryStore, MemoryManager
from perdure.models import ScriptedModel
from perdure.session import FileSessionStore, Session
from perdure.storage import LocalFileStorage
from pii import CARD, EMAIL, FORBIDDEN, IBAN, PHONE, SECRETS


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture
def captured() -> Iterator[_Capture]:
    handler = _Capture()
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


@tool
def find_account(card: str) -> str:
    """Find the bank account paid with a card.

    Args:
        card: the card number.
    """
    return f"card {card} pays into IBAN {IBAN}; owner {EMAIL}"


@tool
def charge(card: str) -> str:
    """Charge a card.

    Args:
        card: the card number.
    """
    raise ValueError(f"card {card} was declined; call {PHONE}")


def _script() -> list[Any]:
    def use(tool_id: str, name: str) -> dict[str, Any]:
        return {
            "role": "assistant",
            "content": [
                {"text": f"Working on {CARD} for {EMAIL}."},
                {"toolUse": {"toolUseId": tool_id, "name": name, "input": {"card": CARD}}},
            ],
        }

    return [
        use("t1", "find_account"),
        use("t2", "charge"),
        f"Your IBAN is {IBAN}; the charge failed, call {PHONE}.",
        f"Noted, {EMAIL}.",
        f"Summary: {EMAIL} {PHONE} {CARD} {IBAN}.",
    ]


def test_a_full_run_logs_no_message_content(captured: _Capture, tmp_path: Path) -> None:
    memory = LocalMemoryStore(tmp_path / "memory.sqlite", namespace="alice")
    asyncio.run(memory.add(f"The user's email is {EMAIL}."))
    extractor = ScriptedModel([f"- The user's card is {CARD}."])  # then fails: out of answers
    manager = MemoryManager([memory], extraction=ExtractionConfig(extractor=extractor))
    store = FileSessionStore(tmp_path / "sessions")
    session = Session(store, "s1")
    agent = Agent(
        model=ScriptedModel(_script()),
        tools=[find_account, charge],
        session_manager=session,
        memory_manager=manager,
        conversation_manager=SlidingWindowConversationManager(window_size=40),
        checkpointing=True,
    )
    prompt = f"I am {EMAIL}, phone {PHONE}; pay with {CARD} from {IBAN}."
    result = agent(prompt)
    while result.stop_reason == "checkpoint":  # the loop pauses after models and tools
        assert result.checkpoint is not None
        result = agent([{"checkpointResume": {"checkpoint": result.checkpoint.to_dict()}}])
    agent(f"Thanks, {EMAIL}!")  # extraction now fails (the extractor has no answer left)
    mark = asyncio.run(session.checkpoint(f"for {EMAIL}"))
    asyncio.run(session.export_checkpoint(mark.checkpoint_id))
    asyncio.run(session.compact())
    asyncio.run(session.restore(mark.checkpoint_id))
    store.close()

    snapshots = SnapshotSessionManager(
        "snap", storage=LocalFileStorage(tmp_path / "blobs"), save_latest_on="message"
    )
    snapshot_agent = Agent(
        agent_id="a1", model=ScriptedModel(_script()), tools=[find_account, charge],
        session_manager=snapshots,
    )  # fmt: skip
    snapshot_agent(prompt)
    Agent(agent_id="a1", model=ScriptedModel([]), session_manager=SnapshotSessionManager(
        "snap", storage=LocalFileStorage(tmp_path / "blobs")))  # fmt: skip
    manager.close()
    memory.close()

    text = "\n".join(captured.lines)
    assert "charge" in text  # the failing tool was logged …
    assert "extraction" in text  # … and so was the failed extraction
    for secret in SECRETS:
        for form in FORBIDDEN[secret]:
            assert form.decode("latin-1") not in text, f"{secret!r} logged:\n{text}"


def test_a_failing_filter_is_logged_without_what_it_was_given(
    captured: _Capture, tmp_path: Path
) -> None:
    """A filter's own exception may quote the value; perdure logs only its own message."""

    def refuse(kind: str) -> Any:
        def check(item: PersistedItem) -> Any:
            if item.kind == kind:
                raise ValueError(f"refusing {item.value!r}")
            return item.value

        return check

    for kind in ("message", "memory_entry"):
        memory = LocalMemoryStore(tmp_path / f"{kind}.sqlite", namespace="alice")
        manager = MemoryManager(
            [memory],
            injection=False,
            extraction=ExtractionConfig(extractor=ScriptedModel([f"- email {EMAIL}"])),
            filters=[refuse(kind)],
        )
        agent = Agent(model=ScriptedModel([f"Noted, {EMAIL}."]), memory_manager=manager)
        agent(f"I am {EMAIL}, card {CARD}")
        manager.close()
        memory.close()
    text = "\n".join(captured.lines)
    assert "is not buffered" in text  # the message filter failed, and was logged …
    assert "failed: persistence filter 0" in text  # … and so was the entry's, in extraction
    for secret in SECRETS:
        for form in FORBIDDEN[secret]:
            assert form.decode("latin-1") not in text, f"{secret!r} logged:\n{text}"
