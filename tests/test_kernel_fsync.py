"""start_fsync: an fsync in the kernel (Linux AIO) or on a thread, awaited on any loop."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import os
import platform
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from helpers import load_benchmark
from perdure._runtime import fsync as _kernel_fsync
from perdure._runtime.fsync import kernel_fsync_available, start_fsync


def _kernel_allows_aio() -> bool:
    """Probe io_setup directly, apart from the module: a sandbox may refuse it."""
    numbers = {"x86_64": (206, 207), "aarch64": (0, 1)}.get(platform.machine())
    if not sys.platform.startswith("linux") or numbers is None:
        return False
    syscall = ctypes.CDLL(None, use_errno=True).syscall
    context = ctypes.c_ulong(0)
    if syscall(ctypes.c_long(numbers[0]), ctypes.c_long(8), ctypes.byref(context)) != 0:
        return False
    syscall(ctypes.c_long(numbers[1]), context)  # io_destroy
    return True


LINUX_AIO = _kernel_allows_aio()
needs_linux_aio = pytest.mark.skipif(
    not LINUX_AIO, reason="native AIO needs Linux on x86_64/aarch64, with io_setup allowed"
)


@pytest.fixture
def fd(tmp_path: Path) -> Iterator[int]:
    descriptor = os.open(tmp_path / "journal", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    yield descriptor
    os.close(descriptor)


@pytest.fixture
def no_kernel_aio(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_kernel_fsync, "_context", lambda: None)


@needs_linux_aio
def test_linux_runs_fsync_in_the_kernel() -> None:
    assert kernel_fsync_available()


async def test_fsync_resolves_after_a_write(fd: int, tmp_path: Path) -> None:
    os.write(fd, b"one\n")
    future = start_fsync(fd)
    assert isinstance(future, asyncio.Future)
    assert await future is None
    assert (tmp_path / "journal").read_bytes() == b"one\n"


async def test_the_fsync_holds_the_file_so_the_caller_may_close_at_once(tmp_path: Path) -> None:
    descriptor = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(descriptor, b"x")
    future = start_fsync(descriptor)
    os.close(descriptor)
    await future


async def test_a_closed_descriptor_is_refused_at_once(fd: int, tmp_path: Path) -> None:
    await start_fsync(fd)  # this loop's eventfd is open before the number is freed
    descriptor = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT, 0o644)
    os.close(descriptor)
    with pytest.raises(OSError) as info:
        start_fsync(descriptor)
    assert info.value.errno == 9  # EBADF


@pytest.mark.parametrize("kernel_aio", [True, False])
async def test_a_file_that_cannot_sync_raises_oserror(
    kernel_aio: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A pipe has no fsync: the kernel refuses the AIO request, the fallback's
    # os.fsync raises EINVAL, and the error reaches the awaiting coroutine.
    if not kernel_aio:
        monkeypatch.setattr(_kernel_fsync, "_context", lambda: None)
    read_end, write_end = os.pipe()
    try:
        with pytest.raises(OSError):
            await start_fsync(write_end)
    finally:
        os.close(read_end)
        os.close(write_end)


async def test_many_fsyncs_in_flight_all_complete(tmp_path: Path) -> None:
    # More than the AIO context holds (256): the extra ones go to the executor.
    descriptors = [os.open(tmp_path / f"f{i}", os.O_WRONLY | os.O_CREAT, 0o644) for i in range(300)]
    try:
        for descriptor in descriptors:
            os.write(descriptor, b"x")
        futures = [start_fsync(d) for d in descriptors]
        assert await asyncio.gather(*futures) == [None] * 300
    finally:
        for descriptor in descriptors:
            os.close(descriptor)


def test_loops_in_several_threads_each_get_their_results(tmp_path: Path) -> None:
    # One AIO context serves every loop: whichever loop reaps a completion hands it
    # to the loop that awaits it.
    errors: list[BaseException] = []
    counts: list[int] = []

    def worker(index: int) -> None:
        async def run() -> int:
            path = tmp_path / f"t{index}"
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                for round_number in range(40):
                    os.write(descriptor, b"%d\n" % round_number)
                    await asyncio.gather(start_fsync(descriptor), start_fsync(descriptor))
            finally:
                os.close(descriptor)
            return len(path.read_bytes().splitlines())

        try:
            counts.append(asyncio.run(run()))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    assert counts == [40, 40, 40, 40]


async def test_a_cancelled_wait_does_not_break_later_fsyncs(fd: int) -> None:
    os.write(fd, b"a")
    waiter = asyncio.ensure_future(start_fsync(fd))
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    for _ in range(5):
        os.write(fd, b"b")
        await start_fsync(fd)


def test_each_new_loop_works_after_the_last_one_closed(fd: int) -> None:
    async def once() -> None:
        os.write(fd, b"x")
        await start_fsync(fd)

    for _ in range(20):
        asyncio.run(once())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_makes_its_own_aio_context(fd: int) -> None:
    async def once() -> None:
        os.write(fd, b"x")
        await start_fsync(fd)

    asyncio.run(once())  # the parent's context exists before the fork
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        code = 0
        try:
            asyncio.run(once())
        except BaseException:
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


async def test_without_kernel_aio_the_executor_syncs_a_duplicate(
    no_kernel_aio: None, tmp_path: Path
) -> None:
    assert not kernel_fsync_available()
    descriptor = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(descriptor, b"x")
    with ThreadPoolExecutor(1, thread_name_prefix="sync") as executor:
        future = start_fsync(descriptor, executor)
        os.close(descriptor)  # the executor syncs its own duplicate
        await future


class _RefusingExecutor(Executor):
    def submit(self, *args: object, **kwargs: object) -> Future[object]:  # type: ignore[override]
        raise AssertionError("the fsync fell back to a thread")


@needs_linux_aio
async def test_on_linux_a_regular_file_never_needs_the_thread(fd: int) -> None:
    for _ in range(3):
        os.write(fd, b"x")
        await start_fsync(fd, _RefusingExecutor())


async def test_out_of_descriptors_for_an_eventfd_falls_back_to_the_thread(
    fd: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_eventfd(*args: object) -> int:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(os, "eventfd", no_eventfd)
    os.write(fd, b"x")
    await start_fsync(fd)  # this test's loop has no eventfd yet and cannot get one
    monkeypatch.undo()
    os.write(fd, b"y")
    executor = _RefusingExecutor() if LINUX_AIO else None
    await start_fsync(fd, executor)  # the next fsync gets its eventfd: no thread needed


def test_the_fsync_benchmark_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Keep benchmarks/fsync.py from rotting (no timing asserted).
    assert load_benchmark("fsync").main(["--n", "5", "--dir", str(tmp_path)]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[2:]}
    assert set(rows) == {"inline", "executor", "kernel", "offload"}
    assert all(float(row[1]) > 0 for row in rows.values())
    assert list(tmp_path.iterdir()) == []


@needs_linux_aio
async def test_a_datasync_runs_in_the_kernel_too(fd: int, tmp_path: Path) -> None:
    for _ in range(3):
        os.write(fd, b"x")
        assert await start_fsync(fd, _RefusingExecutor(), datasync=True) is None
    read_end, write_end = os.pipe()  # and its errors come back as an fsync's do
    try:
        with pytest.raises(OSError):
            await start_fsync(write_end, datasync=True)
    finally:
        os.close(read_end)
        os.close(write_end)


async def test_without_kernel_aio_a_datasync_is_an_fdatasync_on_the_executor(
    no_kernel_aio: None, fd: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    called: list[str] = []
    real_fsync, real_fdatasync = os.fsync, os.fdatasync

    def fsync(descriptor: int) -> None:
        called.append("fsync")
        real_fsync(descriptor)

    def fdatasync(descriptor: int) -> None:
        called.append("fdatasync")
        real_fdatasync(descriptor)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "fdatasync", fdatasync)
    os.write(fd, b"x")
    await start_fsync(fd, datasync=True)
    await start_fsync(fd)
    assert called == ["fdatasync", "fsync"]


# ------------------------------------------------------------- offloaded fsyncs


def _kernel_allows_io_uring() -> bool:
    """Probe io_uring_setup directly: a sandbox's seccomp filter may refuse it."""
    if not sys.platform.startswith("linux") or platform.machine() != "x86_64":
        return False
    syscall = ctypes.CDLL(None, use_errno=True).syscall
    params = (ctypes.c_uint32 * 30)()  # struct io_uring_params is 120 bytes
    ring = syscall(ctypes.c_long(425), ctypes.c_long(4), ctypes.byref(params))
    if ring < 0:
        return False
    os.close(ring)
    return True


