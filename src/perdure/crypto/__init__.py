"""Encryption at rest (SPEC §9): ciphers that every store, storage and memory store takes.

- :class:`Cipher` is the protocol a store calls: ``encrypt(bytes) -> bytes`` gives a
  self-describing envelope (the key id travels inside it), ``decrypt`` gives the
  plaintext back or raises :class:`~perdure.errors.DecryptionError`.
- :class:`AESGCMCipher` is the built-in one (extra ``perdure[crypto]``, the
  ``cryptography`` package): AES-256-GCM, a fresh 96-bit nonce per record, several
  keys by id so records written under an old key still decrypt after rotation.
- :func:`seal_text` / :func:`open_text` are the text form of an envelope, for the
  stores that keep records as text (a ``~pd1~`` marker, then base64).

Sits with ``storage`` (SPEC §1): below everything that takes ``cipher=``.
"""

from perdure.crypto.cipher import (
    ENVELOPE_MAGIC,
    TEXT_PREFIX,
    AESGCMCipher,
    Cipher,
    check_cipher,
    envelope_key_id,
    is_envelope,
    is_sealed_text,
    keys_from_env,
    keys_from_file,
    load_keys,
    open_text,
    open_utf8,
    seal,
    seal_text,
    unseal,
    unseal_all,
)

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
