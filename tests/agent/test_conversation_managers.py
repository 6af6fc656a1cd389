"""Conversation managers and the tool-pair rules they share."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perdure.agent.conversation import (
    ConversationManager,
    NullConversationManager,
    SlidingWindowConversationManager,
    SupportsMessages,
    repair_tool_pairs,
)
from perdure.agent.conversation.pairing import (
    INTERRUPTED_TOOL_RESULT_TEXT,
    find_cut_index,
    find_latest_cut_index,
    is_valid_cut,
    placeholder_tool_result,
    tail_repairs,
)
from perdure.agent.conversation.sliding_window import MIN_TRUNCATABLE_CHARS
from perdure.types import ContentBlock, Message

# --- builders and an independent validity checker -----------------------------------


@dataclass
class FakeAgent:
    messages: list[Message] = field(default_factory=list)


def user(text: str = "hi") -> Message:
    return {"role": "user", "content": [{"text": text}]}


def assistant(text: str = "hello") -> Message:
    return {"role": "assistant", "content": [{"text": text}]}


def tool_use(*ids: str) -> Message:
    return {
        "role": "assistant",
        "content": [{"toolUse": {"toolUseId": i, "name": "t", "input": {}}} for i in ids],
    }


def result_block(tool_use_id: str, text: str = "ok") -> ContentBlock:
    return {
        "toolResult": {"toolUseId": tool_use_id, "status": "success", "content": [{"text": text}]}
    }


def tool_results(*ids: str, text: str = "ok") -> Message:
    return {"role": "user", "content": [result_block(i, text) for i in ids]}


def _ids(message: Message, key: str) -> list[str]:
    if key == "toolUse":
        return [b["toolUse"]["toolUseId"] for b in message["content"] if "toolUse" in b]
    return [b["toolResult"]["toolUseId"] for b in message["content"] if "toolResult" in b]


def pair_problems(messages: list[Message]) -> list[str]:
    """Every orphan toolResult and every unanswered toolUse (but one in the last message)."""
    problems = []
    for index, message in enumerate(messages):
        uses = _ids(message, "toolUse") if message["role"] == "assistant" else []
        if uses and index != len(messages) - 1:
            nxt = messages[index + 1]
            answered = _ids(nxt, "toolResult") if nxt["role"] == "user" else []
            problems += [f"unanswered toolUse {u} at {index}" for u in uses if u not in answered]
        previous = messages[index - 1] if index else None
        allowed = _ids(previous, "toolUse") if previous and previous["role"] == "assistant" else []
        results = _ids(message, "toolResult")
        if message["role"] != "user" and results:
            problems.append(f"toolResult in a {message['role']} message at {index}")
        seen: set[str] = set()
        for r in results:
            if r not in allowed or r in seen:
                problems.append(f"orphan toolResult {r} at {index}")
            seen.add(r)
    return problems


def starts_fresh(messages: list[Message]) -> bool:
    return not messages or (messages[0]["role"] == "user" and not _ids(messages[0], "toolResult"))


@st.composite
def conversations(draw: st.DrawFn) -> list[Message]:
    """Valid histories: user turns with tool loops; the last may end with a pending toolUse."""
    counter = iter(range(10_000))
    messages: list[Message] = []
    turns = draw(st.integers(min_value=1, max_value=6))
    for turn in range(turns):
        messages.append(user(f"prompt {turn}"))
        for _ in range(draw(st.integers(min_value=0, max_value=3))):
            ids = [f"t{next(counter)}" for _ in range(draw(st.integers(1, 3)))]
            messages.append(tool_use(*ids))
            answer = tool_results(*draw(st.permutations(ids)))
            if draw(st.booleans()):
                answer["content"].append({"text": "and more"})
            messages.append(answer)
        if turn == turns - 1 and draw(st.booleans()):
            messages.append(tool_use(f"t{next(counter)}"))  # pending at the end
        else:
            messages.append(assistant(f"answer {turn}"))
    return messages


@given(conversations())
def test_generated_conversations_are_valid(messages: list[Message]) -> None:
    assert pair_problems(messages) == []
    assert starts_fresh(messages)


def test_checker_catches_problems() -> None:
    # The checker the properties rely on must itself see breakage.
    assert pair_problems([user(), tool_use("a"), user()]) != []
    assert pair_problems([user(), assistant(), tool_results("a")]) != []
    assert pair_problems([tool_results("a")]) != []
    assert pair_problems([user(), tool_use("a")]) == []
    assert not starts_fresh([tool_results("a"), assistant()])
    assert not starts_fresh([assistant()])


# --- pairing: cut points ------------------------------------------------------------


TOOL_HISTORY: list[Message] = [
    user("q1"),  # 0
    tool_use("a"),  # 1
    tool_results("a"),  # 2
    assistant("done"),  # 3
    user("q2"),  # 4
    assistant("sure"),  # 5
]


def test_is_valid_cut() -> None:
    assert [is_valid_cut(TOOL_HISTORY, i) for i in range(len(TOOL_HISTORY) + 1)] == [
        True,
        False,  # assistant
        False,  # toolResult would lose its toolUse
        False,  # assistant
        True,
        False,
        False,  # never drop everything
    ]


def test_is_valid_cut_refuses_user_message_with_tool_use() -> None:
    odd: list[Message] = [
        user(),
        {"role": "user", "content": [{"toolUse": {"toolUseId": "x", "name": "t", "input": {}}}]},
    ]
    assert not is_valid_cut(odd, 1)


@pytest.mark.parametrize("index", [-1, 7])
def test_is_valid_cut_out_of_range(index: int) -> None:
    with pytest.raises(ValueError, match="index"):
        is_valid_cut(TOOL_HISTORY, index)


def test_find_cut_index() -> None:
    assert find_cut_index(TOOL_HISTORY, 0) == 0
    assert find_cut_index(TOOL_HISTORY, 1) == 4
    assert find_cut_index(TOOL_HISTORY, 4) == 4
    assert find_cut_index(TOOL_HISTORY, 5) is None
    assert find_cut_index(TOOL_HISTORY, 99) is None
    with pytest.raises(ValueError, match="min_remove"):
        find_cut_index(TOOL_HISTORY, -1)


def test_find_latest_cut_index() -> None:
    assert find_latest_cut_index(TOOL_HISTORY, 99) == 4
    assert find_latest_cut_index(TOOL_HISTORY, 4) == 4
    assert find_latest_cut_index(TOOL_HISTORY, 3) is None
    assert find_latest_cut_index(TOOL_HISTORY, 0) is None
    assert find_latest_cut_index([], 5) is None


# --- pairing: repair_tool_pairs -------------------------------------------------------


def placeholder(tool_use_id: str) -> ContentBlock:
    return {
        "toolResult": {
            "toolUseId": tool_use_id,
            "status": "error",
            "content": [{"text": "Tool execution was interrupted; no result was recorded."}],
        }
    }


def test_placeholder_shape() -> None:
    assert placeholder_tool_result("x") == placeholder("x")
    assert INTERRUPTED_TOOL_RESULT_TEXT in json.dumps(placeholder("x"))


def test_repair_dangling_tool_use_before_user_message() -> None:
    history = [user("q"), tool_use("a"), user("go on"), assistant()]
    repaired, changes = repair_tool_pairs(history)
    assert changes == 1
    assert repaired[2] == {"role": "user", "content": [placeholder("a"), {"text": "go on"}]}
    assert repaired[:2] == history[:2]
    assert repaired[3] == history[3]
    assert pair_problems(repaired) == []


def test_repair_dangling_tool_use_before_assistant_message() -> None:
    history = [user("q"), tool_use("a", "b"), assistant("later")]
    repaired, changes = repair_tool_pairs(history)
    assert changes == 2
    assert repaired == [
        user("q"),
        tool_use("a", "b"),
        {"role": "user", "content": [placeholder("a"), placeholder("b")]},
        assistant("later"),
    ]


def test_repair_partially_answered_tool_use() -> None:
    history: list[Message] = [
        user(),
        tool_use("a", "b", "c"),
        {"role": "user", "content": [result_block("b"), {"text": "note"}]},
        assistant(),
    ]
    repaired, changes = repair_tool_pairs(history)
    assert changes == 2
    assert repaired[2]["content"] == [
        result_block("b"),
        placeholder("a"),
        placeholder("c"),
        {"text": "note"},
    ]


def test_repair_drops_leading_orphan_tool_result_and_empty_message() -> None:
    history = [tool_results("x"), assistant("a"), user("q"), assistant("b")]
    repaired, changes = repair_tool_pairs(history)
    assert changes == 1
    assert repaired == history[1:]


def test_repair_drops_orphan_but_keeps_other_content() -> None:
    history: list[Message] = [
        user(),
        assistant(),
        {"role": "user", "content": [result_block("x"), {"text": "keep me"}]},
        assistant(),
    ]
    repaired, changes = repair_tool_pairs(history)
    assert changes == 1
    assert repaired[2] == user("keep me")


def test_repair_wrong_id_drops_result_and_adds_placeholder() -> None:
    history = [user(), tool_use("a"), tool_results("b"), assistant()]
    repaired, changes = repair_tool_pairs(history)
    assert changes == 2
    assert repaired[2] == {"role": "user", "content": [placeholder("a")]}


def test_repair_drops_duplicate_result() -> None:
    history = [user(), tool_use("a"), tool_results("a", "a"), assistant()]
    repaired, changes = repair_tool_pairs(history)
    assert changes == 1
    assert repaired[2] == tool_results("a")


def test_repair_drops_tool_result_in_assistant_message() -> None:
    history: list[Message] = [
        user(),
        {"role": "assistant", "content": [result_block("a"), {"text": "x"}]},
    ]
    repaired, changes = repair_tool_pairs(history)
    assert changes == 1
    assert repaired == [user(), assistant("x")]


def test_repair_leaves_pending_last_tool_use() -> None:
    history = [user(), tool_use("a", "b")]
    repaired, changes = repair_tool_pairs(history)
    assert changes == 0
    assert repaired == history
    assert repaired[1] is history[1]


def test_repair_valid_history_is_unchanged() -> None:
    history = copy.deepcopy(TOOL_HISTORY)
    repaired, changes = repair_tool_pairs(history)
    assert changes == 0
    assert repaired == history
    assert repaired is not history
    assert all(a is b for a, b in zip(repaired, history, strict=True))


def test_repair_empty() -> None:
    assert repair_tool_pairs([]) == ([], 0)


def test_repair_does_not_mutate_input() -> None:
    history = [tool_results("x"), user(), tool_use("a"), user("next"), tool_use("b"), assistant()]
    before = copy.deepcopy(history)
    repair_tool_pairs(history)
    assert history == before


@st.composite
def broken_conversations(draw: st.DrawFn) -> list[Message]:
    messages = draw(conversations())
    keep = draw(st.lists(st.booleans(), min_size=len(messages), max_size=len(messages)))
    return [m for m, k in zip(messages, keep, strict=True) if k]


@given(broken_conversations())
def test_repair_property_valid_and_idempotent(history: list[Message]) -> None:
    before = copy.deepcopy(history)
    repaired, changes = repair_tool_pairs(history)
    assert history == before
    assert pair_problems(repaired) == []
    assert (changes == 0) == (repaired == history)
    again, second_changes = repair_tool_pairs(repaired)
    assert second_changes == 0
    assert again == repaired


def _reference_repair(messages: list[Message]) -> tuple[list[Message], int]:
    """The plain statement of repair_tool_pairs's rules, one message at a time, with no
    fast path: the library's version must agree with it on every history."""
    repaired: list[Message] = []
    changes = 0
    for message in messages:
        previous = repaired[-1] if repaired else None
        open_ids: list[str] = []
        if previous is not None and previous["role"] == "assistant":
            for block in previous["content"]:
                if "toolUse" in block and block["toolUse"]["toolUseId"] not in open_ids:
                    open_ids.append(block["toolUse"]["toolUseId"])
        content: list[Any] = []
        changed = 0
        if message["role"] == "user":
            answered: list[str] = []
            at = 0
            for block in message["content"]:
                if "toolResult" in block:
                    tid = block["toolResult"]["toolUseId"]
                    if tid not in open_ids or tid in answered:
                        changed += 1
                        continue
                    answered.append(tid)
                    content.append(block)
                    at = len(content)
                else:
                    content.append(block)
            missing = [tid for tid in open_ids if tid not in answered]
            content[at:at] = [placeholder_tool_result(tid) for tid in missing]
            changed += len(missing)
        else:
            if open_ids:
                repaired.append(
                    {"role": "user", "content": [placeholder_tool_result(t) for t in open_ids]}
                )
                changes += len(open_ids)
            content = [block for block in message["content"] if "toolResult" not in block]
            changed = len(message["content"]) - len(content)
        if not changed:
            repaired.append(message)
        else:
            changes += changed
            if content:
                repaired.append({"role": message["role"], "content": content})
    return repaired, changes


