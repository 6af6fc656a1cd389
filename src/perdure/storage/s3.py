"""S3Storage: blobs as objects in an S3 bucket (AWS S3, MinIO, Ceph RGW, Cloudflare R2, …).

``perdure[s3]``. One object per key, under ``<prefix>/<key>`` in the bucket.

**The client: obstore.** perdure talks to S3 through `obstore`_, the Python binding
of the Rust ``object_store`` crate (the one Apache Arrow, DataFusion and Delta Lake
use), rather than boto3/aioboto3:

- it is async-native (its own Tokio runtime; a coroutine may be awaited from any
  event loop and any thread), where boto3 is blocking and aioboto3 binds a client to
  one loop and brings botocore's slow pure-Python request path;
- conditional puts are first-class (``PutMode``: ``"create"`` sends
  ``If-None-Match: *``, an update ``If-Match: <etag>``), which is exactly
  :class:`~perdure.storage.ConditionalStorage`;
- multipart uploads, paging listings and retries with exponential backoff and jitter
  are the crate's own, tested against AWS and the S3-compatible servers;
- one small wheel with no dependencies, and the same API reaches Azure Blob and
  Google Cloud Storage should perdure offer them (it does not yet: no emulator of
  either could be run here to test them, and untested backends are not shipped).

Guarantees:

- **Atomic writes.** A ``PUT`` replaces an object whole: readers see the old blob or
  the new one. A blob of ``multipart_threshold`` bytes or more goes up as a multipart
  upload (parts of ``part_size`` bytes, several at once): the object appears only when
  the upload completes, so a writer killed half-way leaves the previous blob intact
  (and an unfinished upload, which a bucket lifecycle rule should abort after a day).
- **Versions** are the objects' ETags. :meth:`S3Storage.write_if` is a conditional
  ``PUT`` (``If-None-Match: *`` to create, ``If-Match`` to replace), checked by the
  server atomically: of two writers expecting one version exactly one succeeds.
  One difference from the other backends: an ETag names the *content* (the MD5 of a
  blob uploaded in one part), so writing the very same bytes again gives the same
  version. A compare-and-set never loses an update whose bytes differ; two writes of
  identical bytes cannot be told apart, which is harmless to a writer whose new
  blob was computed from those bytes. A conditional ``PUT`` whose answer was lost
  and that the client sent again finds its own bytes there (an ETag equal to their
  MD5): it is taken as applied, not as a conflict.
- **Listing** pages through any number of keys (``ListObjectsV2``, 1000 a page); S3
  sorts keys by their UTF-8 bytes, which is the order ``Storage.list`` promises.
- **Faults**: the client retries connection errors, 5xx answers and timeouts with
  backoff, for up to ``retry_timeout`` seconds; then a server that cannot be reached
  raises :class:`~perdure.errors.StoreUnavailableError`. A missing bucket, refused
  credentials or any other failure raise :class:`~perdure.errors.StorageError`, a
  refused conditional write :class:`~perdure.errors.StorageConflictError` — never an
  obstore exception.
- **Credentials** come from the environment, as every AWS tool reads them:
  ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``, web identity
  (``AWS_WEB_IDENTITY_TOKEN_FILE``, ``AWS_ROLE_ARN``), the ECS container endpoint or
  the EC2 instance metadata; ``AWS_ENDPOINT_URL``, ``AWS_REGION`` and the other
  ``AWS_*`` settings of obstore's ``S3Config`` too. When the environment names no key
  and no role, the AWS shared files are read as every AWS tool reads them: the
  static keys of profile ``AWS_PROFILE`` (else ``default``) in
  ``AWS_SHARED_CREDENTIALS_FILE`` (else ``~/.aws/credentials``), and its region in
  ``AWS_CONFIG_FILE`` (else ``~/.aws/config``) when none is given. (A profile that
  assumes a role or signs in with SSO is not resolved: export its variables.) perdure
  never stores a credential.

.. _obstore: https://developmentseed.org/obstore/
"""

from __future__ import annotations

import builtins
import configparser
import hashlib
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

