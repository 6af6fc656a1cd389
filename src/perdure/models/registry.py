"""``from_string``: build a model from a ``"provider:model"`` spec (used by the CLI).

Adapters are imported only when their provider is asked for, so importing
``perdure.models`` never imports an SDK; a missing SDK raises an ``ImportError``
that names the extra to install.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from perdure.models.model import Model
from perdure.models.scripted import ScriptedModel, ScriptedResponse
from perdure.types import Message

__all__ = [
    "PROVIDERS",
    "SCRIPTED_ECHO_TURNS",
    "SCRIPTED_TOOL_NAME",
    "from_string",
    "scripted_model",
]

SCRIPTED_TOOL_NAME = "current_time"
"""The tool the ``"scripted"`` model calls on its first turn (``perdure chat`` has it)."""

SCRIPTED_ECHO_TURNS = 100
"""How many echo turns the ``"scripted"`` model plays after its tool round trip."""


def _openai(model_id: str) -> Model:
    from perdure.models.openai import OpenAIModel

    return OpenAIModel(model_id)


def _anthropic(model_id: str) -> Model:
    from perdure.models.anthropic import AnthropicModel

    return AnthropicModel(model_id)


PROVIDERS: dict[str, Callable[[str], Model]] = {"openai": _openai, "anthropic": _anthropic}
"""Provider prefix → builder of its adapter from a model id."""


def from_string(spec: str) -> Model:
    """Build the model named by ``spec``.

    - ``"openai:MODEL"`` → :class:`~perdure.models.openai.OpenAIModel` (``OPENAI_API_KEY``,
      ``OPENAI_BASE_URL`` — so ``"openai:llama3.1:8b"`` with ``OPENAI_BASE_URL`` set
      drives Ollama; everything after the first ``:`` is the model id);
    - ``"anthropic:MODEL"`` → :class:`~perdure.models.anthropic.AnthropicModel`
      (``ANTHROPIC_API_KEY``, ``ANTHROPIC_BASE_URL``);
    - ``"scripted"`` → :func:`scripted_model`, a canned script for smoke tests.

    Raises:
        TypeError: ``spec`` is not a str.
        ValueError: a malformed spec or an unknown provider (the message names it).
        ImportError: the provider's SDK is missing (the message names the extra).
        ModelAuthenticationError: the provider needs a key and none is configured.
    """
    if not isinstance(spec, str):
        raise TypeError(f"spec must be a str like 'openai:gpt-4o-mini', got {type(spec).__name__}")
    if spec == "scripted":
        return scripted_model()
    provider, sep, model_id = spec.partition(":")
    known = ", ".join([*(f"'{name}:MODEL'" for name in PROVIDERS), "'scripted'"])
    if not sep:
        raise ValueError(f"model spec {spec!r} is malformed: expected one of {known}")
    if provider not in PROVIDERS:
        raise ValueError(
            f"model spec {spec!r} names an unknown provider {provider!r}: expected one of {known}"
        )
    if not model_id.strip():
        raise ValueError(f"model spec {spec!r} has no model name after {provider + ':'!r}")
    return PROVIDERS[provider](model_id)


def scripted_model() -> ScriptedModel:
    """A :class:`~perdure.models.ScriptedModel` with a canned script for smoke tests.

    No network, no key. The script:

    1. asks for the :data:`SCRIPTED_TOOL_NAME` tool (``current_time``, no input),
       saying ``"Let me check the clock."``;
    2. answers ``"The clock says <result>. I am a scripted model: from now on I repeat
       what you say."`` (or ``"I could not read the clock (<error>). …"``);
    3. then, for :data:`SCRIPTED_ECHO_TURNS` turns, answers ``"You said: <text>"``
       with the latest user text;

    and runs out (a :class:`~perdure.errors.ModelError`) after that. Each answer
    follows from the conversation it is sent, so a conversation resumed from a
    session in a new process goes on where it was instead of starting over.
    """
    responses: list[ScriptedResponse] = [_respond] * (2 + SCRIPTED_ECHO_TURNS)
    return ScriptedModel(responses)


def _respond(messages: list[Message]) -> Message | str:
    if not any(m["role"] == "assistant" for m in messages):
        return _ask_clock(messages)
    last = messages[-1] if messages else None
    if last is not None and any(
        b.get("toolResult", {}).get("toolUseId") == "scripted-clock" for b in last["content"]
    ):
        return _report_clock(messages)
    return _echo(messages)


_ECHO_NOTICE = "I am a scripted model: from now on I repeat what you say."


def _ask_clock(messages: list[Message]) -> Message:
    return {
        "role": "assistant",
        "content": [
            {"text": "Let me check the clock."},
            {"toolUse": {"toolUseId": "scripted-clock", "name": SCRIPTED_TOOL_NAME, "input": {}}},
        ],
    }


def _report_clock(messages: list[Message]) -> str:
    result: Any = None
    for block in messages[-1]["content"] if messages else ():
        if "toolResult" in block:
            result = block["toolResult"]
    text = " ".join(b["text"] for b in (result or {}).get("content", ()) if "text" in b)
    if result is None or result["status"] != "success":
        return f"I could not read the clock ({text or 'no result'}). {_ECHO_NOTICE}"
    return f"The clock says {text}. {_ECHO_NOTICE}"


def _echo(messages: list[Message]) -> str:
    for message in reversed(messages):
        if message["role"] == "user":
            texts = [block["text"] for block in message["content"] if "text" in block]
            if texts:
                return "You said: " + " ".join(texts)
    return "You said nothing I can repeat."