@given(broken_conversations())
def test_repair_agrees_with_the_plain_statement_of_its_rules(history: list[Message]) -> None:
    repaired, changes = repair_tool_pairs(history)
    expected, expected_changes = _reference_repair(history)
    assert (repaired, changes) == (expected, expected_changes)
    kept_as_is = {id(m) for m in expected if any(m is h for h in history)}
    assert {id(m) for m in repaired if any(m is h for h in history)} == kept_as_is


@given(conversations())
def test_repair_property_valid_input_untouched(history: list[Message]) -> None:
    assert repair_tool_pairs(history) == (history, 0)


@given(broken_conversations(), st.data())
def test_tail_repairs_are_the_whole_repair_when_the_head_is_valid(
    history: list[Message], data: st.DataObject
) -> None:
    # A resume reads only the end of a history: what it decides about that end must
    # be what repairing the whole history would decide.
    split = data.draw(st.integers(min_value=0, max_value=len(history)))
    head, tail = history[:split], history[split:]
    changes = tail_repairs(head[-1] if head else None, tail)
    if repair_tool_pairs(head)[1] == 0:
        assert changes == repair_tool_pairs(history)[1]


def test_tail_repairs_see_the_tool_use_just_before_the_tail() -> None:
    assert tail_repairs(tool_use("a"), [user("next"), assistant()]) == 1
    assert tail_repairs(tool_use("a"), [tool_results("a"), assistant()]) == 0
    # Results in the message before answer something not read: they count for nothing.
    assert tail_repairs(tool_results("x"), [user(), assistant()]) == 0
    assert tail_repairs(None, [tool_results("x"), assistant()]) == 1
    assert tail_repairs(tool_use("a"), []) == 0


