"""The memory part of ``perdure demo``: stored in session 1, recalled by a new agent."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

from perdure.cli.demo_memory import NAMESPACE, SECOND_PROMPT, recall_answer, run_memory_demo
from perdure.cli.style import Style
from perdure.memory import LocalMemoryStore


def test_a_new_agent_recalls_what_the_first_session_stored(tmp_path: Path) -> None:
    out = io.StringIO()
    asyncio.run(run_memory_demo(out, Style(False), tmp_path / "data"))
    text = out.getvalue()
    session_2 = text.split("Session 2", 1)[1].split("Another user", 1)[0]
    assert "⚙ add_memory" in text.split("Session 2", 1)[0]
    assert "extracted in the background: The user's gift budget is $50 at most." in text
    # The answer is computed from the injected block: it proves the recall.
    assert "Dark mode — you told me you use it everywhere." in session_2
    assert "Your usual gift budget is $50 at most." in session_2
    assert '<entry source="local">The user prefers dark mode in every app.</entry>' in session_2
    assert "no <memory> block" in session_2
    stranger = text.split("Another user", 1)[1]
    assert "I don't know your preferences yet" in stranger
    assert "\x1b[" not in text


def test_running_twice_stores_nothing_twice(tmp_path: Path) -> None:
    for _ in range(2):
        asyncio.run(run_memory_demo(io.StringIO(), Style(False), tmp_path))
    store = LocalMemoryStore(tmp_path / "memory.sqlite", namespace=NAMESPACE)
    assert asyncio.run(store.count()) == 2
    store.close()


def test_colours_when_asked(tmp_path: Path) -> None:
    out = io.StringIO()
    asyncio.run(run_memory_demo(out, Style(True), tmp_path))
    assert "\x1b[1m" in out.getvalue()


def test_the_scripted_model_answers_only_from_memory() -> None:
    bare = [{"role": "user", "content": [{"text": SECOND_PROMPT}]}]
    assert recall_answer(bare).startswith("I don't know")  # type: ignore[arg-type]
    with_memory = [
        {
            "role": "user",
            "content": [
                {
                    "text": "<memory>\n"
                    '<entry source="x">Budget: $30 &amp; no more</entry>\n</memory>'
                },
                {"text": SECOND_PROMPT},
            ],
        }
    ]
    assert recall_answer(with_memory) == "Your usual gift budget is $30 at most."  # type: ignore[arg-type]
