"""The file store: a directory per session holding a hash-chained JSONL journal.

:mod:`~perdure.stores.file.store` is the store, :class:`FileSessionStore` (writer lock,
reads, writes, seals, rewrites; importable from here, as from :mod:`perdure`);
:mod:`~perdure.stores.file.journal` is the on-disk record format (SPEC §7.1);
:mod:`~perdure.stores.file.layout` the file names and ``meta.json``;
:mod:`~perdure.stores.file.tail` the cached end of a journal an append works from;
:mod:`~perdure.stores.file.leftovers` what killed writers leave;
:mod:`~perdure.stores.file.quarantine` which damaged records recovery moves out.
"""

from __future__ import annotations

import typing as _typing

from perdure._runtime.lazy import lazy_exports as _lazy_exports

if _typing.TYPE_CHECKING:
    from perdure.stores.file.store import FileSessionStore as FileSessionStore

# Lazily: importing the journal format alone (as the tools that read it do) does not
# load the store.
_EXPORTS = {"FileSessionStore": "perdure.stores.file.store"}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS)
