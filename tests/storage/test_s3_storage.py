"""S3Storage against a real S3 API on loopback: moto's server (SPEC §6, issue 19).

No AWS account is used: ``s3_server`` runs ``moto.server.ThreadedMotoServer`` on
127.0.0.1 at a free port, and each test gets a bucket of its own. It runs
perdure.testing's StorageSuite and ConditionalStorageSuite exactly as a third-party
backend would, the snapshot manager and StorageCheckpointStore on it; then what S3
adds: listings past one page, multipart uploads (and a writer SIGKILLed in the middle
of one), two processes racing ``write_if``, typed errors, and ``open_storage``.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import s3_server
from crypto_keys import cipher
from perdure import Agent, NullConversationManager
from perdure.checkpoints.storage import StorageCheckpointStore
from perdure.errors import (
    SessionConflictError,
    StorageConflictError,
    StorageError,
    StoreUnavailableError,
)
from perdure.models import ScriptedModel
from perdure.snapshots.manager import SnapshotSessionManager
from perdure.storage import AppendStorage, ConditionalStorage, EncryptedStorage, open_storage
from perdure.testing import (
    CheckpointStoreSuite,
    CipherStorageSuite,
    ConditionalStorageSuite,
    StorageSuite,
)
from perdure.testing.storage import CipherStorageFactory, StorageFactory

s3_server.import_s3()

from perdure.storage import s3 as s3_module  # noqa: E402  (needs obstore)
from perdure.storage.s3 import S3Storage  # noqa: E402

MiB = 1024 * 1024


@pytest.fixture
def bucket() -> str:
    return s3_server.new_bucket()


@pytest.fixture
def opened(bucket: str) -> Callable[..., S3Storage]:
    """Opens storages on the test's bucket, under the prefix ``t/p`` unless told."""
    endpoint = s3_server.endpoint()

    def open_one(**options: Any) -> S3Storage:
        options.setdefault("prefix", "t/p")
        return S3Storage(bucket, endpoint_url=endpoint, region="us-east-1", **options)

    return open_one


class TestS3Storage(StorageSuite):
    @pytest.fixture
    def storage_factory(self, opened: Callable[..., S3Storage]) -> StorageFactory:
        return opened


class TestEncryptedS3ConditionalStorage(ConditionalStorageSuite):
    """The contract holds with every blob encrypted (SPEC §9)."""

    versions_name_content = True

    @pytest.fixture
    def storage_factory(self, opened: Callable[..., S3Storage]) -> StorageFactory:
        return lambda: EncryptedStorage(opened(), cipher())


class TestS3StorageWithCipher(StorageSuite):
    """Built with ``cipher=`` (issue 20): the plain contract holds."""

    @pytest.fixture
    def storage_factory(self, opened: Callable[..., S3Storage]) -> StorageFactory:
        return lambda: opened(cipher=cipher())


class TestS3ConditionalStorageWithCipher(ConditionalStorageSuite):
    versions_name_content = True

    @pytest.fixture
    def storage_factory(self, opened: Callable[..., S3Storage]) -> StorageFactory:
        return lambda: opened(cipher=cipher())


class TestS3StorageEncryption(CipherStorageSuite):
    """Ciphertext at rest, fresh nonces, a wrong or missing key refused, no garbage."""

    @pytest.fixture
    def cipher_storage_factory(self, opened: Callable[..., S3Storage]) -> CipherStorageFactory:
        return lambda c: opened(cipher=c)


def test_open_storage_builds_it_with_the_cipher() -> None:
    c = cipher()
    storage = open_storage(
        "s3://bucket/pfx?endpoint_url=http://127.0.0.1:9&region=us-east-1", cipher=c
    )
    assert isinstance(storage, S3Storage)
    assert storage.cipher is c


class TestS3ConditionalStorage(ConditionalStorageSuite):
    versions_name_content = True  # an ETag is the MD5 of the bytes

    @pytest.fixture
    def storage_factory(self, opened: Callable[..., S3Storage]) -> StorageFactory:
        return opened