try:
    import obstore
    from obstore import exceptions as obstore_errors
    from obstore.store import S3Store
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("S3Storage needs obstore: pip install 'perdure[s3]'") from exc

from perdure._runtime.checks import check_seconds
from perdure.crypto import Cipher, check_cipher
from perdure.errors import PerdureError, StorageError, StoreUnavailableError
from perdure.storage.encrypted import open_blob, seal_blob
from perdure.storage.keys import (
    check_expected,
    validate_key,
    validate_list_args,
    validate_prefix,
    version_conflict,
)

__all__ = ["S3Storage"]

_PAGE = 1000  # keys per ListObjectsV2 page, the most S3 gives
_MIB = 1024 * 1024
_UNREACHABLE = (
    "error sending request",
    "connection refused",
    "connection reset",
    "timed out",
    "dns error",
    "tcp connect error",
)


def _check_bytes(name: str, value: Any, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
    return value


def _is_etag(version: str) -> bool:
    """Whether ``version`` has an ETag's shape (a quoted, printable ASCII string)."""
    return (
        len(version) >= 3
        and version.isascii()
        and version.isprintable()
        and version.startswith('"')
        and version.endswith('"')
        and '"' not in version[1:-1]
    )


def _as_path(text: str) -> str | None:
    """``text`` if it is a key obstore takes as a list offset, else ``None``."""
    try:
        return _s3_key(text)
    except ValueError:
        return None


def _s3_key(key: Any, argument: str = "key") -> str:
    """A valid storage key that an S3 object path can also hold.

    ``object_store`` refuses ASCII control characters in a path (``Could not parse
    path``), which a session id may hold: refused here, before any request, naming
    the key, rather than as a failed request whose outcome reads as unknown.

    Raises:
        TypeError, ValueError: as :func:`~perdure.storage.keys.validate_key`; or the
            key holds a control character (U+0000-U+001F, U+007F).
    """
    text = validate_key(key, argument)
    for char in text:
        if ord(char) < 0x20 or char == "\x7f":
            raise ValueError(
                f"{argument} {text!r} is invalid on S3: it holds the control character "
                f"{char!r}, which an S3 object path cannot"
            )
    return text


class S3Storage:
    """Blobs as objects in an S3 bucket: atomic, versioned by ETag (see the module).

    Implements :class:`~perdure.storage.Storage` and
    :class:`~perdure.storage.ConditionalStorage`.

    Args:
        bucket: the bucket (it must exist; perdure creates none).
        prefix: put before every key, as ``<prefix>/<key>`` (``""``: none);
            ``/``-separated segments, without a leading or trailing ``/``.
        endpoint_url: the S3 API's URL for anything but AWS (MinIO, R2, a
            loopback test server); ``None``: AWS, or ``AWS_ENDPOINT_URL``. An
            ``http://`` endpoint is allowed as given.
        region: the bucket's region; ``None``: ``AWS_REGION`` /
            ``AWS_DEFAULT_REGION``, else ``us-east-1``.
        retry_timeout: seconds the client goes on retrying a failing request (with
            backoff) before the error is raised.
        max_retries: the most times one request is sent again.
        connect_timeout: seconds to wait for a connection.
        timeout: seconds one request may take.
        multipart_threshold: blobs of at least this many bytes go up in parts.
        part_size: the size of each part (S3's least is 5 MiB).
        config: further ``S3Config`` settings of obstore (``{"virtual_hosted_style_request":
            True}``, say); never credentials in code you commit.
        cipher: a :class:`~perdure.crypto.Cipher`: every blob is stored encrypted
            (:func:`~perdure.storage.encrypted.seal_blob`); a read of a blob that does
            not decrypt raises :class:`~perdure.errors.DecryptionError`.

    Raises:
        TypeError, ValueError: a bad argument (the message names it).
    """

    def __init__(
        self,
        bucket: str,
        *,
        prefix: str = "",
        endpoint_url: str | None = None,
        region: str | None = None,
        retry_timeout: float = 15.0,
        max_retries: int = 10,
        connect_timeout: float = 5.0,
        timeout: float = 60.0,
        multipart_threshold: int = 8 * _MIB,
        part_size: int = 8 * _MIB,
        config: dict[str, Any] | None = None,
        cipher: Cipher | None = None,
    ) -> None:
        self.cipher = check_cipher(cipher)
        if not isinstance(bucket, str) or not bucket or "/" in bucket:
            raise ValueError(f"bucket must be a bucket name (no '/'), got {bucket!r}")
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
        if prefix:
            _s3_key(prefix, "prefix")
        for name, value in (("endpoint_url", endpoint_url), ("region", region)):
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"{name} must be a non-empty str or None, got {value!r}")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ValueError(f"max_retries must be an int >= 0, got {max_retries!r}")
        if config is not None and not isinstance(config, dict):
            raise TypeError(f"config must be a dict or None, got {type(config).__name__}")
        self.bucket = bucket
        self.prefix = prefix
        self.endpoint_url = endpoint_url
        self.region = region
        self.multipart_threshold = _check_bytes("multipart_threshold", multipart_threshold, 1)
        self.part_size = _check_bytes("part_size", part_size, 5 * _MIB)
        settings: dict[str, Any] = dict(config or {})
        client: dict[str, Any] = {
            "connect_timeout": timedelta(seconds=check_seconds("connect_timeout", connect_timeout)),
            "timeout": timedelta(seconds=check_seconds("timeout", timeout)),
        }
        _shared_files(settings, region)
        if endpoint_url is not None:
            settings["endpoint"] = endpoint_url
        # The endpoint given, or the environment's, as every AWS tool reads it.
        endpoint = endpoint_url or os.environ.get("AWS_ENDPOINT_URL") or ""
        if endpoint.startswith("http://"):
            client["allow_http"] = True
        if region is not None:
            settings["region"] = region
        retry = {
            "max_retries": max_retries,
            "retry_timeout": timedelta(seconds=check_seconds("retry_timeout", retry_timeout)),
        }
        where = endpoint_url or "AWS"
        self.server = f"s3://{bucket}/{prefix}" + (f" at {endpoint_url}" if endpoint_url else "")
        try:
            self._store = S3Store(
                bucket,
                prefix=prefix or None,
                config=settings,  # type: ignore[arg-type]
                client_options=client,  # type: ignore[arg-type]
                retry_config=retry,  # type: ignore[arg-type]
            )
        except obstore_errors.BaseError as exc:
            raise ValueError(f"S3 storage for bucket {bucket!r} at {where}: {exc}") from exc

    def __repr__(self) -> str:
        return (
            f"S3Storage({self.bucket!r}, prefix={self.prefix!r}, "
            f"endpoint_url={self.endpoint_url!r}, region={self.region!r})"
        )

    # ------------------------------------------------------------------ Storage

    async def write(self, key: str, data: bytes) -> None:
        """Atomically replace the blob under ``key`` (in parts when it is large).

        Raises:
            ValueError: ``key`` is invalid.
            TypeError: ``data`` is not bytes.
            StoreUnavailableError: the server stayed out of reach (the write may have
                been applied: ``details["outcome"] == "unknown"``).
            StorageError: any other failure.
        """
        _s3_key(key)
        blob = seal_blob(self.cipher, data)
        try:
            await obstore.put_async(
                self._store,
                key,
                blob,
                use_multipart=len(blob) >= self.multipart_threshold,
                chunk_size=self.part_size,
                max_concurrency=4,
            )
        except Exception as exc:
            raise self._translate(exc, f"writing {key!r}", outcome="unknown") from exc

    async def read(self, key: str) -> bytes | None:
        """The blob under ``key``, or ``None`` when there is none.

        Raises:
            StorageError: the bucket does not exist, or another failure.
            StoreUnavailableError: the server stayed out of reach.
        """
        _s3_key(key)
        try:
            result = await obstore.get_async(self._store, key)
            stored = bytes(await result.bytes_async())
        except FileNotFoundError as exc:
            if "NoSuchBucket" in str(exc):
                raise self._translate(exc, f"reading {key!r}") from exc
            return None
        except Exception as exc:
            raise self._translate(exc, f"reading {key!r}") from exc
        return open_blob(self.cipher, stored)  # a DecryptionError is not the server's

    async def delete(self, key: str) -> None:
        """Remove ``key`` (idempotent)."""
        _s3_key(key)
        try:
            await obstore.delete_async(self._store, key)
        except Exception as exc:
            raise self._translate(exc, f"deleting {key!r}") from exc

    async def list(
        self, prefix: str, *, limit: int | None = None, start_after: str | None = None
    ) -> builtins.list[str]:
        """The keys starting with ``prefix``, sorted by their UTF-8 bytes, after
        ``start_after`` (exclusive), at most ``limit`` of them; pages through any
        number of keys."""
        validate_list_args(prefix, limit, start_after)
        if limit == 0:
            return []
        validate_prefix(prefix)
        if any(ord(char) < 0x20 or char == "\x7f" for char in prefix):
            return []  # no key under it can be stored (see _s3_key)
        # obstore lists whole "directories": list the one holding the prefix's last,
        # partial segment, starting just before the prefix, and stop past it.
        directory, _, partial = prefix.rpartition("/")
        offset = _as_path(prefix[:-1]) if partial else None
        after = None if start_after is None else _as_path(start_after)
        if after is not None and (offset is None or after > offset):
            offset = after  # else the filter below skips up to start_after
        found: builtins.list[str] = []
        try:
            stream = obstore.list(
                self._store, prefix=directory or None, offset=offset, chunk_size=_PAGE
            )
            async for page in stream:
                for meta in page:
                    path = meta["path"]
                    if not path.startswith(prefix):
                        if path > prefix:
                            return found
                        continue
                    if start_after is not None and path <= start_after:
                        continue
                    found.append(path)
                    if limit is not None and len(found) >= limit:
                        return found
        except Exception as exc:
            raise self._translate(exc, f"listing {prefix!r}") from exc
        return found

    # ------------------------------------------------------------------ ConditionalStorage

    async def version(self, key: str) -> str | None:
        """The version (ETag) of the blob under ``key``, or ``None`` when there is none."""
        _s3_key(key)
        try:
            meta = await obstore.head_async(self._store, key)
        except FileNotFoundError:
            return None
        except Exception as exc:
            raise self._translate(exc, f"reading the version of {key!r}") from exc
        etag = meta["e_tag"]
        if not etag:
            raise StorageError(
                f"S3 storage {self.server}: the server gave no ETag for {key!r}: it cannot "
                "take conditional writes",
                details=self._details(key=key),
            )
        return str(etag)

    async def write_if(self, key: str, data: bytes, *, expected: str | None) -> str:
        """Replace the blob under ``key`` only if its version (ETag) is ``expected``
        (``None``: only if there is none); return the new version.

        One conditional ``PUT`` (never multipart): the server compares and writes.

        Raises:
            StorageConflictError: the version is not ``expected``; nothing was written.
            ValueError: ``key`` is invalid.
            TypeError: ``data`` is not bytes, ``expected`` neither a str nor None.
            StoreUnavailableError: the server stayed out of reach (the write may have
                been applied: ``details["outcome"] == "unknown"``).
        """
        _s3_key(key)
        blob = seal_blob(self.cipher, data)
        check_expected(expected)
        if expected is not None and not _is_etag(expected):
            # Not an ETag: no object has it (and an empty If-Match would match any).
            raise version_conflict(f"S3 storage {self.server}", key, expected, None)
        mode: Any = "create" if expected is None else {"e_tag": expected}
        doing = f"writing {key!r} if its version is {expected}"
        try:
            result = await obstore.put_async(self._store, key, blob, mode=mode, use_multipart=False)
        except (obstore_errors.AlreadyExistsError, obstore_errors.PreconditionError) as exc:
            found = await self.version(key)
            if found is not None and found == f'"{hashlib.md5(blob).hexdigest()}"':
                # Our own bytes: a send whose answer was lost landed, and the
                # client's retry found it (or another writer wrote the same bytes).
                return found
            raise version_conflict(f"S3 storage {self.server}", key, expected, found) from exc
        except FileNotFoundError as exc:
            if "NoSuchBucket" in str(exc):
                raise self._translate(exc, doing) from exc
            raise version_conflict(f"S3 storage {self.server}", key, expected, None) from exc
        except Exception as exc:
            raise self._translate(exc, doing, outcome="unknown") from exc
        etag = result.get("e_tag")
        if not etag:
            raise StorageError(
                f"S3 storage {self.server}: the server gave no ETag for {key!r}",
                details=self._details(key=key),
            )
        return str(etag)

    # ------------------------------------------------------------------ internals

    def _details(self, **more: Any) -> dict[str, Any]:
        return {"bucket": self.bucket, "prefix": self.prefix, "server": self.server, **more}

    def _translate(
        self, exc: BaseException, doing: str, *, outcome: str | None = None
    ) -> PerdureError:
        """perdure's error for a client error (the caller raises it ``from exc``)."""
        text = str(exc)
        first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
        details = self._details()
        if "NoSuchBucket" in text:
            return StorageError(
                f"S3 storage {self.server}: {doing}: the bucket {self.bucket!r} does not exist",
                details={**details, "kind": "no_bucket"},
            )
        if isinstance(
            exc, obstore_errors.PermissionDeniedError | obstore_errors.UnauthenticatedError
        ):
            return StorageError(
                f"S3 storage {self.server}: {doing}: access refused (check the AWS_* "
                f"credentials in the environment): {first}",
                details={**details, "kind": "access_denied"},
            )
        if "169.254.169.254" in text or "169.254.170.2" in text:
            # No key anywhere, so the client asked the instance (or container) for a
            # role, and nothing answered there.
            return StorageError(
                f"S3 storage {self.server}: {doing}: no credentials found: set "
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, give a profile in "
                f"~/.aws/credentials (AWS_PROFILE), or run with an instance role ({first})",
                details={**details, "kind": "no_credentials"},
            )
        lowered = text.lower()
        if isinstance(exc, obstore_errors.GenericError) and any(
            word in lowered for word in _UNREACHABLE
        ):
            if outcome is not None:
                details["outcome"] = outcome
            return StoreUnavailableError(
                f"S3 storage {self.server}: {doing}: the server cannot be reached ({first})",
                details=details,
            )
        return StorageError(f"S3 storage {self.server}: {doing}: {first}", details=details)


