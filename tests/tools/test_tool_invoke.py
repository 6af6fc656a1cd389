"""DecoratedTool.invoke: validation, conversion, threads, context injection, results."""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import enum
import threading
from typing import Any

import pytest

from perdure.state import AgentState
from perdure.tools import Interrupt, InterruptException, ToolContext, interrupt_id, tool
from perdure.types import ToolResult, ToolUse


def call(name: str, tool_use_id: str = "t-1", **tool_input: Any) -> ToolUse:
    return {"toolUseId": tool_use_id, "name": name, "input": tool_input}


def context_for(
    tool_use: ToolUse, *, state: AgentState | None = None, interrupt: Any = None
) -> ToolContext:
    return ToolContext(
        tool_use=tool_use,
        agent=None,
        state=state if state is not None else AgentState(),
        _interrupt=interrupt,
    )


async def run(decorated: Any, tool_use: ToolUse, **kwargs: Any) -> ToolResult:
    result: ToolResult = await decorated.invoke(tool_use, context_for(tool_use, **kwargs))
    return result


class Unit(enum.Enum):
    C = "celsius"
    F = "fahrenheit"


@dataclasses.dataclass
class Window:
    start: int
    end: int = 10


@tool
def convert(value: float, unit: Unit = Unit.C, window: Window | None = None) -> dict[str, Any]:
    """Echo what the function received, with types."""
    return {
        "value": [value, type(value).__name__],
        "unit": [unit.name, type(unit).__name__],
        "window": None if window is None else [window.start, window.end, type(window).__name__],
    }


async def test_sync_tool_result() -> None:
    result = await run(convert, call("convert", "abc", value=3, unit="fahrenheit"))
    assert result == {
        "toolUseId": "abc",
        "status": "success",
        "content": [
            {
                "text": '{"value": [3.0, "float"], "unit": ["F", "Unit"], "window": null}',
            }
        ],
    }


async def test_input_converted_to_declared_types_and_defaults_filled() -> None:
    result = await run(convert, call("convert", value=1.5, window={"start": 2}))
    assert result["content"] == [
        {"text": '{"value": [1.5, "float"], "unit": ["C", "Unit"], "window": [2, 10, "Window"]}'}
    ]


async def test_async_tool_runs_on_the_loop_thread() -> None:
    @tool
    async def where(tag: str) -> str:
        """Where am I."""
        await asyncio.sleep(0)
        return f"{tag}:{threading.get_ident()}"

    result = await run(where, call("where", tag="x"))
    assert result["content"] == [{"text": f"x:{threading.get_ident()}"}]


async def test_sync_tool_runs_off_the_event_loop_thread() -> None:
    seen: list[int] = []

    @tool
    def where() -> str:
        """Where am I."""
        seen.append(threading.get_ident())
        return "ok"

    assert (await run(where, call("where")))["status"] == "success"
    assert len(seen) == 1
    assert seen[0] != threading.get_ident()


async def test_blocking_sync_tool_does_not_block_the_loop() -> None:
    started = threading.Event()
    release = threading.Event()

    @tool
    def blocker() -> str:
        """Block until released."""
        started.set()
        return "released" if release.wait(5) else "timed out"

    task = asyncio.create_task(run(blocker, call("blocker")))
    assert await asyncio.to_thread(started.wait, 5)
    release.set()  # only reachable while the tool blocks if the loop is free
    assert (await task)["content"] == [{"text": "released"}]


async def test_sync_tool_sees_context_variables() -> None:
    request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id")
    request_id.set("r-42")

    @tool
    def read() -> str:
        """Read the context variable."""
        return request_id.get()

    assert (await run(read, call("read")))["content"] == [{"text": "r-42"}]


@pytest.mark.parametrize("is_async", [False, True])
async def test_context_injection(is_async: bool) -> None:
    answers: list[tuple[ToolUse, str, Any]] = []

    def fake_interrupt(tool_use: ToolUse, name: str, reason: Any) -> Any:
        answers.append((tool_use, name, reason))
        return "approved"

    def body(note: str, context: ToolContext) -> str:
        context.state.set("last_note", note)
        answer = context.interrupt("confirm", reason={"note": note})
        return f"{context.tool_use['toolUseId']}:{answer}"

    if is_async:

        async def impl(note: str, context: ToolContext) -> str:
            """Use the context."""
            return body(note, context)

        decorated: Any = tool(name="use_context")(impl)
    else:

        def impl_sync(note: str, context: ToolContext) -> str:
            """Use the context."""
            return body(note, context)

        decorated = tool(name="use_context")(impl_sync)

    state = AgentState()
    tool_use = call("use_context", "id-7", note="hi")
    result = await run(decorated, tool_use, state=state, interrupt=fake_interrupt)
    assert result["content"] == [{"text": "id-7:approved"}]
    assert state.get("last_note") == "hi"
    assert answers == [(tool_use, "confirm", {"note": "hi"})]


async def test_context_under_another_name_by_annotation() -> None:
    @tool
    def named(ctx: ToolContext) -> str:
        """Read the call id."""
        return ctx.tool_use["toolUseId"]

    assert (await run(named, call("named", "zz")))["content"] == [{"text": "zz"}]


