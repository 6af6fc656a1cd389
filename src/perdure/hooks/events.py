"""The events an agent emits to hooks (SPEC §3).

Every event has ``.agent``. ``After*`` events run their callbacks in reverse
registration order, so that a hook that wraps work (opens something before, closes
it after) nests properly with the others.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from perdure.types import Message, StopReason, ToolResult, ToolUse

if TYPE_CHECKING:
    from perdure.agent.agent import Agent
    from perdure.agent.result import AgentResult
    from perdure.tools import AgentTool


@dataclass
class HookEvent:
    """Base of all hook events."""

    agent: Agent
    should_reverse_callbacks: ClassVar[bool] = False


@dataclass
class AgentInitializedEvent(HookEvent):
    """The agent finished construction (session managers restore here)."""


@dataclass
class BeforeInvocationEvent(HookEvent):
    """An invocation starts; ``messages`` are the new messages of its prompt."""

    messages: list[Message] = field(default_factory=list)


@dataclass
class AfterInvocationEvent(HookEvent):
    """An invocation ended, normally (``result``) or with an error (``exception``)."""

    result: AgentResult | None = None
    exception: BaseException | None = None
    should_reverse_callbacks: ClassVar[bool] = True


@dataclass
class MessageAddedEvent(HookEvent):
    """A message was appended to ``agent.messages``."""

    message: Message


@dataclass
class BeforeModelCallEvent(HookEvent):
    """The model is about to be called in cycle ``cycle_index``."""

    cycle_index: int = 0


@dataclass
class AfterModelCallEvent(HookEvent):
    """The model call returned (``message``, ``stop_reason``) or failed (``exception``)."""

    cycle_index: int = 0
    message: Message | None = None
    stop_reason: StopReason | None = None
    exception: BaseException | None = None
    should_reverse_callbacks: ClassVar[bool] = True


@dataclass
class BeforeToolCallEvent(HookEvent):
    """A tool is about to run.

    Set ``cancel_tool`` to a message (or ``True``) to skip the call: the tool does not
    run and its result is an error carrying that message.
    """

    tool_use: ToolUse
    selected_tool: AgentTool | None
    invocation_state: dict[str, Any] = field(default_factory=dict)
    cancel_tool: bool | str = False


@dataclass
class AfterToolCallEvent(HookEvent):
    """A tool call finished; a hook may replace ``result`` (it is what gets recorded)."""

    tool_use: ToolUse
    selected_tool: AgentTool | None
    result: ToolResult
    invocation_state: dict[str, Any] = field(default_factory=dict)
    exception: BaseException | None = None
    should_reverse_callbacks: ClassVar[bool] = True


@dataclass
class BeforeCompactEvent(HookEvent):
    """A compaction is about to fold messages ``[0, end)`` into a summary.

    Set ``cancel`` to a reason (or ``True``) to block it: the compaction is
    rejected with ``hook_blocked`` and nothing is written.
    """

    end: int = 0
    trigger: str = "manual"
    cancel: bool | str = False


@dataclass
class SessionCheckpointedEvent(HookEvent):
    """A session checkpoint was written (before any compaction or restore it guards)."""

    session_id: str = ""
    checkpoint_id: str = ""
    trigger: str = "manual"
    label: str | None = None
    message_count: int = 0


@dataclass
class SessionCompactedEvent(HookEvent):
    """Messages ``removed_range`` were folded into a summary and the store rewritten."""

    session_id: str = ""
    compaction_id: str = ""
    removed_range: tuple[int, int] = (0, 0)
    checkpoint_id: str | None = None
    trigger: str = "manual"


@dataclass
class SessionRestoredEvent(HookEvent):
    """The session's history was replaced by a checkpoint's."""

    session_id: str = ""
    checkpoint_id: str = ""
    from_messages: int = 0
    to_messages: int = 0
    pre_restore_checkpoint_id: str | None = None
