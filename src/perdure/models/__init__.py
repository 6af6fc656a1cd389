"""Models: the protocol the loop calls, stream events, the scripted test model, adapters.

``from_string("openai:gpt-4o-mini" | "anthropic:MODEL" | "scripted")`` builds a model.
The provider adapters, :class:`~perdure.models.openai.OpenAIModel` and
:class:`~perdure.models.anthropic.AnthropicModel`, are reachable here too, but
imported (with their SDK) only on first access: importing ``perdure.models`` never
imports ``openai`` or ``anthropic``. They are left out of ``__all__`` so that a star
import does not need every extra.
"""

from __future__ import annotations

import typing as _typing

from perdure._runtime.lazy import lazy_exports as _lazy_exports
from perdure.models.model import Model
from perdure.models.registry import from_string
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

if _typing.TYPE_CHECKING:
    # Redundant aliases: re-exported for type checkers, loaded lazily at run time.
    from perdure.models.anthropic import AnthropicModel as AnthropicModel
    from perdure.models.openai import OpenAIModel as OpenAIModel

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
    "from_string",
]

_LAZY = {
    "OpenAIModel": "perdure.models.openai",
    "AnthropicModel": "perdure.models.anthropic",
}


__getattr__, __dir__ = _lazy_exports(__name__, _LAZY)
