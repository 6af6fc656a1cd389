"""PythonAgentTool: hand-written specs, sync and async functions, spec validation."""

from __future__ import annotations

import copy
import threading
from typing import Any

import pytest

from perdure.state import AgentState
from perdure.tools import (
    AgentTool,
    Interrupt,
    InterruptException,
    PythonAgentTool,
    ToolContext,
)
from perdure.types import ToolResult, ToolSpec, ToolUse

SPEC: ToolSpec = {
    "name": "echo",
    "description": "Echo the input.",
    "inputSchema": {"json": {"type": "object", "properties": {"x": {"type": "integer"}}}},
}


def call(tool_input: Any, tool_use_id: str = "t-1") -> ToolUse:
    return {"toolUseId": tool_use_id, "name": "echo", "input": tool_input}


async def run(agent_tool: PythonAgentTool, tool_use: ToolUse, interrupt: Any = None) -> ToolResult:
    context = ToolContext(tool_use=tool_use, agent=None, state=AgentState(), _interrupt=interrupt)
    return await agent_tool.invoke(tool_use, context)


async def test_sync_function_gets_raw_input_off_the_loop_thread() -> None:
    seen: list[tuple[Any, int, str]] = []

    def echo(tool_use: ToolUse, context: ToolContext) -> Any:
        seen.append((tool_use["input"], threading.get_ident(), context.tool_use["toolUseId"]))
        return {"echo": tool_use["input"]}

    agent_tool = PythonAgentTool(SPEC, echo)
    # Not validated against the schema: the function gets exactly what the model sent.
    result = await run(agent_tool, call({"x": "not an int"}, "abc"))
    assert result == {
        "toolUseId": "abc",
        "status": "success",
        "content": [{"text": '{"echo": {"x": "not an int"}}'}],
    }
    assert seen[0][0] == {"x": "not an int"}
    assert seen[0][1] != threading.get_ident()
    assert seen[0][2] == "abc"


async def test_async_function_and_tool_result_with_a_wrong_id() -> None:
    async def echo(tool_use: ToolUse, context: ToolContext) -> ToolResult:
        return {"toolUseId": "whatever", "status": "error", "content": [{"text": "no"}]}

    result = await run(PythonAgentTool(SPEC, echo), call({}, "right"))
    assert result == {"toolUseId": "right", "status": "error", "content": [{"text": "no"}]}


async def test_callable_object_with_async_call() -> None:
    class Echo:
        async def __call__(self, tool_use: ToolUse, context: ToolContext) -> str:
            return "async object"

    result = await run(PythonAgentTool(SPEC, Echo()), call({}))
    assert result["content"] == [{"text": "async object"}]


async def test_exceptions_and_interrupts_propagate() -> None:
    def fails(tool_use: ToolUse, context: ToolContext) -> None:
        raise KeyError("nope")

    with pytest.raises(KeyError, match="nope"):
        await run(PythonAgentTool(SPEC, fails), call({}))

    def asks(tool_use: ToolUse, context: ToolContext) -> Any:
        return context.interrupt("approve")

    def raise_interrupt(tool_use: ToolUse, name: str, reason: Any) -> Any:
        raise InterruptException(Interrupt(id="i", name=name))

    with pytest.raises(InterruptException):
        await run(PythonAgentTool(SPEC, asks), call({}), interrupt=raise_interrupt)


def test_name_spec_and_protocol() -> None:
    spec = copy.deepcopy(SPEC)
    agent_tool = PythonAgentTool(spec, lambda tool_use, context: None)
    assert agent_tool.tool_name == "echo"
    assert agent_tool.tool_spec == SPEC
    assert isinstance(agent_tool, AgentTool)
    # The tool keeps its own copy, and hands out copies.
    spec["name"] = "changed"
    agent_tool.tool_spec["inputSchema"]["json"].clear()
    assert agent_tool.tool_spec == SPEC
    assert agent_tool.tool_name == "echo"


def _without(key: str) -> dict[str, Any]:
    spec = copy.deepcopy(dict(SPEC))
    del spec[key]
    return spec


def _with(key: str, value: Any) -> dict[str, Any]:
    return {**copy.deepcopy(dict(SPEC)), key: value}


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        (_without("name"), "missing 'name'"),
        (_with("name", "bad name"), "'name' 'bad name'"),
        (_with("name", 3), "'name' 3"),
        (_with("name", ""), "'name' ''"),
        (_without("description"), "'description' must be a str"),
        (_with("description", ["x"]), "'description' must be a str, got list"),
        (_without("inputSchema"), "'inputSchema' must be"),
        (_with("inputSchema", {"type": "object"}), "'inputSchema' must be"),
        (_with("inputSchema", {"json": "{}"}), "'inputSchema' must be"),
    ],
)
def test_invalid_specs(spec: Any, fragment: str) -> None:
    with pytest.raises(ValueError) as info:
        PythonAgentTool(spec, lambda tool_use, context: None)
    assert fragment in str(info.value)


def test_type_errors() -> None:
    with pytest.raises(TypeError, match="tool_spec must be a dict"):
        PythonAgentTool(["echo"], lambda tool_use, context: None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="func must be callable"):
        PythonAgentTool(SPEC, "echo")  # type: ignore[arg-type]
