"""The Storage conformance suite (SPEC §6): every backend, ours and yours, runs it.

Subclass :class:`StorageSuite` in a ``Test*`` class and give it one fixture,
``storage_factory``: a callable that opens your backend over one test's data (each
call a new instance over the same data, as a restarted process would see it). The
suite closes what it opened (``close()``, when the backend has one)::

    class TestMyStorage(StorageSuite):
        @pytest.fixture
        def storage_factory(self, tmp_path):
            return lambda: MyStorage(tmp_path / "blobs")

A backend that keeps its data in one object sets ``durable_across_reopen = False``
(and its factory returns that object, or a fresh one, as it likes).

A backend that also implements :class:`~perdure.storage.ConditionalStorage` runs
:class:`ConditionalStorageSuite` as well, with the same fixture.
A backend that is also an :class:`~perdure.storage.AppendStorage` subclasses
:class:`AppendStorageSuite` instead: the same contract, plus conditional appends and
replaces.

A backend that takes ``cipher=`` (SPEC §9) runs the suites above with a factory that
passes one, and :class:`CipherStorageSuite` for what encryption promises, with the
fixture ``cipher_storage_factory``: ``factory(cipher)`` opens the backend over the
test's data with that cipher (``None``: without one, to see the bytes as stored)::

    class TestMyStorageEncryption(CipherStorageSuite):
        @pytest.fixture
        def cipher_storage_factory(self, tmp_path):
            return lambda cipher: MyStorage(tmp_path / "blobs", cipher=cipher)
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Iterator
from typing import ClassVar, cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perdure.crypto import Cipher, envelope_key_id, is_envelope
from perdure.errors import DecryptionError, StorageConflictError
from perdure.storage.protocol import AppendStorage, ConditionalStorage, Storage, can_append
from perdure.testing._support import close, run_in_threads

__all__ = ["AppendStorageSuite", "CipherStorageSuite", "ConditionalStorageSuite", "StorageSuite"]

StorageFactory = Callable[[], Storage]
CipherStorageFactory = Callable[[Cipher | None], Storage]

INVALID_KEYS = [
    "",
    "/abs",
    "a/../b",
    "..",
    "a/..",
    ".",
    "a/./b",
    "a//b",
    "a/",
    "a\\b",
    "a\x00b",
    "bad\udc80",
]

KEYS = [
    "a",
    "a/b",
    "a/b/c",
    "a-c",
    "a.b",
    "a0",
    "ab",
    "b",
    "%41",
    "x/é",
    "x/日本",
    "x/ space",
    "x/~tilde",
    "A",
    "sessions/s/agents/default/latest",
    "sessions/s/agents/default/snapshots/01ARZ3NDEKTSV4RRFFQ69G5FAV",
]


_segment = st.text(alphabet=st.sampled_from(list("ab-_.%~é日 0Z")), min_size=1, max_size=4).filter(
    lambda s: s not in (".", "..")
)
_key = st.lists(_segment, min_size=1, max_size=3).map("/".join)


# Each backend's subclass runs the same method on its own class (an "executor" to
# hypothesis): by design, as fsspec's suites do, so that health check does not apply.
_PER_BACKEND = [
    HealthCheck.too_slow,
    HealthCheck.function_scoped_fixture,
    HealthCheck.differing_executors,
]


class StorageSuite:
    """The contract every :class:`~perdure.storage.Storage` keeps (SPEC §6).

    Needs one fixture, ``storage_factory`` (see the module docstring).

    Attributes:
        durable_across_reopen: a second instance from ``storage_factory`` sees the
            data of the first.
    """

    durable_across_reopen: ClassVar[bool] = True

    @pytest.fixture
    def opened_storage(self, storage_factory: StorageFactory) -> Iterator[StorageFactory]:
        """``storage_factory``, closing every instance it opened when the test ends."""
        opened: list[Storage] = []

        def factory() -> Storage:
            storage = storage_factory()
            opened.append(storage)
            return storage

        yield factory
        for storage in opened:
            close(storage)

    @pytest.fixture
    def storage(self, opened_storage: StorageFactory) -> Storage:
        """The backend under test: the first instance from ``storage_factory``."""
        return opened_storage()

    async def test_write_then_read_returns_the_bytes(self, storage: Storage) -> None:
        await storage.write("k", b"hello")
        assert await storage.read("k") == b"hello"

    async def test_read_of_a_missing_key_is_none(self, storage: Storage) -> None:
        assert await storage.read("missing/key") is None

    async def test_write_replaces(self, storage: Storage) -> None:
        await storage.write("k", b"one")
        await storage.write("k", b"two, longer")
        await storage.write("k", b"3")
        assert await storage.read("k") == b"3"

    async def test_empty_and_binary_blobs_round_trip(self, storage: Storage) -> None:
        await storage.write("empty", b"")
        binary = bytes(range(256)) * 64
        await storage.write("binary", binary)
        assert await storage.read("empty") == b""
        assert await storage.read("binary") == binary

    async def test_a_large_blob_round_trips(self, storage: Storage) -> None:
        blob = bytes(range(256)) * 8192  # 2 MiB
        await storage.write("big/blob", blob)
        assert await storage.read("big/blob") == blob

    async def test_bytes_like_data_is_accepted_and_str_refused(self, storage: Storage) -> None:
        await storage.write("ba", bytearray(b"xy"))  # type: ignore[arg-type]  # bytes-like
        await storage.write("mv", memoryview(b"zw"))  # type: ignore[arg-type]  # bytes-like
        assert await storage.read("ba") == b"xy"
        assert await storage.read("mv") == b"zw"
        with pytest.raises(TypeError, match="data"):
            await storage.write("s", "text")  # type: ignore[arg-type]

    async def test_delete_removes_and_is_idempotent(self, storage: Storage) -> None:
        await storage.write("a/b", b"1")
        await storage.delete("a/b")
        assert await storage.read("a/b") is None
        await storage.delete("a/b")
        await storage.delete("never/was")
        assert await storage.list("") == []

    async def test_a_key_can_also_be_a_prefix_of_other_keys(self, storage: Storage) -> None:
        await storage.write("a", b"file")
        await storage.write("a/b", b"nested")
        assert await storage.read("a") == b"file"
        assert await storage.read("a/b") == b"nested"
        await storage.delete("a")
        assert await storage.read("a/b") == b"nested"

    async def test_list_returns_every_key_sorted(self, storage: Storage) -> None:
        for key in reversed(KEYS):
            await storage.write(key, key.encode())
        assert await storage.list("") == sorted(KEYS)
        for key in KEYS:
            assert await storage.read(key) == key.encode()

    async def test_list_filters_by_prefix_including_a_partial_segment(
        self, storage: Storage
    ) -> None:
        for key in KEYS:
            await storage.write(key, b"")
        for prefix in (
            "a",
            "a/",
            "a/b",
            "a/b/",
            "x/",
            "x/日",
            "sessions/s/agents/default/",
            "zz",
            "%",
        ):
            assert await storage.list(prefix) == sorted(k for k in KEYS if k.startswith(prefix)), (
                prefix
            )

    async def test_list_limit_and_start_after_page_through_in_order(self, storage: Storage) -> None:
        for key in KEYS:
            await storage.write(key, b"")
        expected = sorted(KEYS)
        assert await storage.list("", limit=0) == []
        assert await storage.list("", limit=3) == expected[:3]
        pages: list[str] = []
        cursor: str | None = None
        while True:
            page = await storage.list("", limit=4, start_after=cursor)
            pages.extend(page)
            if len(page) < 4:
                break
            cursor = page[-1]
        assert pages == expected
        for cursor in ("a", "a/b", "a/", "a-", "x", "zzz", "", "0"):
            want = [k for k in expected if k > cursor]
            assert await storage.list("", start_after=cursor) == want, cursor
            assert (
                await storage.list("a", start_after=cursor, limit=2)
                == [k for k in want if k.startswith("a")][:2]
            ), cursor

    @pytest.mark.parametrize("key", INVALID_KEYS)
    async def test_invalid_keys_are_refused_naming_the_key(
        self, storage: Storage, key: str
    ) -> None:
        for call in (
            storage.write(key, b"x"),
            storage.read(key),
            storage.delete(key),
        ):
            with pytest.raises(ValueError, match="key") as info:
                await call
            assert repr(key) in str(info.value)
        assert await storage.list("") == []

    async def test_non_str_keys_are_a_type_error(self, storage: Storage) -> None:
        with pytest.raises(TypeError, match="key"):
            await storage.read(b"k")  # type: ignore[arg-type]

    @pytest.mark.parametrize("prefix", ["/a", "a/../", "a//", "a\\", "a\x00", "./"])
    async def test_invalid_prefixes_are_refused(self, storage: Storage, prefix: str) -> None:
        with pytest.raises(ValueError, match="prefix"):
            await storage.list(prefix)

    async def test_bad_list_arguments_name_themselves(self, storage: Storage) -> None:
        with pytest.raises(ValueError, match="limit"):
            await storage.list("", limit=-1)
        with pytest.raises(TypeError, match="limit"):
            await storage.list("", limit=True)
        with pytest.raises(TypeError, match="start_after"):
            await storage.list("", start_after=3)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="start_after"):
            await storage.list("", start_after="a\x00")

    async def test_data_survives_reopening(self, opened_storage: StorageFactory) -> None:
        if not self.durable_across_reopen:
            pytest.skip("the backend keeps nothing past its instance (durable_across_reopen)")
        first = opened_storage()
        await first.write("sessions/s/latest", b"state")
        second = opened_storage()
        assert await second.read("sessions/s/latest") == b"state"
        assert await second.list("sessions/") == ["sessions/s/latest"]

    async def test_concurrent_writes_of_different_keys_all_land(self, storage: Storage) -> None:
        await asyncio.gather(*(storage.write(f"c/{i:03d}", str(i).encode()) for i in range(40)))
        assert await storage.list("c/") == [f"c/{i:03d}" for i in range(40)]
        values = await asyncio.gather(*(storage.read(f"c/{i:03d}") for i in range(40)))
        assert values == [str(i).encode() for i in range(40)]

    async def test_concurrent_writes_of_one_key_leave_one_whole_value(
        self, storage: Storage
    ) -> None:
        blobs = [bytes([i]) * (1000 + i) for i in range(20)]
        await asyncio.gather(*(storage.write("same", blob) for blob in blobs))
        assert await storage.read("same") in blobs

    async def test_usable_from_another_thread_and_event_loop(self, storage: Storage) -> None:
        await storage.write("here", b"1")

        async def elsewhere(_: int) -> None:
            assert await storage.read("here") == b"1"
            await storage.write("there", b"2")
            assert await storage.list("") == ["here", "there"]

        assert run_in_threads(elsewhere, 3) == []  # this loop waits, blocked, meanwhile
        assert await storage.read("there") == b"2"

    def test_usable_from_plain_asyncio_run_calls(self, storage: Storage) -> None:
        asyncio.run(storage.write("sync/a", b"a"))
        assert asyncio.run(storage.read("sync/a")) == b"a"
        assert asyncio.run(storage.list("sync/")) == ["sync/a"]

    @settings(
        max_examples=25,
        deadline=None,
        suppress_health_check=_PER_BACKEND,
    )
    @given(
        keys=st.sets(_key, max_size=12),
        prefix=st.text(alphabet=st.sampled_from(list("ab-_.%/")), max_size=3).filter(
            lambda p: not p.startswith("/") and "//" not in p and "./" not in p
        ),
        cursor=st.none() | st.text(alphabet=st.sampled_from(list("ab-_./%")), max_size=4),
        limit=st.none() | st.integers(min_value=0, max_value=5),
    )
    def test_list_matches_a_sorted_model(
        self,
        opened_storage: StorageFactory,
        keys: set[str],
        prefix: str,
        cursor: str | None,
        limit: int | None,
    ) -> None:
        # Each example starts from an empty backend: a new instance over the test's
        # data, emptied (and checked empty) first.
        storage = opened_storage()

        async def run() -> list[str]:
            for key in await storage.list(""):
                await storage.delete(key)
            assert await storage.list("") == []
            for key in keys:
                await storage.write(key, key.encode())
            return await storage.list(prefix, limit=limit, start_after=cursor)

        got = asyncio.run(run())
        want = sorted(k for k in keys if k.startswith(prefix) and (cursor is None or k > cursor))
        assert got == (want if limit is None else want[:limit])


class ConditionalStorageSuite:
    """The contract of :class:`~perdure.storage.ConditionalStorage` (SPEC §6).

    Needs the fixture ``storage_factory`` of :class:`StorageSuite`, returning a
    backend that implements ``ConditionalStorage``.

    Attributes:
        durable_across_reopen: a second instance from ``storage_factory`` sees the
            data (and the versions) of the first.
        versions_name_content: a version names the blob's bytes rather than the
            write (S3's ETag, an MD5): writing the same bytes again may give the
            same version. Every other promise holds.
    """

    durable_across_reopen: ClassVar[bool] = True
    versions_name_content: ClassVar[bool] = False

    @pytest.fixture
    def opened_storage(self, storage_factory: StorageFactory) -> Iterator[StorageFactory]:
        """``storage_factory``, closing every instance it opened when the test ends."""
        opened: list[Storage] = []

        def factory() -> Storage:
            storage = storage_factory()
            opened.append(storage)
            return storage

        yield factory
        for storage in opened:
            close(storage)

    @pytest.fixture
    def storage(self, opened_storage: StorageFactory) -> ConditionalStorage:
        """The backend under test: the first instance from ``storage_factory``."""
        storage = opened_storage()
        assert isinstance(storage, ConditionalStorage)
        return storage

    async def test_a_missing_key_has_no_version(self, storage: ConditionalStorage) -> None:
        assert await storage.version("missing") is None

    async def test_every_write_gives_a_new_version(self, storage: ConditionalStorage) -> None:
        seen: set[str] = set()
        # The same bytes again: a new version too, unless versions name content.
        blobs = (
            (b"one", b"two", b"three") if self.versions_name_content else (b"one", b"one", b"two")
        )
        for data in blobs:
            await storage.write("k", data)
            version = await storage.version("k")
            assert isinstance(version, str)
            assert version not in seen
            seen.add(version)
        made = await storage.write_if("k", b"four", expected=await storage.version("k"))
        assert made not in seen
        assert await storage.version("k") == made
        assert await storage.read("k") == b"four"

    async def test_create_only_if_absent(self, storage: ConditionalStorage) -> None:
        made = await storage.write_if("new/key", b"first", expected=None)
        assert isinstance(made, str)
        assert await storage.version("new/key") == made
        with pytest.raises(StorageConflictError) as info:
            await storage.write_if("new/key", b"second", expected=None)
        assert info.value.code == "storage_conflict"
        assert await storage.read("new/key") == b"first"  # nothing was written
        assert await storage.version("new/key") == made

    async def test_replace_only_at_the_expected_version(self, storage: ConditionalStorage) -> None:
        first = await storage.write_if("k", b"1", expected=None)
        second = await storage.write_if("k", b"2", expected=first)
        assert second != first
        with pytest.raises(StorageConflictError):
            await storage.write_if("k", b"stale", expected=first)
        assert await storage.read("k") == b"2"
        assert await storage.version("k") == second
        third = await storage.write_if("k", b"3", expected=second)
        assert await storage.read("k") == b"3"
        assert third not in (first, second)

    async def test_a_plain_write_or_a_delete_moves_the_version_on(
        self, storage: ConditionalStorage
    ) -> None:
        first = await storage.write_if("k", b"1", expected=None)
        await storage.write("k", b"plain")
        with pytest.raises(StorageConflictError):
            await storage.write_if("k", b"lost", expected=first)
        assert await storage.read("k") == b"plain"
        current = await storage.version("k")
        await storage.delete("k")
        assert await storage.version("k") is None
        with pytest.raises(StorageConflictError):
            await storage.write_if("k", b"gone", expected=current)
        assert await storage.read("k") is None
        again = await storage.write_if("k", b"again", expected=None)
        assert again not in (first, current)  # a key written anew: never an old version
        assert await storage.read("k") == b"again"

    async def test_a_version_it_never_gave_is_a_conflict(self, storage: ConditionalStorage) -> None:
        with pytest.raises(StorageConflictError):
            await storage.write_if("k", b"x", expected="no such version")
        assert await storage.read("k") is None
        await storage.write("k", b"1")
        current = await storage.version("k")
        for made_up in ("", "0", "-1", "99999999999999999999999", "v1", "1 "):
            if made_up == current:
                continue
            with pytest.raises(StorageConflictError):
                await storage.write_if("k", b"x", expected=made_up)
        assert await storage.read("k") == b"1"

    async def test_bad_arguments_name_themselves(self, storage: ConditionalStorage) -> None:
        for key in INVALID_KEYS:
            with pytest.raises(ValueError, match="key"):
                await storage.version(key)
            with pytest.raises(ValueError, match="key"):
                await storage.write_if(key, b"x", expected=None)
        with pytest.raises(TypeError, match="data"):
            await storage.write_if("k", "text", expected=None)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="expected"):
            await storage.write_if("k", b"x", expected=3)  # type: ignore[arg-type]
        assert await storage.list("") == []

    async def test_versions_survive_reopening(self, opened_storage: StorageFactory) -> None:
        if not self.durable_across_reopen:
            pytest.skip("the backend keeps nothing past its instance (durable_across_reopen)")
        first = opened_storage()
        assert isinstance(first, ConditionalStorage)
        made = await first.write_if("latest", b"1", expected=None)
        second = opened_storage()
        assert isinstance(second, ConditionalStorage)
        assert await second.version("latest") == made
        await second.write_if("latest", b"2", expected=made)
        with pytest.raises(StorageConflictError):
            await first.write_if("latest", b"lost update", expected=made)
        assert await first.read("latest") == b"2"

    async def test_of_writers_expecting_one_version_exactly_one_wins(
        self, storage: ConditionalStorage
    ) -> None:
        current = await storage.write_if("race", b"start", expected=None)
        for round_ in range(5):
            # Bytes no earlier round wrote (an ETag-like version names content).
            async def attempt(i: int, expected: str = current, r: int = round_) -> str | None:
                try:
                    return await storage.write_if("race", f"{r}:{i}".encode(), expected=expected)
                except StorageConflictError:
                    return None

            results = await asyncio.gather(*(attempt(i) for i in range(8)))
            winners = [(i, made) for i, made in enumerate(results) if made is not None]
            assert len(winners) == 1, (round_, results)
            index, made = winners[0]
            assert await storage.read("race") == f"{round_}:{index}".encode()
            assert await storage.version("race") == made
            current = made

    async def test_one_create_wins_across_threads_and_loops(
        self, storage: ConditionalStorage
    ) -> None:
        wins: list[int] = []

        async def create(index: int) -> None:
            try:
                await storage.write_if("once", f"{index}".encode(), expected=None)
            except StorageConflictError:
                return
            wins.append(index)

        assert run_in_threads(create, 6) == []
        assert len(wins) == 1
        assert await storage.read("once") == f"{wins[0]}".encode()


class AppendStorageSuite(StorageSuite):
    """The :class:`StorageSuite` contract plus :class:`~perdure.storage.AppendStorage`'s.

    Needs the same fixture, ``storage_factory``, opening a backend that implements
    ``append`` and ``replace``.
    """

    @pytest.fixture
    def appender(self, storage: Storage) -> AppendStorage:
        """The backend under test, as an ``AppendStorage``."""
        assert isinstance(storage, AppendStorage), "the backend must implement AppendStorage"
        return storage

    async def test_replace_creates_only_a_missing_blob(self, appender: AppendStorage) -> None:
        await appender.replace("log", b"head\n", size=None, tail=b"")
        with pytest.raises(StorageConflictError) as info:
            await appender.replace("log", b"other\n", size=None, tail=b"")
        assert info.value.code == "storage_conflict"
        assert await cast(Storage, appender).read("log") == b"head\n"

    async def test_append_extends_a_blob_that_ends_as_expected(
        self, appender: AppendStorage
    ) -> None:
        storage = cast(Storage, appender)
        await appender.replace("log", b"head\n", size=None, tail=b"")
        await appender.append("log", b"one\n", size=5, tail=b"head\n")
        await appender.append("log", b"two\n", size=9, tail=b"e\n")
        await appender.append("log", b"", size=13, tail=b"")  # nothing to add: still checked
        assert await storage.read("log") == b"head\none\ntwo\n"
        assert await storage.list("") == ["log"]

    @pytest.mark.parametrize(
        ("size", "tail"),
        [
            (4, b""),  # shorter than the blob
            (9, b""),  # longer
            (5, b"HEAD\n"),  # as long, but ending otherwise
            (5, b"xhead\n"),  # a tail longer than the size: misuse
        ],
    )
    async def test_append_to_a_blob_that_ends_otherwise_writes_nothing(
        self, appender: AppendStorage, size: int, tail: bytes
    ) -> None:
        await appender.replace("log", b"head\n", size=None, tail=b"")
        if len(tail) > size:
            with pytest.raises(ValueError, match="size"):
                await appender.append("log", b"x", size=size, tail=tail)
        else:
            with pytest.raises(StorageConflictError):
                await appender.append("log", b"x", size=size, tail=tail)
        assert await cast(Storage, appender).read("log") == b"head\n"

    async def test_append_to_a_missing_blob_is_a_conflict(self, appender: AppendStorage) -> None:
        with pytest.raises(StorageConflictError):
            await appender.append("missing", b"x", size=0, tail=b"")
        assert await cast(Storage, appender).read("missing") is None

    async def test_replace_swaps_only_the_blob_it_expects(self, appender: AppendStorage) -> None:
        storage = cast(Storage, appender)
        await appender.replace("log", b"v1\n", size=None, tail=b"")
        await appender.replace("log", b"v2 longer\n", size=3, tail=b"v1\n")
        assert await storage.read("log") == b"v2 longer\n"
        with pytest.raises(StorageConflictError):  # the end before that replace
            await appender.replace("log", b"lost", size=3, tail=b"v1\n")
        await storage.write("log", b"v3 other!\n")  # as long as v2: a plain write counts too
        with pytest.raises(StorageConflictError):
            await appender.replace("log", b"lost", size=10, tail=b"longer\n")
        assert await storage.read("log") == b"v3 other!\n"
        await storage.delete("log")
        with pytest.raises(StorageConflictError):
            await appender.replace("log", b"lost", size=10, tail=b"")
        assert await storage.read("log") is None

    async def test_bad_arguments_are_refused_before_any_write(
        self, appender: AppendStorage
    ) -> None:
        storage = cast(Storage, appender)
        with pytest.raises(ValueError, match=r"a/\.\./b"):
            await appender.append("a/../b", b"x", size=0, tail=b"")
        with pytest.raises(ValueError, match=r"a/\.\./b"):
            await appender.replace("a/../b", b"x", size=None, tail=b"")
        with pytest.raises(TypeError, match="data"):
            await appender.append("k", "text", size=0, tail=b"")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="tail"):
            await appender.append("k", b"x", size=0, tail="t")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="size"):
            await appender.append("k", b"x", size=None, tail=b"")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="size"):
            await appender.replace("k", b"x", size=True, tail=b"")
        with pytest.raises(ValueError, match="size"):
            await appender.append("k", b"x", size=-1, tail=b"")
        with pytest.raises(ValueError, match="tail must be empty"):
            await appender.replace("k", b"x", size=None, tail=b"t")
        assert await storage.list("") == []

    async def test_appends_survive_reopening(self, opened_storage: StorageFactory) -> None:
        if not self.durable_across_reopen:
            pytest.skip("the backend keeps nothing past its instance (durable_across_reopen)")
        first = cast(AppendStorage, opened_storage())
        await first.replace("log", b"a", size=None, tail=b"")
        await first.append("log", b"b", size=1, tail=b"a")
        second = opened_storage()
        assert await second.read("log") == b"ab"
        await cast(AppendStorage, second).append("log", b"c", size=2, tail=b"ab")
        assert await cast(Storage, first).read("log") == b"abc"

    def test_of_writers_racing_from_one_end_exactly_one_wins(self, appender: AppendStorage) -> None:
        """Threads, each with its own event loop, append from the end they all read."""
        storage = cast(Storage, appender)
        asyncio.run(appender.replace("race", b"start\n", size=None, tail=b""))
        writers, rounds = 4, 25
        barrier = threading.Barrier(writers)
        wins: list[tuple[int, int]] = []

        async def writer(index: int) -> None:
            for round_ in range(rounds):
                barrier.wait()
                blob = await storage.read("race")
                assert blob is not None
                barrier.wait()  # everyone read the same end
                line = f"{round_} {index}\n".encode()
                try:
                    await appender.append("race", line, size=len(blob), tail=blob[-8:])
                except StorageConflictError:
                    continue
                wins.append((round_, index))

        assert run_in_threads(writer, writers) == []
        blob = asyncio.run(storage.read("race"))
        assert blob is not None
        lines = blob.decode().splitlines()
        assert lines[0] == "start"
        assert [int(line.split()[0]) for line in lines[1:]] == list(range(rounds))
        assert sorted(wins) == sorted(
            (int(r), int(i)) for r, i in (line.split() for line in lines[1:])
        )


_SECRET = b"card 4111 1111 1111 1111 of alice@example.com"


class CipherStorageSuite:
    """What a :class:`~perdure.storage.Storage` built with ``cipher=`` promises (SPEC §9).

    Needs the fixture ``cipher_storage_factory`` (see the module docstring). Every
    blob is stored as an envelope under the active key, with a fresh nonce each
    write; a blob that does not decrypt — another key, an unknown key id, altered
    bytes, a blob written without encryption — raises
    :class:`~perdure.errors.DecryptionError`, never garbage; such a storage takes no
    appends. The plain contract runs as :class:`StorageSuite` (and
    :class:`ConditionalStorageSuite`) with a factory that passes a cipher.

    The ciphers are :class:`~perdure.crypto.AESGCMCipher` with random keys
    (``perdure[crypto]``); override the ``cipher`` fixture to test another.
    """

    @pytest.fixture
    def cipher(self) -> Cipher:
        """The cipher under test: one key, ``k1``, drawn afresh for each test."""
        from perdure.crypto import AESGCMCipher

        return AESGCMCipher(keys={"k1": os.urandom(32)}, active="k1")

    @pytest.fixture
    def opened_cipher_storage(
        self, cipher_storage_factory: CipherStorageFactory
    ) -> Iterator[CipherStorageFactory]:
        """``cipher_storage_factory``, closing every instance it opened when the test ends."""
        opened: list[Storage] = []

        def factory(cipher: Cipher | None) -> Storage:
            storage = cipher_storage_factory(cipher)
            opened.append(storage)
            return storage

        yield factory
        for storage in opened:
            close(storage)

    @pytest.fixture
    def storage(self, opened_cipher_storage: CipherStorageFactory, cipher: Cipher) -> Storage:
        """The backend under test, with ``cipher``."""
        return opened_cipher_storage(cipher)

    @pytest.fixture
    def raw(self, opened_cipher_storage: CipherStorageFactory) -> Storage:
        """The same data without a cipher: the bytes as stored."""
        return opened_cipher_storage(None)

    async def test_blobs_are_stored_as_envelopes_of_the_active_key(
        self, storage: Storage, raw: Storage
    ) -> None:
        await storage.write("a/b", _SECRET)
        stored = await raw.read("a/b")
        assert stored is not None
        assert is_envelope(stored)
        assert envelope_key_id(stored) == "k1"
        assert b"alice" not in stored
        assert b"4111" not in stored
        assert await storage.read("a/b") == _SECRET
        assert await storage.read("missing") is None

    async def test_each_write_draws_a_fresh_nonce(self, storage: Storage, raw: Storage) -> None:
        await storage.write("k", _SECRET)
        first = await raw.read("k")
        await storage.write("k", _SECRET)
        assert await raw.read("k") != first
        if isinstance(storage, ConditionalStorage):
            version = await storage.version("k")
            await storage.write_if("k", _SECRET, expected=version)
            stored = await raw.read("k")
            assert stored is not None
            assert is_envelope(stored)
            assert b"alice" not in stored
            assert await storage.read("k") == _SECRET

    async def test_listing_and_delete_are_unchanged(self, storage: Storage, raw: Storage) -> None:
        for key in ("p/a", "p/b", "q"):
            await storage.write(key, _SECRET)
        assert await storage.list("p/") == ["p/a", "p/b"] == await raw.list("p/")
        await storage.delete("p/a")
        assert await raw.read("p/a") is None
        assert await storage.list("") == ["p/b", "q"]

    async def test_a_wrong_key_is_refused(
        self, storage: Storage, opened_cipher_storage: CipherStorageFactory
    ) -> None:
        from perdure.crypto import AESGCMCipher

        await storage.write("k", _SECRET)
        wrong = opened_cipher_storage(AESGCMCipher(keys={"k1": os.urandom(32)}, active="k1"))
        with pytest.raises(DecryptionError) as info:
            await wrong.read("k")
        assert info.value.details["reason"] == "authentication_failed"

    async def test_a_missing_key_is_refused(
        self, storage: Storage, opened_cipher_storage: CipherStorageFactory
    ) -> None:
        from perdure.crypto import AESGCMCipher

        await storage.write("k", _SECRET)
        other = opened_cipher_storage(AESGCMCipher(keys={"k9": os.urandom(32)}, active="k9"))
        with pytest.raises(DecryptionError) as info:
            await other.read("k")
        assert info.value.details["reason"] == "unknown_key"

    async def test_altered_ciphertext_is_refused(self, storage: Storage, raw: Storage) -> None:
        await storage.write("k", _SECRET)
        stored = await raw.read("k")
        assert stored is not None
        await raw.write("k", stored[:-1] + bytes([stored[-1] ^ 1]))
        with pytest.raises(DecryptionError):
            await storage.read("k")

    async def test_a_blob_written_without_encryption_is_refused(
        self, storage: Storage, raw: Storage
    ) -> None:
        await raw.write("k", b"plain text")
        with pytest.raises(DecryptionError) as info:
            await storage.read("k")
        assert info.value.details["reason"] == "not_encrypted"

    async def test_it_takes_no_appends(self, storage: Storage, raw: Storage) -> None:
        assert not can_append(storage)
        if not isinstance(storage, AppendStorage):
            return
        await storage.write("log", b"head\n")
        before = await raw.read("log")
        with pytest.raises(TypeError, match="cipher"):
            await storage.append("log", b"more\n", size=5, tail=b"head\n")
        with pytest.raises(TypeError, match="cipher"):
            await storage.replace("log", b"new\n", size=None, tail=b"")
        assert await raw.read("log") == before
