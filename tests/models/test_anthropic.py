"""AnthropicModel against a local server speaking the Messages API wire format."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from _servers import (
    PING,
    SSE,
    FakeServer,
    Sleeps,
    anthropic_end,
    anthropic_error,
    anthropic_message_start,
    anthropic_sse,
    anthropic_stream,
    anthropic_text_block,
    anthropic_tool_block,
    closed_port_url,
    require_sdk,
)

from helpers import assert_model_valid

anthropic = require_sdk("anthropic")

from perdure import Agent, tool  # noqa: E402
from perdure.errors import (  # noqa: E402
    ContextWindowOverflowError,
    ModelAuthenticationError,
    ModelConnectionError,
    ModelError,
    ModelRateLimitError,
    ModelServerError,
)
from perdure.models import Model, ModelResponse, TextDelta, ToolUseDelta  # noqa: E402
from perdure.models.anthropic import AnthropicModel  # noqa: E402
from perdure.types import Message  # noqa: E402

HI: list[Message] = [{"role": "user", "content": [{"text": "hi"}]}]
KEY = "sk-ant-api03-test"


@tool
def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: the first number.
        b: the second number.
    """
    return a + b


@pytest.fixture
def server() -> Iterator[FakeServer]:
    with FakeServer() as srv:
        yield srv


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


@pytest.fixture
async def model(server: FakeServer, sleeps: Sleeps) -> AsyncIterator[AnthropicModel]:
    async with AnthropicModel(
        "claude-test", max_tokens=1024, api_key=KEY, base_url=server.url, sleep=sleeps
    ) as m:
        yield m


async def collect(model: Model, messages: list[Message] = HI, **kwargs: Any) -> list[Any]:
    kwargs.setdefault("tool_specs", [])
    kwargs.setdefault("system_prompt", None)
    return [event async for event in model.stream(messages, **kwargs)]


def sent_key(request: Any) -> str | None:
    """The API key a request carried (x-api-key, or a bearer token in newer SDKs)."""
    if "x-api-key" in request.headers:
        return str(request.headers["x-api-key"])
    auth = request.headers.get("authorization", "")
    return auth.removeprefix("Bearer ") or None


# ------------------------------------------------------------------ streaming


async def test_text_streams_with_pings_and_usage(server: FakeServer, model: AnthropicModel) -> None:
    server.add(
        anthropic_stream(
            anthropic_text_block(0, "Hello", "!", " How can I help?"),
            input_tokens=21,
            output_tokens=9,
        )
    )
    events = await collect(model, system_prompt="You are terse.")
    assert events[:-1] == [TextDelta("Hello"), TextDelta("!"), TextDelta(" How can I help?")]
    assert events[-1] == ModelResponse(
        message={"role": "assistant", "content": [{"text": "Hello! How can I help?"}]},
        stop_reason="end_turn",
        usage={"inputTokens": 21, "outputTokens": 9, "totalTokens": 30},
    )
    (request,) = server.requests
    assert request.path == "/v1/messages"
    assert sent_key(request) == KEY
    assert "anthropic-version" in request.headers
    assert request.body == {
        "model": "claude-test",
        "max_tokens": 1024,
        "system": "You are terse.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "stream": True,
    }


async def test_deltas_arrive_before_the_server_has_sent_the_rest(
    server: FakeServer, model: AnthropicModel
) -> None:
    reply = anthropic_stream(anthropic_text_block(0, "first", " second"))
    reply.hold_after = 4  # message_start, ping, block start, "first"
    server.add(reply)
    stream = model.stream(HI, tool_specs=[], system_prompt=None)
    assert await asyncio.wait_for(anext(stream), timeout=5) == TextDelta("first")
    assert not reply.release.is_set()
    reply.release.set()
    rest = [event async for event in stream]
    assert rest[-1].message["content"] == [{"text": "first second"}]


async def test_tool_use_with_input_json_fragments(
    server: FakeServer, model: AnthropicModel
) -> None:
    server.add(
        anthropic_stream(
            anthropic_text_block(0, "I'll add them."),
            anthropic_tool_block(
                1, "toolu_01A09q90qw90lq917835lq9", "add", '{"a": 2', ', "b"', ": 40}"
            ),
            anthropic_tool_block(2, "toolu_01B", "add", '{"a": 1, "b": 1}'),
            stop_reason="tool_use",
        )
    )
    events = await collect(model, tool_specs=[add.tool_spec])
    fragments = [
        e.input_fragment
        for e in events
        if isinstance(e, ToolUseDelta) and e.tool_use_id.endswith("lq9")
    ]
    assert fragments == ["", '{"a": 2', ', "b"', ": 40}"]
    final = events[-1]
    assert final.stop_reason == "tool_use"
    assert final.message["content"] == [
        {"text": "I'll add them."},
        {
            "toolUse": {
                "toolUseId": "toolu_01A09q90qw90lq917835lq9",
                "name": "add",
                "input": {"a": 2, "b": 40},
            }
        },
        {"toolUse": {"toolUseId": "toolu_01B", "name": "add", "input": {"a": 1, "b": 1}}},
    ]
    assert server.bodies[0]["tools"] == [
        {
            "name": "add",
            "description": add.tool_spec["description"],
            "input_schema": add.tool_spec["inputSchema"]["json"],
        }
    ]