# --- SlidingWindowConversationManager: apply_management --------------------------------


def chat(turns: int) -> list[Message]:
    messages: list[Message] = []
    for turn in range(turns):
        messages += [user(f"q{turn}"), assistant(f"a{turn}")]
    return messages


@pytest.mark.parametrize("window_size", [0, -1, True, 1.5, "4"])
def test_window_size_must_be_positive_int(window_size: Any) -> None:
    with pytest.raises(ValueError, match="window_size"):
        SlidingWindowConversationManager(window_size=window_size)


def test_defaults() -> None:
    manager = SlidingWindowConversationManager()
    assert manager.window_size == 40
    assert manager.should_truncate_results is True
    assert manager.removed_message_count == 0


def test_trims_oldest_in_place() -> None:
    agent = FakeAgent(chat(10))
    original = agent.messages
    expected_tail = list(original[-6:])
    manager = SlidingWindowConversationManager(window_size=6)
    manager.apply_management(agent)
    assert agent.messages is original
    assert agent.messages == expected_tail
    assert manager.removed_message_count == 14


def test_odd_window_keeps_fewer_rather_than_start_with_assistant() -> None:
    agent = FakeAgent(chat(10))
    manager = SlidingWindowConversationManager(window_size=5)
    manager.apply_management(agent)
    assert len(agent.messages) == 4
    assert agent.messages[0] == user("q8")
    assert manager.removed_message_count == 16