IO_URING = _kernel_allows_io_uring()
needs_io_uring = pytest.mark.skipif(
    not IO_URING,
    reason="offloaded fsyncs need io_uring on Linux x86_64, with io_uring_setup allowed",
)


def _ring() -> Any:
    """The running loop's ring for offloaded fsyncs (made on first use)."""
    return _kernel_fsync._rings.value.get(asyncio.get_running_loop())


@needs_io_uring
async def test_an_offloaded_fsync_goes_through_the_loops_io_uring(
    fd: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_aio(*args: object) -> None:
        raise AssertionError("an offloaded fsync went to AIO")

    monkeypatch.setattr(_kernel_fsync, "_context", no_aio)
    for datasync in (False, True, False):
        os.write(fd, b"x")
        future = start_fsync(fd, _RefusingExecutor(), datasync=datasync, offload=True)
        assert len(_ring()._waiters) == 1  # in flight in the ring
        assert await future is None
    ring = _ring()
    assert ring._waiters == {}
    assert not ring.retired
    assert (tmp_path / "journal").read_bytes() == b"xxx"


@needs_io_uring
async def test_an_offloaded_fsync_holds_a_duplicate_so_the_caller_may_close_at_once(
    tmp_path: Path,
) -> None:
    descriptors = [os.open(tmp_path / f"f{i}", os.O_WRONLY | os.O_CREAT, 0o644) for i in range(8)]
    futures = []
    for descriptor in descriptors:
        os.write(descriptor, b"x")
        futures.append(start_fsync(descriptor, offload=True))
        os.close(descriptor)
    assert len(_open_under(tmp_path)) == 8  # the ring's duplicates, one a file
    assert await asyncio.gather(*futures) == [None] * 8
    assert _open_under(tmp_path) == []  # each closed with its completion


def _open_under(directory: Path) -> list[str]:
    """What this process's descriptors have open under ``directory``."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor, gone
            target = os.readlink(f"/proc/self/fd/{name}")
            if target.startswith(str(directory)):
                found.append(target)
    return found


@needs_io_uring
async def test_offloaded_fsync_errors_come_back_as_an_fsyncs_do(fd: int, tmp_path: Path) -> None:
    await start_fsync(fd, offload=True)  # the ring exists before the number is freed
    descriptor = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT, 0o644)
    os.close(descriptor)
    with pytest.raises(OSError) as info:
        start_fsync(descriptor, offload=True)
    assert info.value.errno == 9  # EBADF, at once
    read_end, write_end = os.pipe()  # no fsync: EINVAL (from AIO: the ring takes files only)
    try:
        with pytest.raises(OSError) as raised:
            await start_fsync(write_end, offload=True)
        assert raised.value.errno == 22
    finally:
        os.close(read_end)
        os.close(write_end)
    assert _ring()._waiters == {}


@needs_io_uring
async def test_more_offloads_than_the_ring_holds_all_complete(tmp_path: Path) -> None:
    descriptors = [os.open(tmp_path / f"f{i}", os.O_WRONLY | os.O_CREAT, 0o644) for i in range(100)]
    try:
        for descriptor in descriptors:
            os.write(descriptor, b"x")
        futures = [start_fsync(d, offload=True) for d in descriptors]
        assert len(_ring()._waiters) == _kernel_fsync._URING_ENTRIES  # the rest: AIO
        assert await asyncio.gather(*futures) == [None] * 100
    finally:
        for descriptor in descriptors:
            os.close(descriptor)


async def test_a_cancelled_offload_is_run_again_on_a_thread(fd: int) -> None:
    # What a completion says when the thread that submitted the fsync exited before
    # an io_uring worker ran it: the fsync is run again, and the duplicate closed.
    os.write(fd, b"x")
    duplicate = os.dup(fd)
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    _kernel_fsync._finish(future, duplicate, False, -125)  # -ECANCELED
    assert not future.done()
    assert await future is None
    with pytest.raises(OSError):
        os.fstat(duplicate)
    failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    _kernel_fsync._finish(failed, os.dup(fd), True, -5)  # -EIO: the fsync's own error
    with pytest.raises(OSError, match="fsync failed"):
        await failed


@needs_io_uring
def test_a_loop_driven_by_another_thread_gets_its_offloads_back(tmp_path: Path) -> None:
    # A loop's fsyncs submitted from one thread, which then exits, and reaped while
    # another thread runs the loop (as perdure's sync facade hands its loop over).
    loop = asyncio.new_event_loop()
    descriptors = [os.open(tmp_path / f"f{i}", os.O_WRONLY | os.O_CREAT, 0o644) for i in range(32)]
    futures: list[asyncio.Future[None]] = []

    async def submit() -> None:
        for descriptor in descriptors:
            os.write(descriptor, b"x" * 65536)
            futures.append(start_fsync(descriptor, offload=True))

    first = threading.Thread(target=loop.run_until_complete, args=(submit(),))
    first.start()
    first.join(30)
    try:
        results = loop.run_until_complete(
            asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 30)
        )
        assert results == [None] * 32
    finally:
        loop.close()
        for descriptor in descriptors:
            os.close(descriptor)


async def test_a_refused_io_uring_offloads_to_aio(fd: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rings = _kernel_fsync._Rings()
    monkeypatch.setattr(_kernel_fsync._rings, "value", rings)

    def refused(loop: object) -> None:
        raise OSError(1, "Operation not permitted")  # what a seccomp filter answers

    monkeypatch.setattr(_kernel_fsync, "_Ring", refused)
    os.write(fd, b"x")
    assert await start_fsync(fd, offload=True) is None
    assert rings.refused
    assert rings.by_loop[asyncio.get_running_loop()] is None


@needs_io_uring
async def test_a_ring_whose_submit_failed_is_retired(fd: int) -> None:
    await start_fsync(fd, offload=True)
    ring = _ring()
    good = ring._enter_args
    ring._enter_args = (good[0], ctypes.c_long(-1), *good[2:])  # io_uring_enter: EBADF
    os.write(fd, b"x")
    assert await start_fsync(fd, offload=True) is None  # through AIO instead
    assert ring.retired
    assert ring._waiters == {}
    os.write(fd, b"y")
    assert await start_fsync(fd, offload=True) is None


@needs_io_uring
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_makes_its_own_ring(fd: int) -> None:
    async def once() -> None:
        os.write(fd, b"x")
        await start_fsync(fd, offload=True)
        assert not _ring().retired

    asyncio.run(once())  # the parent's rings exist before the fork
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        code = 0
        try:
            asyncio.run(once())
        except BaseException:
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@needs_io_uring
def test_a_killed_processs_offloaded_fsync_does_not_keep_its_files_lock(tmp_path: Path) -> None:
    # A flock lives as long as the open file it was taken on. The kernel ends an
    # io_uring after its process is gone, and a worker still running an fsync holds
    # that fsync's file until it is done: on the caller's own open file (a dup), the
    # lock would outlive the process. The file store's commit log is locked so, and a
    # recovery that finds it locked takes it for a live process's and replays nothing.
    path = tmp_path / "locked"
    code = textwrap.dedent(
        f"""
        import asyncio, fcntl, os
        from perdure._runtime.fsync import start_fsync
        fd = os.open({str(path)!r}, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        block = b"x" * (1 << 20)
        for _ in range(64):  # dirty pages enough for the fsync to take a while
            os.write(fd, block)

        async def main():
            start_fsync(fd, datasync=True, offload=True)
            print("started", flush=True)
            await asyncio.sleep(60)

        asyncio.run(main())
        """
    )
    for _ in range(3):
        with subprocess.Popen(
            [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True
        ) as proc:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "started"
            proc.kill()
            proc.wait(timeout=30)
        fd = os.open(path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError: still held
        finally:
            os.close(fd)
