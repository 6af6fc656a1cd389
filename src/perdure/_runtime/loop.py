"""The one event loop behind perdure's sync entry points.

Sync calls (``agent("...")``, ``Session.resume``, the CLI) run their coroutine on a
single long-lived event loop, created on first use. Never a new loop per call: async
stores and connection pools that bind to a loop stay valid across calls.

Who runs that loop: a sync call from a thread that runs no loop of its own runs it
itself, on the calling thread, until its coroutine is done (as ``asyncio.Runner``
does), so a bare ``agent("...")`` turn costs what ``await agent.invoke_async(...)``
costs, with no thread hand-off. A call that cannot do that — the loop is already
being run for another call, or the calling thread runs a loop of its own (a
notebook cell, a web handler) — hands its coroutine to the loop and waits: when no
thread runs the loop then, a daemon thread is started to run it until the handed-off
calls are done, and a caller whose own call ends while others' are still running
hands the loop to such a thread, so it never waits for them. So does a caller whose
call leaves tasks running on the loop (a memory extraction job, a tool's background
task): they go on in that thread, which stops once the loop has nothing left to run.

A sync call made inside someone else's running loop runs on perdure's loop, blocking
only the calling thread, and logs once (per process and async twin) a warning that
names the coroutine to await instead. Only a call made while running perdure's own
loop (from a tool or a hook of a running agent) is refused: it would wait for itself.

On the main thread, Ctrl-C during a call cancels its coroutine (which sees
``CancelledError`` at the ``await`` it was in) and then raises ``KeyboardInterrupt``.

The loop belongs to the process that made it: a child made by ``fork()`` (a
pre-fork server's worker, a ``multiprocessing`` child) starts its own on first use,
even when the parent's was running at the fork (its thread did not come along).
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # no stub; see _drive
import asyncio
import atexit
import contextlib
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Coroutine
from typing import Any, Generic, TypeVar, cast

from perdure._runtime.threads import PerProcess

T = TypeVar("T")

_log = logging.getLogger(__name__)

# The calling thread's running loop or None, without the RuntimeError that
# get_running_loop() raises (and a sync call pays for) when there is none.
running_loop = asyncio.events._get_running_loop

_IDLE_CHECK = 0.05  # seconds between looks, by the loop thread, for work left to run
_MADE_PRUNE = 1024  # tasks remembered before the finished ones are dropped


class _Runner:
    """perdure's event loop in one process, and who runs it.

    At most one thread runs the loop at a time: a ``driver`` (a caller running it for
    its own call) or the ``thread`` started for handed-off calls. Both fields, and
    ``handed``, change under ``lock``; a thread that stops running the loop leaves
    ``stopping`` set, and the next one to run it first waits for it to be out.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.driver: threading.Thread | None = None
        self.thread: threading.Thread | None = None
        self.stopping: threading.Thread | None = None
        self.handed = 0  # handed-off calls not finished yet
        # Tasks made on the loop since it last had nothing left to run: what a driver
        # checks when its call ends (asyncio.all_tasks walks every task of the process).
        self.made: list[asyncio.Task[Any]] = []
        self.warned: set[str] = set()  # async twins named in a warning already
        # A socket pair's fds (read end, write end); the loop watches the read end
        # (see _drive), when it can. Plain fds: no socket object to warn at exit.
        self.wake: tuple[int, int] | None = None
        self.wake_fd = -1  # its write end, or -1

    def claim(self, may_drive: bool) -> tuple[asyncio.AbstractEventLoop, bool]:
        """The loop, and whether the caller runs it (else it hands its call off)."""
        while True:
            with self.lock:
                stopping = self.stopping
                if stopping is None or not stopping.is_alive():
                    self.stopping = None
                    if self.loop is None or self.loop.is_closed():
                        self.loop = asyncio.new_event_loop()
                        self.loop.set_task_factory(self._new_task)
                        self._watch_wake()
                    if self.driver is None and self.thread is None and may_drive:
                        self.driver = threading.current_thread()
                        return self.loop, True
                    self.handed += 1
                    if self.driver is None and self.thread is None:
                        self._start_thread()
                    return self.loop, False
            stopping.join()  # a thread still leaving run_forever(): wait it out

    def _watch_wake(self) -> None:
        """A new socket pair for the new loop to watch (the last loop's is closed)."""
        self._close_wake()
        self.wake = _wake_on_signal(self.loop)
        self.wake_fd = -1 if self.wake is None else self.wake[1]

    def _close_wake(self) -> None:
        wake, self.wake, self.wake_fd = self.wake, None, -1
        for fd in wake or ():
            with contextlib.suppress(OSError):
                os.close(fd)

    def _new_task(
        self, loop: asyncio.AbstractEventLoop, coro: Any, **options: Any
    ) -> asyncio.Task[Any]:
        task = asyncio.Task(coro, loop=loop, **options)
        made = self.made
        if len(made) >= _MADE_PRUNE:  # a long call making many tasks: keep only the live
            made[:] = [other for other in made if not other.done()]
        made.append(task)
        return task

    def _start_thread(self) -> None:
        """Run the loop in a new daemon thread (under ``lock``, nobody running it).

        The thread runs it while there is work: handed-off calls, or tasks a call left
        running (a memory extraction job, a tool's background task). It looks again
        when a handed-off call ends, and every ``_IDLE_CHECK`` seconds for the rest.
        """
        loop = self.loop
        assert loop is not None
        loop.call_soon(self._idle_check)
        self.thread = threading.Thread(
            target=loop.run_forever, name="perdure-event-loop", daemon=True
        )
        self.thread.start()

    def _stop_if_idle(self) -> bool:
        """Stop the loop thread (called on it, under ``lock``) when no work is left."""
        loop = self.loop
        if loop is None or self.thread is not threading.current_thread() or self.handed:
            return self.thread is None
        current = asyncio.current_task(loop)
        if any(task is not current for task in asyncio.all_tasks(loop)):
            return False
        self.made.clear()
        self.stopping, self.thread = self.thread, None
        loop.stop()
        return True

    def _idle_check(self) -> None:
        with self.lock:
            stopped = self._stop_if_idle()
        if not stopped and self.loop is not None:
            self.loop.call_later(_IDLE_CHECK, self._idle_check)

    def handed_done(self) -> None:
        """A handed-off call ended (on the loop): the last one may stop the loop thread."""
        with self.lock:
            self.handed -= 1
            self._stop_if_idle()

    def release(self) -> None:
        """The driver's call is done: others' calls, and tasks it left, go on in a thread."""
        with self.lock:
            self.driver = None
            left = [task for task in self.made if not task.done()]
            self.made.clear()
            if self.handed > 0 or left:
                self._start_thread()

    def running_here(self) -> bool:
        """True when the calling thread is running perdure's loop (in this process)."""
        running = running_loop()
        return running is not None and running is self.loop

    def shutdown(self) -> None:
        with self.lock:
            loop, thread = self.loop, self.thread
            if thread is None and self.driver is None:
                self.loop = None
        if loop is None:
            return
        if thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=5)
        if not loop.is_running() and not loop.is_closed():
            loop.close()
            self._close_wake()