def test_within_window_unchanged() -> None:
    agent = FakeAgent(chat(3))
    before = copy.deepcopy(agent.messages)
    manager = SlidingWindowConversationManager(window_size=6)
    manager.apply_management(agent)
    assert agent.messages == before
    assert manager.removed_message_count == 0


def test_removed_count_accumulates() -> None:
    agent = FakeAgent(chat(4))
    manager = SlidingWindowConversationManager(window_size=4)
    manager.apply_management(agent)
    assert manager.removed_message_count == 4
    agent.messages += chat(2)
    manager.apply_management(agent)
    assert manager.removed_message_count == 8
    assert len(agent.messages) == 4


def test_never_starts_with_tool_result() -> None:
    history = [
        user("q1"),
        tool_use("a"),
        tool_results("a"),
        tool_use("b"),
        tool_results("b"),
        assistant("done"),
        user("q2"),
        assistant("ok"),
    ]
    agent = FakeAgent(list(history))
    manager = SlidingWindowConversationManager(window_size=4)
    manager.apply_management(agent)
    assert agent.messages == history[6:]
    assert manager.removed_message_count == 6


def test_keeps_more_than_window_rather_than_split_a_pair() -> None:
    history = [user("old"), assistant("old")]
    history += [user("q")]
    for i in range(3):
        history += [tool_use(f"t{i}"), tool_results(f"t{i}")]
    history += [assistant("done")]
    agent = FakeAgent(list(history))
    manager = SlidingWindowConversationManager(window_size=3)
    manager.apply_management(agent)
    # The only fresh user turn after the first is at index 2.
    assert agent.messages == history[2:]
    assert len(agent.messages) > 3
    assert manager.removed_message_count == 2
    assert pair_problems(agent.messages) == []


