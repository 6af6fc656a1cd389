"""The :class:`Cipher` protocol, the envelope format and :class:`AESGCMCipher`.

An encrypted record is one self-describing envelope::

    b"PDE" | version (1 byte, 1) | key id length (1 byte) | key id (ASCII)
          | nonce (12 bytes) | ciphertext and 16-byte GCM tag

The header (everything before the nonce) is authenticated as associated data, so a
record's key id cannot be swapped for another. The key id travels with each record:
after a rotation a store holds records under several keys, and a cipher that knows
them all reads them all. Stores that keep text (JSON rows, journal records) store an
envelope as :data:`TEXT_PREFIX` followed by its base64 (:func:`seal_text`).
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import json
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from perdure.errors import DecryptionError

__all__ = [
    "ENVELOPE_MAGIC",
    "TEXT_PREFIX",
    "AESGCMCipher",
    "Cipher",
    "check_cipher",
    "envelope_key_id",
    "is_envelope",
    "is_sealed_text",
    "keys_from_env",
    "keys_from_file",
    "load_keys",
    "open_text",
    "open_utf8",
    "seal",
    "seal_text",
    "unseal",
    "unseal_all",
]

ENVELOPE_MAGIC = b"PDE"
"""The first bytes of every envelope."""
_VERSION = 1
_NONCE_LEN = 12
_TAG_LEN = 16
KEY_LEN = 32
TEXT_PREFIX = "~pd1~"
"""The start of an envelope kept as text: the marker, then standard base64."""
_KEY_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")


@runtime_checkable
class Cipher(Protocol):
    """What a store needs to encrypt its records; plug in your own (a KMS, say).

    ``encrypt`` must return a fresh envelope each call (a new nonce) that names the
    key it used (:func:`envelope_key_id` reads it back), and ``decrypt`` must refuse
    — with :class:`~perdure.errors.DecryptionError`, never garbage — anything it
    cannot authenticate.
    """

    @property
    def active(self) -> str:
        """The id of the key new records are encrypted with."""
        ...

    def encrypt(self, plaintext: bytes) -> bytes:
        """An envelope of ``plaintext`` under the active key."""
        ...

    def decrypt(self, envelope: bytes) -> bytes:
        """The plaintext of ``envelope``, under whichever known key it names.

        Raises:
            DecryptionError: the key it names is unknown, or it does not authenticate
                (a wrong key, or altered bytes), or it is no envelope.
        """
        ...

    def fingerprint(self, data: bytes) -> str:
        """A keyed hash of ``data`` (hex) under the active key: equal data, equal
        fingerprint, but nobody without the key can test a guess against it (a
        memory store's duplicate check uses it in place of a plain sha256)."""
        ...


def _check_key_id(key_id: Any, where: str) -> str:
    if not isinstance(key_id, str) or not _KEY_ID.fullmatch(key_id):
        raise ValueError(
            f"{where} must be 1-64 characters of letters, digits, '_', '.', '-'; got {key_id!r}"
        )
    return key_id


def _header(key_id: str) -> bytes:
    raw = key_id.encode("ascii")
    return ENVELOPE_MAGIC + bytes((_VERSION, len(raw))) + raw


def is_envelope(data: bytes) -> bool:
    """Whether ``data`` starts like an envelope (magic and version)."""
    return data[:4] == ENVELOPE_MAGIC + bytes((_VERSION,))


def _split(envelope: bytes) -> tuple[str, bytes, bytes, bytes]:
    """(key id, header, nonce, ciphertext) of ``envelope``, or DecryptionError."""
    if not isinstance(envelope, bytes | bytearray | memoryview):
        raise TypeError(f"envelope must be bytes, got {type(envelope).__name__}")
    envelope = bytes(envelope)
    if not is_envelope(envelope):
        raise DecryptionError(
            "the data is not an encrypted perdure record (no envelope header)",
            details={"reason": "not_encrypted"},
        )
    length = envelope[4]
    end = 5 + length
    if len(envelope) < end + _NONCE_LEN + _TAG_LEN:
        raise DecryptionError("the encrypted record is truncated", details={"reason": "truncated"})
    try:
        key_id = envelope[5:end].decode("ascii")
    except UnicodeDecodeError:
        raise DecryptionError(
            "the encrypted record's key id is not ASCII", details={"reason": "bad_header"}
        ) from None
    return key_id, envelope[:end], envelope[end : end + _NONCE_LEN], envelope[end + _NONCE_LEN :]


def envelope_key_id(envelope: bytes) -> str:
    """The id of the key ``envelope`` was encrypted with (no key needed).

    Raises:
        DecryptionError: ``envelope`` is no envelope (``details["reason"]``).
    """
    return _split(envelope)[0]


def seal_text(cipher: Cipher, text: str) -> str:
    """``text`` encrypted, as text: :data:`TEXT_PREFIX` and the envelope's base64."""
    envelope = cipher.encrypt(text.encode("utf-8", "surrogatepass"))
    return TEXT_PREFIX + _base64()[1](envelope).decode("ascii")


@functools.cache
def _base64() -> tuple[Callable[[Any], bytes], Callable[[bytes], bytes]]:
    """pybase64's decoder and encoder (SIMD; ``perdure[crypto]`` brings it), else the
    standard library's; imported on first use. The decoder does not validate: the
    hash chain and the GCM tag vouch for what it reads."""
    try:
        import pybase64
    except ImportError:
        return binascii.a2b_base64, base64.b64encode
    return pybase64.b64decode, pybase64.b64encode


def is_sealed_text(text: str | bytes) -> bool:
    """Whether ``text`` is :func:`seal_text` output (starts with its marker)."""
    if isinstance(text, bytes):
        return text.startswith(_TEXT_PREFIX_BYTES)
    return text.startswith(TEXT_PREFIX)


_TEXT_PREFIX_BYTES = TEXT_PREFIX.encode("ascii")


def text_envelope(text: str | bytes) -> bytes:
    """The envelope inside :func:`seal_text` output.

    Raises:
        DecryptionError: ``text`` is not sealed text.
    """
    if not is_sealed_text(text):
        raise DecryptionError(
            "the stored record is not encrypted, and this store was given a cipher",
            details={"reason": "not_encrypted"},
        )
    try:
        return base64.b64decode(text[len(TEXT_PREFIX) :], validate=True)
    except (binascii.Error, ValueError):
        raise DecryptionError(
            "the encrypted record's base64 is damaged", details={"reason": "bad_encoding"}
        ) from None


def open_text(cipher: Cipher | None, text: str | bytes) -> str:
    """The plaintext of :func:`seal_text` output.

    Raises:
        DecryptionError: no ``cipher`` was given for sealed text, ``text`` is not
            sealed, or its envelope does not decrypt.
    """
    plain = open_utf8(cipher, text)
    try:
        return plain.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        raise DecryptionError(
            "the decrypted record is not UTF-8 text", details={"reason": "bad_plaintext"}
        ) from None


def open_utf8(cipher: Cipher | None, text: str | bytes) -> bytes:
    """The plaintext of :func:`seal_text` output as the bytes that were sealed (UTF-8).

    Raises:
        DecryptionError: as :func:`open_text`.
    """
    if cipher is None:
        raise DecryptionError(
            "the stored record is encrypted and no cipher was given: pass cipher= "
            f"with key {_key_id_or_unknown(text)!r}",
            details={"reason": "no_cipher", "key_id": _key_id_or_unknown(text)},
        )
    return cipher.decrypt(text_envelope(text))


def check_cipher(cipher: Any) -> Cipher | None:
    """``cipher`` checked: ``None`` or a :class:`~perdure.crypto.Cipher`.

    Raises:
        TypeError: anything else (named ``cipher``).
    """
    if cipher is not None and not isinstance(cipher, Cipher):
        raise TypeError(
            f"cipher must be a perdure.crypto.Cipher (e.g. AESGCMCipher) or None, "
            f"got {type(cipher).__name__}"
        )
    return cipher


def seal(cipher: Cipher | None, text: str) -> str:
    """``text`` as stored: sealed with ``cipher`` when there is one, else unchanged."""
    return text if cipher is None else seal_text(cipher, text)


def unseal(cipher: Cipher | None, text: Any) -> Any:
    """The plain text of a stored ``text`` (``str`` or UTF-8 ``bytes``).

    Text that is not sealed comes back unchanged, whatever ``cipher`` is (a store
    that turned encryption on later still reads its older rows).

    Raises:
        DecryptionError: sealed text with no cipher, a key the cipher does not hold,
            or a ciphertext that does not authenticate.
    """
    if type(text) is str:
        return open_text(cipher, text) if is_sealed_text(text) else text
    if type(text) is bytes and is_sealed_text(text):
        return open_utf8(cipher, text)  # bytes in, bytes out: a batch stays of one kind
    return text


def unseal_all(cipher: Cipher | None, texts: list[Any]) -> list[Any]:
    """:func:`unseal` of each of ``texts`` (a no-op without a cipher: plain text
    cannot be told from sealed there until it fails to parse)."""
    if cipher is None:
        return texts
    if isinstance(cipher, AESGCMCipher):
        opened = cipher.open_texts(texts)
        if opened is not None:
            return opened
    return [unseal(cipher, text) for text in texts]


def _key_id_or_unknown(text: str | bytes) -> str:
    try:
        return envelope_key_id(text_envelope(text))
    except DecryptionError:
        return "?"


class AESGCMCipher:
    """AES-256-GCM with named keys: ``AESGCMCipher(keys={"k1": key}, active="k1")``.

    Each :meth:`encrypt` draws a fresh random 96-bit nonce (``os.urandom``) and
    writes the active key's id in the envelope; :meth:`decrypt` uses the key the
    envelope names, so records under an older key keep reading after ``active``
    moves on (``perdure rotate-keys`` re-encrypts them). Needs ``perdure[crypto]``.

    Raises (constructor):
        ValueError: no keys, a key id that is not 1-64 of ``[A-Za-z0-9_.-]``, a key
            that is not 32 bytes, or ``active`` not among ``keys`` (the message names
            which).
        TypeError: ``keys`` is not a mapping, or a key is not bytes.
        ImportError: ``cryptography`` is not installed (``pip install 'perdure[crypto]'``).
    """

    def __init__(self, keys: Mapping[str, bytes], active: str) -> None:
        if not isinstance(keys, Mapping):
            raise TypeError(f"keys must be a mapping of key id to bytes, got {type(keys).__name__}")
        if not keys:
            raise ValueError("keys must hold at least one key")
        checked: dict[str, bytes] = {}
        for key_id, key in keys.items():
            _check_key_id(key_id, "a key id in keys")
            if not isinstance(key, bytes | bytearray):
                raise TypeError(f"keys[{key_id!r}] must be bytes, got {type(key).__name__}")
            if len(key) != KEY_LEN:
                raise ValueError(
                    f"keys[{key_id!r}] must be {KEY_LEN} bytes (AES-256), got {len(key)}"
                )
            checked[key_id] = bytes(key)
        _check_key_id(active, "active")
        if active not in checked:
            raise ValueError(f"active key {active!r} is not in keys ({sorted(checked)})")
        try:
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM
        except ImportError as exc:  # pragma: no cover - the extra is installed in dev
            raise ImportError(
                "AESGCMCipher needs the cryptography package: pip install 'perdure[crypto]'"
            ) from exc
        self._aead = {key_id: AESGCM(key) for key_id, key in checked.items()}
        self._headers = {key_id: _header(key_id) for key_id in checked}
        self._by_header = {self._headers[key_id]: aead for key_id, aead in self._aead.items()}
        # A separate key for fingerprints: the AES key is never used for two things.
        self._macs = {
            key_id: hmac.new(key, b"perdure fingerprint key", hashlib.sha256).digest()
            for key_id, key in checked.items()
        }
        self._active = active

    @property
    def active(self) -> str:
        """The id of the key new records are encrypted with."""
        return self._active

    @property
    def key_ids(self) -> frozenset[str]:
        """The ids of every key this cipher can decrypt with."""
        return frozenset(self._aead)

    def __repr__(self) -> str:  # never the keys
        return f"AESGCMCipher(keys={sorted(self._aead)}, active={self._active!r})"

    def with_active(self, active: str) -> AESGCMCipher:
        """The same keys, encrypting with ``active`` (for a rotation).

        Raises:
            ValueError: ``active`` is not one of the keys.
        """
        if active not in self._aead:
            raise ValueError(f"active key {active!r} is not in keys ({sorted(self._aead)})")
        clone = object.__new__(AESGCMCipher)
        clone._aead = self._aead
        clone._headers = self._headers
        clone._by_header = self._by_header
        clone._macs = self._macs
        clone._active = active
        return clone

    def encrypt(self, plaintext: bytes) -> bytes:
        """An envelope of ``plaintext`` under the active key, with a fresh nonce."""
        header = self._headers[self._active]
        nonce = os.urandom(_NONCE_LEN)
        return header + nonce + self._aead[self._active].encrypt(nonce, plaintext, header)

    def open_texts(self, texts: list[Any]) -> list[Any] | None:
        """:func:`unseal` of each of ``texts`` in one tight loop (the hot path of a
        long resume); ``None`` at the first doubt, for the one-by-one path to name it.

        Plain texts pass unchanged; ``str`` comes back as ``str``, ``bytes`` as
        ``bytes``.
        """
        from cryptography.exceptions import InvalidTag

        if not texts:
            return []
        a2b = _base64()[0]
        by_header = self._by_header
        as_str = type(texts[0]) is str
        prefix = TEXT_PREFIX if as_str else _TEXT_PREFIX_BYTES
        cut = len(TEXT_PREFIX)
        out: list[Any] = []
        append = out.append
        # One key writes most records: its header is looked up once, not per record.
        header, size, aead = b"", 0, None
        try:
            for text in texts:  # a str among bytes (or back) raises: the slow path sorts it
                if not text.startswith(prefix):
                    append(text)
                    continue
                envelope = a2b(text[cut:])
                if not envelope.startswith(header) or aead is None:
                    size = 5 + envelope[4]
                    header = envelope[:size]
                    aead = by_header.get(header)
                    if aead is None:
                        return None
                plain = aead.decrypt(envelope[size : size + 12], envelope[size + 12 :], header)
                append(plain.decode("utf-8", "surrogatepass") if as_str else plain)
        except (InvalidTag, binascii.Error, TypeError, ValueError, IndexError):
            return None
        return out

    def fingerprint(self, data: bytes) -> str:
        """HMAC-SHA256 of ``data`` under a key derived from the active key (hex)."""
        return hmac.new(self._macs[self._active], data, hashlib.sha256).hexdigest()

    def decrypt(self, envelope: bytes) -> bytes:
        """The plaintext of ``envelope`` (see :meth:`Cipher.decrypt`).

        Raises:
            DecryptionError: ``details["reason"]`` is ``"unknown_key"`` (the key id
                is not among this cipher's keys; ``details["key_id"]`` names it),
                ``"authentication_failed"`` (a wrong key or altered bytes),
                ``"not_encrypted"``, ``"truncated"`` or ``"bad_header"``.
        """
        from cryptography.exceptions import InvalidTag

        key_id, header, nonce, sealed = _split(envelope)
        aead = self._aead.get(key_id)
        if aead is None:
            raise DecryptionError(
                f"the record was encrypted with key {key_id!r}, which this cipher does not "
                f"hold (it holds {sorted(self._aead)})",
                details={"reason": "unknown_key", "key_id": key_id},
            )
        try:
            return aead.decrypt(nonce, sealed, header)
        except InvalidTag:
            raise DecryptionError(
                f"the record does not decrypt under key {key_id!r}: a wrong key, or the "
                "bytes were altered",
                details={"reason": "authentication_failed", "key_id": key_id},
            ) from None


# ---------------------------------------------------------------- keys from outside


def load_keys(text: str, where: str) -> tuple[dict[str, bytes], str | None]:
    """Keys from their JSON form: ``{"keys": {"k1": "<base64 of 32 bytes>", …}, "active": "k1"}``.

    ``active`` may be left out (``None`` comes back). ``where`` names the source in
    errors.

    Raises:
        ValueError: not that JSON, or a key that is not base64 of 32 bytes.
    """
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{where} is not JSON: {exc}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("keys"), dict):
        raise ValueError(f'{where} must be a JSON object {{"keys": {{id: base64}}, "active": id}}')
    keys: dict[str, bytes] = {}
    for key_id, encoded in raw["keys"].items():
        _check_key_id(key_id, f"a key id in {where}")
        try:
            key = base64.b64decode(str(encoded), validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(f"{where}: key {key_id!r} is not base64") from None
        if len(key) != KEY_LEN:
            raise ValueError(f"{where}: key {key_id!r} must be {KEY_LEN} bytes, got {len(key)}")
        keys[key_id] = key
    active = raw.get("active")
    if active is not None and not isinstance(active, str):
        raise ValueError(f"{where}: active must be a key id string")
    return keys, active


def keys_from_file(path: str | os.PathLike[str]) -> tuple[dict[str, bytes], str | None]:
    """:func:`load_keys` of a key file."""
    return load_keys(Path(path).read_text(encoding="utf-8"), f"key file {os.fspath(path)!r}")


def keys_from_env(
    environ: Mapping[str, str] | None = None,
) -> tuple[dict[str, bytes], str | None] | None:
    """Keys from ``PERDURE_KEYS`` (the JSON itself) or ``PERDURE_KEYS_FILE`` (a path).

    ``None`` when neither is set.
    """
    env = os.environ if environ is None else environ
    if env.get("PERDURE_KEYS"):
        return load_keys(env["PERDURE_KEYS"], "PERDURE_KEYS")
    if env.get("PERDURE_KEYS_FILE"):
        return keys_from_file(env["PERDURE_KEYS_FILE"])
    return None
