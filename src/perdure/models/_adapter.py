"""Pieces both provider adapters share: argument checks, an SDK client per event loop,
and the streaming entry point with its retry."""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from typing import Any, Generic, Protocol, Self, TypeVar

from perdure.models._retry import RetryPolicy, Sleep, stream_with_retry
from perdure.models.stream import ModelStreamEvent
from perdure.types import Message, ToolSpec


class _Closable(Protocol):
    async def close(self) -> None: ...


C = TypeVar("C", bound=_Closable)


def check_model_id(model_id: Any) -> str:
    """Return ``model_id`` when it is a non-empty str.

    Raises:
        TypeError, ValueError: naming ``model_id``.
    """
    if not isinstance(model_id, str):
        raise TypeError(f"model_id must be a str, got {type(model_id).__name__}")
    if not model_id.strip():
        raise ValueError("model_id must be a non-empty str")
    return model_id


def check_params(params: Any, reserved: frozenset[str], owner: str) -> dict[str, Any]:
    """A copy of ``params`` (extra request arguments), refusing the ones the adapter owns.

    Raises:
        TypeError: ``params`` is not a mapping with str keys.
        ValueError: ``params`` sets a reserved argument (the message names it).
    """
    if params is None:
        return {}
    if not isinstance(params, Mapping) or not all(isinstance(key, str) for key in params):
        raise TypeError(f"params must be a dict with str keys, got {type(params).__name__}")
    clash = sorted(reserved.intersection(params))
    if clash:
        raise ValueError(
            f"params must not set {clash}: {owner} sets {sorted(reserved)} itself "
            "(use its arguments instead)"
        )
    return dict(params)


def check_optional_str(value: Any, argument: str) -> str | None:
    """Return ``value`` when it is a str or ``None``.

    Raises:
        TypeError: naming ``argument``.
    """
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{argument} must be a str or None, got {type(value).__name__}")
    return value


def from_env(explicit: str | None, variable: str) -> str | None:
    """``explicit`` when given, else the environment variable when set and non-empty."""
    if explicit is not None:
        return explicit
    return os.environ.get(variable) or None


def check_timeout(timeout: Any) -> float | None:
    """Return ``timeout`` (seconds, > 0) or ``None`` for the SDK's default.

    Raises:
        TypeError, ValueError: naming ``timeout``.
    """
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise TypeError(f"timeout must be a number of seconds or None, got {timeout!r}")
    if timeout <= 0:
        raise ValueError(f"timeout must be > 0, got {timeout!r}")
    return float(timeout)


def retry_setup(
    max_retries: int, retry_delay: float, max_retry_delay: float, sleep: Sleep | None
) -> tuple[RetryPolicy, Sleep]:
    """The retry policy and sleep function of an adapter (validating the arguments).

    Raises:
        TypeError, ValueError: naming the bad argument.
    """
    policy = RetryPolicy(max_retries, retry_delay, max_retry_delay)
    if sleep is None:
        return policy, asyncio.sleep
    if not callable(sleep):
        raise TypeError(f"sleep must be an async callable taking seconds, got {sleep!r}")
    return policy, sleep


class LoopBoundClient(Generic[C]):
    """An SDK client per event loop: HTTP connection pools belong to the loop that made them.

    The client is built on first use in a loop; used from another loop, a fresh one
    is built (perdure's sync API runs on one long-lived loop, so this is rare). A
    client given by the caller is used as is, whatever the loop, and never closed
    here: its owner closes it.
    """

    def __init__(self, factory: Callable[[], C] | None, given: C | None = None) -> None:
        if (factory is None) == (given is None):
            raise ValueError("LoopBoundClient needs exactly one of factory or given")
        self._factory = factory
        self._given = given
        self._client: C | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def get(self) -> C:
        """The client for the running loop."""
        if self._given is not None:
            return self._given
        assert self._factory is not None
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            self._client, self._loop = self._factory(), loop
        return self._client

    async def aclose(self) -> None:
        """Close the client this object built for the running loop (idempotent)."""
        client, loop = self._client, self._loop
        self._client = self._loop = None
        if client is not None and loop is asyncio.get_running_loop():
            await client.close()


@functools.lru_cache(maxsize=32)
def _keyword_names(function: Callable[..., Any]) -> frozenset[str] | None:
    parameters = inspect.signature(function).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None  # takes anything
    return frozenset(p.name for p in parameters)


def sdk_kwargs(method: Callable[..., Any], request: Mapping[str, Any]) -> dict[str, Any]:
    """``request`` (body fields) as keyword arguments for an SDK ``create`` method.

    Fields the method does not name go into ``extra_body`` (merged under a given
    ``extra_body``): a parameter an SDK version dropped or never had — a
    compatible server's own option, say — still reaches the server.
    """
    names = _keyword_names(getattr(method, "__func__", method))
    if names is None:
        return dict(request)
    kwargs: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in request.items():
        (kwargs if key in names else extra)[key] = value
    if extra:
        kwargs["extra_body"] = {**extra, **(kwargs.get("extra_body") or {})}
    return kwargs


_HTTP_PACKAGES = frozenset({"httpx", "httpx2", "httpcore", "httpcore2", "h11"})


def is_transport_error(exc: BaseException) -> bool:
    """True for an exception of the HTTP stack under an SDK (a connection dropped mid-stream).

    Some SDK versions let these escape while a stream is read instead of wrapping
    them in their own connection error; the adapters map them to
    :class:`~perdure.errors.ModelConnectionError` either way.
    """
    return type(exc).__module__.partition(".")[0] in _HTTP_PACKAGES


class StreamingAdapter(ABC):
    """The shape of a provider adapter: build a request, stream it with retries.

    Subclasses set ``provider``, ``model_id``, ``_retry``, ``_sleep`` and
    ``_clients`` (a :class:`LoopBoundClient`), and implement :meth:`request` (pure)
    and :meth:`_attempt` (one call, translating the SDK's errors).
    """

    provider: str
    model_id: str
    _retry: RetryPolicy
    _sleep: Sleep
    _clients: LoopBoundClient[Any]

    @abstractmethod
    def request(
        self, messages: list[Message], *, tool_specs: list[ToolSpec], system_prompt: str | None
    ) -> dict[str, Any]:
        """The request of one call, as body fields (pure; nothing is sent)."""

    @abstractmethod
    def _attempt(self, request: dict[str, Any]) -> AsyncGenerator[ModelStreamEvent, None]:
        """Make one call and stream its events."""

    async def stream(
        self,
        messages: list[Message],
        *,
        tool_specs: list[ToolSpec],
        system_prompt: str | None,
    ) -> AsyncIterator[ModelStreamEvent]:
        """Stream one call, retrying transient failures before anything was yielded."""
        request = self.request(messages, tool_specs=tool_specs, system_prompt=system_prompt)
        async for event in stream_with_retry(
            lambda: self._attempt(request),
            policy=self._retry,
            sleep=self._sleep,
            label=f"{self.provider}:{self.model_id}",
        ):
            yield event

    async def aclose(self) -> None:
        """Close the HTTP client this model built for the running loop."""
        await self._clients.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