def test_no_valid_cut_leaves_history_alone() -> None:
    history = [user("q"), tool_use("a"), tool_results("a"), tool_use("b"), tool_results("b")]
    history.append(assistant())
    agent = FakeAgent(list(history))
    manager = SlidingWindowConversationManager(window_size=2)
    manager.apply_management(agent)
    assert agent.messages == history
    assert manager.removed_message_count == 0


def test_pending_tool_use_in_last_message_is_kept() -> None:
    history = [user("q1"), assistant(), user("q2"), tool_use("p")]
    agent = FakeAgent(list(history))
    manager = SlidingWindowConversationManager(window_size=2)
    manager.apply_management(agent)
    assert agent.messages == [user("q2"), tool_use("p")]


@given(conversations(), st.integers(min_value=1, max_value=12))
def test_sliding_window_never_orphans(history: list[Message], window_size: int) -> None:
    agent = FakeAgent(copy.deepcopy(history))
    original = agent.messages
    manager = SlidingWindowConversationManager(window_size=window_size)
    manager.apply_management(agent)
    kept = agent.messages
    assert kept is original
    assert pair_problems(kept) == []
    assert starts_fresh(kept)
    assert kept == history[len(history) - len(kept) :]
    assert manager.removed_message_count == len(history) - len(kept)
    # Within the window whenever some fresh user turn allows it, keeping the most.
    excess = len(history) - window_size
    fresh = [i for i, m in enumerate(history) if m["role"] == "user" and not _ids(m, "toolResult")]
    if excess <= 0:
        assert kept == history
    elif any(i >= excess for i in fresh):
        assert len(history) - len(kept) == min(i for i in fresh if i >= excess)
    elif any(0 < i < excess for i in fresh):
        assert len(history) - len(kept) == max(i for i in fresh if 0 < i < excess)
    else:
        assert kept == history


# --- SlidingWindowConversationManager: reduce_context ----------------------------------


