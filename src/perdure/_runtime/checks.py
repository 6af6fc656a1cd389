"""Argument checks shared by the stores, storages and memory stores."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["check_count", "check_path", "check_seconds"]


def check_seconds(name: str, value: Any) -> float:
    """``value`` as a float when it is a number of seconds > 0.

    Raises:
        ValueError: anything else (a bool, a string, 0, a negative number, NaN); the
            message names ``name``.
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")
    return float(value)


def check_path(name: str, value: Any) -> Path:
    """``value`` as a :class:`~pathlib.Path` when it is a ``str`` or ``os.PathLike``.

    Raises:
        TypeError: anything else (an int, ``None``, bytes); the message names ``name``.
    """
    if not isinstance(value, str | os.PathLike):
        raise TypeError(f"{name} must be a str or os.PathLike path, got {type(value).__name__}")
    return Path(value)


def check_count(name: str, value: Any, *, minimum: int = 0) -> int:
    """``value`` when it is an int (not a bool) of at least ``minimum``.

    Raises:
        TypeError: not an int (a float, a string, a bool); the message names ``name``.
        ValueError: below ``minimum``.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return value