class TestS3CheckpointStore(CheckpointStoreSuite):
    @pytest.fixture
    def checkpoint_store_factory(self, opened: Callable[..., S3Storage]) -> Any:
        return lambda **retention: StorageCheckpointStore(opened(), **retention)


# ------------------------------------------------------------------ S3 itself


def test_it_is_conditional_and_cannot_append(opened: Callable[..., S3Storage]) -> None:
    storage = opened()
    assert isinstance(storage, ConditionalStorage)
    assert not isinstance(storage, AppendStorage)


async def test_keys_live_under_the_prefix_and_prefixes_are_apart(
    opened: Callable[..., S3Storage],
) -> None:
    inner, other, whole = opened(prefix="a/b"), opened(prefix="a/c"), opened(prefix="")
    await inner.write("k/1", b"x")
    await other.write("k/1", b"y")
    assert await whole.list("") == ["a/b/k/1", "a/c/k/1"]
    assert await inner.list("") == ["k/1"]
    assert await inner.read("k/1") == b"x"
    assert await whole.read("a/c/k/1") == b"y"


@pytest.mark.parametrize("char", ["\t", "\n", "\x01", "\x7f"])
async def test_a_key_with_a_control_character_is_refused_by_name_before_any_request(
    opened: Callable[..., S3Storage], char: str
) -> None:
    # A session id may hold one; an S3 object path cannot (obstore refused it as a
    # failed request whose outcome read as unknown).
    storage = opened()
    key = f"sessions/user{char}42/latest"
    for call in (
        lambda: storage.write(key, b"x"),
        lambda: storage.read(key),
        lambda: storage.version(key),
        lambda: storage.write_if(key, b"x", expected=None),
        lambda: storage.delete(key),
    ):
        with pytest.raises(ValueError, match=r"is invalid on S3: it holds the control character"):
            await call()
    assert await storage.list(f"sessions/user{char}") == []
    assert await storage.list("") == []


async def test_list_pages_past_one_page_of_keys(opened: Callable[..., S3Storage]) -> None:
    storage = opened()
    keys = [f"many/{i:05d}" for i in range(2100)]  # S3 gives 1000 keys a page
    semaphore = asyncio.Semaphore(32)

    async def put(key: str) -> None:
        async with semaphore:
            await storage.write(key, b"")

    await asyncio.gather(*(put(key) for key in keys))
    await storage.write("many0", b"")  # beside the directory: not under "many/"
    assert await storage.list("many/") == keys
    assert await storage.list("many/01") == keys[1000:2000]
    assert await storage.list("many/", start_after=keys[1499], limit=700) == keys[1500:2100]
    assert await storage.list("many", limit=3, start_after="many/02099") == ["many0"]


async def test_a_large_blob_goes_up_in_parts_and_round_trips(
    opened: Callable[..., S3Storage],
) -> None:
    storage = opened(multipart_threshold=6 * MiB, part_size=5 * MiB)
    blob = os.urandom(11 * MiB)
    await storage.write("big/blob", blob)
    assert await storage.read("big/blob") == blob
    version = await storage.version("big/blob")
    assert version is not None
    assert version.endswith('-3"')  # a multipart ETag: three parts
    small = os.urandom(MiB)
    await storage.write("big/small", small)
    assert re.fullmatch(r'"[0-9a-f]{32}"', await storage.version("big/small") or "")


async def test_a_conditional_write_whose_bytes_are_there_is_taken_as_applied(
    opened: Callable[..., S3Storage],
) -> None:
    """What a retried send finds when its first send landed: its own bytes."""
    storage = opened()
    first = await storage.write_if("k", b"mine", expected=None)
    assert await storage.write_if("k", b"mine", expected=None) == first
    with pytest.raises(StorageConflictError) as info:
        await storage.write_if("k", b"other", expected=None)
    assert info.value.details["found"] == first


