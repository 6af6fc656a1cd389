"""fsync off the event loop without a thread hop (Linux native AIO).

A journal append is durable only after an fsync, and an fsync must not block the
event loop. Handing it to a Python worker thread costs two thread wake-ups and a GIL
hand-over each way. On Linux (4.18 and later) the kernel can run the fsync for us:
:func:`start_fsync` submits it with native AIO (``io_submit`` of ``IOCB_CMD_FSYNC``),
the kernel runs it on its own worker and signals an eventfd that the running loop
watches, and the awaiting coroutine resumes as it would after a socket read.

``benchmarks/fsync.py`` on 2-vCPU VMs, per durable append of 420 bytes, as a
multiple of the fsync on the calling thread (the floor, which blocks the loop):
through ``run_in_executor`` 1.5–2.4×, through this module 1.3–1.7× (on three
machines). Of the difference, the kernel's hand-off to its worker is ~10 µs; the
rest is the loop waking up to resume the coroutine (~30 µs): ``io_submit`` and a
blocking wait on the eventfd, without asyncio, came within ~10 µs of the floor.

AIO runs the fsync on a kernel worker bound to the calling CPU: right for a lone
fsync, whose loop only waits for it, but a loop that is busy (many sessions'
commits) loses that CPU to the worker whenever it runs, and ``io_submit`` itself
got slow (~80 µs). ``offload=True`` asks for an fsync that takes nothing from the
loop's CPU: it goes through an io_uring of the loop's own (x86_64), whose workers
are threads the scheduler puts on an idle core, and resolves through an eventfd the
same way (16 durable sessions on one file store, one 2-vCPU VM: 5-20% more
messages a second than with AIO for those syncs; a lone fsync is slower that way,
240-256 µs against AIO's 216-233, ``benchmarks/fsync.py``, hence not the default).
The ring syncs the file through an open file of its own, so that a ring the kernel
ends after its process is gone never holds the caller's locks past it; a file it
cannot open so (not a regular one, no ``/proc``) is synced by AIO.

Where that is not available (another OS, an older kernel, ``io_setup`` refused by a
sandbox, a loop without ``add_reader``, too many fsyncs in flight) the fsync runs on
the given executor on a duplicate of the descriptor, so the caller may close its own
descriptor as soon as :func:`start_fsync` returns. An offload that cannot have an
io_uring (refused by a sandbox's seccomp, another machine) is an AIO fsync.

Either way the fsync is submitted before :func:`start_fsync` returns: the kernel (or
the duplicate) holds its own reference to the open file. The result awaits the same
guarantee as ``os.fsync``: when it resolves, everything written to the file before
the call is on stable storage; a failed fsync raises the ``OSError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import functools
import itertools
import mmap
import os
import platform
import stat
import struct
import sys
import threading
import weakref
from concurrent.futures import Executor

from perdure._runtime.threads import PerProcess

__all__ = ["kernel_fsync_available", "start_fsync"]

_IOCB_CMD_FSYNC = 2
_IOCB_CMD_FDSYNC = 3
_IOCB_FLAG_RESFD = 1
_MAX_EVENTS = 256
# (io_setup, io_destroy, io_getevents, io_submit) by machine; the context lives as
# long as the process, so io_destroy is never called
_SYSCALLS = {
    "x86_64": (206, 207, 208, 209),
    "aarch64": (0, 1, 4, 2),
}


class _Iocb(ctypes.Structure):
    """``struct iocb`` (``linux/aio_abi.h``) on a little-endian 64-bit machine."""

    _fields_ = [
        ("aio_data", ctypes.c_uint64),
        ("aio_key", ctypes.c_uint32),
        ("aio_rw_flags", ctypes.c_int32),
        ("aio_lio_opcode", ctypes.c_uint16),
        ("aio_reqprio", ctypes.c_int16),
        ("aio_fildes", ctypes.c_uint32),
        ("aio_buf", ctypes.c_uint64),
        ("aio_nbytes", ctypes.c_uint64),
        ("aio_offset", ctypes.c_int64),
        ("aio_reserved2", ctypes.c_uint64),
        ("aio_flags", ctypes.c_uint32),
        ("aio_resfd", ctypes.c_uint32),
    ]


class _IoEvent(ctypes.Structure):
    """``struct io_event``."""

    _fields_ = [
        ("data", ctypes.c_uint64),
        ("obj", ctypes.c_uint64),
        ("res", ctypes.c_int64),
        ("res2", ctypes.c_int64),
    ]


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_Waiter = tuple["asyncio.Future[None]", asyncio.AbstractEventLoop]


class _Aio:
    """One process-wide AIO context; an eventfd per event loop signals completions.

    Any loop's eventfd callback reaps every finished fsync and hands each result to
    the loop that awaits it (directly, or with ``call_soon_threadsafe`` when it is
    another loop's), so no completion is lost whichever loop wakes first.
    """

    def __init__(self) -> None:
        numbers = _SYSCALLS.get(platform.machine())
        if not sys.platform.startswith("linux") or numbers is None or sys.byteorder != "little":
            raise OSError("native AIO fsync needs Linux on x86_64 or aarch64")
        if ctypes.sizeof(_Iocb) != 64 or ctypes.sizeof(_IoEvent) != 32:
            raise OSError("unexpected AIO structure layout")
        self._setup, _, self._getevents, self._submit = numbers
        libc = ctypes.CDLL(None, use_errno=True)
        self._syscall = libc.syscall
        self._syscall.restype = ctypes.c_long
        self._ctx = ctypes.c_ulong(0)
        if self._call(self._setup, _MAX_EVENTS, ctypes.byref(self._ctx)) != 0:
            raise _errno_error("io_setup")
        self._lock = threading.Lock()
        self._waiters: dict[int, _Waiter] = {}
        self._tokens = itertools.count(1)
        self._eventfds: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, int | None] = (
            weakref.WeakKeyDictionary()
        )
        # One request block and one event array, reused under the lock: io_submit
        # copies the block, io_getevents fills the array. The syscall arguments are
        # built once (this runs for every durable append).
        self._iocb = _Iocb(aio_lio_opcode=_IOCB_CMD_FSYNC, aio_flags=_IOCB_FLAG_RESFD)
        self._submit_args = (
            ctypes.c_long(self._submit),
            self._ctx,
            ctypes.c_long(1),
            (ctypes.POINTER(_Iocb) * 1)(ctypes.pointer(self._iocb)),
        )
        self._events = (_IoEvent * _MAX_EVENTS)()
        self._no_wait = _Timespec(0, 0)
        self._reap_args = (
            ctypes.c_long(self._getevents),
            self._ctx,
            ctypes.c_long(0),
            ctypes.c_long(_MAX_EVENTS),
            self._events,
            ctypes.byref(self._no_wait),
        )

    def _call(self, number: int, *args: object) -> int:
        """``syscall(number, *args)``; ints go as C longs (varargs would truncate them)."""
        converted = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
        return int(self._syscall(ctypes.c_long(number), *converted))

    def start(self, fd: int, datasync: bool = False) -> asyncio.Future[None] | None:
        """Submit an fsync (``datasync``: fdatasync) of ``fd``; None when this loop or
        the kernel cannot."""
        loop = asyncio.get_running_loop()
        eventfd = self._eventfds.get(loop, -1)
        if eventfd == -1:
            eventfd = self._eventfd(loop)
        if eventfd is None:
            return None
        future: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if len(self._waiters) >= _MAX_EVENTS:
                return None
            token = next(self._tokens)
            iocb = self._iocb
            iocb.aio_data = token
            iocb.aio_lio_opcode = _IOCB_CMD_FDSYNC if datasync else _IOCB_CMD_FSYNC
            iocb.aio_fildes = fd
            iocb.aio_resfd = eventfd
            self._waiters[token] = (future, loop)
            if self._syscall(*self._submit_args) != 1:
                del self._waiters[token]
                error = _errno_error("io_submit")
                if error.errno == errno.EBADF:  # the caller's mistake, not ours
                    raise error
                return None  # EINVAL (no AIO fsync on this kernel or file), EAGAIN, …
        return future

    def _eventfd(self, loop: asyncio.AbstractEventLoop) -> int | None:
        with self._lock:
            if loop in self._eventfds:
                return self._eventfds[loop]
            return self._watch(loop)

    def _watch(self, loop: asyncio.AbstractEventLoop) -> int | None:
        try:
            eventfd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        except OSError:  # out of descriptors, say: use the thread this time, retry later
            return None
        try:
            loop.add_reader(eventfd, self._reap, eventfd, loop)
        except NotImplementedError:  # e.g. the Windows proactor loop
            os.close(eventfd)
            self._eventfds[loop] = None
            return None
        weakref.finalize(loop, os.close, eventfd)
        self._eventfds[loop] = eventfd
        return eventfd

    def _reap(self, eventfd: int, here: asyncio.AbstractEventLoop) -> None:
        with contextlib.suppress(BlockingIOError):  # a wake-up with nothing counted
            os.eventfd_read(eventfd)
        with self._lock:
            count = self._syscall(*self._reap_args)
            finished = [
                (self._waiters.pop(event.data, None), event.res)
                for event in self._events[: max(count, 0)]
            ]
        for waiter, result in finished:
            if waiter is None:
                continue
            future, loop = waiter
            if loop is here:
                _resolve(future, result)
            else:
                with contextlib.suppress(RuntimeError):  # that loop is closed
                    loop.call_soon_threadsafe(_resolve, future, result)


# io_uring, for offloaded fsyncs. x86_64 only: the rings are read and written here
# with plain loads and stores, which x86's memory ordering makes safe (elsewhere
# they would need barriers Python cannot issue).
_URING_SETUP, _URING_ENTER, _URING_REGISTER = 425, 426, 427
_URING_OP_FSYNC = 3
_URING_FSYNC_DATASYNC = 1
_URING_REGISTER_EVENTFD = 4
_URING_FEAT_SINGLE_MMAP = 1
_URING_OFF_CQ_RING, _URING_OFF_SQES = 0x8000000, 0x10000000
_URING_ENTRIES = 64
_URING_SQE = struct.Struct(
    "<BBHiQQIIQ24x"
)  # opcode, flags, ioprio, fd, off, addr, len, fsync_flags, user_data
_URING_CQE = struct.Struct("<QiI")  # user_data, res, flags
_U32 = struct.Struct("<I")


class _RingOffsets(ctypes.Structure):
    """``struct io_sqring_offsets`` and ``io_cqring_offsets`` (same layout)."""

    _fields_ = [
        ("head", ctypes.c_uint32),
        ("tail", ctypes.c_uint32),
        ("ring_mask", ctypes.c_uint32),
        ("ring_entries", ctypes.c_uint32),
        ("flags_or_overflow", ctypes.c_uint32),
        ("dropped_or_cqes", ctypes.c_uint32),
        ("array_or_flags", ctypes.c_uint32),
        ("resv1", ctypes.c_uint32),
        ("user_addr", ctypes.c_uint64),
    ]


class _UringParams(ctypes.Structure):
    """``struct io_uring_params``."""

    _fields_ = [
        ("sq_entries", ctypes.c_uint32),
        ("cq_entries", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("sq_thread_cpu", ctypes.c_uint32),
        ("sq_thread_idle", ctypes.c_uint32),
        ("features", ctypes.c_uint32),
        ("wq_fd", ctypes.c_uint32),
        ("resv", ctypes.c_uint32 * 3),
        ("sq_off", _RingOffsets),
        ("cq_off", _RingOffsets),
    ]


_RingWaiter = tuple["asyncio.Future[None]", int, bool]  # future, reopened fd, datasync


class _Ring:
    """One event loop's io_uring for offloaded fsyncs.

    Used on that loop's thread only (``start`` from a coroutine, ``_reap`` as the
    loop's reader of the ring's eventfd), so it takes no lock. Each fsync is of a
    descriptor of the caller's file opened again (:func:`_reopened`, never a ``dup``,
    whose open file and locks a ring may keep past its process), closed when it
    completes: io_uring looks the descriptor up only when its worker runs the fsync,
    and the caller may close its own at once. A failed ``io_uring_enter`` retires the
    ring (its queue may then hold an entry the kernel did not take); the loop's
    offloads become AIO.
    A ring holds four descriptors: its own, its eventfd, and the two that ``mmap``
    keeps for its maps.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self._syscall = libc.syscall
        self._syscall.restype = ctypes.c_long
        params = _UringParams()
        fd = int(
            self._syscall(
                ctypes.c_long(_URING_SETUP), ctypes.c_long(_URING_ENTRIES), ctypes.byref(params)
            )
        )
        if fd < 0:
            raise _errno_error("io_uring_setup")
        self._fd = fd
        self._maps: list[mmap.mmap] = []
        self._eventfd = -1
        self._waiters: dict[int, _RingWaiter] = {}
        try:
            self._map(params)
            self._eventfd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            target = ctypes.c_int(self._eventfd)
            registered = self._syscall(
                ctypes.c_long(_URING_REGISTER),
                ctypes.c_long(fd),
                ctypes.c_long(_URING_REGISTER_EVENTFD),
                ctypes.byref(target),
                ctypes.c_long(1),
            )
            if registered != 0:
                raise _errno_error("io_uring_register")
            loop.add_reader(self._eventfd, self._reap)
        except BaseException:
            _close_ring(fd, self._eventfd, self._maps, {})
            raise
        weakref.finalize(loop, _close_ring, fd, self._eventfd, self._maps, self._waiters)
        self._tokens = itertools.count(1)
        self.retired = False
        self._enter_args = (
            ctypes.c_long(_URING_ENTER),
            ctypes.c_long(fd),
            ctypes.c_long(1),  # to submit
            ctypes.c_long(0),  # completions to wait for
            ctypes.c_long(0),  # flags
            ctypes.c_long(0),  # no signal mask
            ctypes.c_long(0),
        )

    def _map(self, params: _UringParams) -> None:
        sq_off, cq_off = params.sq_off, params.cq_off
        sq_size = sq_off.array_or_flags + params.sq_entries * 4
        cq_size = cq_off.dropped_or_cqes + params.cq_entries * _URING_CQE.size
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        prot = mmap.PROT_READ | mmap.PROT_WRITE
        if params.features & _URING_FEAT_SINGLE_MMAP:
            self._sq = self._cq = mmap.mmap(self._fd, max(sq_size, cq_size), flags, prot)
            self._maps.append(self._sq)
        else:
            self._sq = mmap.mmap(self._fd, sq_size, flags, prot)
            self._maps.append(self._sq)
            self._cq = mmap.mmap(self._fd, cq_size, flags, prot, offset=_URING_OFF_CQ_RING)
            self._maps.append(self._cq)
        self._sqes = mmap.mmap(
            self._fd, params.sq_entries * 64, flags, prot, offset=_URING_OFF_SQES
        )
        self._maps.append(self._sqes)
        self._sq_tail = sq_off.tail
        self._sq_mask = _U32.unpack_from(self._sq, sq_off.ring_mask)[0]
        self._sq_array = sq_off.array_or_flags
        self._cq_head, self._cq_tail = cq_off.head, cq_off.tail
        self._cq_mask = _U32.unpack_from(self._cq, cq_off.ring_mask)[0]
        self._cqes = cq_off.dropped_or_cqes

    def start(self, fd: int, datasync: bool) -> asyncio.Future[None] | None:
        """Submit an fsync of ``fd``; None when the ring cannot take it."""
        if self.retired or len(self._waiters) >= _URING_ENTRIES:
            return None
        reopened = _reopened(fd)
        if reopened is None:
            return None
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        token = next(self._tokens)
        tail = _U32.unpack_from(self._sq, self._sq_tail)[0]
        index = tail & self._sq_mask
        flags = _URING_FSYNC_DATASYNC if datasync else 0
        _URING_SQE.pack_into(
            self._sqes, index * 64, _URING_OP_FSYNC, 0, 0, reopened, 0, 0, 0, flags, token
        )
        _U32.pack_into(self._sq, self._sq_array + index * 4, index)
        _U32.pack_into(self._sq, self._sq_tail, (tail + 1) & 0xFFFFFFFF)
        if self._syscall(*self._enter_args) != 1:
            self.retired = True
            os.close(reopened)
            return None
        self._waiters[token] = (future, reopened, datasync)
        return future

    def _reap(self) -> None:
        with contextlib.suppress(BlockingIOError):  # a wake-up with nothing counted
            os.eventfd_read(self._eventfd)
        head = _U32.unpack_from(self._cq, self._cq_head)[0]
        tail = _U32.unpack_from(self._cq, self._cq_tail)[0]
        finished = []
        while head != tail:
            at = self._cqes + (head & self._cq_mask) * _URING_CQE.size
            finished.append(_URING_CQE.unpack_from(self._cq, at)[:2])
            head = (head + 1) & 0xFFFFFFFF
        _U32.pack_into(self._cq, self._cq_head, head)
        for token, result in finished:
            waiter = self._waiters.pop(token, None)
            if waiter is not None:
                _finish(*waiter, result)


