"""Agent(model="provider:model") builds the model with perdure.models.from_string."""

from __future__ import annotations

import sys

import pytest

from perdure import Agent
from perdure.models import ScriptedModel


def test_a_model_spec_string_builds_the_model() -> None:
    agent = Agent(model="scripted")
    assert isinstance(agent.model, ScriptedModel)
    assert agent("what time is it?").stop_reason == "end_turn"


def test_an_unknown_provider_is_named() -> None:
    with pytest.raises(ValueError, match="unknown provider 'nosuch'"):
        Agent(model="nosuch:some-model")


def test_a_spec_without_a_model_name_is_refused() -> None:
    with pytest.raises(ValueError, match="no model name"):
        Agent(model="openai:")


def test_a_missing_sdk_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    # As if the SDK were not installed: a None entry makes `import openai` fail.
    for name in [m for m in sys.modules if m == "openai" or m.startswith("openai.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "openai", None)
    monkeypatch.delitem(sys.modules, "perdure.models.openai", raising=False)
    with pytest.raises(ImportError, match=r"perdure\[openai\]"):
        Agent(model="openai:gpt-4o-mini")


def test_a_model_by_provider_string_uses_the_installed_sdk(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("openai")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")  # built only; nothing is sent
    from perdure.models.openai import OpenAIModel

    agent = Agent(model="openai:gpt-4o-mini")
    assert isinstance(agent.model, OpenAIModel)
