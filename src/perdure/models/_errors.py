"""Provider failures → perdure's ``ModelError`` subclasses (pure; shared by the adapters).

Each adapter pulls the HTTP status, the decoded error body and the response headers
out of its SDK's exception and calls :func:`classify_error`; the SDK exception never
reaches the caller (it stays as ``__cause__``). The same rules serve errors carried
inside a stream (an SSE ``error`` event), which have no status of their own.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from perdure.errors import (
    ContextWindowOverflowError,
    ModelAuthenticationError,
    ModelError,
    ModelRateLimitError,
    ModelServerError,
)
from perdure.models._retry import parse_retry_after

# How providers word "the prompt does not fit": OpenAI (context_length_exceeded,
# "maximum context length"), Anthropic ("prompt is too long", "exceed context limit"),
# vLLM ("maximum context length"), llama.cpp server (exceed_context_size_error,
# "exceeds the available context size"), LM Studio and others ("context length",
# "context window").
_OVERFLOW = re.compile(
    r"context[_ ]length[_ ]exceeded|maximum context length|context (?:length|window|size)"
    r"|exceed_context_size|exceeds? (?:the )?(?:available )?context|prompt is too long"
    r"|input is too long|too many (?:input )?tokens|reduce the length of the messages",
    re.IGNORECASE,
)
_SERVER_TYPES = frozenset(
    {"overloaded_error", "api_error", "server_error", "internal_server_error", "timeout_error"}
)
_RATE_TYPES = frozenset({"rate_limit_error", "rate_limit_exceeded"})
_AUTH_TYPES = frozenset({"authentication_error", "permission_error", "invalid_api_key"})
_OVERFLOW_TYPES = frozenset({"request_too_large", "context_length_exceeded"})
_NOT_RETRYABLE_429 = frozenset({"insufficient_quota", "billing_error"})


def error_details(body: object) -> tuple[str | None, str | None, str | None]:
    """``(type, code, message)`` of a provider error body, each ``None`` when absent.

    Accepts the body as a whole (``{"error": {...}}``, Anthropic's ``{"type":
    "error", "error": {...}}``), the inner error object, or a plain string.
    """
    error: Any = body
    if isinstance(body, Mapping) and isinstance(body.get("error"), Mapping):
        error = body["error"]
    if isinstance(error, Mapping):
        kind, code, message = error.get("type"), error.get("code"), error.get("message")
        return (
            str(kind) if kind is not None else None,
            str(code) if code is not None else None,
            str(message) if message is not None else None,
        )
    if isinstance(body, str) and body.strip():
        return None, None, body.strip()
    return None, None, None


def looks_like_context_overflow(*texts: str | None) -> bool:
    """True when a provider's error type, code or message says the prompt is too long."""
    return any(text is not None and _OVERFLOW.search(text) for text in texts)


def classify_error(
    *,
    provider: str,
    status: int | None,
    body: object,
    headers: Mapping[str, str] | None = None,
    fallback: str = "",
) -> ModelError:
    """The ``ModelError`` subclass for a provider failure.

    Args:
        provider: names the provider in the message (``"openai"``, ``"anthropic"``).
        status: the HTTP status; ``None`` for an error event inside a stream.
        body: the decoded error body (see :func:`error_details`).
        headers: the response headers (``retry-after`` is read from them).
        fallback: the message to use when the body has none.

    Rules: 401/403 → :class:`ModelAuthenticationError`; 429 →
    :class:`ModelRateLimitError` (except an exhausted quota, which waiting does not
    fix: plain :class:`ModelError`); 408, 5xx and 529 → :class:`ModelServerError`;
    413, or a 4xx whose type, code or message says the prompt is too long →
    :class:`ContextWindowOverflowError`; any other 4xx → :class:`ModelError`.
    Without a status the error's type decides the same way.
    """
    kind, code, message = error_details(body)
    text = message or fallback or "no error message"
    label = " / ".join(part for part in (kind, code) if part)
    where = f"{provider} HTTP {status}" if status is not None else f"{provider} stream error"
    full = f"{where}{f' ({label})' if label else ''}: {text}"
    retry_after = parse_retry_after(headers)
    names = {name for name in (kind, code) if name}

    if status in (401, 403) or (status is None and names & _AUTH_TYPES):
        return ModelAuthenticationError(full, status_code=status)
    if status == 429 or (status is None and names & _RATE_TYPES):
        if names & _NOT_RETRYABLE_429:
            return ModelError(full)
        return ModelRateLimitError(full, status_code=status, retry_after=retry_after)
    if (status is not None and (status >= 500 or status == 408)) or (
        status is None and names & _SERVER_TYPES
    ):
        return ModelServerError(full, status_code=status, retry_after=retry_after)
    if status == 413 or names & _OVERFLOW_TYPES or looks_like_context_overflow(kind, code, text):
        return ContextWindowOverflowError(full)
    return ModelError(full)
