"""AnthropicModel: Claude through the Anthropic Messages API, streaming.

Needs the ``anthropic`` package (``pip install 'perdure[anthropic]'``)::

    AnthropicModel("claude-sonnet-4-5")                  # ANTHROPIC_API_KEY
    AnthropicModel("claude-haiku-4-5", max_tokens=1024, params={"temperature": 0})
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from typing import Any, cast

try:
    import anthropic
except ImportError as exc:  # pragma: no cover - exercised without the extra installed
    raise ImportError(
        "AnthropicModel needs the anthropic package: pip install 'perdure[anthropic]'"
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
from perdure.models._anthropic_format import (
    AnthropicStreamState,
    to_anthropic_messages,
    to_anthropic_tools,
)
from perdure.models._errors import classify_error
from perdure.models._retry import Sleep
from perdure.models.stream import ModelStreamEvent
from perdure.types import Message, ToolSpec

__all__ = ["AnthropicModel"]

# Newer SDKs raise CredentialsError when no credential source resolves (older ones
# a TypeError, handled where the request is made).
_CREDENTIAL_ERRORS: tuple[type[Exception], ...] = tuple(
    error
    for error in (getattr(anthropic, "CredentialsError", None),)
    if isinstance(error, type) and issubclass(error, Exception)
)
_RESERVED_PARAMS = frozenset({"model", "messages", "system", "tools", "stream", "max_tokens"})


class AnthropicModel(StreamingAdapter):
    """A :class:`~perdure.models.Model` on the Anthropic Messages API, streaming.

    Each call streams (``stream=True``) and yields text as it arrives, ``tool_use``
    blocks (their input streamed as ``input_json_delta`` fragments) as
    :class:`~perdure.models.ToolUseDelta`, extended thinking as
    :class:`~perdure.models.ReasoningDelta`, and a final
    :class:`~perdure.models.ModelResponse` with the message, the stop reason
    (``end_turn``, ``tool_use``, ``max_tokens``, ``stop_sequence``; ``refusal`` →
    ``content_filtered``) and the usage (input tokens from ``message_start``, cache
    reads and writes included; output tokens from the last ``message_delta``).

    The request mapping keeps the API's rules — alternating roles (consecutive
    messages of one role are merged), ``tool_result`` blocks first in a user turn,
    errors flagged with ``is_error`` — on copies; see
    :mod:`perdure.models._anthropic_format`.

    Failures become :class:`~perdure.errors.ModelError` subclasses: 401/403 →
    ``ModelAuthenticationError``, 429 → ``ModelRateLimitError``, 5xx and 529
    (``overloaded_error``, also inside a stream) → ``ModelServerError``, network
    trouble → ``ModelConnectionError``, "prompt is too long" and 413 →
    ``ContextWindowOverflowError``, any other refusal → ``ModelError``. Rate-limit,
    server and connection errors are retried while nothing was streamed yet, as in
    :class:`~perdure.models.openai.OpenAIModel`; the SDK's own retries are off.

    Args:
        model_id: the model (``"claude-sonnet-4-5"``).
        max_tokens: the most tokens one answer may have (the API requires it).
        api_key: default ``ANTHROPIC_API_KEY`` (without either, the SDK's other
            credential sources are tried; none → ``ModelAuthenticationError`` on the
            first call).
        base_url: default ``ANTHROPIC_BASE_URL``, else Anthropic's API.
        params: extra request arguments (``temperature``, ``stop_sequences``,
            ``thinking``, ``tool_choice``, ``extra_headers``, …); the adapter owns
            ``model``, ``messages``, ``system``, ``tools``, ``stream``, ``max_tokens``.
        client: an ``anthropic.AsyncAnthropic`` to use (its retries are turned off on a
            copy; the caller keeps closing it). Not together with ``api_key``/``base_url``.
        max_retries, retry_delay, max_retry_delay, timeout, sleep: as for
            :class:`~perdure.models.openai.OpenAIModel`.

    Raises:
        TypeError, ValueError: a bad argument (named in the message).
    """

    provider = "anthropic"

    def __init__(
        self,
        model_id: str,
        *,
        max_tokens: int = 4096,
        api_key: str | None = None,
        base_url: str | None = None,
        params: Mapping[str, Any] | None = None,
        client: anthropic.AsyncAnthropic | None = None,
        max_retries: int = 3,
        retry_delay: float = 1.0,
        max_retry_delay: float = 60.0,
        timeout: float | None = None,
        sleep: Sleep | None = None,
    ) -> None:
        self.model_id = check_model_id(model_id)
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
            raise TypeError(f"max_tokens must be an int, got {type(max_tokens).__name__}")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        self.max_tokens = max_tokens
        check_optional_str(api_key, "api_key")
        check_optional_str(base_url, "base_url")
        self.params = check_params(params, _RESERVED_PARAMS, "AnthropicModel")
        self._timeout = check_timeout(timeout)
        self._retry, self._sleep = retry_setup(max_retries, retry_delay, max_retry_delay, sleep)
        self._clients: LoopBoundClient[anthropic.AsyncAnthropic]
        if client is not None:
            if not isinstance(client, anthropic.AsyncAnthropic):
                raise TypeError(f"client must be an anthropic.AsyncAnthropic, got {client!r}")
            if api_key is not None or base_url is not None:
                raise ValueError("pass either client or api_key/base_url, not both")
            self.base_url: str | None = str(client.base_url)
            self._api_key: str | None = None
            self._clients = LoopBoundClient(None, client.with_options(max_retries=0))
            return
        self.base_url = from_env(base_url, "ANTHROPIC_BASE_URL")
        self._api_key = from_env(api_key, "ANTHROPIC_API_KEY")
        self._clients = LoopBoundClient(self._make_client)

    def __repr__(self) -> str:
        where = f", base_url={self.base_url!r}" if self.base_url else ""
        return f"AnthropicModel({self.model_id!r}, max_tokens={self.max_tokens}{where})"

    def _make_client(self) -> anthropic.AsyncAnthropic:
        options: dict[str, Any] = {}
        if self._api_key is not None:
            options["api_key"] = self._api_key
        if self.base_url is not None:
            options["base_url"] = self.base_url
        if self._timeout is not None:
            options["timeout"] = self._timeout
        return anthropic.AsyncAnthropic(max_retries=0, **options)

    def request(
        self, messages: list[Message], *, tool_specs: list[ToolSpec], system_prompt: str | None
    ) -> dict[str, Any]:
        """The request of one call, as body fields (pure; nothing is sent).

        Fields the installed SDK's ``messages.create`` does not name (a ``params`` entry
        it does not know) are sent in ``extra_body``, so they still reach the server.

        Raises:
            ValueError, TypeError: a message the format cannot carry (names where).
        """
        request: dict[str, Any] = {
            **self.params,
            "model": self.model_id,
            "max_tokens": self.max_tokens,
            "messages": to_anthropic_messages(messages),
            "stream": True,
        }
        if system_prompt:
            request["system"] = system_prompt
        if tool_specs:
            request["tools"] = to_anthropic_tools(tool_specs)
        return request

    async def _attempt(self, request: dict[str, Any]) -> AsyncGenerator[ModelStreamEvent, None]:
        state = AnthropicStreamState()
        try:
            # The overloads of create() cannot see stream=True inside **request; with
            # it the SDK returns an AsyncStream of raw stream events.
            client = self._clients.get()
            response = cast(
                "anthropic.AsyncStream[Any]",
                await client.messages.create(**sdk_kwargs(client.messages.create, request)),
            )
            try:
                async for event in response:
                    for delta in state.feed(event.to_dict(mode="json", warnings=False)):
                        yield delta
            finally:
                await response.close()
        except _CREDENTIAL_ERRORS as exc:
            raise ModelAuthenticationError(
                f"no Anthropic credentials: pass api_key=... or set ANTHROPIC_API_KEY ({exc})"
            ) from exc
        except anthropic.AnthropicError as exc:
            raise self._translate(exc) from exc
        except TypeError as exc:
            # The SDK checks credentials while building the request and raises a
            # TypeError when it finds none.
            if "authentication" not in str(exc).lower():
                raise
            raise ModelAuthenticationError(
                "no Anthropic credentials: pass api_key=... or set ANTHROPIC_API_KEY"
            ) from exc
        except Exception as exc:
            if not is_transport_error(exc):
                raise
            where = self.base_url or "api.anthropic.com"
            raise ModelConnectionError(f"anthropic: connection failed ({where}): {exc}") from exc
        yield state.finish()

    def _translate(self, exc: anthropic.AnthropicError) -> ModelError:
        if isinstance(exc, anthropic.APIStatusError):
            # An `event: error` inside a 200 stream arrives with the stream's status.
            status = exc.status_code if exc.status_code >= 400 else None
            return classify_error(
                provider="anthropic",
                status=status,
                body=exc.body,
                headers=exc.response.headers,
                fallback=exc.message,
            )
        if isinstance(exc, anthropic.APIConnectionError):
            where = self.base_url or "api.anthropic.com"
            return ModelConnectionError(f"anthropic: {exc.message} ({where})")
        if isinstance(exc, anthropic.APIError):
            return classify_error(
                provider="anthropic", status=None, body=exc.body, fallback=exc.message
            )
        return ModelError(f"anthropic: {exc}")
