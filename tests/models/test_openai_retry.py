"""The retry rules, error classification and client handling both adapters share.

``perdure.models._retry``, ``perdure.models._errors`` and ``perdure.models._adapter``
serve the OpenAI and the Anthropic adapter alike (no server here); the providers'
real bodies and headers are exercised in each adapter's tests.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
from collections.abc import AsyncGenerator
from typing import Any

import pytest
from _servers import Sleeps

from perdure.errors import (
    ContextWindowOverflowError,
    ModelAuthenticationError,
    ModelConnectionError,
    ModelError,
    ModelRateLimitError,
    ModelServerError,
)
from perdure.models._adapter import LoopBoundClient, sdk_kwargs
from perdure.models._errors import classify_error, error_details, looks_like_context_overflow
from perdure.models._retry import RetryPolicy, parse_retry_after, stream_with_retry


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        (None, None),
        ({}, None),
        ({"retry-after": "3"}, 3.0),
        ({"Retry-After": "1.5"}, 1.5),
        ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),
        ({"retry-after-ms": "junk", "retry-after": "9"}, 9.0),
        ({"retry-after": "-1"}, None),
        ({"retry-after": "soon"}, None),
        ({"retry-after": "nan"}, None),
    ],
)
def test_parse_retry_after(headers: dict[str, str] | None, expected: float | None) -> None:
    assert parse_retry_after(headers) == expected


def test_parse_retry_after_reads_http_dates() -> None:
    now = 1_700_000_000.0
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert parse_retry_after({"retry-after": date}, now=now) == pytest.approx(30.0)
    past = email.utils.formatdate(now - 30, usegmt=True)
    assert parse_retry_after({"retry-after": past}, now=now) == 0.0


def test_policy_backs_off_exponentially_and_honours_retry_after_within_its_cap() -> None:
    policy = RetryPolicy(max_retries=4, initial_delay=0.5, max_delay=3.0)
    assert [policy.delay(n, None) for n in range(5)] == [0.5, 1.0, 2.0, 3.0, None]
    assert policy.delay(0, 2.5) == 2.5
    assert policy.delay(0, 3.5) is None  # asked to wait longer than we would: give up now
    assert RetryPolicy(max_retries=0).delay(0, None) is None


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"max_retries": -1}, ValueError),
        ({"max_retries": 1.5}, TypeError),
        ({"max_retries": True}, TypeError),
        ({"initial_delay": float("inf")}, ValueError),
        ({"max_delay": -2}, ValueError),
    ],
)
def test_policy_rejects_bad_values(kwargs: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error, match=next(iter(kwargs))):
        RetryPolicy(**kwargs)


async def test_stream_with_retry_retries_only_before_the_first_event(
    caplog: pytest.LogCaptureFixture,
) -> None:
    attempts: list[int] = []
    sleeps = Sleeps()

    def attempt() -> AsyncGenerator[str, None]:
        async def run() -> AsyncGenerator[str, None]:
            attempts.append(len(attempts))
            if len(attempts) == 1:
                raise ModelServerError("boom", status_code=503, retry_after=0.1)
            yield "a"
            raise ModelRateLimitError("late", status_code=429)

        return run()

    events: list[str] = []

    async def consume() -> None:
        async for event in stream_with_retry(
            attempt, policy=RetryPolicy(3, 1.0, 10.0), sleep=sleeps, label="test:model"
        ):
            events.append(event)

    with caplog.at_level(logging.WARNING, logger="perdure"), pytest.raises(ModelRateLimitError):
        await consume()
    assert events == ["a"]
    assert attempts == [0, 1]
    assert sleeps.delays == [0.1]
    assert "test:model: model_server_error (boom); retry 1 of 3 in 0.10s" in caplog.text


async def test_stream_with_retry_does_not_retry_other_errors() -> None:
    sleeps = Sleeps()

    async def failing() -> AsyncGenerator[str, None]:
        raise ContextWindowOverflowError("too long")
        yield "never"

    with pytest.raises(ContextWindowOverflowError):
        async for _ in stream_with_retry(failing, policy=RetryPolicy(), sleep=sleeps, label="x"):
            pass
    assert sleeps.delays == []


async def test_stream_with_retry_closes_the_attempt_when_the_caller_stops() -> None:
    closed: list[bool] = []

    async def endless() -> AsyncGenerator[int, None]:
        try:
            n = 0
            while True:
                yield n
                n += 1
        finally:
            closed.append(True)

    stream = stream_with_retry(endless, policy=RetryPolicy(), label="x")
    assert await anext(stream) == 0
    await stream.aclose()
    assert closed == [True]


# ------------------------------------------------------------ classification


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (
            401,
            {"error": {"type": "authentication_error", "message": "bad key"}},
            ModelAuthenticationError,
        ),
        (403, {"error": {"type": "permission_error", "message": "no"}}, ModelAuthenticationError),
        (429, {"message": "slow", "code": "rate_limit_exceeded"}, ModelRateLimitError),
        (429, {"message": "pay up", "code": "insufficient_quota"}, ModelError),
        (500, {"message": "oops", "type": "server_error"}, ModelServerError),
        (529, {"type": "error", "error": {"type": "overloaded_error"}}, ModelServerError),
        (408, "timeout", ModelServerError),
        (413, {"error": {"type": "request_too_large"}}, ContextWindowOverflowError),
        (400, {"code": "context_length_exceeded", "message": "x"}, ContextWindowOverflowError),
        (
            400,
            {"error": {"message": "prompt is too long: 1 tokens > 0 maximum"}},
            ContextWindowOverflowError,
        ),
        (
            400,
            {"error": {"message": "the request exceeds the available context size"}},
            ContextWindowOverflowError,
        ),
        (
            400,
            {"error": {"type": "exceed_context_size_error", "code": 400}},
            ContextWindowOverflowError,
        ),
        (400, {"error": {"message": "tools[0].name: invalid"}}, ModelError),
        (404, {"error": {"message": "model not found"}}, ModelError),
        (None, {"type": "overloaded_error", "message": "Overloaded"}, ModelServerError),
        (None, {"type": "rate_limit_error", "message": "slow"}, ModelRateLimitError),
        (None, {"type": "authentication_error"}, ModelAuthenticationError),
        (
            None,
            {"type": "invalid_request_error", "message": "prompt is too long"},
            ContextWindowOverflowError,
        ),
        (None, {"type": "weird"}, ModelError),
    ],
)
def test_classify_error(status: int | None, body: Any, expected: type[ModelError]) -> None:
    error = classify_error(provider="p", status=status, body=body)
    assert type(error) is expected
    assert error.message.startswith("p HTTP" if status is not None else "p stream error")


def test_classified_errors_keep_status_and_retry_after() -> None:
    error = classify_error(
        provider="openai",
        status=429,
        body={"message": "Rate limit reached", "type": "tokens", "code": "rate_limit_exceeded"},
        headers={"retry-after": "4"},
    )
    assert isinstance(error, ModelRateLimitError)
    assert (error.status_code, error.retry_after) == (429, 4.0)
    assert error.message == "openai HTTP 429 (tokens / rate_limit_exceeded): Rate limit reached"
    assert classify_error(provider="x", status=502, body=None, fallback="Bad Gateway").message == (
        "x HTTP 502: Bad Gateway"
    )


def test_error_details_and_overflow_wording() -> None:
    assert error_details({"type": "error", "error": {"type": "t", "message": "m"}}) == (
        "t",
        None,
        "m",
    )
    assert error_details({"code": 400, "message": "m"}) == (None, "400", "m")
    assert error_details("  plain text ") == (None, None, "plain text")
    assert error_details(None) == (None, None, None)
    assert looks_like_context_overflow("This model's maximum context length is 8192 tokens")
    assert not looks_like_context_overflow("Invalid 'messages[1].content': string too long", None)


def test_connection_errors_carry_no_retry_after() -> None:
    assert ModelConnectionError("x").retry_after is None


# ---------------------------------------------------------- adapter helpers


class FakeClient:
    def __init__(self) -> None:
        self.closed = False

    async def close(self) -> None:
        self.closed = True


def test_one_client_per_event_loop_and_only_built_clients_are_closed() -> None:
    built: list[FakeClient] = []

    def factory() -> FakeClient:
        built.append(FakeClient())
        return built[-1]

    clients = LoopBoundClient(factory)

    async def use_twice() -> FakeClient:
        first = clients.get()
        assert clients.get() is first  # same loop, same client
        return first

    a = asyncio.run(use_twice())
    b = asyncio.run(use_twice())  # another loop: a fresh client
    assert a is not b
    assert built == [a, b]
    asyncio.run(clients.aclose())  # b belongs to a finished loop: dropped, not closed
    assert not b.closed

    async def build_and_close() -> None:
        client = clients.get()
        await clients.aclose()
        assert client.closed

    asyncio.run(build_and_close())

    given = FakeClient()
    fixed = LoopBoundClient(None, given)
    assert asyncio.run(_get(fixed)) is given
    asyncio.run(fixed.aclose())
    assert not given.closed  # the caller owns it
    with pytest.raises(ValueError, match="exactly one"):
        LoopBoundClient(None)


async def _get(clients: LoopBoundClient[FakeClient]) -> FakeClient:
    return clients.get()


def test_sdk_kwargs_sends_unknown_fields_in_extra_body() -> None:
    def create(*, model: str, messages: list[Any], extra_body: Any = None) -> None: ...

    assert sdk_kwargs(create, {"model": "m", "messages": []}) == {"model": "m", "messages": []}
    assert sdk_kwargs(create, {"model": "m", "top_k": 5, "extra_body": {"min_p": 0.1}}) == {
        "model": "m",
        "extra_body": {"top_k": 5, "min_p": 0.1},
    }

    def anything(**kwargs: Any) -> None: ...

    assert sdk_kwargs(anything, {"top_k": 5}) == {"top_k": 5}
