"""Agent(model="provider:model") builds the model with perdure.models.from_string."""

from __future__ import annotations

import importlib.util

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


@pytest.mark.skipif(
    importlib.util.find_spec("openai") is not None, reason="the openai SDK is installed"
)
def test_a_missing_sdk_names_the_extra() -> None:
    with pytest.raises(ImportError, match=r"perdure\[openai\]"):
        Agent(model="openai:gpt-4o-mini")
