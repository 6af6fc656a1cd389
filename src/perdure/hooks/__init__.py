"""Hook events, the hook registry and model-call middleware."""

from perdure.hooks.events import (
    AfterInvocationEvent,
    AfterModelCallEvent,
    AfterToolCallEvent,
    AgentInitializedEvent,
    BeforeCompactEvent,
    BeforeInvocationEvent,
    BeforeModelCallEvent,
    BeforeToolCallEvent,
    HookEvent,
    MessageAddedEvent,
    SessionCheckpointedEvent,
    SessionCompactedEvent,
    SessionRestoredEvent,
)
from perdure.hooks.middleware import (
    InvokeModelContext,
    InvokeModelStage,
    Middleware,
    MiddlewareRegistry,
)
from perdure.hooks.registry import HookCallback, HookProvider, HookRegistry

__all__ = [
    "AfterInvocationEvent",
    "AfterModelCallEvent",
    "AfterToolCallEvent",
    "AgentInitializedEvent",
    "BeforeCompactEvent",
    "BeforeInvocationEvent",
    "BeforeModelCallEvent",
    "BeforeToolCallEvent",
    "HookCallback",
    "HookEvent",
    "HookProvider",
    "HookRegistry",
    "InvokeModelContext",
    "InvokeModelStage",
    "MessageAddedEvent",
    "Middleware",
    "MiddlewareRegistry",
    "SessionCheckpointedEvent",
    "SessionCompactedEvent",
    "SessionRestoredEvent",
]