def big_tool_history(*sizes: int) -> list[Message]:
    history: list[Message] = [user("q")]
    for i, size in enumerate(sizes):
        history += [tool_use(f"t{i}"), tool_results(f"t{i}", text="x" * size)]
    history.append(assistant("done"))
    return history


def test_reduce_truncates_largest_tool_result_first() -> None:
    agent = FakeAgent(big_tool_history(300, 1000, 500))
    original_list = agent.messages
    original_message = agent.messages[4]
    snapshot = copy.deepcopy(original_message)
    manager = SlidingWindowConversationManager()
    manager.reduce_context(agent)
    assert agent.messages is original_list
    assert len(agent.messages) == 8
    assert manager.removed_message_count == 0
    assert agent.messages[4]["content"] == [
        {
            "toolResult": {
                "toolUseId": "t1",
                "status": "success",
                "content": [{"text": "[truncated: 1000 characters]"}],
            }
        }
    ]
    # The message was replaced, not edited: whoever held it still has the original.
    assert original_message == snapshot
    assert agent.messages[2] == tool_results("t0", text="x" * 300)
    # Next call picks the next largest.
    manager.reduce_context(agent)
    assert agent.messages[6]["content"][0]["toolResult"]["content"] == [
        {"text": "[truncated: 500 characters]"}
    ]
    assert pair_problems(agent.messages) == []


def test_reduce_keeps_error_status_when_truncating() -> None:
    history = big_tool_history(MIN_TRUNCATABLE_CHARS + 1)
    history[2]["content"][0]["toolResult"]["status"] = "error"
    agent = FakeAgent(history)
    SlidingWindowConversationManager().reduce_context(agent)
    assert agent.messages[2]["content"][0]["toolResult"]["status"] == "error"


def test_reduce_trims_when_results_are_small() -> None:
    history = chat(2) + big_tool_history(MIN_TRUNCATABLE_CHARS) + chat(2)
    agent = FakeAgent(list(history))
    manager = SlidingWindowConversationManager()
    manager.reduce_context(agent)
    # half = 6; index 6 (a toolResult) is not a valid cut, 8 (a fresh user turn) is.
    assert agent.messages == history[8:]
    assert manager.removed_message_count == 8


def test_reduce_trims_when_truncation_disabled() -> None:
    history = chat(2) + big_tool_history(5000, 10, 10)
    agent = FakeAgent(list(history))
    manager = SlidingWindowConversationManager(should_truncate_results=False)
    manager.reduce_context(agent)
    # half = 6; no valid cut at or after 6 (a tool loop follows), the latest before is 4.
    assert agent.messages == history[4:]
    assert manager.removed_message_count == 4
    assert agent.messages[2]["content"][0]["toolResult"]["content"][0]["text"] == "x" * 5000


def test_reduce_trims_roughly_half() -> None:
    agent = FakeAgent(chat(10))
    manager = SlidingWindowConversationManager()
    manager.reduce_context(agent)
    assert agent.messages == chat(10)[10:]
    assert manager.removed_message_count == 10


def test_reduce_raises_given_exception_when_impossible() -> None:
    agent = FakeAgent([user(), assistant()])
    overflow = RuntimeError("context window overflow")
    with pytest.raises(RuntimeError) as info:
        SlidingWindowConversationManager().reduce_context(agent, overflow)
    assert info.value is overflow
    assert agent.messages == [user(), assistant()]


def test_reduce_raises_value_error_without_exception() -> None:
    agent = FakeAgent([user(), tool_use("a"), tool_results("a", text="y" * 10), assistant()])
    manager = SlidingWindowConversationManager()
    with pytest.raises(ValueError, match="cannot reduce"):
        manager.reduce_context(agent)
    assert manager.removed_message_count == 0


