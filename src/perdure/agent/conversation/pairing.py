"""Pure rules for tool pairs: where a history may be cut, and how a broken one is repaired.

A history is *model-valid* when every ``toolUse`` of an assistant message is answered
by a ``toolResult`` with the same ``toolUseId`` in the very next message (a user
message), and every ``toolResult`` answers a ``toolUse`` of the assistant message just
before it. The only exception is a ``toolUse`` in the **last** message: it is pending
(the loop paused at ``after_model``, or the process died before the tools ran) and is
left for the agent to run or close.

Every function here is pure: the input list and its messages are never mutated. The
conversation managers, sessions and history pages all use these rules, so a cut or a
page boundary is decided the same way everywhere.
"""

from __future__ import annotations

from collections.abc import Sequence

from perdure.types import ContentBlock, Message

__all__ = [
    "INTERRUPTED_TOOL_RESULT_TEXT",
    "find_cut_index",
    "find_latest_cut_index",
    "is_valid_cut",
    "merge_user_runs",
    "placeholder_tool_result",
    "repair_tool_pairs",
    "tail_repairs",
]

INTERRUPTED_TOOL_RESULT_TEXT = "Tool execution was interrupted; no result was recorded."
"""The text of the placeholder result given to a ``toolUse`` that never got one."""


def placeholder_tool_result(
    tool_use_id: str, text: str = INTERRUPTED_TOOL_RESULT_TEXT
) -> ContentBlock:
    """Return an error ``toolResult`` block that closes ``tool_use_id`` without a result."""
    return {
        "toolResult": {
            "toolUseId": tool_use_id,
            "status": "error",
            "content": [{"text": text}],
        }
    }


def is_valid_cut(messages: Sequence[Message], index: int) -> bool:
    """Say whether ``messages[index:]`` may be kept after dropping ``messages[:index]``.

    A cut is valid when the first kept message is a user message holding no
    ``toolResult`` (and no ``toolUse``) block: it then starts a fresh user turn, so no
    kept ``toolResult`` loses its ``toolUse`` and no dropped ``toolUse`` loses its
    result. ``index == len(messages)`` (dropping everything) is never a valid cut.

    Raises:
        ValueError: ``index`` is outside ``0..len(messages)``.
    """
    if not 0 <= index <= len(messages):
        raise ValueError(f"index must be within 0..{len(messages)}, got {index}")
    if index == len(messages):
        return False
    message = messages[index]
    return message["role"] == "user" and not any(
        "toolResult" in block or "toolUse" in block for block in message["content"]
    )


def find_cut_index(messages: Sequence[Message], min_remove: int) -> int | None:
    """Return the smallest valid cut index ``>= min_remove``, or ``None`` if there is none.

    The result is the number of leading messages to drop: the fewest that remove at
    least ``min_remove`` messages without breaking a tool pair.

    Raises:
        ValueError: ``min_remove`` is negative.
    """
    if min_remove < 0:
        raise ValueError(f"min_remove must be >= 0, got {min_remove}")
    for index in range(min_remove, len(messages)):
        if is_valid_cut(messages, index):
            return index
    return None


def find_latest_cut_index(messages: Sequence[Message], max_remove: int) -> int | None:
    """Return the largest valid cut index in ``1..max_remove``, or ``None`` if there is none.

    Used when no cut removes as much as wanted: this removes as much as possible while
    keeping the history valid.
    """
    for index in range(min(max_remove, len(messages) - 1), 0, -1):
        if is_valid_cut(messages, index):
            return index
    return None


class UserRunWatch:
    """Whether a history holds two user messages in a row, looked at incrementally.

    Asked before every model call, where a scan of the whole history would make every
    turn cost more the longer the conversation: an agent's history grows at its end,
    so messages seen by the last look are not looked at again while the list is the
    same object, no shorter, and still holds the message it ended with where it was.
    Any other change (a resume, a compaction, a list set anew) is looked at whole.
    """

    __slots__ = ("_found", "_last", "_list", "_seen")

    def __init__(self) -> None:
        self._list: list[Message] | None = None
        self._seen = 0
        self._last: Message | None = None
        self._found = False

    def has_runs(self, messages: list[Message]) -> bool:
        """True when ``messages`` holds consecutive user messages somewhere."""
        seen = self._seen
        if (
            messages is not self._list
            or len(messages) < seen
            or (seen and messages[seen - 1] is not self._last)
        ):
            seen, self._found = 0, False
        if not self._found:
            after_user = seen > 0 and messages[seen - 1].get("role") == "user"
            for index in range(seen, len(messages)):
                user = messages[index].get("role") == "user"
                if user and after_user:
                    self._found = True
                    break
                after_user = user
        self._list, self._seen = messages, len(messages)
        self._last = messages[-1] if messages else None
        return self._found


