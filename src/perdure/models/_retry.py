"""Bounded retry with exponential backoff for model streams (shared by the adapters).

The rules are pure (:func:`parse_retry_after`, :meth:`RetryPolicy.delay`); the one
I/O piece, :func:`stream_with_retry`, takes its ``sleep`` as an argument so tests
never wait. A call is retried only while it has not yielded anything: once a delta
reached the caller, a retry would send it the same text twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import logging
import math
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from perdure.errors import ModelConnectionError, ModelRateLimitError, ModelServerError

logger = logging.getLogger("perdure")

E = TypeVar("E")

Sleep = Callable[[float], Awaitable[None]]
RETRYABLE_ERRORS = (ModelRateLimitError, ModelServerError, ModelConnectionError)


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to wait before calling a model again.

    Attributes:
        max_retries: retries after the first attempt (0 disables retrying).
        initial_delay: seconds before the first retry; doubles on each next one.
        max_delay: the longest wait. A provider asking (``retry-after``) for longer
            than this is not retried: the error is raised at once, so a caller is
            never blocked for minutes without knowing.
    """

    max_retries: int = 3
    initial_delay: float = 1.0
    max_delay: float = 60.0

    def __post_init__(self) -> None:
        if isinstance(self.max_retries, bool) or not isinstance(self.max_retries, int):
            raise TypeError(f"max_retries must be an int, got {type(self.max_retries).__name__}")
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")
        for name in ("initial_delay", "max_delay"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"{name} must be a number, got {type(value).__name__}")
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")

    def delay(self, attempt: int, retry_after: float | None) -> float | None:
        """Seconds to wait before retry number ``attempt + 1``, or ``None``: do not retry.

        ``attempt`` counts the retries already made. The backoff is
        ``initial_delay * 2**attempt`` capped at ``max_delay``; a ``retry_after``
        from the provider replaces it (when it is within ``max_delay``).
        """
        if attempt >= self.max_retries:
            return None
        if retry_after is not None:
            return retry_after if retry_after <= self.max_delay else None
        return float(min(self.max_delay, self.initial_delay * 2.0**attempt))


def parse_retry_after(
    headers: Mapping[str, str] | None, *, now: float | None = None
) -> float | None:
    """The wait a provider asked for, in seconds, from its response headers.

    Reads ``retry-after-ms`` (OpenAI) first, then ``retry-after`` as seconds or an
    HTTP date. Header names are matched case-insensitively. Anything unparsable or
    negative counts as not said (``None``).
    """
    if not headers:
        return None
    lowered = {key.lower(): value for key, value in headers.items()}
    raw_ms = lowered.get("retry-after-ms")
    if raw_ms is not None:
        try:
            millis = float(raw_ms)
        except ValueError:
            millis = -1.0
        if math.isfinite(millis) and millis >= 0:
            return millis / 1000.0
    raw = lowered.get("retry-after")
    if raw is None:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError, IndexError):
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
        return max(0.0, seconds)
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


async def stream_with_retry(
    attempt: Callable[[], AsyncGenerator[E, None]],
    *,
    policy: RetryPolicy,
    sleep: Sleep = asyncio.sleep,
    label: str,
) -> AsyncIterator[E]:
    """Yield the events of ``attempt()``, calling it again on a transient failure.

    A :class:`~perdure.errors.ModelRateLimitError`,
    :class:`~perdure.errors.ModelServerError` or
    :class:`~perdure.errors.ModelConnectionError` raised before the attempt yielded
    anything is retried per ``policy`` (each retry logged as a warning under the
    ``perdure`` logger, naming ``label``). Raised after the first event, or once the
    retries are spent, the error propagates unchanged. Each attempt's iterator is
    closed before the next starts or when the caller stops early.
    """
    retries = 0
    while True:
        started = False
        try:
            async with contextlib.aclosing(attempt()) as events:
                async for event in events:
                    started = True
                    yield event
            return
        except RETRYABLE_ERRORS as exc:
            if started:
                raise
            delay = policy.delay(retries, exc.retry_after)
            if delay is None:
                raise
            retries += 1
            logger.warning(
                "%s: %s (%s); retry %d of %d in %.2fs",
                label,
                exc.code,
                exc.message,
                retries,
                policy.max_retries,
                delay,
            )
            await sleep(delay)