@given(conversations())
def test_reduce_property_keeps_history_valid(history: list[Message]) -> None:
    agent = FakeAgent(copy.deepcopy(history))
    manager = SlidingWindowConversationManager(should_truncate_results=False)
    try:
        manager.reduce_context(agent)
    except ValueError:
        assert agent.messages == history
        return
    assert 0 < len(agent.messages) < len(history)
    assert pair_problems(agent.messages) == []
    assert starts_fresh(agent.messages)
    assert manager.removed_message_count == len(history) - len(agent.messages)


# --- state ----------------------------------------------------------------------------


def test_state_round_trip() -> None:
    agent = FakeAgent(chat(10))
    manager = SlidingWindowConversationManager(window_size=4)
    manager.apply_management(agent)
    state = manager.get_state()
    assert state == {"__name__": "SlidingWindowConversationManager", "removed_message_count": 16}
    restored = SlidingWindowConversationManager(window_size=4)
    assert restored.restore_from_session(json.loads(json.dumps(state))) is None
    assert restored.removed_message_count == 16
    assert restored.get_state() == state


def test_restore_refuses_other_class() -> None:
    state = NullConversationManager().get_state()
    with pytest.raises(ValueError, match="NullConversationManager") as info:
        SlidingWindowConversationManager().restore_from_session(state)
    assert "SlidingWindowConversationManager" in str(info.value)


@pytest.mark.parametrize("count", [None, -1, "3", True, 2.0])
def test_restore_refuses_bad_count(count: Any) -> None:
    state: dict[str, Any] = {"__name__": "SlidingWindowConversationManager"}
    if count is not None:
        state["removed_message_count"] = count
    manager = SlidingWindowConversationManager()
    with pytest.raises(ValueError, match="removed_message_count"):
        manager.restore_from_session(state)
    assert manager.removed_message_count == 0


def test_restore_refuses_non_dict() -> None:
    with pytest.raises(TypeError, match="state"):
        SlidingWindowConversationManager().restore_from_session([])  # type: ignore[arg-type]


# --- NullConversationManager and the base class ---------------------------------------


def test_null_manager_changes_nothing() -> None:
    agent = FakeAgent(chat(50))
    manager = NullConversationManager()
    manager.apply_management(agent)
    assert agent.messages == chat(50)
    assert manager.get_state() == {
        "__name__": "NullConversationManager",
        "removed_message_count": 0,
    }


def test_null_manager_reraises() -> None:
    agent = FakeAgent(chat(50))
    overflow = RuntimeError("overflow")
    with pytest.raises(RuntimeError) as info:
        NullConversationManager().reduce_context(agent, overflow)
    assert info.value is overflow
    with pytest.raises(ValueError, match="never reduces"):
        NullConversationManager().reduce_context(agent)
    assert agent.messages == chat(50)


def test_base_is_abstract() -> None:
    with pytest.raises(TypeError):
        ConversationManager()  # type: ignore[abstract]


class KeepLast(ConversationManager):
    """A subclass that extends the state and prepends a summary on restore."""

    def __init__(self) -> None:
        super().__init__()
        self.summary = ""

    def apply_management(self, agent: SupportsMessages) -> None:
        if len(agent.messages) > 2:
            self.removed_message_count += len(agent.messages) - 2
            agent.messages[:] = agent.messages[-2:]

    def reduce_context(self, agent: SupportsMessages, exception: Exception | None = None) -> None:
        raise ValueError("no")

    def get_state(self) -> dict[str, Any]:
        return {**super().get_state(), "summary": self.summary}

    def restore_from_session(self, state: dict[str, Any]) -> list[Message] | None:
        super().restore_from_session(state)
        self.summary = state["summary"]
        return [user(f"summary: {self.summary}")]


def test_subclass_state_extension() -> None:
    manager = KeepLast()
    manager.summary = "s"
    manager.apply_management(FakeAgent(chat(3)))
    state = manager.get_state()
    assert state == {"__name__": "KeepLast", "removed_message_count": 4, "summary": "s"}
    other = KeepLast()
    assert other.restore_from_session(state) == [user("summary: s")]
    assert other.removed_message_count == 4
    with pytest.raises(ValueError, match="KeepLast"):
        SlidingWindowConversationManager().restore_from_session(state)
