"""Models: the protocol the loop calls, stream events, and the scripted test model."""

from perdure.models.model import Model
from perdure.models.scripted import ScriptedModel, ScriptedResponse
from perdure.models.stream import (
    ModelResponse,
    ModelStreamEvent,
    ReasoningDelta,
    TextDelta,
    ToolUseDelta,
    add_usage,
    empty_usage,
)

__all__ = [
    "Model",
    "ModelResponse",
    "ModelStreamEvent",
    "ReasoningDelta",
    "ScriptedModel",
    "ScriptedResponse",
    "TextDelta",
    "ToolUseDelta",
    "add_usage",
    "empty_usage",
]
