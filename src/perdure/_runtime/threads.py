"""A store's own worker thread, safe across fork()."""

from __future__ import annotations

import concurrent.futures
import os
import threading


class StoreThread:
    """One worker thread, started on first use and started again after fork().

    A child made by fork() inherits a ``ThreadPoolExecutor`` but not its thread:
    work queued there would never run. :meth:`executor` notices the new process
    and makes another.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._guard = threading.Lock()
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._pid = 0  # the process that made _executor

    def executor(self) -> concurrent.futures.ThreadPoolExecutor:
        """The thread's executor in this process."""
        with self._guard:
            if self._executor is None or self._pid != os.getpid():
                self._executor = concurrent.futures.ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix=self._name
                )
                self._pid = os.getpid()
            return self._executor

    def shutdown(self) -> None:
        """Wait for queued work and stop the thread (the next use starts another)."""
        with self._guard:
            executor, self._executor = self._executor, None
        if executor is not None and self._pid == os.getpid():
            executor.shutdown(wait=True)