def _reopened(fd: int) -> int | None:
    """A descriptor of ``fd``'s file on an open file of its own, for the ring's fsync;
    None when there is none to have (not a regular file, no ``/proc``, no read
    permission): AIO then syncs it.

    Not a ``dup``: that would share the caller's open file, and with it the locks
    taken on it (``flock``), and the kernel ends a ring only after its process is gone
    — a worker still running the fsync then holds its file, so a killed process's lock
    would outlive it (the file store's commit log is locked so, and its recovery takes
    a locked log for a live process's). An fsync syncs the file, whichever open file
    it goes through.

    Raises:
        OSError: ``fd`` is not open (EBADF: the caller's mistake, raised at once).
    """
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        return None
    try:
        return os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None


def _finish(future: asyncio.Future[None], reopened: int, datasync: bool, result: int) -> None:
    """Settle an offloaded fsync from its completion (on its loop)."""
    if result in (-errno.ECANCELED, -errno.EINTR):
        # Cancelled before it ran (the thread that submitted it exited): run it
        # again, on a thread, which closes the reopened descriptor.
        retry = asyncio.get_running_loop().run_in_executor(
            None, _fsync_and_close, reopened, datasync
        )
        retry.add_done_callback(functools.partial(_pass_on, future))
        return
    os.close(reopened)
    _resolve(future, result)