@pytest.mark.parametrize("is_async", [False, True])
async def test_interrupt_exception_propagates(is_async: bool) -> None:
    def raise_interrupt(tool_use: ToolUse, name: str, reason: Any) -> Any:
        raise InterruptException(
            Interrupt(id=interrupt_id(tool_use["toolUseId"], name), name=name, reason=reason)
        )

    async def ask_async(context: ToolContext) -> str:
        """Ask."""
        return str(context.interrupt("approve", "why"))

    def ask_sync(context: ToolContext) -> str:
        """Ask."""
        return str(context.interrupt("approve", "why"))

    decorated: Any = tool(ask_async if is_async else ask_sync)
    with pytest.raises(InterruptException) as info:
        await run(decorated, call("ask", "u1"), interrupt=raise_interrupt)
    assert info.value.interrupt.name == "approve"
    assert info.value.interrupt.id == interrupt_id("u1", "approve")


@pytest.mark.parametrize(
    ("tool_input", "message"),
    [
        ({"value": "3"}, "argument 'value': expected number, got str"),
        ({}, "argument 'value': missing required argument"),
        ({"value": 1, "units": "C"}, "argument 'units': unexpected argument"),
        ({"value": 1, "unit": "kelvin"}, "argument 'unit': expected one of"),
        ({"value": 1, "window": {"start": "0"}}, "argument 'window.start': expected integer"),
    ],
)
async def test_invalid_input_raises_value_error_naming_the_argument(
    tool_input: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError) as info:
        await run(convert, call("convert", **tool_input))
    assert str(info.value).startswith(message)


@pytest.mark.parametrize("bad_input", [[1], "value=3", 3])
async def test_input_that_is_not_an_object(bad_input: Any) -> None:
    tool_use: ToolUse = {"toolUseId": "t", "name": "convert", "input": bad_input}
    with pytest.raises(ValueError, match="input of tool 'convert' must be an object"):
        await run(convert, tool_use)


async def test_missing_or_null_input_is_an_empty_object() -> None:
    @tool
    def hello(name: str = "world") -> str:
        """Greet."""
        return f"hello {name}"

    no_input: Any = {"toolUseId": "t", "name": "hello"}
    null_input: ToolUse = {"toolUseId": "t", "name": "hello", "input": None}
    assert (await run(hello, no_input))["content"] == [{"text": "hello world"}]
    assert (await run(hello, null_input))["content"] == [{"text": "hello world"}]
    with pytest.raises(ValueError, match="missing required"):
        await run(convert, {"toolUseId": "t", "name": "convert", "input": None})


@pytest.mark.parametrize("is_async", [False, True])
async def test_exceptions_from_the_function_propagate_unchanged(is_async: bool) -> None:
    class Boom(RuntimeError):
        pass

    def fail_sync() -> None:
        """Fail."""
        raise Boom("kaput")

    async def fail_async() -> None:
        """Fail."""
        raise Boom("kaput")

    decorated: Any = tool(fail_async if is_async else fail_sync)
    with pytest.raises(Boom, match="kaput"):
        await run(decorated, call("fail"))


async def test_return_values_are_normalised() -> None:
    @tool
    def returns(kind: str) -> Any:
        """Return something of the given kind."""
        values: dict[str, Any] = {
            "none": None,
            "list": [1, "a"],
            "blocks": [{"text": "a"}, {"json": {"k": 1}}],
            "result": {"toolUseId": "wrong", "status": "error", "content": [{"text": "bad"}]},
            "object": object,
        }
        return values[kind]

    async def content(kind: str) -> ToolResult:
        return await run(returns, call("returns", "right", kind=kind))

    assert (await content("none"))["content"] == [{"text": "null"}]
    assert (await content("list"))["content"] == [{"text": '[1, "a"]'}]
    assert (await content("blocks"))["content"] == [{"text": "a"}, {"json": {"k": 1}}]
    assert await content("result") == {
        "toolUseId": "right",
        "status": "error",
        "content": [{"text": "bad"}],
    }
    assert (await content("object"))["content"] == [{"text": "<class 'object'>"}]


async def test_sync_wrapper_returning_a_coroutine_is_awaited() -> None:
    async def inner(x: int) -> int:
        return x + 1

    class Wrapper:
        def __call__(self, x: int) -> Any:
            """Return a coroutine from a sync call."""
            return inner(x)

    decorated = tool(name="wrapped")(Wrapper())
    assert (await run(decorated, call("wrapped", x=1)))["content"] == [{"text": "2"}]


async def test_concurrent_invocations_do_not_share_arguments() -> None:
    @tool
    async def echo(n: int) -> int:
        """Echo after a pause."""
        await asyncio.sleep(0.001 * (5 - n))
        return n

    results = await asyncio.gather(*(run(echo, call("echo", f"id{n}", n=n)) for n in range(5)))
    assert [r["content"] for r in results] == [[{"text": str(n)}] for n in range(5)]
    assert [r["toolUseId"] for r in results] == [f"id{n}" for n in range(5)]
