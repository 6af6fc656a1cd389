"""Key rules shared by every :class:`~perdure.storage.Storage` backend (pure functions).

A key is a ``/``-separated path of one or more non-empty segments, the same on every
backend, so that a layout written to one store can be copied to another::

    sessions/my-session/agents/default/latest          valid
    /sessions/x   a//b   a/../b   a/./b   a\\b   a/b/   ""    invalid (ValueError)

A key must also be encodable as UTF-8 (no lone surrogates) and hold no NUL.
"""

from __future__ import annotations

from typing import Any

from perdure.errors import StorageConflictError

__all__ = [
    "check_data",
    "check_end",
    "check_expected",
    "prefix_upper_bound",
    "validate_key",
    "validate_list_args",
    "validate_prefix",
    "version_conflict",
]


def _fail(argument: str, value: str, why: str) -> ValueError:
    return ValueError(f"{argument} {value!r} is invalid: {why}")


def _check_text(value: Any, argument: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{argument} must be a str, got {type(value).__name__}")
    if "\x00" in value:
        raise _fail(argument, value, "it contains NUL")
    if "\\" in value:
        raise _fail(argument, value, "it contains a backslash")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _fail(argument, value, "it is not encodable as UTF-8") from None
    return value


def validate_key(key: Any, argument: str = "key") -> str:
    """Return ``key`` unchanged if it is a valid storage key.

    Raises:
        TypeError: ``key`` is not a ``str``.
        ValueError: ``key`` is empty, starts with ``/``, holds a backslash or NUL, is
            not UTF-8 encodable, or has an empty, ``.`` or ``..`` segment (which also
            rules out a trailing ``/``). The message names the key.
    """
    text = _check_text(key, argument)
    if not text:
        raise _fail(argument, text, "it is empty")
    if text.startswith("/"):
        raise _fail(argument, text, "it starts with '/'")
    for segment in text.split("/"):
        if segment in ("", ".", ".."):
            raise _fail(
                argument, text, f"it has an {'empty' if not segment else repr(segment)} segment"
            )
    return text


def validate_prefix(prefix: Any, argument: str = "prefix") -> str:
    """Return ``prefix`` unchanged if it can prefix valid keys (``""`` lists everything).

    The last segment may be partial (``"sessions/ab"`` matches ``"sessions/abc/x"``)
    or empty (``"sessions/"``); every earlier segment follows :func:`validate_key`.

    Raises:
        TypeError: ``prefix`` is not a ``str``.
        ValueError: ``prefix`` breaks a key rule (see :func:`validate_key`).
    """
    text = _check_text(prefix, argument)
    if text.startswith("/"):
        raise _fail(argument, text, "it starts with '/'")
    for segment in text.split("/")[:-1]:
        if segment in ("", ".", ".."):
            raise _fail(
                argument,
                text,
                f"it has an {'empty' if not segment else repr(segment)} segment",
            )
    return text


def validate_list_args(prefix: Any, limit: Any, start_after: Any) -> None:
    """Check the arguments of ``Storage.list``; return ``None`` if they are valid.

    Raises:
        TypeError: ``prefix``/``start_after`` is not a ``str``, ``limit`` not an ``int``.
        ValueError: ``prefix`` is invalid, ``limit`` is negative, or ``start_after``
            holds NUL or is not UTF-8 encodable. Each message names the argument.
    """
    validate_prefix(prefix)
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise TypeError(f"limit must be an int or None, got {type(limit).__name__}")
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
    if start_after is not None:
        if not isinstance(start_after, str):
            raise TypeError(f"start_after must be a str or None, got {type(start_after).__name__}")
        if "\x00" in start_after:
            raise _fail("start_after", start_after, "it contains NUL")
        try:
            start_after.encode("utf-8")
        except UnicodeEncodeError:
            raise _fail("start_after", start_after, "it is not encodable as UTF-8") from None


def check_data(data: Any) -> bytes:
    """Return ``data`` as ``bytes`` (bytes-like values are copied).

    Raises:
        TypeError: ``data`` is not bytes-like (a ``str`` must be encoded first).
    """
    if isinstance(data, bytes):
        return data
    if isinstance(data, bytearray | memoryview):
        return bytes(data)
    raise TypeError(f"data must be bytes, got {type(data).__name__}")


def check_expected(expected: Any) -> str | None:
    """Return ``expected`` (the version a conditional write expects) if it is one.

    Raises:
        TypeError: ``expected`` is neither a ``str`` nor ``None`` (the message names it).
    """
    if expected is not None and not isinstance(expected, str):
        raise TypeError(f"expected must be a version (str) or None, got {type(expected).__name__}")
    return expected


MAX_COUNTER_VERSION = 2**63 - 1
"""The largest version a counting backend (PostgreSQL, Redis) gives a key."""


def counter_version(expected: str) -> int | None:
    """The number a counting backend's version string names, or None if it names none.

    Such a version is the decimal of a counter in ``1..MAX_COUNTER_VERSION``, written
    without sign or leading zeros: any other text was never given by the backend.
    """
    if not expected.isascii() or not expected.isdigit():
        return None
    number = int(expected)
    if str(number) != expected or not 0 < number <= MAX_COUNTER_VERSION:
        return None
    return number


def version_conflict(
    where: str, key: str, expected: str | None, found: str | None, *, lost: bool = False
) -> StorageConflictError:
    """The error of a conditional write (``write_if``) that found another version.

    ``where`` names the storage ("PostgreSQL storage postgresql://…"); ``found`` is
    the version seen (``None``: no blob). With ``lost``, the connection was lost during
    the write and the key moved on since: ``details["outcome"]`` is ``"unknown"``.
    """
    if expected is None:
        why = f"expected no blob, found version {found}"
    elif found is None:
        why = f"expected version {expected}, found no blob"
    else:
        why = f"expected version {expected}, found {found}"
    details: dict[str, Any] = {"key": key, "expected": expected, "found": found}
    if lost:
        details["outcome"] = "unknown"
        why += (
            "; the connection was lost during the write and the key moved on "
            "meanwhile: whether the write was applied first cannot be told"
        )
    return StorageConflictError(f"{where}: {key!r} was not written: {why}", details=details)


def prefix_upper_bound(prefix: str) -> str | None:
    """The smallest string above every string starting with ``prefix`` (None: unbounded).

    ``key >= prefix AND key < bound`` selects the keys starting with ``prefix`` in a
    store that compares keys by code point (by UTF-8 bytes), with an index.
    """
    chars = list(prefix)
    while chars:
        code = ord(chars[-1]) + 1
        if 0xD800 <= code <= 0xDFFF:
            code = 0xE000  # skip surrogates: they cannot be encoded as UTF-8
        if code <= 0x10FFFF:
            chars[-1] = chr(code)
            return "".join(chars)
        chars.pop()
    return None


def check_end(size: Any, tail: Any, *, absent_ok: bool) -> tuple[int | None, bytes]:
    """Check the expected end of an :class:`~perdure.storage.AppendStorage` call.

    Returns ``(size, tail)`` with ``tail`` as ``bytes``.

    Raises:
        TypeError: ``size`` is not an int (or ``None`` where ``absent_ok``), or
            ``tail`` is not bytes-like.
        ValueError: ``size`` is negative or shorter than ``tail``, or ``size`` is
            ``None`` with a non-empty ``tail``.
    """
    if isinstance(tail, bytearray | memoryview):
        tail = bytes(tail)
    if not isinstance(tail, bytes):
        raise TypeError(f"tail must be bytes, got {type(tail).__name__}")
    if size is None and absent_ok:
        if tail:
            raise ValueError("tail must be empty when size is None (the blob must not exist)")
        return None, tail
    if isinstance(size, bool) or not isinstance(size, int):
        raise TypeError(f"size must be an int, got {type(size).__name__}")
    if size < len(tail):
        raise ValueError(f"size must be >= len(tail) ({len(tail)}), got {size}")
    return size, tail
