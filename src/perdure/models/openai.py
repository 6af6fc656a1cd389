"""OpenAIModel: OpenAI Chat Completions, and every server that speaks it.

Needs the ``openai`` package (``pip install 'perdure[openai]'``). The same adapter
drives OpenAI itself and OpenAI-compatible servers — vLLM, Ollama, llama.cpp
server, LM Studio, … — through ``base_url``::

    OpenAIModel("gpt-4o-mini")                                    # OPENAI_API_KEY
    OpenAIModel("llama3.1:8b", base_url="http://localhost:11434/v1")  # Ollama
    OpenAIModel("qwen2.5", base_url="http://localhost:8000/v1", api_key="token")  # vLLM
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from typing import Any, cast

try:
    import openai
except ImportError as exc:  # pragma: no cover - exercised without the extra installed
    raise ImportError(
        "OpenAIModel needs the openai package: pip install 'perdure[openai]'"
    ) from exc

from perdure.errors import ModelAuthenticationError, ModelConnectionError, ModelError
from perdure.models._adapter import (
    LoopBoundClient,
    StreamingAdapter,
    check_model_id,
    check_optional_str,
    check_params,
    check_timeout,
    from_env,
    is_transport_error,
    retry_setup,
    sdk_kwargs,
)
from perdure.models._errors import classify_error
from perdure.models._openai_format import (
    OpenAIStreamState,
    to_openai_messages,
    to_openai_tools,
)
from perdure.models._retry import Sleep
from perdure.models.stream import ModelStreamEvent
from perdure.types import Message, ToolSpec

__all__ = ["LOCAL_API_KEY", "OpenAIModel"]

LOCAL_API_KEY = "not-needed"
"""The key sent to an OpenAI-compatible server when none is configured (local servers
ignore it; the SDK insists on one)."""

_RESERVED_PARAMS = frozenset({"model", "messages", "stream", "tools"})


class OpenAIModel(StreamingAdapter):
    """A :class:`~perdure.models.Model` on the Chat Completions API, streaming.

    Each call sends ``stream=True`` with ``stream_options={"include_usage": True}``
    and yields text as it arrives, tool calls (parallel ones too, with arguments
    streamed in fragments) as :class:`~perdure.models.ToolUseDelta`, and a final
    :class:`~perdure.models.ModelResponse` carrying the message, the stop reason
    (``stop``→``end_turn``, ``tool_calls``→``tool_use``, ``length``→``max_tokens``,
    ``content_filter``→``content_filtered``) and the usage.

    Failures become :class:`~perdure.errors.ModelError` subclasses: 401/403 →
    ``ModelAuthenticationError``, 429 → ``ModelRateLimitError``, 5xx →
    ``ModelServerError``, network trouble → ``ModelConnectionError``, a prompt too
    long for the model (``context_length_exceeded``, or a compatible server's
    wording of it) → ``ContextWindowOverflowError``, any other refusal → ``ModelError``.
    The rate-limit, server and connection errors are retried — only while nothing was
    streamed yet — up to ``max_retries`` times, waiting ``retry_delay`` seconds
    doubled at each retry, or what the server's ``retry-after`` asks when it is at
    most ``max_retry_delay``. The SDK's own retries are off, so these are the only
    ones.

    Args:
        model_id: the model name the server knows (``"gpt-4o-mini"``, ``"llama3.1:8b"``).
        api_key: the API key; default ``OPENAI_API_KEY``. Against a ``base_url`` with
            no key configured, :data:`LOCAL_API_KEY` is sent (local servers need none).
        base_url: the server's API root (``http://localhost:11434/v1``); default
            ``OPENAI_BASE_URL``, else OpenAI.
        params: extra request arguments (``temperature``, ``max_tokens``,
            ``extra_body`` for server-specific options, …); the adapter owns
            ``model``, ``messages``, ``stream`` and ``tools``. ``{"stream_options":
            None}`` stops sending ``stream_options`` (for a server that rejects it;
            the usage is then whatever the server reports, often zeros).
        client: an ``openai.AsyncOpenAI`` to use instead of building one (its retries
            are turned off on a copy; the caller keeps closing it). Not together with
            ``api_key``/``base_url``.
        max_retries: retries of a transient failure (0 disables).
        retry_delay: seconds before the first retry.
        max_retry_delay: the longest wait between retries.
        timeout: seconds for one HTTP request; ``None`` keeps the SDK's default.
        sleep: the coroutine function used to wait between retries (tests pass one
            that records instead of waiting); default ``asyncio.sleep``.

    Raises:
        ModelAuthenticationError: no API key and no ``base_url`` (nothing to call).
        TypeError, ValueError: a bad argument (named in the message).

    The model holds an HTTP connection pool per event loop; ``await model.aclose()``
    (or ``async with``) releases it.
    """

    provider = "openai"

    def __init__(
        self,
        model_id: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        params: Mapping[str, Any] | None = None,
        client: openai.AsyncOpenAI | None = None,
        max_retries: int = 3,
        retry_delay: float = 1.0,
        max_retry_delay: float = 60.0,
        timeout: float | None = None,
        sleep: Sleep | None = None,
    ) -> None:
        self.model_id = check_model_id(model_id)
        check_optional_str(api_key, "api_key")
        check_optional_str(base_url, "base_url")
        self.params = check_params(params, _RESERVED_PARAMS, "OpenAIModel")
        self._timeout = check_timeout(timeout)
        self._retry, self._sleep = retry_setup(max_retries, retry_delay, max_retry_delay, sleep)
        self._clients: LoopBoundClient[openai.AsyncOpenAI]
        if client is not None:
            if not isinstance(client, openai.AsyncOpenAI):
                raise TypeError(f"client must be an openai.AsyncOpenAI, got {client!r}")
            if api_key is not None or base_url is not None:
                raise ValueError("pass either client or api_key/base_url, not both")
            self.base_url: str | None = str(client.base_url)
            self._api_key: str | None = None
            self._clients = LoopBoundClient(None, client.with_options(max_retries=0))
            return
        self.base_url = from_env(base_url, "OPENAI_BASE_URL")
        key = from_env(api_key, "OPENAI_API_KEY")
        if key is None:
            if self.base_url is None:
                raise ModelAuthenticationError(
                    "no OpenAI API key: pass api_key=... or set OPENAI_API_KEY "
                    "(or point base_url/OPENAI_BASE_URL at an OpenAI-compatible server)"
                )
            key = LOCAL_API_KEY
        self._api_key = key
        self._clients = LoopBoundClient(self._make_client)

    def __repr__(self) -> str:
        where = f", base_url={self.base_url!r}" if self.base_url else ""
        return f"OpenAIModel({self.model_id!r}{where})"

    def _make_client(self) -> openai.AsyncOpenAI:
        options: dict[str, Any] = {}
        if self._timeout is not None:
            options["timeout"] = self._timeout
        return openai.AsyncOpenAI(
            api_key=self._api_key, base_url=self.base_url, max_retries=0, **options
        )

    def request(
        self, messages: list[Message], *, tool_specs: list[ToolSpec], system_prompt: str | None
    ) -> dict[str, Any]:
        """The request of one call, as body fields (pure; nothing is sent).

        Fields the installed SDK's ``chat.completions.create`` does not name (a ``params`` entry
        it does not know) are sent in ``extra_body``, so they still reach the server.

        Raises:
            ValueError, TypeError: a message the format cannot carry (names where).
        """
        request: dict[str, Any] = {
            "stream_options": {"include_usage": True},
            **self.params,
            "model": self.model_id,
            "messages": to_openai_messages(messages, system_prompt),
            "stream": True,
        }
        if request["stream_options"] is None:  # params={"stream_options": None} opts out
            del request["stream_options"]
        if tool_specs:
            request["tools"] = to_openai_tools(tool_specs)
        return request

    async def _attempt(self, request: dict[str, Any]) -> AsyncGenerator[ModelStreamEvent, None]:
        state = OpenAIStreamState()
        try:
            # The overloads of create() cannot see stream=True inside **request; with
            # it the SDK returns an AsyncStream of chunks.
            client = self._clients.get()
            response = cast(
                "openai.AsyncStream[Any]",
                await client.chat.completions.create(
                    **sdk_kwargs(client.chat.completions.create, request)
                ),
            )
            try:
                async for chunk in response:
                    for event in state.feed(chunk.to_dict(mode="json", warnings=False)):
                        yield event
            finally:
                await response.close()
        except openai.OpenAIError as exc:
            raise self._translate(exc) from exc
        except Exception as exc:
            if not is_transport_error(exc):
                raise
            where = self.base_url or "api.openai.com"
            raise ModelConnectionError(f"openai: connection failed ({where}): {exc}") from exc
        yield state.finish()

    def _translate(self, exc: openai.OpenAIError) -> ModelError:
        if isinstance(exc, openai.APIStatusError):
            return classify_error(
                provider="openai",
                status=exc.status_code,
                body=exc.body,
                headers=exc.response.headers,
                fallback=exc.message,
            )
        if isinstance(exc, openai.APIConnectionError):
            where = self.base_url or "api.openai.com"
            return ModelConnectionError(f"openai: {exc.message} ({where})")
        if isinstance(exc, openai.APIError):  # an error object inside the stream
            return classify_error(
                provider="openai", status=None, body=exc.body, fallback=exc.message
            )
        return ModelError(f"openai: {exc}")