def _pass_on(future: asyncio.Future[None], retry: asyncio.Future[None]) -> None:
    """Settle ``future`` as the fsync run again for it ended."""
    if future.done():
        return
    error = retry.exception()
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


def _close_ring(
    fd: int, eventfd: int, maps: list[mmap.mmap], waiters: dict[int, _RingWaiter]
) -> None:
    """Release a ring whose loop is gone (or that could not be set up)."""
    for item in maps:
        with contextlib.suppress(BufferError):
            item.close()
    for _, reopened, _ in waiters.values():
        with contextlib.suppress(OSError):
            os.close(reopened)
    for descriptor in (fd, eventfd):
        if descriptor >= 0:
            with contextlib.suppress(OSError):
                os.close(descriptor)


class _Rings:
    """This process's rings, one per event loop that asked for an offload."""

    def __init__(self) -> None:
        self.by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Ring | None] = (
            weakref.WeakKeyDictionary()
        )
        # io_uring refused (ENOSYS, EPERM under a seccomp filter): ask no more.
        self.refused = platform.machine() != "x86_64" or not sys.platform.startswith("linux")

    def get(self, loop: asyncio.AbstractEventLoop) -> _Ring | None:
        if loop in self.by_loop:
            return self.by_loop[loop]
        ring = None
        if not self.refused:
            try:
                ring = _Ring(loop)
            except NotImplementedError:  # a loop without add_reader
                pass
            except OSError as exc:
                if exc.errno in (errno.ENOSYS, errno.EPERM, errno.EACCES):
                    self.refused = True
        self.by_loop[loop] = ring
        return ring


