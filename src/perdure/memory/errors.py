"""The errors a memory store raises when its backend fails (defined in :mod:`perdure.errors`).

:class:`MemoryStoreLockedError` (a :class:`MemoryStoreError`) when another
connection kept the database locked; :class:`MemoryStoreError` for damage
(``details["fault"] == "damage"``) and any other failure.
"""

from __future__ import annotations

from perdure.errors import MemoryStoreError, MemoryStoreLockedError

__all__ = ["MemoryStoreError", "MemoryStoreLockedError"]
