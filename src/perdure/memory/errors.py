"""The error a memory store raises when its backend fails (defined in :mod:`perdure.errors`)."""

from __future__ import annotations

from perdure.errors import MemoryStoreError

__all__ = ["MemoryStoreError"]