_ENV_CREDENTIALS = (
    "AWS_ACCESS_KEY_ID",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
)


def _shared_files(settings: dict[str, Any], region: str | None) -> None:
    """Fill ``settings`` from the AWS shared files when nothing else names credentials.

    The static keys of the profile (``AWS_PROFILE``, else ``default``) in the shared
    credentials file, and its region from the config file when neither ``region`` nor
    the environment gives one. Settings given, and the environment, come first.
    """
    if any(os.environ.get(name) for name in _ENV_CREDENTIALS) or "access_key_id" in settings:
        return
    profile = os.environ.get("AWS_PROFILE") or os.environ.get("AWS_DEFAULT_PROFILE") or "default"
    home = Path.home() / ".aws"
    credentials = _ini_section(
        os.environ.get("AWS_SHARED_CREDENTIALS_FILE") or str(home / "credentials"), profile
    )
    key, secret = credentials.get("aws_access_key_id"), credentials.get("aws_secret_access_key")
    if not key or not secret:
        return
    settings["access_key_id"], settings["secret_access_key"] = key, secret
    if credentials.get("aws_session_token"):
        settings["session_token"] = credentials["aws_session_token"]
    if (
        region is None
        and "region" not in settings
        and not (os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION"))
    ):
        section = profile if profile == "default" else f"profile {profile}"
        found = _ini_section(os.environ.get("AWS_CONFIG_FILE") or str(home / "config"), section)
        if found.get("region"):
            settings["region"] = found["region"]


def _ini_section(path: str, section: str) -> dict[str, str]:
    """One section of an INI file (empty when the file or the section is missing)."""
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(path, encoding="utf-8")
    except (OSError, configparser.Error, UnicodeDecodeError):
        return {}
    if not parser.has_section(section):
        return {}
    return {name: value.strip() for name, value in parser.items(section)}
