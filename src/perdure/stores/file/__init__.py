"""The file store: a directory per session holding a hash-chained JSONL journal.

:mod:`~perdure.stores.file.store` is the store (writer lock, reads, writes, seals,
rewrites); :mod:`~perdure.stores.file.journal` is the on-disk record format
(SPEC §7.1); :mod:`~perdure.stores.file.layout` the file names and ``meta.json``;
:mod:`~perdure.stores.file.tail` the cached end of a journal an append works from;
:mod:`~perdure.stores.file.leftovers` what killed writers leave;
:mod:`~perdure.stores.file.quarantine` which damaged records recovery moves out.
"""