@pytest.mark.parametrize("stop_reason", ["max_tokens", "stop_sequence", "end_turn"])
async def test_stop_reasons_pass_through(
    server: FakeServer, model: AnthropicModel, stop_reason: str
) -> None:
    server.add(anthropic_stream(anthropic_text_block(0, "cut"), stop_reason=stop_reason))
    assert (await collect(model))[-1].stop_reason == stop_reason


async def test_the_server_receives_images_and_error_results_in_valid_turns(
    server: FakeServer, model: AnthropicModel
) -> None:
    jpeg = b"\xff\xd8\xff\xe0fake-jpeg"
    messages: list[Message] = [
        {
            "role": "user",
            "content": [
                {"text": "describe"},
                {"image": {"format": "jpeg", "source": {"bytes": jpeg}}},
            ],
        },
        {
            "role": "assistant",
            "content": [{"toolUse": {"toolUseId": "toolu_1", "name": "add", "input": {"a": "x"}}}],
        },
        {
            "role": "user",
            "content": [
                {
                    "toolResult": {
                        "toolUseId": "toolu_1",
                        "status": "error",
                        "content": [{"text": "a must be an integer"}],
                    }
                }
            ],
        },
        {"role": "user", "content": [{"text": "try again"}]},
    ]
    server.add(anthropic_stream(anthropic_text_block(0, "ok")))
    await collect(model, messages)
    sent = server.bodies[0]["messages"]
    assert sent[0]["content"][1] == {
        "type": "image",
        "source": {
            "type": "base64",
            "media_type": "image/jpeg",
            "data": base64.b64encode(jpeg).decode(),
        },
    }
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert sent[2]["content"] == [
        {
            "type": "tool_result",
            "tool_use_id": "toolu_1",
            "content": [{"type": "text", "text": "a must be an integer"}],
            "is_error": True,
        },
        {"type": "text", "text": "try again"},
    ]


async def test_params_are_sent_and_reserved_ones_refused(server: FakeServer) -> None:
    server.add(anthropic_stream(anthropic_text_block(0, "ok")))
    async with AnthropicModel(
        "claude-test-small",
        api_key=KEY,
        base_url=server.url,
        params={"temperature": 0, "stop_sequences": ["###"]},
    ) as model:
        await collect(model)
    assert server.bodies[0]["temperature"] == 0
    assert server.bodies[0]["stop_sequences"] == ["###"]
    assert server.bodies[0]["max_tokens"] == 4096
    with pytest.raises(ValueError, match=r"params must not set \['max_tokens', 'system'\]"):
        AnthropicModel("m", api_key=KEY, params={"system": "x", "max_tokens": 5})


# --------------------------------------------------------------------- errors


async def test_401_is_an_authentication_error(
    server: FakeServer, model: AnthropicModel, sleeps: Sleeps
) -> None:
    server.add(anthropic_error(401, "authentication_error", "invalid x-api-key"))
    with pytest.raises(ModelAuthenticationError, match="invalid x-api-key") as info:
        await collect(model)
    assert info.value.status_code == 401
    assert isinstance(info.value.__cause__, anthropic.AuthenticationError)
    assert len(server.requests) == 1
    assert sleeps.delays == []


async def test_prompt_too_long_is_a_context_window_overflow(
    server: FakeServer, model: AnthropicModel
) -> None:
    server.add(
        anthropic_error(
            400, "invalid_request_error", "prompt is too long: 208315 tokens > 200000 maximum"
        )
    )
    with pytest.raises(ContextWindowOverflowError, match="prompt is too long"):
        await collect(model)


async def test_413_request_too_large_is_a_context_window_overflow(
    server: FakeServer, model: AnthropicModel
) -> None:
    server.add(
        anthropic_error(
            413, "request_too_large", "Request exceeds the maximum allowed number of bytes."
        )
    )
    with pytest.raises(ContextWindowOverflowError):
        await collect(model)


async def test_other_invalid_requests_are_plain_model_errors(
    server: FakeServer, model: AnthropicModel
) -> None:
    server.add(anthropic_error(400, "invalid_request_error", "messages: roles must alternate"))
    with pytest.raises(ModelError, match="roles must alternate") as info:
        await collect(model)
    assert type(info.value) is ModelError