async def test_a_missing_bucket_is_a_storage_error_not_an_empty_store(bucket: str) -> None:
    storage = S3Storage("perdure-no-such-bucket", endpoint_url=s3_server.endpoint())
    for call in (storage.read("k"), storage.write("k", b"x"), storage.list("")):
        with pytest.raises(StorageError, match="does not exist") as info:
            await call
        assert info.value.code == "storage_error"
        assert info.value.details["kind"] == "no_bucket"


async def test_an_unreachable_endpoint_is_store_unavailable() -> None:
    s3_server.require_s3()
    port = s3_server._free_port()  # nobody listens there
    storage = S3Storage(
        "bucket", endpoint_url=f"http://127.0.0.1:{port}", retry_timeout=1, max_retries=2
    )
    started = time.monotonic()
    for call in (storage.read("k"), storage.write("k", b"x"), storage.list("")):
        with pytest.raises(StoreUnavailableError) as info:
            await call
        assert info.value.code == "store_unavailable"
        assert "cannot be reached" in str(info.value)
        assert not type(info.value.__cause__).__module__.startswith("perdure")
    with pytest.raises(StoreUnavailableError) as info:
        await storage.write_if("k", b"x", expected=None)
    assert info.value.details["outcome"] == "unknown"
    assert time.monotonic() - started < 30


def test_bad_arguments_name_themselves() -> None:
    s3_server.require_s3()
    with pytest.raises(ValueError, match="bucket"):
        S3Storage("a/b")
    with pytest.raises(ValueError, match="prefix"):
        S3Storage("b", prefix="/abs")
    with pytest.raises(ValueError, match="part_size"):
        S3Storage("b", part_size=1024)
    with pytest.raises(ValueError, match="retry_timeout"):
        S3Storage("b", retry_timeout=0)


async def test_open_storage_takes_an_s3_url(bucket: str) -> None:
    endpoint = s3_server.endpoint()
    storage = open_storage(f"s3://{bucket}/app/blobs?endpoint_url={endpoint}&region=us-east-1")
    assert isinstance(storage, S3Storage)
    assert (storage.bucket, storage.prefix, storage.region) == (bucket, "app/blobs", "us-east-1")
    await storage.write("k", b"v")
    whole = open_storage(f"s3://{bucket}?endpoint_url={endpoint}")
    assert await whole.list("") == ["app/blobs/k"]
    for bad, word in (
        (f"s3://{bucket}/p?colour=red", "colour="),
        (f"s3://{bucket}/p?timeout=soon", "timeout="),
        ("s3:///p", "bucket"),
        ("s3://key:secret@bucket/p", "credentials"),
    ):
        with pytest.raises(ValueError, match=word):
            open_storage(bad)


# ------------------------------------------------------------ the snapshot manager


def _agent(manager: SnapshotSessionManager | None) -> Agent:
    return Agent(
        model=ScriptedModel([]),
        conversation_manager=NullConversationManager(),
        session_manager=manager,
    )


def _text(i: int) -> Any:
    return {"role": "user" if i % 2 == 0 else "assistant", "content": [{"text": f"m{i}"}]}


async def test_snapshots_save_restore_and_refuse_a_stale_writer(
    opened: Callable[..., S3Storage],
) -> None:
    seed = _agent(None)
    seed.messages = [_text(i) for i in range(300)]
    writer = SnapshotSessionManager("s", storage=opened())
    await writer.save_snapshot(seed, is_latest=True)
    snapshot_id = await writer.save_snapshot(seed, is_latest=False)
    one, two = _agent(None), _agent(None)
    first = SnapshotSessionManager("s", storage=opened())
    second = SnapshotSessionManager("s", storage=opened())
    assert await first.restore_snapshot(one)
    assert await second.restore_snapshot(two)
    assert one.messages == seed.messages
    one.messages.append(_text(300))
    await first.save_snapshot(one, is_latest=True)
    two.messages.append(_text(999))
    with pytest.raises(SessionConflictError):
        await second.save_snapshot(two, is_latest=True)
    assert await second.restore_snapshot(two)  # picks up the other's save
    assert two.messages == [*seed.messages, _text(300)]
    two.messages.append(_text(301))
    await second.save_snapshot(two, is_latest=True)
    back = _agent(None)
    assert await SnapshotSessionManager("s", storage=opened()).restore_snapshot(back)
    assert len(back.messages) == 302
    assert await SnapshotSessionManager("s", storage=opened()).list_snapshot_ids(back) == [
        snapshot_id
    ]


