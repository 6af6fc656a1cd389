"""The memory part of ``perdure demo``: a preference told in one session, recalled in the next.

Session 1: the user mentions a preference (dark mode) and their usual gift budget.
The model saves the first with the ``add_memory`` tool; background extraction
distils the second from the conversation. Both land in a :class:`LocalMemoryStore`
file. Session 2 is a brand-new agent — new store object, new manager, empty
history, as in a restarted process. The memory manager injects what it finds into
that one request; the scripted model's answer is computed from the ``<memory>``
block it receives, so the recall is real. The injected block is never in the
agent's history.
"""

from __future__ import annotations

import asyncio
import html
import json
import re
from pathlib import Path
from typing import Any, TextIO

from perdure.agent import Agent
from perdure.cli.style import Style
from perdure.cli.transcript import stream_transcript
from perdure.memory import ExtractionConfig, LocalMemoryStore, MemoryManager
from perdure.models import ScriptedModel
from perdure.types import Message

__all__ = ["FIRST_PROMPT", "NAMESPACE", "SECOND_PROMPT", "recall_answer", "run_memory_demo"]

NAMESPACE = "demo-user"
FIRST_PROMPT = (
    "Before we start: I always use dark mode, everywhere. Oh, and for presents I never "
    "spend more than $50."
)
SECOND_PROMPT = "Light or dark mode for my new dashboard? And what is my usual gift budget?"
_DARK_MODE = "The user prefers dark mode in every app."
_BUDGET = "The user's gift budget is $50 at most."

_ENTRY = re.compile(r'<entry source="[^"]*">(.*?)</entry>', re.S)


def _memory_entries(messages: list[Message]) -> list[str]:
    """The (unescaped) entries of the ``<memory>`` block in the request's last message."""
    texts = [block.get("text", "") for block in messages[-1]["content"]] if messages else []
    block = next((text for text in texts if text.startswith("<memory>")), "")
    return [html.unescape(entry) for entry in _ENTRY.findall(block)]


def recall_answer(messages: list[Message]) -> str:
    """The scripted model of session 2: it answers only from the injected memories."""
    entries = _memory_entries(messages)
    if not entries:
        return "I don't know your preferences yet — light or dark? And what budget do you have?"
    facts = " ".join(entries).lower()
    parts = []
    if "dark mode" in facts:
        parts.append("Dark mode — you told me you use it everywhere.")
    budget = re.search(r"\$\d+", facts)
    if budget:
        parts.append(f"Your usual gift budget is {budget.group(0)} at most.")
    return " ".join(parts) or "I remember something, but not about that."


async def _converse(agent: Agent, prompt: str, out: TextIO, s: Style) -> None:
    out.write(s("  user › ", "blue") + prompt + "\n")
    await stream_transcript(agent, prompt, out, s)


async def run_memory_demo(out: TextIO, style: Style, data_dir: Path) -> None:
    """Run the two sessions, writing a readable transcript to ``out``.

    Memories go to ``data_dir / "memory.sqlite"`` (namespace ``demo-user``); running
    it twice on one directory stores nothing twice.
    """
    s = style
    await asyncio.to_thread(data_dir.mkdir, parents=True, exist_ok=True)
    path = data_dir / "memory.sqlite"
    out.write("\n" + s("perdure demo — memory that follows the user", "bold") + "\n")

    # --- session 1: the preference is stored ----------------------------------------
    out.write(
        s("Session 1", "bold") + s(" (agent A, memory store " + str(path) + ")", "dim") + "\n"
    )
    store = LocalMemoryStore(path, namespace=NAMESPACE)
    first_script: list[Any] = [
        {
            "role": "assistant",
            "content": [
                {"text": "Let me remember that."},
                {
                    "toolUse": {
                        "toolUseId": "m1",
                        "name": "add_memory",
                        "input": {"content": _DARK_MODE},
                    }
                },
            ],
        },
        "Noted: dark mode from now on, and presents within your budget.",
    ]
    manager = MemoryManager(
        [store],
        add_tool_config=True,
        extraction=ExtractionConfig(extractor=ScriptedModel([f"- {_BUDGET}"])),
    )
    agent = Agent(model=ScriptedModel(first_script), memory_manager=manager)
    await _converse(agent, FIRST_PROMPT, out, s)
    await manager.flush()  # what the sync agent(...) call does after each invocation
    manager.close()
    stored = await store.list()
    out.write(
        s("  ✎ extracted in the background: ", "yellow")
        + ", ".join(e.content for e in stored if (e.metadata or {}).get("source") == "extraction")
        + "\n"
    )
    out.write(
        s(f"  ✔ {len(stored)} memories stored for {NAMESPACE!r}", "green")
        + s(" — agent A and its history are now gone", "dim")
        + "\n"
    )
    store.close()

    # --- session 2: a brand-new agent recalls it ------------------------------------
    out.write(
        s("Session 2", "bold") + s(" (agent B: new store object, empty history)", "dim") + "\n"
    )
    store = LocalMemoryStore(path, namespace=NAMESPACE)
    model = ScriptedModel([recall_answer])
    agent = Agent(model=model, memory_manager=MemoryManager([store]))
    await _converse(agent, SECOND_PROMPT, out, s)
    injected = next(
        (
            b["text"]
            for b in model.requests[0]["messages"][-1]["content"]
            if b.get("text", "").startswith("<memory>")
        ),
        None,
    )
    out.write(s("  what the model received, folded into this request only:", "yellow") + "\n")
    for line in (injected or "(nothing)").splitlines():
        out.write("    " + s(line, "dim") + "\n")
    in_history = "<memory>" in json.dumps(agent.messages)
    out.write(
        s(f"  ✔ agent.messages: {len(agent.messages)} messages, ", "green")
        + s("no <memory> block" if not in_history else "CONTAINS the injected block!", "green")
        + "\n"
    )
    store.close()

    # --- another user sees nothing ---------------------------------------------------
    stranger = LocalMemoryStore(path, namespace="another-user")
    model = ScriptedModel([recall_answer])
    agent = Agent(model=model, memory_manager=MemoryManager([stranger]))
    out.write(s("Another user", "bold") + s(" (namespace 'another-user', same file)", "dim") + "\n")
    await _converse(agent, SECOND_PROMPT, out, s)
    stranger.close()