_rings: PerProcess[_Rings] = PerProcess(_Rings)


def _resolve(future: asyncio.Future[None], result: int) -> None:
    if future.done():  # the awaiting task was cancelled; the fsync ran anyway
        return
    if result < 0:
        future.set_exception(OSError(-result, f"fsync failed: {os.strerror(-result)}"))
    else:
        future.set_result(None)


def _errno_error(call: str) -> OSError:
    number = ctypes.get_errno()
    return OSError(number, f"{call}: {os.strerror(number)}")


def _make_context() -> _Aio | None:
    try:
        return _Aio()
    except (OSError, AttributeError):
        return None


# AIO contexts are per process: a child made by fork() sets up its own on first use
# (the kernel does not carry the parent's over), with its own eventfds.
_aio: PerProcess[_Aio | None] = PerProcess(_make_context)


def _context() -> _Aio | None:
    return _aio.value


def kernel_fsync_available() -> bool:
    """True when fsyncs in this process go to the kernel rather than a thread."""
    return _context() is not None


def start_fsync(
    fd: int, executor: Executor | None = None, *, datasync: bool = False, offload: bool = False
) -> asyncio.Future[None]:
    """Start an fsync of ``fd`` now; await the result for it to be durable.

    Must be called from a coroutine (on the running loop). The fsync is in flight
    when this returns, with its own reference to the file, so ``fd`` may be closed
    at once. Falls back to ``os.fsync`` on ``executor`` (the loop's default when
    None) where native AIO is not available. With ``datasync`` it is an fdatasync
    (``IOCB_CMD_FDSYNC``, ``os.fdatasync``): the data and what reading it needs
    (the size), not the times — a file overwritten in place (SQLite's WAL) then
    needs no journal commit of its inode. With ``offload`` (for a loop busy with
    other work) it runs where it takes no time from the loop's CPU: an io_uring
    worker (see the module docstring), else as without.
    """
    if offload:
        ring = _rings.value.get(asyncio.get_running_loop())
        if ring is not None:
            future = ring.start(fd, datasync)
            if future is not None:
                return future
    aio = _context()
    if aio is not None:
        future = aio.start(fd, datasync)
        if future is not None:
            return future
    duplicate = os.dup(fd)
    loop = asyncio.get_running_loop()
    return loop.run_in_executor(executor, _fsync_and_close, duplicate, datasync)


def _fsync_and_close(fd: int, datasync: bool = False) -> None:
    try:
        (os.fdatasync if datasync else os.fsync)(fd)
    finally:
        os.close(fd)
