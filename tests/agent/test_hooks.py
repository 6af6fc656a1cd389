"""Hook events, their order, providers, plugins and model-call middleware."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from helpers import tool_call
from perdure import Agent, tool
from perdure.errors import ModelError
from perdure.hooks import (
    AfterInvocationEvent,
    AfterModelCallEvent,
    AfterToolCallEvent,
    AgentInitializedEvent,
    BeforeInvocationEvent,
    BeforeModelCallEvent,
    BeforeToolCallEvent,
    HookEvent,
    HookRegistry,
    InvokeModelContext,
    InvokeModelStage,
    MessageAddedEvent,
)
from perdure.models import ScriptedModel


@tool
def echo(text: str) -> str:
    """Echo the text.

    Args:
        text: what to echo.
    """
    return text


class Recorder:
    """A hook provider that records every event it sees."""

    def __init__(self, label: str = "") -> None:
        self.label = label
        self.seen: list[str] = []

    def register_hooks(self, registry: HookRegistry) -> None:
        for event_type in (
            AgentInitializedEvent,
            BeforeInvocationEvent,
            AfterInvocationEvent,
            MessageAddedEvent,
            BeforeModelCallEvent,
            AfterModelCallEvent,
            BeforeToolCallEvent,
            AfterToolCallEvent,
        ):
            registry.add_callback(event_type, self.record)

    def record(self, event: HookEvent) -> None:
        name = type(event).__name__.removesuffix("Event")
        if isinstance(event, MessageAddedEvent):
            name += f"({event.message['role']})"
        self.seen.append(self.label + name)


def test_hook_events_fire_in_loop_order() -> None:
    recorder = Recorder()
    model = ScriptedModel([tool_call("t1", "echo", text="x"), "done"])
    agent = Agent(model=model, tools=[echo], hooks=[recorder])
    assert recorder.seen == ["AgentInitialized"]
    agent("go")
    assert recorder.seen == [
        "AgentInitialized",
        "BeforeInvocation",
        "MessageAdded(user)",
        "BeforeModelCall",
        "AfterModelCall",
        "MessageAdded(assistant)",
        "BeforeToolCall",
        "AfterToolCall",
        "MessageAdded(user)",
        "BeforeModelCall",
        "AfterModelCall",
        "MessageAdded(assistant)",
        "AfterInvocation",
    ]


def test_after_events_run_callbacks_in_reverse_order() -> None:
    order: list[str] = []

    class Wrapper:
        def __init__(self, label: str) -> None:
            self.label = label

        def register_hooks(self, registry: HookRegistry) -> None:
            registry.add_callback(
                BeforeInvocationEvent, lambda e: order.append(f"before {self.label}")
            )
            registry.add_callback(
                AfterInvocationEvent, lambda e: order.append(f"after {self.label}")
            )
            registry.add_callback(
                BeforeModelCallEvent, lambda e: order.append(f"model< {self.label}")
            )
            registry.add_callback(
                AfterModelCallEvent, lambda e: order.append(f"model> {self.label}")
            )

    agent = Agent(model=ScriptedModel(["hi"]), hooks=[Wrapper("outer"), Wrapper("inner")])
    agent("go")
    assert order == [
        "before outer",
        "before inner",
        "model< outer",
        "model< inner",
        "model> inner",
        "model> outer",
        "after inner",
        "after outer",
    ]


async def test_async_hooks_are_awaited() -> None:
    seen: list[str] = []

    async def on_message(event: MessageAddedEvent) -> None:
        seen.append(event.message["role"])

    agent = Agent(model=ScriptedModel(["hello"]))
    agent.hooks.add_callback(MessageAddedEvent, on_message)
    await agent.invoke_async("hi")
    assert seen == ["user", "assistant"]


def test_after_invocation_fires_on_error_with_the_exception() -> None:
    errors: list[BaseException | None] = []
    agent = Agent(model=ScriptedModel([ModelError("boom")]))
    agent.hooks.add_callback(AfterInvocationEvent, lambda e: errors.append(e.exception))
    with pytest.raises(ModelError):
        agent("hi")
    assert len(errors) == 1
    assert isinstance(errors[0], ModelError)


def test_before_tool_hook_can_cancel_a_call_and_after_hook_can_rewrite_result() -> None:
    calls: list[str] = []

    @tool
    def guarded(text: str) -> str:
        """Record a call.

        Args:
            text: anything.
        """
        calls.append(text)
        return text

    def deny(event: BeforeToolCallEvent) -> None:
        if event.tool_use["input"].get("text") == "forbidden":
            event.cancel_tool = "denied by policy"

    def redact(event: AfterToolCallEvent) -> None:
        event.result = {**event.result, "content": [{"text": "[redacted]"}]}

    model = ScriptedModel(
        [tool_call("t1", "guarded", text="forbidden"), tool_call("t2", "guarded", text="ok"), "end"]
    )
    agent = Agent(model=model, tools=[guarded])
    agent.hooks.add_callback(BeforeToolCallEvent, deny)
    agent.hooks.add_callback(AfterToolCallEvent, redact)
    agent("go")
    assert calls == ["ok"]
    first = agent.messages[2]["content"][0]["toolResult"]
    assert first["status"] == "error"
    assert first["content"] == [{"text": "[redacted]"}]  # after-hooks see cancelled calls too
    assert agent.messages[4]["content"][0]["toolResult"]["content"] == [{"text": "[redacted]"}]


def test_registry_rejects_bad_registrations() -> None:
    registry = HookRegistry()
    with pytest.raises(TypeError, match="HookEvent"):
        registry.add_callback(dict, lambda e: None)  # type: ignore[type-var]
    with pytest.raises(TypeError, match="callable"):
        registry.add_callback(MessageAddedEvent, "nope")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="register_hooks"):
        registry.add_hook(object())  # type: ignore[arg-type]


def test_plugin_init_agent_runs_and_can_register_hooks() -> None:
    class Counter:
        name = "counter"

        def __init__(self) -> None:
            self.agent: Agent | None = None
            self.messages = 0

        def init_agent(self, agent: Agent) -> None:
            self.agent = agent
            agent.hooks.add_callback(MessageAddedEvent, self.count)

        def count(self, event: MessageAddedEvent) -> None:
            self.messages += 1

    plugin = Counter()
    agent = Agent(model=ScriptedModel(["x"]), plugins=[plugin])
    assert plugin.agent is agent
    agent("hi")
    assert plugin.messages == 2
    with pytest.raises(TypeError, match="name"):
        Agent(model=ScriptedModel([]), plugins=[object()])  # type: ignore[list-item]


def test_async_plugin_and_async_init_hook_run_before_first_use() -> None:
    class AsyncPlugin:
        name = "async"
        ready = False

        async def init_agent(self, agent: Agent) -> None:
            AsyncPlugin.ready = True
            agent.state.set("initialised", True)

    agent = Agent(model=ScriptedModel(["x"]), plugins=[AsyncPlugin()])
    assert AsyncPlugin.ready  # sync construction runs async init at once
    assert agent.state.get("initialised") is True


class _RestoringProvider:
    """An async AgentInitializedEvent hook that restores a history, as sessions do."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def register_hooks(self, registry: HookRegistry) -> None:
        registry.add_callback(AgentInitializedEvent, self.on_init)

    async def on_init(self, event: AgentInitializedEvent) -> None:
        self.seen.append("init")
        event.agent.messages.append({"role": "user", "content": [{"text": "restored"}]})
        event.agent.messages.append({"role": "assistant", "content": [{"text": "ok"}]})