async def test_429_honours_retry_after(
    server: FakeServer, model: AnthropicModel, sleeps: Sleeps
) -> None:
    server.add(
        anthropic_error(
            429,
            "rate_limit_error",
            "This request would exceed the rate limit for your organization "
            "of 50 requests per minute.",
            headers={"retry-after": "7", "anthropic-ratelimit-requests-remaining": "0"},
        ),
        anthropic_stream(anthropic_text_block(0, "after the wait")),
    )
    events = await collect(model)
    assert events[-1].message["content"] == [{"text": "after the wait"}]
    assert sleeps.delays == [7.0]
    assert [r.headers.get("x-stainless-retry-count") for r in server.requests] == ["0", "0"]


async def test_rate_limit_retries_are_bounded(server: FakeServer, sleeps: Sleeps) -> None:
    for _ in range(2):
        server.add(
            anthropic_error(
                429, "rate_limit_error", "Number of request tokens has exceeded your limit."
            )
        )
    async with AnthropicModel(
        "m", api_key=KEY, base_url=server.url, max_retries=1, retry_delay=0.25, sleep=sleeps
    ) as model:
        with pytest.raises(ModelRateLimitError) as info:
            await collect(model)
    assert info.value.status_code == 429
    assert sleeps.delays == [0.25]


async def test_529_overloaded_and_500_are_retried_with_backoff(
    server: FakeServer, model: AnthropicModel, sleeps: Sleeps
) -> None:
    server.add(
        anthropic_error(529, "overloaded_error", "Overloaded"),
        anthropic_error(500, "api_error", "Internal server error"),
        anthropic_stream(anthropic_text_block(0, "back")),
    )
    events = await collect(model)
    assert events[0] == TextDelta("back")
    assert sleeps.delays == [1.0, 2.0]
    assert len(server.requests) == 3


async def test_529_exhausted_is_a_server_error(server: FakeServer, sleeps: Sleeps) -> None:
    for _ in range(4):
        server.add(anthropic_error(529, "overloaded_error", "Overloaded"))
    async with AnthropicModel("m", api_key=KEY, base_url=server.url, sleep=sleeps) as model:
        with pytest.raises(ModelServerError, match="Overloaded") as info:
            await collect(model)
    assert info.value.status_code == 529
    assert info.value.code == "model_server_error"
    assert len(server.requests) == 4


async def test_an_overloaded_error_event_before_any_delta_is_retried(
    server: FakeServer, model: AnthropicModel, sleeps: Sleeps
) -> None:
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    server.add(SSE(anthropic_sse([anthropic_message_start(), PING, error])))
    server.add(anthropic_stream(anthropic_text_block(0, "retried")))
    events = await collect(model)
    assert events[0] == TextDelta("retried")
    assert sleeps.delays == [1.0]


async def test_an_error_event_after_a_delta_is_raised_without_retry(
    server: FakeServer, model: AnthropicModel, sleeps: Sleeps
) -> None:
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    events = [anthropic_message_start(), *anthropic_text_block(0, "partial")[:2], error]
    server.add(SSE(anthropic_sse(events)), anthropic_stream(anthropic_text_block(0, "never")))
    seen: list[Any] = []

    async def consume() -> None:
        async for event in model.stream(HI, tool_specs=[], system_prompt=None):
            seen.append(event)

    with pytest.raises(ModelServerError, match="stream error"):
        await consume()
    assert seen == [TextDelta("partial")]
    assert len(server.requests) == 1
    assert sleeps.delays == []


async def test_a_stream_without_message_stop_is_a_connection_error(
    server: FakeServer, model: AnthropicModel
) -> None:
    events = [
        anthropic_message_start(),
        *anthropic_text_block(0, "half"),
        anthropic_end("end_turn", 3)[0],
    ]
    server.add(SSE(anthropic_sse(events)))
    with pytest.raises(ModelConnectionError, match="message_stop"):
        await collect(model)


async def test_connection_refused(sleeps: Sleeps) -> None:
    async with AnthropicModel(
        "m", api_key=KEY, base_url=closed_port_url(), max_retries=2, sleep=sleeps
    ) as model:
        with pytest.raises(ModelConnectionError, match="anthropic"):
            await collect(model)
    assert sleeps.delays == [1.0, 2.0]


# ----------------------------------------------------------- configuration


