"""Group commit: writes that arrive while one is being made durable go together.

A store whose every durable write costs one sync (an SQLite transaction with
``synchronous=FULL``) can make many sessions' writes durable with that one sync,
as PostgreSQL does for its clients. :class:`GroupWriter` hands each write to the
store's writer thread; while the thread runs a batch, the writes submitted meanwhile
wait, and the next batch takes all of them at once. A lone write is run at once: no
timer waits for company, so one session's latency is one hop to the thread, as
before; sixteen sessions share their syncs.

The store's batch function gets the items in the order they were submitted and
returns one outcome per item (a result, or the exception that item raises), so one
item's failure is its own. Nothing is acknowledged before the batch function
returns, which is after the sync that covers the item.

A write whose awaiting coroutine is cancelled before its batch starts is not run; one
cancelled later runs to its end (the caller no longer waits for its outcome).
Any event loop and any thread may submit: outcomes come back through
``concurrent.futures`` futures, which :func:`asyncio.wrap_future` hands to the
submitting loop. The thread and the queue belong to one process (a child made by
``fork()`` starts its own, see :mod:`perdure._runtime.threads`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from perdure._runtime.threads import PerProcess, ProcessLock, StoreThread

__all__ = ["GroupWriter"]

ItemT = TypeVar("ItemT")
ResultT = TypeVar("ResultT")


class _Queue(Generic[ItemT, ResultT]):
    """The items waiting for the next batch, and whether a drain is on its way."""

    __slots__ = ("draining", "items")

    def __init__(self) -> None:
        self.items: list[tuple[ItemT, concurrent.futures.Future[ResultT]]] = []
        self.draining = False


class GroupWriter(Generic[ItemT, ResultT]):
    """Runs submitted items in batches on one worker thread (see the module docstring).

    Args:
        name: the worker thread's name prefix.
        run_batch: called on the worker thread with the items of one batch, in
            submission order; returns one outcome per item, in the same order: the
            item's result or the exception its submitter gets. An exception it
            raises itself is every item's outcome.
    """

    def __init__(
        self,
        name: str,
        run_batch: Callable[[Sequence[ItemT]], Sequence[ResultT | BaseException]],
    ) -> None:
        self._run_batch = run_batch
        self._thread = StoreThread(name)
        self._guard = ProcessLock()
        self._queue: PerProcess[_Queue[ItemT, ResultT]] = PerProcess(_Queue)

    async def submit(self, item: ItemT) -> ResultT:
        """Run ``item`` in the next batch and return its outcome (or raise it)."""
        future: concurrent.futures.Future[ResultT] = concurrent.futures.Future()
        with self._guard:
            queue = self._queue.value
            queue.items.append((item, future))
            start, queue.draining = not queue.draining, True
        if start:
            try:
                self._thread.executor().submit(self._drain)
            except RuntimeError as exc:  # the interpreter is shutting down
                self._fail_queued(exc)
        return await asyncio.wrap_future(future)

    def shutdown(self) -> None:
        """Wait for the batches under way and stop the thread (the next submit starts one)."""
        self._thread.shutdown()

    def _drain(self) -> None:
        """Run batches until no item waits (on the worker thread)."""
        while True:
            with self._guard:
                queue = self._queue.value
                batch, queue.items = queue.items, []
                if not batch:
                    queue.draining = False
                    return
            # A submitter cancelled before its batch starts gets no write made for it.
            live = [(item, fut) for item, fut in batch if fut.set_running_or_notify_cancel()]
            if not live:
                continue
            try:
                outcomes = self._run_batch([item for item, _ in live])
                if len(outcomes) != len(live):
                    raise RuntimeError(
                        f"a batch of {len(live)} items gave {len(outcomes)} outcomes"
                    )
            except BaseException as exc:  # every item of the batch shares its fate
                outcomes = [exc] * len(live)
            for (_, future), outcome in zip(live, outcomes, strict=True):
                if isinstance(outcome, BaseException):
                    future.set_exception(outcome)
                else:
                    future.set_result(outcome)

    def _fail_queued(self, exc: BaseException) -> None:
        with self._guard:
            queue = self._queue.value
            batch, queue.items = queue.items, []
            queue.draining = False
        for _, future in batch:
            if future.set_running_or_notify_cancel():
                future.set_exception(exc)