async def test_async_init_inside_a_loop_waits_for_initialize() -> None:
    # The constructor does no I/O inside a running loop (SPEC §7).
    provider = _RestoringProvider()
    agent = Agent(model=ScriptedModel(["fresh"]), hooks=[provider])
    assert provider.seen == []
    await agent.initialize()
    assert provider.seen == ["init"]
    assert len(agent.messages) == 2
    await agent.invoke_async("new")
    assert provider.seen == ["init"]  # once
    assert [m["content"][0]["text"] for m in agent.messages] == ["restored", "ok", "new", "fresh"]


async def test_async_init_inside_a_loop_runs_before_the_first_call() -> None:
    provider = _RestoringProvider()
    agent = Agent(model=ScriptedModel(["fresh"]), hooks=[provider])
    await agent.invoke_async("new")
    assert provider.seen == ["init"]
    assert [m["content"][0]["text"] for m in agent.messages] == ["restored", "ok", "new", "fresh"]


def test_agent_built_on_perdures_loop_thread_defers_async_init() -> None:
    inner: list[Agent] = []
    provider = _RestoringProvider()

    @tool
    async def spawn() -> str:
        """Build and run a sub-agent from inside a tool."""
        sub = Agent(model=ScriptedModel(["sub answer"]), hooks=[provider])
        inner.append(sub)
        before = len(sub.messages)  # deferred: we are on perdure's loop thread
        result = await sub.invoke_async("sub task")
        return f"{before}:{result}"

    outer = Agent(model=ScriptedModel([tool_call("t", "spawn"), "done"]), tools=[spawn])
    outer("go")
    assert outer.messages[2]["content"][0]["toolResult"]["content"] == [{"text": "0:sub answer"}]
    assert provider.seen == ["init"]
    assert len(inner[0].messages) == 4


def test_middleware_rewrites_one_call_and_never_touches_history() -> None:
    seen_in_middleware: list[list[Any]] = []

    def inject(context: InvokeModelContext) -> None:
        seen_in_middleware.append(copy.deepcopy(context.messages))
        # mutate in place, deeply: the agent's history must not see this
        context.messages[-1]["content"].insert(0, {"text": "<memory>likes tea</memory>"})
        context.messages[0]["content"][0]["text"] = "MUTATED"
        context.system_prompt = "rewritten prompt"

    async def add_marker(context: InvokeModelContext) -> None:
        context.messages = [*context.messages]
        context.tool_specs = []

    model = ScriptedModel(["one", "two"])
    agent = Agent(model=model, system_prompt="original", tools=[echo])
    agent.middleware.add_middleware(InvokeModelStage.Input, inject)
    agent.middleware.add_middleware(InvokeModelStage.Input, add_marker)
    agent("first")
    agent("second")
    # the model saw the rewrite ...
    sent = model.requests[1]["messages"]
    assert sent[-1]["content"][0] == {"text": "<memory>likes tea</memory>"}
    assert model.requests[1]["system_prompt"] == "rewritten prompt"
    assert model.requests[1]["tool_specs"] == []
    # ... the history never did, and each call started from the clean history
    assert agent.messages == [
        {"role": "user", "content": [{"text": "first"}]},
        {"role": "assistant", "content": [{"text": "one"}]},
        {"role": "user", "content": [{"text": "second"}]},
        {"role": "assistant", "content": [{"text": "two"}]},
    ]
    assert agent.system_prompt == "original"
    assert seen_in_middleware[1][0]["content"][0]["text"] == "first"
    with pytest.raises(TypeError, match="InvokeModelStage"):
        agent.middleware.add_middleware("input", inject)  # type: ignore[arg-type]
