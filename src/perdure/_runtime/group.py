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
Any event loop and any thread may submit. A batch's outcomes go back to each
submitting loop in one call (:meth:`asyncio.AbstractEventLoop.call_soon_threadsafe`
of all that loop's items): sixteen sessions' commits made durable by one sync wake
their loop once, not sixteen times, each wake-up a write to its self-pipe taken
under the GIL from the loop's thread. The thread and the queue belong to one process
(a child made by ``fork()`` starts its own, see :mod:`perdure._runtime.threads`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from perdure._runtime.threads import PerProcess, ProcessLock, StoreThread

__all__ = ["GroupWriter"]

ItemT = TypeVar("ItemT")
ResultT = TypeVar("ResultT")


class _Waiter:
    """One submitted item and what its submitter awaits, on ``loop``."""

    __slots__ = ("item", "loop", "result")

    def __init__(self, item: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.item = item
        self.loop = loop
        self.result: asyncio.Future[Any] = loop.create_future()


class _Queue:
    """The items waiting for the next batch, and whether a drain is on its way."""

    __slots__ = ("draining", "items")

    def __init__(self) -> None:
        self.items: list[_Waiter] = []
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
        self._queue: PerProcess[_Queue] = PerProcess(_Queue)

    async def submit(self, item: ItemT) -> ResultT:
        """Run ``item`` in the next batch and return its outcome (or raise it)."""
        loop = asyncio.get_running_loop()
        waiter = _Waiter(item, loop)
        with self._guard:
            queue = self._queue.value
            queue.items.append(waiter)
            start, queue.draining = not queue.draining, True
        if start:
            try:
                self._thread.executor().submit(self._drain)
            except RuntimeError as exc:  # the interpreter is shutting down
                self._fail_queued(exc)
        try:
            result: ResultT = await waiter.result
        except asyncio.CancelledError:
            self._withdraw(waiter)
            raise
        return result

    def _withdraw(self, waiter: _Waiter) -> None:
        """A cancelled submitter's item is not run, unless its batch has taken it."""
        with self._guard:
            items = self._queue.value.items
            for at, queued in enumerate(items):
                if queued is waiter:
                    del items[at]
                    return

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
            # A submitter cancelled before its batch starts withdrew its item (and got
            # no write made for it); one cancelled from now on no longer waits for it.
            outcomes: Sequence[ResultT | BaseException]
            try:
                outcomes = self._run_batch([waiter.item for waiter in batch])
                if len(outcomes) != len(batch):
                    raise RuntimeError(
                        f"a batch of {len(batch)} items gave {len(outcomes)} outcomes"
                    )
            except BaseException as exc:  # every item of the batch shares its fate
                outcomes = [exc] * len(batch)
            _hand_back(list(zip(batch, outcomes, strict=True)))

    def _fail_queued(self, exc: BaseException) -> None:
        with self._guard:
            queue = self._queue.value
            batch, queue.items = queue.items, []
            queue.draining = False
        _hand_back([(waiter, exc) for waiter in batch])


def _hand_back(done: list[tuple[_Waiter, Any]]) -> None:
    """Each outcome to its submitter: one call on each submitting loop (any thread)."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Waiter, Any]]] = {}
    for waiter, outcome in done:
        by_loop.setdefault(waiter.loop, []).append((waiter, outcome))
    for loop, outcomes in by_loop.items():
        with contextlib.suppress(RuntimeError):  # that loop is closed: nobody awaits
            loop.call_soon_threadsafe(_settle, outcomes)


def _settle(done: list[tuple[_Waiter, Any]]) -> None:
    """On the submitters' loop: their awaited futures get the outcomes (a cancelled
    submitter's is done already and stays so)."""
    for waiter, outcome in done:
        result = waiter.result
        if result.done():
            continue
        if isinstance(outcome, BaseException):
            result.set_exception(outcome)
        else:
            result.set_result(outcome)
