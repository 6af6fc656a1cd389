"""OpenAIModel against a local server speaking the Chat Completions wire format."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from _servers import (
    SSE,
    FakeServer,
    Sleeps,
    closed_port_url,
    openai_chunk,
    openai_error,
    openai_sse,
    openai_text_stream,
    openai_tool_stream,
    require_sdk,
)

from helpers import assert_model_valid

openai = require_sdk("openai")

from perdure import Agent, tool  # noqa: E402
from perdure.agent import ResultEvent, TextDeltaEvent  # noqa: E402
from perdure.errors import (  # noqa: E402
    ContextWindowOverflowError,
    ModelAuthenticationError,
    ModelConnectionError,
    ModelError,
    ModelRateLimitError,
    ModelServerError,
)
from perdure.models import Model, ModelResponse, TextDelta, ToolUseDelta  # noqa: E402
from perdure.models.openai import LOCAL_API_KEY, OpenAIModel  # noqa: E402
from perdure.types import Message  # noqa: E402

HI: list[Message] = [{"role": "user", "content": [{"text": "hi"}]}]


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
async def model(server: FakeServer, sleeps: Sleeps) -> AsyncIterator[OpenAIModel]:
    async with OpenAIModel(
        "gpt-4o-mini", api_key="sk-test", base_url=server.url + "/v1", sleep=sleeps
    ) as m:
        yield m


async def collect(model: Model, messages: list[Message] = HI, **kwargs: Any) -> list[Any]:
    kwargs.setdefault("tool_specs", [])
    kwargs.setdefault("system_prompt", None)
    return [event async for event in model.stream(messages, **kwargs)]


# ------------------------------------------------------------------ streaming


async def test_text_streams_in_pieces_and_ends_with_the_response(
    server: FakeServer, model: OpenAIModel
) -> None:
    server.add(openai_text_stream("Hello", ", ", "world!", usage=(12, 4)))
    events = await collect(model, system_prompt="Be brief.")
    assert events[:-1] == [TextDelta("Hello"), TextDelta(", "), TextDelta("world!")]
    assert events[-1] == ModelResponse(
        message={"role": "assistant", "content": [{"text": "Hello, world!"}]},
        stop_reason="end_turn",
        usage={"inputTokens": 12, "outputTokens": 4, "totalTokens": 16},
    )
    (request,) = server.requests
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == "Bearer sk-test"
    assert request.body == {
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hi"},
        ],
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def test_deltas_arrive_before_the_server_has_sent_the_rest(
    server: FakeServer, model: OpenAIModel
) -> None:
    reply = openai_text_stream("first", " second")
    reply.hold_after = 2  # the role chunk and "first" go out; the rest waits
    server.add(reply)
    stream = model.stream(HI, tool_specs=[], system_prompt=None)
    first = await asyncio.wait_for(anext(stream), timeout=5)
    assert first == TextDelta("first")
    assert not reply.release.is_set()
    reply.release.set()
    rest = [event async for event in stream]
    assert rest[0] == TextDelta(" second")
    assert rest[-1].message["content"] == [{"text": "first second"}]


async def test_parallel_tool_calls_with_fragmented_arguments(
    server: FakeServer, model: OpenAIModel
) -> None:
    server.add(
        openai_tool_stream(
            ("call_DdmO9pD3xa9XTPNJ32zg2hcA", "add", ['{"a"', ": 2, ", '"b": 3}']),
            ("call_ABCDEF0123456789abcdefgh", "add", ['{"a": 10', ', "b": -4}']),
        )
    )
    events = await collect(model, tool_specs=[add.tool_spec])
    deltas = [event for event in events if isinstance(event, ToolUseDelta)]
    first_args = "".join(d.input_fragment for d in deltas if d.tool_use_id.startswith("call_Ddm"))
    assert first_args == '{"a": 2, "b": 3}'
    assert [d.name for d in deltas] == ["add"] * len(deltas)
    final = events[-1]
    assert final.stop_reason == "tool_use"
    assert final.message["content"] == [
        {
            "toolUse": {
                "toolUseId": "call_DdmO9pD3xa9XTPNJ32zg2hcA",
                "name": "add",
                "input": {"a": 2, "b": 3},
            }
        },
        {
            "toolUse": {
                "toolUseId": "call_ABCDEF0123456789abcdefgh",
                "name": "add",
                "input": {"a": 10, "b": -4},
            }
        },
    ]
    assert final.usage == {"inputTokens": 82, "outputTokens": 17, "totalTokens": 99}
    assert server.bodies[0]["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "add",
                "description": add.tool_spec["description"],
                "parameters": add.tool_spec["inputSchema"]["json"],
            },
        }
    ]


@pytest.mark.parametrize(
    ("finish_reason", "stop_reason"),
    [("length", "max_tokens"), ("content_filter", "content_filtered"), ("stop", "end_turn")],
)
async def test_finish_reasons_become_stop_reasons(
    server: FakeServer, model: OpenAIModel, finish_reason: str, stop_reason: str
) -> None:
    server.add(openai_text_stream("cut", finish_reason=finish_reason))
    assert (await collect(model))[-1].stop_reason == stop_reason


async def test_the_server_receives_images_tool_results_and_error_results(
    server: FakeServer, model: OpenAIModel
) -> None:
    png = b"\x89PNG\r\n\x1a\nfake"
    messages: list[Message] = [
        {
            "role": "user",
            "content": [
                {"text": "look"},
                {"image": {"format": "png", "source": {"bytes": png}}},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"toolUse": {"toolUseId": "call_1", "name": "add", "input": {"a": 1, "b": 1}}},
                {"toolUse": {"toolUseId": "call_2", "name": "add", "input": {"a": "x"}}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "toolResult": {
                        "toolUseId": "call_1",
                        "status": "success",
                        "content": [{"text": "2"}],
                    }
                },
                {
                    "toolResult": {
                        "toolUseId": "call_2",
                        "status": "error",
                        "content": [{"text": "a must be an integer"}],
                    }
                },
            ],
        },
    ]
    server.add(openai_text_stream("ok"))
    await collect(model, messages)
    sent = server.bodies[0]["messages"]
    assert sent[0]["content"][1] == {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64," + base64.b64encode(png).decode()},
    }
    assert sent[1]["tool_calls"][1]["function"] == {"name": "add", "arguments": '{"a": "x"}'}
    assert sent[2:] == [
        {"role": "tool", "tool_call_id": "call_1", "content": "2"},
        {"role": "tool", "tool_call_id": "call_2", "content": "[tool error] a must be an integer"},
    ]


async def test_params_are_sent_and_reserved_ones_refused(server: FakeServer) -> None:
    server.add(openai_text_stream("ok"))
    async with OpenAIModel(
        "m",
        api_key="k",
        base_url=server.url + "/v1",
        params={"temperature": 0.2, "max_tokens": 50, "stream_options": None, "top_k": 20},
    ) as model:
        await collect(model)
    body = server.bodies[0]
    assert body["temperature"] == 0.2
    assert body["max_tokens"] == 50
    assert body["top_k"] == 20  # unknown to the SDK: sent through extra_body (vLLM takes it)
    assert "stream_options" not in body  # None drops it, for servers that reject it
    with pytest.raises(ValueError, match=r"params must not set \['messages'\]"):
        OpenAIModel("m", api_key="k", params={"messages": []})


# --------------------------------------------------------------------- errors


async def test_401_is_an_authentication_error_and_is_not_retried(
    server: FakeServer, model: OpenAIModel, sleeps: Sleeps
) -> None:
    server.add(
        openai_error(
            401,
            "Incorrect API key provided: sk-test. You can find your API key at "
            "https://platform.openai.com/account/api-keys.",
            code="invalid_api_key",
        )
    )
    with pytest.raises(ModelAuthenticationError, match="Incorrect API key") as info:
        await collect(model)
    assert info.value.code == "model_authentication"
    assert info.value.status_code == 401
    assert isinstance(info.value.__cause__, openai.AuthenticationError)
    assert len(server.requests) == 1
    assert sleeps.delays == []


async def test_context_length_exceeded_is_a_context_window_overflow(
    server: FakeServer, model: OpenAIModel
) -> None:
    server.add(
        openai_error(
            400,
            "This model's maximum context length is 128000 tokens. However, your messages "
            "resulted in 130532 tokens. Please reduce the length of the messages.",
            param="messages",
            code="context_length_exceeded",
        )
    )
    with pytest.raises(ContextWindowOverflowError, match="maximum context length"):
        await collect(model)
    assert len(server.requests) == 1


async def test_vllm_worded_overflow_without_a_code_is_recognised(
    server: FakeServer, model: OpenAIModel
) -> None:
    server.add(
        openai_error(
            400,
            "This model's maximum context length is 4096 tokens. However, you requested "
            "5000 tokens (4000 in the messages, 1000 in the completion).",
            type="BadRequestError",
        )
    )
    with pytest.raises(ContextWindowOverflowError):
        await collect(model)


async def test_other_400_is_a_plain_model_error(server: FakeServer, model: OpenAIModel) -> None:
    server.add(openai_error(404, "The model `gpt-9` does not exist", code="model_not_found"))
    with pytest.raises(ModelError, match="model_not_found") as info:
        await collect(model)
    assert type(info.value) is ModelError


async def test_429_honours_retry_after_then_succeeds(
    server: FakeServer, model: OpenAIModel, sleeps: Sleeps
) -> None:
    server.add(
        openai_error(
            429,
            "Rate limit reached for gpt-4o-mini on tokens per min (TPM): Limit 200000, "
            "Used 199500, Requested 1200. Please try again in 2s.",
            type="tokens",
            code="rate_limit_exceeded",
            headers={"retry-after": "2"},
        ),
        openai_error(
            429,
            "Rate limit reached",
            type="tokens",
            code="rate_limit_exceeded",
            headers={"retry-after-ms": "250"},
        ),
        openai_text_stream("finally"),
    )
    events = await collect(model)
    assert events[-1].message["content"] == [{"text": "finally"}]
    assert sleeps.delays == [2.0, 0.25]
    assert len(server.requests) == 3
    # The SDK's own retries are off: it would say so in this header.
    assert [r.headers.get("x-stainless-retry-count") for r in server.requests] == ["0"] * 3


async def test_rate_limit_retries_are_bounded(server: FakeServer, sleeps: Sleeps) -> None:
    for _ in range(3):
        server.add(openai_error(429, "Rate limit reached", code="rate_limit_exceeded"))
    async with OpenAIModel(
        "m", api_key="k", base_url=server.url + "/v1", max_retries=2, retry_delay=0.5, sleep=sleeps
    ) as model:
        with pytest.raises(ModelRateLimitError) as info:
            await collect(model)
    assert info.value.code == "model_rate_limited"
    assert info.value.status_code == 429
    assert sleeps.delays == [0.5, 1.0]  # exponential backoff without retry-after
    assert len(server.requests) == 3


async def test_a_retry_after_longer_than_the_maximum_is_not_waited_for(
    server: FakeServer, sleeps: Sleeps
) -> None:
    server.add(
        openai_error(429, "slow down", code="rate_limit_exceeded", headers={"retry-after": "600"})
    )
    async with OpenAIModel(
        "m", api_key="k", base_url=server.url + "/v1", max_retry_delay=30, sleep=sleeps
    ) as model:
        with pytest.raises(ModelRateLimitError) as info:
            await collect(model)
    assert info.value.retry_after == 600
    assert sleeps.delays == []


async def test_insufficient_quota_is_not_retried(
    server: FakeServer, model: OpenAIModel, sleeps: Sleeps
) -> None:
    server.add(
        openai_error(
            429,
            "You exceeded your current quota, please check your plan and billing details.",
            code="insufficient_quota",
        )
    )
    with pytest.raises(ModelError, match="quota") as info:
        await collect(model)
    assert type(info.value) is ModelError
    assert sleeps.delays == []


async def test_5xx_is_retried_with_backoff_then_raised(
    server: FakeServer, model: OpenAIModel, sleeps: Sleeps
) -> None:
    body = "The server had an error while processing your request. Sorry about that!"
    for status in (500, 502, 503, 500):
        server.add(openai_error(status, body, type="server_error"))
    with pytest.raises(ModelServerError, match="Sorry about that") as info:
        await collect(model)
    assert info.value.code == "model_server_error"
    assert info.value.status_code == 500
    assert sleeps.delays == [1.0, 2.0, 4.0]
    assert len(server.requests) == 4


async def test_an_error_inside_the_stream_before_any_delta_is_retried(
    server: FakeServer, model: OpenAIModel, sleeps: Sleeps
) -> None:
    error = {
        "error": {
            "message": "The server had an error while processing your request.",
            "type": "server_error",
            "param": None,
            "code": None,
        }
    }
    server.add(SSE(openai_sse([openai_chunk({"role": "assistant"}), error])))
    server.add(openai_text_stream("second try"))
    events = await collect(model)
    assert events[0] == TextDelta("second try")
    assert sleeps.delays == [1.0]


async def test_a_stream_cut_after_a_delta_fails_without_retry(
    server: FakeServer, model: OpenAIModel, sleeps: Sleeps
) -> None:
    reply = openai_text_stream("partial", " answer")
    reply.cut_after = 2  # role chunk and "partial" sent, then the connection drops
    server.add(reply, openai_text_stream("never sent"))
    seen: list[Any] = []

    async def consume() -> None:
        async for event in model.stream(HI, tool_specs=[], system_prompt=None):
            seen.append(event)

    with pytest.raises(ModelConnectionError):
        await consume()
    assert seen == [TextDelta("partial")]
    assert len(server.requests) == 1
    assert sleeps.delays == []


async def test_a_stream_that_ends_without_finish_reason_is_an_error(
    server: FakeServer, model: OpenAIModel
) -> None:
    server.add(SSE(openai_sse([openai_chunk({"content": "trunc"})])))
    with pytest.raises(ModelConnectionError, match="finish_reason"):
        await collect(model)


async def test_connection_refused_is_a_connection_error_after_retries(sleeps: Sleeps) -> None:
    async with OpenAIModel(
        "m", api_key="k", base_url=closed_port_url() + "/v1", max_retries=1, sleep=sleeps
    ) as model:
        with pytest.raises(ModelConnectionError, match="openai") as info:
            await collect(model)
    assert info.value.code == "model_connection"
    assert sleeps.delays == [1.0]


# ----------------------------------------------------------- configuration


async def test_environment_variables_are_honoured(
    server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    monkeypatch.setenv("OPENAI_BASE_URL", server.url + "/v1")
    server.add(openai_text_stream("env"), openai_text_stream("explicit"))
    async with OpenAIModel("m") as model:
        assert model.base_url == server.url + "/v1"
        await collect(model)
    async with OpenAIModel("m", api_key="sk-explicit") as model:
        await collect(model)
    assert [r.headers["authorization"] for r in server.requests] == [
        "Bearer sk-from-env",
        "Bearer sk-explicit",
    ]


async def test_a_local_server_needs_no_key(
    server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    server.add(openai_text_stream("local"))
    async with OpenAIModel("llama3.1:8b", base_url=server.url + "/v1") as model:
        await collect(model)
    assert server.requests[0].headers["authorization"] == f"Bearer {LOCAL_API_KEY}"
    assert server.bodies[0]["model"] == "llama3.1:8b"


def test_no_key_and_no_server_is_an_authentication_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ModelAuthenticationError, match="OPENAI_API_KEY"):
        OpenAIModel("gpt-4o-mini")


async def test_a_given_client_is_used_with_its_retries_off(server: FakeServer) -> None:
    client = openai.AsyncOpenAI(api_key="sk-client", base_url=server.url + "/v1")  # retries 2
    server.add(openai_error(500, "boom", type="server_error"))
    model = OpenAIModel("m", client=client, max_retries=0)
    with pytest.raises(ModelServerError):
        await collect(model)
    assert len(server.requests) == 1  # neither the SDK nor perdure retried
    assert server.requests[0].headers["authorization"] == "Bearer sk-client"
    await client.close()


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"model_id": ""}, ValueError, "model_id"),
        ({"model_id": 3}, TypeError, "model_id"),
        ({"model_id": "m", "api_key": 1}, TypeError, "api_key"),
        ({"model_id": "m", "params": ["x"]}, TypeError, "params"),
        ({"model_id": "m", "max_retries": -1}, ValueError, "max_retries"),
        ({"model_id": "m", "retry_delay": "1"}, TypeError, "initial_delay"),
        ({"model_id": "m", "timeout": 0}, ValueError, "timeout"),
        ({"model_id": "m", "client": object()}, TypeError, "client"),
    ],
)
def test_bad_arguments_are_named(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    if "client" not in kwargs:
        kwargs = {"api_key": "k", **kwargs}
    with pytest.raises(error, match=match):
        OpenAIModel(**kwargs)


def test_client_and_api_key_together_are_refused() -> None:
    client = openai.AsyncOpenAI(api_key="k")
    with pytest.raises(ValueError, match="either client or api_key"):
        OpenAIModel("m", client=client, api_key="k")


def test_the_model_satisfies_the_protocol() -> None:
    assert isinstance(OpenAIModel("m", api_key="k"), Model)
    assert repr(OpenAIModel("m", api_key="k", base_url="http://h/v1")) == (
        "OpenAIModel('m', base_url='http://h/v1')"
    )


# ------------------------------------------------------------ in the agent


async def test_a_tool_round_trip_through_the_agent(server: FakeServer, model: OpenAIModel) -> None:
    server.add(
        openai_tool_stream(("call_1", "add", ['{"a": 2', ', "b": 3}']), text="Let me add."),
        openai_text_stream("2 + 3 = ", "5."),
    )
    agent = Agent(model=model, tools=[add], system_prompt="You add numbers.")
    result = await agent.invoke_async("What is 2 + 3?")
    assert str(result) == "2 + 3 = 5."
    assert result.stop_reason == "end_turn"
    assert result.usage["inputTokens"] == 82 + 19
    assert_model_valid(agent.messages)
    assert agent.messages[1]["content"] == [
        {"text": "Let me add."},
        {"toolUse": {"toolUseId": "call_1", "name": "add", "input": {"a": 2, "b": 3}}},
    ]
    assert server.bodies[1]["messages"] == [
        {"role": "system", "content": "You add numbers."},
        {"role": "user", "content": "What is 2 + 3?"},
        {
            "role": "assistant",
            "content": "Let me add.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "5"},
    ]


async def test_a_failed_second_model_call_leaves_a_valid_history(
    server: FakeServer, sleeps: Sleeps
) -> None:
    server.add(
        openai_tool_stream(("call_1", "add", ['{"a": 1, "b": 1}'])),
        openai_error(503, "The engine is currently overloaded", type="server_error"),
    )
    async with OpenAIModel(
        "m", api_key="k", base_url=server.url + "/v1", max_retries=0, sleep=sleeps
    ) as model:
        agent = Agent(model=model, tools=[add])
        with pytest.raises(ModelServerError, match="overloaded"):
            await agent.invoke_async("1 + 1?")
        assert_model_valid(agent.messages)
        assert [m["role"] for m in agent.messages] == ["user", "assistant", "user"]
        assert "toolResult" in agent.messages[-1]["content"][0]
        # The conversation goes on: the next prompt follows the tool results.
        server.add(openai_text_stream("It was 2."))
        result = await agent.invoke_async("So?")
    assert str(result) == "It was 2."
    assert [m["role"] for m in server.bodies[2]["messages"]] == [
        "user",
        "assistant",
        "tool",
        "user",
    ]
    assert_model_valid(agent.messages)


async def test_cancelling_mid_stream_closes_the_response_and_keeps_the_history(
    server: FakeServer, model: OpenAIModel
) -> None:
    reply = openai_text_stream("partial", " never seen")
    reply.hold_after = 2
    server.add(reply, openai_text_stream("next turn"))
    agent = Agent(model=model)
    seen: list[str] = []
    async for event in agent.stream_async("go"):
        if isinstance(event, TextDeltaEvent):
            seen.append(event.text)
            agent.cancel()
            # The loop looks at the cancel flag when the next chunk arrives.
            reply.release.set()
        elif isinstance(event, ResultEvent):
            assert event.result.stop_reason == "cancelled"
    assert seen == ["partial"]
    assert agent.messages == [{"role": "user", "content": [{"text": "go"}]}]
    # the connection was given back in a usable state: the next call works
    assert str(await agent.invoke_async("again")) == "next turn"


async def test_a_context_overflow_makes_the_agent_reduce_and_call_again(
    server: FakeServer, model: OpenAIModel
) -> None:
    history: list[Message] = []
    for i in range(4):
        history.append({"role": "user", "content": [{"text": f"question {i}"}]})
        history.append({"role": "assistant", "content": [{"text": f"answer {i}"}]})
    server.add(
        openai_error(400, "maximum context length exceeded", code="context_length_exceeded"),
        openai_text_stream("fits now"),
    )
    agent = Agent(model=model, messages=history)
    result = await agent.invoke_async("last question")
    assert str(result) == "fits now"
    first, second = (len(body["messages"]) for body in server.bodies)
    assert first == 9
    assert second < first
    assert server.bodies[1]["messages"][-1] == {"role": "user", "content": "last question"}
