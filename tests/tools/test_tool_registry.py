"""ToolRegistry: what it accepts, lookups, order, duplicates."""

from __future__ import annotations

from typing import Any

import pytest

from perdure.tools import (
    AgentTool,
    DecoratedTool,
    PythonAgentTool,
    ToolContext,
    ToolRegistry,
    tool,
)
from perdure.types import ToolResult, ToolSpec, ToolUse


@tool
def alpha(x: int) -> int:
    """Alpha."""
    return x


def beta(y: str) -> str:
    """Beta, a plain function."""
    return y


GAMMA = PythonAgentTool(
    {"name": "gamma", "description": "Gamma.", "inputSchema": {"json": {"type": "object"}}},
    lambda tool_use, context: "g",
)


class Custom:
    """An AgentTool written from scratch."""

    def __init__(self, name: Any = "custom") -> None:
        self._name = name

    @property
    def tool_name(self) -> str:
        return self._name  # type: ignore[no-any-return]

    @property
    def tool_spec(self) -> ToolSpec:
        return {"name": self._name, "description": "Custom.", "inputSchema": {"json": {}}}

    async def invoke(self, tool_use: ToolUse, context: ToolContext) -> ToolResult:
        return {"toolUseId": tool_use["toolUseId"], "status": "success", "content": []}


def test_accepts_every_kind_of_tool_in_order() -> None:
    custom = Custom()
    registry = ToolRegistry([alpha, beta, GAMMA, custom])
    assert registry.names == ["alpha", "beta", "gamma", "custom"]
    assert len(registry) == 4
    assert registry.get("alpha") is alpha
    assert registry.get("gamma") is GAMMA
    assert registry.get("custom") is custom
    made = registry.get("beta")
    assert isinstance(made, DecoratedTool)
    assert made.original_function is beta
    assert all(isinstance(t, AgentTool) for t in registry)
    assert list(registry) == [alpha, made, GAMMA, custom]
    assert [spec["name"] for spec in registry.specs()] == registry.names
    assert registry.specs()[0] == alpha.tool_spec


def test_register_returns_the_registered_tool() -> None:
    registry = ToolRegistry()
    assert len(registry) == 0
    assert registry.register(alpha) is alpha
    made = registry.register(beta)
    assert isinstance(made, DecoratedTool)
    assert registry.get("beta") is made


def test_lookup_and_membership() -> None:
    registry = ToolRegistry([alpha])
    assert registry.get("missing") is None
    assert "alpha" in registry
    assert "beta" not in registry
    assert alpha in registry
    assert tool(name="alpha")(alpha.original_function) not in registry


def test_specs_are_copies() -> None:
    registry = ToolRegistry([alpha])
    registry.specs()[0]["name"] = "changed"
    assert registry.specs()[0]["name"] == "alpha"


def test_duplicate_names_are_refused() -> None:
    registry = ToolRegistry([alpha])
    with pytest.raises(ValueError, match="'alpha' is already registered"):
        registry.register(tool(name="alpha")(beta))
    with pytest.raises(ValueError, match="'gamma' is already registered"):
        ToolRegistry([GAMMA, GAMMA])
    assert registry.names == ["alpha"]


class NotATool:
    def __repr__(self) -> str:
        return "<NotATool>"


@pytest.mark.parametrize(
    ("value", "named"),
    [(42, "42"), ("alpha", "'alpha'"), (NotATool(), "<NotATool>"), (NotATool, "NotATool")],
)
def test_other_objects_are_type_errors(value: Any, named: str) -> None:
    registry = ToolRegistry()
    with pytest.raises(TypeError, match="cannot register") as info:
        registry.register(value)
    assert named in str(info.value)
    assert len(registry) == 0


def test_tool_name_must_be_a_string() -> None:
    with pytest.raises(TypeError, match="tool_name that is not a str"):
        ToolRegistry([Custom(name=7)])


def test_plain_function_that_cannot_be_a_tool_is_a_value_error() -> None:
    def untyped(x):  # type: ignore[no-untyped-def]
        """No hints."""

    with pytest.raises(ValueError, match="'x' has no type annotation"):
        ToolRegistry([untyped])