def merge_user_runs(messages: Sequence[Message]) -> list[Message]:
    """The request to send for ``messages``: consecutive user messages merged into one.

    A failed model call (or a torn tail) leaves the user's prompt in the history, and
    the next prompt follows it; providers refuse two user messages in a row, or
    read them oddly. The merged message carries every block of the run in order,
    except that ``toolResult`` blocks come first (they must open the turn that
    answers the tool calls). The stored history is not touched: the result is a new
    list, a merged message is a new dict with a new content list, and every other
    message is the same object.
    """
    merged: list[Message] = []
    run = 0  # how many messages the last entry of ``merged`` stands for
    for message in messages:
        if message.get("role") == "user" and merged and merged[-1].get("role") == "user":
            previous = merged[-1]
            if run == 1:
                previous = {"role": "user", "content": list(previous["content"])}
                merged[-1] = previous
            previous["content"].extend(message["content"])
            run += 1
            continue
        if run > 1:
            _results_first(merged[-1])
        merged.append(message)
        run = 1
    if run > 1:
        _results_first(merged[-1])
    return merged


def _results_first(message: Message) -> None:
    """Move ``toolResult`` blocks ahead of the others in a merged message (stable)."""
    message["content"].sort(key=lambda block: "toolResult" not in block)


def _tool_use_ids(message: Message) -> list[str]:
    if message["role"] != "assistant":
        return []
    ids = [block["toolUse"]["toolUseId"] for block in message["content"] if "toolUse" in block]
    return list(dict.fromkeys(ids)) if ids else ids


def _repair_user_content(
    content: list[ContentBlock], open_ids: list[str]
) -> tuple[list[ContentBlock], int]:
    """Keep results that answer ``open_ids`` (once each), add placeholders for the rest."""
    kept: list[ContentBlock] = []
    answered: set[str] = set()
    insert_at = 0
    changes = 0
    for block in content:
        if "toolResult" in block:
            tool_use_id = block["toolResult"]["toolUseId"]
            if tool_use_id not in open_ids or tool_use_id in answered:
                changes += 1
                continue
            answered.add(tool_use_id)
            kept.append(block)
            insert_at = len(kept)
        else:
            kept.append(block)
    missing = [tool_use_id for tool_use_id in open_ids if tool_use_id not in answered]
    # Results go with the other results, ahead of any text: providers expect the
    # toolResult blocks of a user message to come first.
    kept[insert_at:insert_at] = [placeholder_tool_result(tool_use_id) for tool_use_id in missing]
    return kept, changes + len(missing)


def repair_tool_pairs(messages: Sequence[Message]) -> tuple[list[Message], int]:
    """Return a model-valid copy of ``messages`` and the number of changes made.

    * A ``toolUse`` in any message but the last that is not answered by the next
      message gets a placeholder error ``toolResult`` (see
      :func:`placeholder_tool_result`): inserted into the next message when that is a
      user message, else in a new user message right after the ``toolUse``.
    * A ``toolResult`` whose ``toolUseId`` has no ``toolUse`` in the assistant message
      just before it (an orphan, or a second answer to the same id) is dropped; a
      message left with no content by this is dropped too.
    * A ``toolUse`` in the last message is left pending.

    Each placeholder added and each ``toolResult`` dropped counts as one change, so an
    already-valid history comes back equal with ``0`` changes, and repairing a repaired
    history changes nothing. Messages that need no change are returned as the same
    objects (not copies); the input list and its messages are never mutated.
    """
    repaired: list[Message] = []
    changes = 0
    open_ids: list[str] = []  # the toolUse ids of the last message kept
    for message in messages:
        if not open_ids:
            for block in message["content"]:
                if "toolResult" in block:
                    break
            else:
                # Nothing to answer and no result to check: kept as it is (the common
                # case, which a resume of a long history runs once a message).
                repaired.append(message)
                if message["role"] == "assistant":
                    open_ids = _tool_use_ids(message)
                continue
        if message["role"] == "user":
            # Missing answers are filled in here, so this message is never left empty
            # while a toolUse before it is open.
            content, changed = _repair_user_content(message["content"], open_ids)
        else:
            if open_ids:
                repaired.append(
                    {
                        "role": "user",
                        "content": [
                            placeholder_tool_result(tool_use_id) for tool_use_id in open_ids
                        ],
                    }
                )
                changes += len(open_ids)
            content = [block for block in message["content"] if "toolResult" not in block]
            changed = len(message["content"]) - len(content)
        if not changed:
            repaired.append(message)
        else:
            changes += changed
            if content:  # other keys (a message's metadata) are kept
                repaired.append({**message, "content": content})
        open_ids = _tool_use_ids(repaired[-1]) if repaired else []
    # Whatever is open in the last message kept is pending: every message after a
    # toolUse either answers it above or is preceded by a placeholder message, so the
    # last kept message is the input's last message or a user message.
    return repaired, changes


def tail_repairs(before: Message | None, tail: Sequence[Message]) -> int:
    """How many changes :func:`repair_tool_pairs` of a whole history makes in its ``tail``.

    ``tail`` is the history from some index on and ``before`` the message just before
    it (``None`` when ``tail`` is the whole history). When the part before ``tail``
    needs no repair, the whole history's repair makes exactly this many changes, all
    in ``tail``; with ``0`` it returns ``tail`` as it is. So a reader that loads only
    the end of a long history (a session resumed with its conversation manager's
    window) knows whether that end is model-valid without reading the rest: repair
    looks at no message but the one before.
    """
    if before is None:
        return repair_tool_pairs(tail)[1]
    # Only the toolUse ids of the message before decide what the tail must answer;
    # its own results answer a message that was not read, so they are left out.
    context: Message = {
        "role": before["role"],
        "content": [block for block in before["content"] if "toolUse" in block],
    }
    return repair_tool_pairs([context, *tail])[1]