# ------------------------------------------------------------ processes


RACER = textwrap.dedent(
    """
    import asyncio, sys
    from perdure.errors import StorageConflictError
    from perdure.storage.s3 import S3Storage

    async def main():
        bucket, endpoint, name = sys.argv[1], sys.argv[2], sys.argv[3]
        storage = S3Storage(bucket, prefix="race", endpoint_url=endpoint)
        print("ready", flush=True)
        for line in sys.stdin:
            round_, expected = line.split()
            try:
                made = await storage.write_if(
                    "key", f"{name} {round_}".encode(), expected=expected
                )
            except StorageConflictError:
                print("lost", flush=True)
            else:
                print("won", made, flush=True)

    asyncio.run(main())
    """
)


def test_two_processes_racing_write_if_have_one_winner_a_round(
    opened: Callable[..., S3Storage], bucket: str, tmp_path: Path
) -> None:
    storage = opened(prefix="race")
    current = asyncio.run(storage.write_if("key", b"start", expected=None))
    script = tmp_path / "racer.py"
    script.write_text(RACER)
    racers = [
        subprocess.Popen(
            [sys.executable, str(script), bucket, s3_server.endpoint(), name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("a", "b")
    ]
    try:
        for racer in racers:
            assert racer.stdout is not None
            assert racer.stdout.readline().strip() == "ready"
        wins = {"a": 0, "b": 0}
        for round_ in range(200):
            for racer in racers:
                assert racer.stdin is not None
                racer.stdin.write(f"{round_} {current}\n")
                racer.stdin.flush()
            answers = [racer.stdout.readline().split() for racer in racers]  # type: ignore[union-attr]
            winners = [
                (name, words[1])
                for name, words in zip(("a", "b"), answers, strict=True)
                if words[0] == "won"
            ]
            assert len(winners) == 1, (round_, answers)
            name, made = winners[0]
            wins[name] += 1
            assert asyncio.run(storage.read("key")) == f"{name} {round_}".encode()
            assert asyncio.run(storage.version("key")) == made
            current = made
        assert wins["a"] + wins["b"] == 200
    finally:
        errors = [racer.communicate(timeout=30)[1] for racer in racers]  # closes the pipes
    for racer, error in zip(racers, errors, strict=True):
        assert racer.returncode == 0, error


UPLOADER = textwrap.dedent(
    """
    import asyncio, os, sys
    from perdure.storage.s3 import S3Storage

    async def main():
        bucket, endpoint = sys.argv[1], sys.argv[2]
        storage = S3Storage(
            bucket, prefix="t/p", endpoint_url=endpoint,
            multipart_threshold=5 * 1024 * 1024, part_size=5 * 1024 * 1024,
        )
        blob = os.urandom(80 * 1024 * 1024)
        print("uploading", flush=True)
        await storage.write("blob", blob)
        print("done", flush=True)

    asyncio.run(main())
    """
)


def _unfinished_uploads(endpoint: str, bucket: str) -> list[str]:
    with urllib.request.urlopen(f"{endpoint}/{bucket}?uploads", timeout=10) as answer:
        body = answer.read().decode()
    return re.findall(r"<Key>([^<]*)</Key>", body)


def test_a_writer_killed_during_a_multipart_upload_leaves_the_old_blob(
    opened: Callable[..., S3Storage], bucket: str, tmp_path: Path
) -> None:
    storage = opened()
    old = os.urandom(2 * MiB)
    asyncio.run(storage.write("blob", old))
    endpoint = s3_server.endpoint()
    script = tmp_path / "uploader.py"
    script.write_text(UPLOADER)
    child = subprocess.Popen(
        [sys.executable, str(script), bucket, endpoint],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "uploading"
        deadline = time.monotonic() + 30
        while not _unfinished_uploads(endpoint, bucket):  # the upload has begun
            assert time.monotonic() < deadline, "the upload never began"
            assert child.poll() is None, "the uploader ended before it was killed"
            time.sleep(0.005)
        child.send_signal(signal.SIGKILL)
    finally:
        if child.poll() is None:
            child.kill()
        child.communicate(timeout=30)  # closes the pipes
    assert child.returncode == -signal.SIGKILL
    assert _unfinished_uploads(endpoint, bucket) == ["t/p/blob"]  # killed in the middle
    assert asyncio.run(storage.read("blob")) == old
    assert asyncio.run(storage.list("")) == ["blob"]


def _no_aws_environment(monkeypatch: pytest.MonkeyPatch, home: Path) -> Path:
    """No AWS_* credentials, profile, region or file paths; HOME at ``home``."""
    for name in list(os.environ):
        if name.startswith("AWS_") and name != "AWS_ENDPOINT_URL":
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(home))
    aws = home / ".aws"
    aws.mkdir()
    return aws


async def test_credentials_come_from_the_shared_files_when_the_environment_has_none(
    bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    aws = _no_aws_environment(monkeypatch, tmp_path)
    (aws / "credentials").write_text(
        "[default]\naws_access_key_id = from-default\naws_secret_access_key = s\n\n"
        "[work]\naws_access_key_id = from-work\naws_secret_access_key = s2\n"
        "aws_session_token = t2\n"
    )
    (aws / "config").write_text("[profile work]\nregion = eu-west-3\n")
    monkeypatch.setenv("AWS_PROFILE", "work")
    storage = S3Storage(bucket, endpoint_url=s3_server.endpoint(), retry_timeout=2)
    # The profile's keys sign the requests: without them there is nothing to sign with
    # (obstore would look for an instance role and fail).
    await storage.write("k", b"v")
    assert await storage.read("k") == b"v"
    settings: dict[str, Any] = {}
    s3_module._shared_files(settings, None)
    assert settings == {
        "access_key_id": "from-work",
        "secret_access_key": "s2",
        "session_token": "t2",
        "region": "eu-west-3",
    }
    monkeypatch.delenv("AWS_PROFILE")
    settings = {}
    s3_module._shared_files(settings, "us-east-1")  # a region given is kept
    assert settings == {"access_key_id": "from-default", "secret_access_key": "s"}


async def test_no_credentials_anywhere_is_a_storage_error_that_says_so(
    bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_aws_environment(monkeypatch, tmp_path)
    storage = S3Storage(bucket, endpoint_url=s3_server.endpoint(), retry_timeout=2)
    with pytest.raises(StorageError, match="no credentials found") as info:
        await storage.write("k", b"v")
    assert info.value.details["kind"] == "no_credentials"


def test_the_environment_comes_before_the_shared_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    aws = _no_aws_environment(monkeypatch, tmp_path)
    (aws / "credentials").write_text(
        "[default]\naws_access_key_id = f\naws_secret_access_key = s\n"
    )
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "from-env")
    settings: dict[str, Any] = {}
    s3_module._shared_files(settings, None)
    assert settings == {}
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    (aws / "credentials").write_text("[default]\nnot ini at all = [\n")  # unreadable: ignored
    s3_module._shared_files(settings, None)
    assert settings == {}


@pytest.fixture(autouse=True, scope="module")
def _credentials() -> Iterator[None]:
    """moto's dummy credentials for this module's storages (and its subprocesses)."""
    saved = {name: os.environ.get(name) for name in s3_server.ENV}
    os.environ.update(s3_server.ENV)
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
