"""Lazy re-exports for the package faces (``perdure``, ``perdure.session``, ``perdure.models``).

A face names what users import; :func:`lazy_exports` gives it the module-level
``__getattr__`` and ``__dir__`` (PEP 562) that load a name's module on first use, so
importing the face stays cheap and never loads a backend or an optional SDK.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    face: str, exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for the module ``face``, loading ``exports`` lazily.

    ``exports`` maps each lazily exported name to the module that defines it. A name
    is imported on first access and then kept in the face's namespace, so later
    accesses cost nothing.
    """
    namespace = vars(sys.modules[face])

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {face!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *exports})

    return __getattr__, __dir__
