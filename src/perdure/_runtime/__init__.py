"""Layer 0: the private plumbing every layer may use (SPEC §1).

Knowledge of threads, ``fork()`` and the sync façade lives here and nowhere else:

- :mod:`~perdure._runtime.loop` — the one event loop behind every sync entry point
  (``agent("...")``, ``Session.resume``, the CLI), safe across ``fork()``.
- :mod:`~perdure._runtime.threads` — the writer worker a store runs its blocking I/O
  on, and the fork handling every worker shares.
- :mod:`~perdure._runtime.fsync` — the fsync strategies (a thread, the kernel's AIO).
- :mod:`~perdure._runtime.fs` — atomic writes, directory syncs, full appends.
- :mod:`~perdure._runtime.sqlite` — the one translation of SQLite driver errors;
  :mod:`~perdure._runtime.sqlite_wal` — the write-ahead log's frame check.
"""
