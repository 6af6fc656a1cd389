"""``perdure.models.from_string``: specs, lazy imports, missing extras, the scripted model."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from helpers import assert_model_valid
from perdure import Agent
from perdure.cli.chat import current_time
from perdure.errors import ModelAuthenticationError, ModelError
from perdure.models import ScriptedModel, from_string
from perdure.models.registry import SCRIPTED_ECHO_TURNS, SCRIPTED_TOOL_NAME


def test_openai_and_anthropic_specs_build_their_adapters(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("openai")
    pytest.importorskip("anthropic")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-x")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-x")
    from perdure.models import AnthropicModel, OpenAIModel

    openai_model = from_string("openai:gpt-4o-mini")
    assert isinstance(openai_model, OpenAIModel)
    assert openai_model.model_id == "gpt-4o-mini"
    # everything after the first colon is the model id (Ollama tags have colons)
    assert from_string("openai:llama3.1:8b").model_id == "llama3.1:8b"  # type: ignore[attr-defined]
    anthropic_model = from_string("anthropic:claude-test")
    assert isinstance(anthropic_model, AnthropicModel)
    assert anthropic_model.model_id == "claude-test"


def test_openai_spec_without_a_key_says_which_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("openai")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ModelAuthenticationError, match="OPENAI_API_KEY"):
        from_string("openai:gpt-4o-mini")


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("", "malformed"),
        ("gpt-4o-mini", "malformed"),
        ("Scripted", "malformed"),
        ("mistral:large", "unknown provider 'mistral'"),
        (":gpt", "unknown provider ''"),
        ("openai:", "no model name"),
        ("anthropic:  ", "no model name"),
    ],
)
def test_bad_specs_are_value_errors_naming_the_spec(spec: str, match: str) -> None:
    with pytest.raises(ValueError, match=match) as info:
        from_string(spec)
    assert repr(spec) in str(info.value)


def test_a_non_string_spec_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="spec must be a str"):
        from_string(None)  # type: ignore[arg-type]


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_scripted_and_importing_models_load_no_sdk() -> None:
    proc = _run(
        """
        import sys
        from perdure.models import from_string
        from_string("scripted")
        loaded = [m for m in ("openai", "anthropic") if m in sys.modules]
        assert not loaded, loaded
        """
    )
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    ("provider", "name"), [("openai", "OpenAIModel"), ("anthropic", "AnthropicModel")]
)
def test_a_missing_sdk_names_the_extra(provider: str, name: str) -> None:
    proc = _run(
        f"""
        import sys
        sys.modules[{provider!r}] = None  # as if the package were not installed
        from perdure.models import from_string
        try:
            from_string("{provider}:some-model")
        except ImportError as exc:
            print(exc)
        try:
            import perdure.models as models
            models.{name}
        except ImportError as exc:
            print(exc)
        """
    )
    assert proc.returncode == 0, proc.stderr
    expected = f"{name} needs the {provider} package: pip install 'perdure[{provider}]'"
    assert proc.stdout.splitlines() == [expected, expected]


def test_unknown_attributes_of_perdure_models_are_attribute_errors() -> None:
    import perdure.models as models

    with pytest.raises(AttributeError, match="NoSuchModel"):
        _ = models.NoSuchModel  # type: ignore[attr-defined]
    assert "OpenAIModel" in dir(models)


async def test_the_scripted_model_plays_a_tool_round_trip_then_echoes() -> None:
    model = from_string("scripted")
    assert isinstance(model, ScriptedModel)
    assert model.remaining == 2 + SCRIPTED_ECHO_TURNS
    agent = Agent(model=model, tools=[current_time])
    first = await agent.invoke_async("hello")
    assert str(first).startswith("The clock says 20")
    assert agent.messages[1]["content"][1]["toolUse"]["name"] == SCRIPTED_TOOL_NAME
    second = await agent.invoke_async("repeat me")
    assert str(second) == "You said: repeat me"
    assert_model_valid(agent.messages)


async def test_the_scripted_model_copes_without_the_clock_tool_and_runs_out() -> None:
    model = from_string("scripted")
    agent = Agent(model=model)  # no current_time tool: the call gets an error result
    result = await agent.invoke_async("hello")
    assert str(result).startswith("I could not read the clock (")
    assert isinstance(model, ScriptedModel)
    for _ in range(SCRIPTED_ECHO_TURNS):
        await agent.invoke_async("again")
    with pytest.raises(ModelError, match="ScriptedModel ran out"):
        await agent.invoke_async("one too many")
