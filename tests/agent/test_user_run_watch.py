"""UserRunWatch: the look for consecutive user messages before each model call."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from perdure.agent.conversation.pairing import UserRunWatch


def msg(role: str) -> dict[str, Any]:
    return {"role": role, "content": [{"text": role}]}


def brute(messages: list[Any]) -> bool:
    return any(a["role"] == "user" and b["role"] == "user" for a, b in itertools.pairwise(messages))


def test_a_growing_history_is_looked_at_only_where_it_grew() -> None:
    watch = UserRunWatch()
    history = [msg("user"), msg("assistant")]
    assert not watch.has_runs(history)
    looked: list[int] = []

    class Counting(dict[str, Any]):
        def get(self, key: str, default: Any = None) -> Any:
            looked.append(1)
            return super().get(key, default)

    history.extend([Counting(msg("user")), Counting(msg("assistant"))])
    assert not watch.has_runs(history)
    assert len(looked) == 2  # the two new messages, not the two seen before
    history.append(msg("user"))
    history.append(msg("user"))
    assert watch.has_runs(history)
    history.append(msg("assistant"))
    assert watch.has_runs(history)  # the run is still in the history


def test_a_history_replaced_shortened_or_rewritten_is_looked_at_whole() -> None:
    watch = UserRunWatch()
    history = [msg("user"), msg("user"), msg("assistant")]
    assert watch.has_runs(history)
    fresh = [msg("user"), msg("assistant")]
    assert not watch.has_runs(fresh)  # another list
    history[:] = [msg("user"), msg("assistant")]
    assert not watch.has_runs(history)  # shorter: looked at whole
    history[-1] = msg("user")
    history.append(msg("assistant"))
    assert watch.has_runs(history)  # the last message seen was replaced


@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("append"), st.sampled_from(["user", "assistant"])),
            st.tuples(st.just("pop"), st.just("")),
            st.tuples(st.just("new"), st.sampled_from(["user", "assistant"])),
            st.tuples(st.just("look"), st.just("")),
        ),
        max_size=40,
    )
)
def test_it_agrees_with_a_whole_scan_after_any_changes(ops: list[tuple[str, str]]) -> None:
    watch = UserRunWatch()
    history: list[Any] = []
    for op, role in ops:
        if op == "append":
            history.append(msg(role))
        elif op == "pop" and history:
            history.pop()
        elif op == "new":
            history = [*history, msg(role)]
        assert watch.has_runs(history) == brute(history)
