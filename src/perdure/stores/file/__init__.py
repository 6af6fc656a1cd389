"""The file store: a directory per session holding a hash-chained JSONL journal.

:mod:`~perdure.stores.file.store` is the store (layout, writer lock, reads, writes,
quarantine); :mod:`~perdure.stores.file.journal` is the on-disk record format
(SPEC §7.1).
"""