async def test_environment_variables_are_honoured(
    server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-env")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.url)
    server.add(
        anthropic_stream(anthropic_text_block(0, "a")),
        anthropic_stream(anthropic_text_block(0, "b")),
    )
    async with AnthropicModel("m") as model:
        assert model.base_url == server.url
        await collect(model)
    async with AnthropicModel("m", api_key="sk-ant-explicit") as model:
        await collect(model)
    assert [sent_key(r) for r in server.requests] == ["sk-ant-env", "sk-ant-explicit"]


async def test_no_credentials_is_an_authentication_error(
    server: FakeServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ANTHROPIC_CONFIG_DIR", str(tmp_path))  # no profile on disk either
    async with AnthropicModel("m", base_url=server.url, max_retries=0) as model:
        with pytest.raises(ModelAuthenticationError, match="ANTHROPIC_API_KEY"):
            await collect(model)
    assert server.requests == []


async def test_a_given_client_is_used_with_its_retries_off(server: FakeServer) -> None:
    client = anthropic.AsyncAnthropic(api_key="sk-ant-client", base_url=server.url)
    server.add(anthropic_error(529, "overloaded_error", "Overloaded"))
    model = AnthropicModel("m", client=client, max_retries=0)
    with pytest.raises(ModelServerError):
        await collect(model)
    assert len(server.requests) == 1
    assert sent_key(server.requests[0]) == "sk-ant-client"
    await client.close()


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"model_id": ""}, ValueError, "model_id"),
        ({"model_id": "m", "max_tokens": 0}, ValueError, "max_tokens"),
        ({"model_id": "m", "max_tokens": "9"}, TypeError, "max_tokens"),
        ({"model_id": "m", "base_url": 5}, TypeError, "base_url"),
        ({"model_id": "m", "max_retry_delay": -1}, ValueError, "max_delay"),
        ({"model_id": "m", "sleep": 3}, TypeError, "sleep"),
    ],
)
def test_bad_arguments_are_named(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        AnthropicModel(api_key=KEY, **kwargs)


def test_the_model_satisfies_the_protocol() -> None:
    model = AnthropicModel("claude-x", api_key=KEY)
    assert isinstance(model, Model)
    assert repr(model) == "AnthropicModel('claude-x', max_tokens=4096)"


# ------------------------------------------------------------ in the agent


async def test_a_tool_round_trip_through_the_agent(
    server: FakeServer, model: AnthropicModel
) -> None:
    server.add(
        anthropic_stream(
            anthropic_tool_block(0, "toolu_X", "add", '{"a": 20, ', '"b": 22}'),
            stop_reason="tool_use",
            input_tokens=300,
            output_tokens=40,
        ),
        anthropic_stream(
            anthropic_text_block(0, "The answer is ", "42."), input_tokens=350, output_tokens=8
        ),
    )
    agent = Agent(model=model, tools=[add], system_prompt="You add.")
    result = await agent.invoke_async("20 + 22?")
    assert str(result) == "The answer is 42."
    assert result.usage == {"inputTokens": 650, "outputTokens": 48, "totalTokens": 698}
    assert_model_valid(agent.messages)
    second = server.bodies[1]
    assert second["system"] == "You add."
    assert second["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "20 + 22?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "toolu_X", "name": "add", "input": {"a": 20, "b": 22}}
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_X",
                    "content": [{"type": "text", "text": "42"}],
                }
            ],
        },
    ]


def test_the_sync_agent_call_uses_perdures_loop(server: FakeServer) -> None:
    from perdure._runtime.loop import run_sync

    server.add(anthropic_stream(anthropic_text_block(0, "sync works")))
    model = AnthropicModel("claude-test", api_key=KEY, base_url=server.url)
    agent = Agent(model=model)
    try:
        assert str(agent("hi")) == "sync works"
    finally:
        run_sync(model.aclose(), async_name="model.aclose()")


async def test_a_failed_second_model_call_leaves_a_valid_history(
    server: FakeServer, sleeps: Sleeps
) -> None:
    server.add(
        anthropic_stream(
            anthropic_tool_block(0, "toolu_1", "add", '{"a": 1, "b": 2}'), stop_reason="tool_use"
        ),
        anthropic_error(401, "authentication_error", "invalid x-api-key"),
    )
    async with AnthropicModel("m", api_key=KEY, base_url=server.url, sleep=sleeps) as model:
        agent = Agent(model=model, tools=[add])
        with pytest.raises(ModelAuthenticationError):
            await agent.invoke_async("1 + 2?")
        assert_model_valid(agent.messages)
        assert [m["role"] for m in agent.messages] == ["user", "assistant", "user"]
        # Next prompt: two perdure user messages in a row become one valid user turn.
        server.add(anthropic_stream(anthropic_text_block(0, "3")))
        result = await agent.invoke_async("well?")
    assert str(result) == "3"
    sent = server.bodies[2]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert [b["type"] for b in sent[2]["content"]] == ["tool_result", "text"]
    assert_model_valid(agent.messages)