# A forked child gets a new _Runner; the parent's (a loop another thread may have been
# running, an epoll instance shared with the parent) is kept alive there but never touched.
_runner: PerProcess[_Runner] = PerProcess(_Runner)


@atexit.register
def _shutdown() -> None:
    _runner.value.shutdown()


def in_running_loop() -> bool:
    """True when the calling thread is running an event loop."""
    return running_loop() is not None


def is_runner_thread() -> bool:
    """True when the calling thread is running perdure's event loop (in this process)."""
    return _runner.value.running_here()


def run_sync(coro: Coroutine[Any, Any, T], *, async_name: str) -> T:
    """Run ``coro`` on perdure's event loop and return its result.

    The calling thread waits; when it runs an event loop of its own, that loop is
    blocked until the call returns, and a warning naming ``async_name`` (the
    coroutine to await instead) is logged once per process.

    Raises:
        RuntimeError: called while running perdure's own event loop (from a tool or a
            hook of a running agent), where waiting would deadlock; the message
            names ``async_name``.
    """
    if running_loop() is not None:
        runner = _runner.value
        if runner.running_here():
            coro.close()
            raise RuntimeError(
                "cannot call perdure's sync API on perdure's own event loop thread (inside "
                f"a tool or hook of a running agent): it would wait for itself; "
                f"use `await {async_name}` instead"
            )
        if async_name not in runner.warned:
            runner.warned.add(async_name)
            _log.warning(
                "a sync perdure call was made inside a running event loop: it runs on "
                "perdure's loop and blocks this one until it returns; use `await %s` "
                "instead",
                async_name,
            )
    return run_blocking(coro)


