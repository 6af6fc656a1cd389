"""Argument checks shared by the stores, storages and memory stores."""

from __future__ import annotations

from typing import Any

__all__ = ["check_seconds"]


def check_seconds(name: str, value: Any) -> float:
    """``value`` as a float when it is a number of seconds > 0.

    Raises:
        ValueError: anything else (a bool, a string, 0, a negative number, NaN); the
            message names ``name``.
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")
    return float(value)