def run_blocking(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on perdure's loop and wait, even if this thread runs another loop.

    Must not be called while running perdure's own loop (it would wait on itself).
    """
    runner = _runner.value
    running = running_loop()
    if running is not None and running is runner.loop:
        coro.close()
        raise RuntimeError("run_blocking called from perdure's own event loop thread")
    loop, drive = runner.claim(may_drive=running is None)
    if drive:
        try:
            return _drive(runner, loop, coro)
        finally:
            runner.release()
    return _hand_off(runner, loop, coro)


def _drive(runner: _Runner, loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
    """Run the loop on this thread until ``coro`` is done (``asyncio.Runner``'s way).

    On the main thread, a SIGINT cancels the coroutine, which then raises
    ``KeyboardInterrupt`` here once it has unwound; a second one interrupts at once.
    """
    # Made here, not by the loop's task factory: the call's own task is done when the
    # call returns, so it need not join the tasks a call may leave behind (runner.made).
    task: asyncio.Task[T] = asyncio.Task(coro, loop=loop)
    interrupts = 0

    def on_sigint(signum: int, frame: object) -> None:
        nonlocal interrupts
        interrupts += 1
        if interrupts == 1 and not task.done():
            task.cancel()
            loop.call_soon_threadsafe(lambda: None)  # wake the loop out of its wait
            return
        raise KeyboardInterrupt

    previous: Any = None
    wake_fd = -1
    old_wake_fd: int | None = None  # set while this call has the wakeup fd set
    # _signal: the signal module's own functions, without the enum conversions its
    # wrappers make (12 us a call here, as much as the rest of the hand-over).
    if (
        threading.get_ident() == threading.main_thread().ident
        and _signal.getsignal(signal.SIGINT) is signal.default_int_handler
    ):
        previous = _signal.signal(signal.SIGINT, on_sigint)
        wake_fd = runner.wake_fd
    try:
        try:
            if _first_step(loop, task) and not _has_ready(loop):
                return task.result()
            if wake_fd >= 0:
                # A SIGINT that lands after the loop's last look at pending signals
                # and before its select() would otherwise wait there unhandled until
                # the next event (an hour's sleep): the C handler writes to this fd,
                # which the loop watches, so select() returns and the Python handler
                # runs. Not needed before: the first step runs no select(), and a
                # SIGINT during it runs the handler at its next bytecode.
                old_wake_fd = _signal.set_wakeup_fd(wake_fd, warn_on_full_buffer=False)
            return loop.run_until_complete(task)
        except asyncio.CancelledError:
            if interrupts:
                raise KeyboardInterrupt from None
            raise
        except BaseException:
            if not task.done():  # escaped the loop mid-step: stop the coroutine too
                task.cancel()
                with contextlib.suppress(BaseException):  # its outcome: the cancellation
                    loop.run_until_complete(task)
            elif not task.cancelled():
                task.exception()  # raised here: no "never retrieved" warning on the task
            raise
    finally:
        if previous is not None:
            if old_wake_fd is not None:
                _signal.set_wakeup_fd(old_wake_fd)
            _signal.signal(signal.SIGINT, previous)


def _wake_on_signal(loop: asyncio.AbstractEventLoop | None) -> tuple[int, int] | None:
    """A socket pair's fds (read end, write end); ``loop`` watches and drains the first.

    None when the loop cannot watch a socket (a proactor loop): a driver then does
    without (see :func:`_drive`).
    """
    assert loop is not None
    pair = socket.socketpair()
    for end in pair:
        end.setblocking(False)
    reader, writer = (end.detach() for end in pair)

    def drain() -> None:
        with contextlib.suppress(OSError):
            while os.read(reader, 4096):
                pass

    try:
        loop.add_reader(reader, drain)
    except NotImplementedError:
        os.close(reader)
        os.close(writer)
        return None
    return reader, writer


def _first_step(loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> bool:
    """Run ``task``'s first step here and now; True when that finished it.

    A turn that never waits (a bare turn, a session whose writes need no wait)
    finishes in its first step, and ``run_until_complete`` would spend as much again
    around it: two passes of the loop, two ``select`` calls, a done-callback and the
    loop's start and stop. So the step ``create_task`` scheduled is taken back out
    of the loop's queue and run on this thread with the loop set up as
    ``run_forever`` sets it (the running loop, its thread, its async-generator
    hooks), as Python 3.12's eager tasks run a task's first step inside ``create_task``.
    The task is a real one: ``current_task()``, ``asyncio.timeout`` and a cancel
    behave as in any step. When the step is not the one just queued (another thread
    queued a callback in between) or the loop is not asyncio's own (uvloop), nothing
    is taken and False is returned: the loop runs the task as usual.
    """
    ready = getattr(loop, "_ready", None)
    if not _EAGER or not isinstance(loop, asyncio.BaseEventLoop) or not ready:
        return False
    handle = ready[-1]
    if getattr(handle._callback, "__self__", None) is not task:
        return False
    ready.pop()
    hooks = sys.get_asyncgen_hooks()
    loop_any: Any = loop  # the private parts run_forever sets; checked in _EAGER
    loop_any._thread_id = threading.get_ident()
    sys.set_asyncgen_hooks(
        firstiter=loop_any._asyncgen_firstiter_hook, finalizer=loop_any._asyncgen_finalizer_hook
    )
    asyncio.events._set_running_loop(loop)
    try:
        handle._run()
    finally:
        asyncio.events._set_running_loop(None)
        sys.set_asyncgen_hooks(*hooks)
        loop_any._thread_id = None
    finished: bool = task.done()
    return finished


def _has_ready(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether callbacks wait in the loop's queue (run by one pass of the loop)."""
    return bool(getattr(loop, "_ready", True))


def _eager_possible() -> bool:
    """Whether this Python's event loop has the parts :func:`_first_step` uses."""
    loop = asyncio.new_event_loop()
    try:
        if not isinstance(loop, asyncio.BaseEventLoop):
            return False
        parts = ("_ready", "_thread_id", "_asyncgen_firstiter_hook", "_asyncgen_finalizer_hook")
        return all(hasattr(loop, name) for name in parts)
    finally:
        loop.close()


_EAGER = _eager_possible()


def _hand_off(runner: _Runner, loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
    """Hand ``coro`` to whoever runs perdure's loop and wait for its outcome.

    The hand-off is the lightest there is: one wake-up of the loop (its self-pipe),
    the coroutine run in a task that records its outcome and releases a plain lock
    as its last step, and the caller woken by that lock. (``run_coroutine_threadsafe``
    adds a loop iteration for the task's done-callbacks and a condition variable.)
    """
    call: _Call[T] = _Call(coro, runner)
    try:
        loop.call_soon_threadsafe(call.start, loop)
        call.done.acquire()
    except BaseException:
        # KeyboardInterrupt (or any escape) while waiting: stop the coroutine too.
        try:
            loop.call_soon_threadsafe(call.cancel)
        except RuntimeError:  # the loop is closed: nothing runs there any more
            coro.close()
            runner.handed_done()
        else:
            call.done.acquire(timeout=5)
        raise
    return call.result()


class _Call(Generic[T]):
    """One coroutine handed to perdure's loop by a blocked thread, and its outcome."""

    def __init__(self, coro: Coroutine[Any, Any, T], runner: _Runner) -> None:
        self.coro = coro
        self.runner = runner
        self.done = threading.Lock()
        self.done.acquire()  # released once the outcome is set
        self.task: asyncio.Task[None] | None = None
        self.value: T | None = None
        self.error: BaseException | None = None
        self.finished = False  # the outcome is set (touched on the loop's thread only)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.task = loop.create_task(self.run())

    def cancel(self) -> None:
        # Scheduled after start() by the same thread, when start() was scheduled at
        # all: the loop runs them in order, so no task here means it never will be.
        if self.task is None:
            self._never_ran()
            return
        self.task.cancel()
        # A task cancelled before its first step never enters run(): its finally
        # would not release the caller, nor would the coroutine be closed.
        self.task.add_done_callback(lambda _task: self._never_ran())

    def _never_ran(self) -> None:
        if not self.finished:
            self.coro.close()
            self._finish()

    def _finish(self) -> None:
        self.finished = True
        self.runner.handed_done()
        self.done.release()

    async def run(self) -> None:
        try:
            self.value = await self.coro
        except BaseException as exc:  # handed to the waiting thread, raised there
            self.error = exc
        finally:
            self._finish()

    def result(self) -> T:
        if self.error is not None:
            error, self.error = self.error, None  # no cycle through the traceback
            raise error
        return cast(T, self.value)  # run() set a value (None is one) or an error
