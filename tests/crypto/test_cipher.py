"""AESGCMCipher, the envelope and the key sources (SPEC §9, encryption at rest)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crypto_keys import K1, K2, cipher
from perdure.crypto import (
    AESGCMCipher,
    Cipher,
    envelope_key_id,
    is_sealed_text,
    keys_from_env,
    keys_from_file,
    open_text,
    seal_text,
)
from perdure.errors import DecryptionError, PerdureError


def test_round_trip_with_a_fresh_nonce_and_the_key_id_beside_each_record() -> None:
    c = cipher()
    first, second = c.encrypt(b"hello"), c.encrypt(b"hello")
    assert first != second  # a fresh nonce each time
    assert first[:3] == b"PDE"
    assert envelope_key_id(first) == "k1"
    assert b"hello" not in first
    assert c.decrypt(first) == c.decrypt(second) == b"hello"
    assert isinstance(c, Cipher)
    # 3 magic + version + length + "k1" + 12 nonce + 5 text + 16 tag
    assert len(first) == 5 + 2 + 12 + 5 + 16


def test_old_keys_still_decrypt_after_the_active_key_moves() -> None:
    old = cipher("k1").encrypt(b"before rotation")
    rotated = cipher("k2")
    assert rotated.decrypt(old) == b"before rotation"
    assert envelope_key_id(rotated.encrypt(b"x")) == "k2"
    assert envelope_key_id(cipher().with_active("k2").encrypt(b"x")) == "k2"


def test_a_wrong_missing_or_altered_key_is_decryption_error_never_garbage() -> None:
    envelope = cipher().encrypt(b"secret")
    with pytest.raises(DecryptionError) as unknown:
        AESGCMCipher(keys={"k2": K2}, active="k2").decrypt(envelope)
    assert unknown.value.code == "decryption"
    assert unknown.value.details == {"reason": "unknown_key", "key_id": "k1"}
    assert isinstance(unknown.value, PerdureError)
    with pytest.raises(DecryptionError) as wrong:
        AESGCMCipher(keys={"k1": K2}, active="k1").decrypt(envelope)
    assert wrong.value.details["reason"] == "authentication_failed"
    altered = bytearray(envelope)
    altered[-1] ^= 1
    with pytest.raises(DecryptionError):
        cipher().decrypt(bytes(altered))
    # The key id is authenticated too: relabelling k1's record as k2's fails.
    relabelled = envelope.replace(b"k1", b"k2", 1)
    with pytest.raises(DecryptionError):
        cipher().decrypt(relabelled)
    with pytest.raises(DecryptionError) as plain:
        cipher().decrypt(b'{"role":"user"}')
    assert plain.value.details["reason"] == "not_encrypted"
    with pytest.raises(DecryptionError) as short:
        cipher().decrypt(envelope[:20])
    assert short.value.details["reason"] == "truncated"


def test_keys_are_checked_with_errors_that_name_the_problem() -> None:
    with pytest.raises(ValueError, match=r"keys\['k1'\] must be 32 bytes"):
        AESGCMCipher(keys={"k1": b"short"}, active="k1")
    with pytest.raises(ValueError, match="active key 'k9' is not in keys"):
        AESGCMCipher(keys={"k1": K1}, active="k9")
    with pytest.raises(ValueError, match="at least one key"):
        AESGCMCipher(keys={}, active="k1")
    with pytest.raises(ValueError, match="key id"):
        AESGCMCipher(keys={"bad id!": K1}, active="bad id!")
    with pytest.raises(TypeError, match=r"keys\['k1'\] must be bytes"):
        AESGCMCipher(keys={"k1": "x" * 32}, active="k1")  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="keys must be a mapping"):
        AESGCMCipher(keys=[("k1", K1)], active="k1")  # type: ignore[arg-type]
    assert repr(cipher()) == "AESGCMCipher(keys=['k1', 'k2'], active='k1')"


def test_sealed_text_hides_the_text_and_says_what_is_missing() -> None:
    sealed = seal_text(cipher(), "mail alice@example.com")
    assert is_sealed_text(sealed)
    assert is_sealed_text(sealed.encode())
    assert "alice" not in sealed
    assert open_text(cipher(), sealed) == "mail alice@example.com"
    assert open_text(cipher(), sealed.encode()) == "mail alice@example.com"
    with pytest.raises(DecryptionError) as none:
        open_text(None, sealed)
    assert none.value.details == {"reason": "no_cipher", "key_id": "k1"}
    with pytest.raises(DecryptionError, match="not encrypted"):
        open_text(cipher(), '{"role":"user"}')
    with pytest.raises(DecryptionError, match="base64"):
        open_text(cipher(), "~pd1~!!!")


def test_keys_from_a_file_or_the_environment(tmp_path: Path) -> None:
    doc = json.dumps(
        {
            "keys": {"k1": base64.b64encode(K1).decode(), "k2": base64.b64encode(K2).decode()},
            "active": "k2",
        }
    )
    path = tmp_path / "keys.json"
    path.write_text(doc)
    assert keys_from_file(path) == ({"k1": K1, "k2": K2}, "k2")
    assert keys_from_env({"PERDURE_KEYS": doc}) == ({"k1": K1, "k2": K2}, "k2")
    assert keys_from_env({"PERDURE_KEYS_FILE": str(path)}) == ({"k1": K1, "k2": K2}, "k2")
    assert keys_from_env({}) is None
    with pytest.raises(ValueError, match="must be 32 bytes"):
        keys_from_env({"PERDURE_KEYS": json.dumps({"keys": {"k1": "AAAA"}})})
    with pytest.raises(ValueError, match="not JSON"):
        keys_from_env({"PERDURE_KEYS": "k1=abc"})


def test_fingerprints_are_keyed() -> None:
    assert cipher().fingerprint(b"x") == cipher().fingerprint(b"x")
    assert cipher().fingerprint(b"x") != cipher().fingerprint(b"y")
    assert cipher("k1").fingerprint(b"x") != cipher("k2").fingerprint(b"x")
    import hashlib

    assert cipher().fingerprint(b"x") != hashlib.sha256(b"x").hexdigest()


def test_a_batch_opens_in_one_pass_and_any_doubt_is_named_one_by_one() -> None:
    from perdure.crypto import unseal_all

    c = cipher("k1")
    texts = [seal_text(c, f"m{i}") for i in range(5)]
    assert unseal_all(c, texts) == [f"m{i}" for i in range(5)]
    assert unseal_all(c, [t.encode() for t in texts]) == [f"m{i}".encode() for i in range(5)]
    # Plain texts (written before encryption) pass; types are kept, mixed or not.
    assert unseal_all(c, ["plain", texts[0], b"raw", texts[1].encode()]) == [
        "plain", "m0", b"raw", b"m1",
    ]  # fmt: skip
    # Records under several keys (mid-rotation) open together.
    assert unseal_all(c, [texts[0], seal_text(cipher("k2"), "new")]) == ["m0", "new"]
    assert unseal_all(None, texts) == texts  # no cipher: left for the parser to refuse
    with pytest.raises(DecryptionError) as unknown:
        unseal_all(AESGCMCipher(keys={"k2": K2}, active="k2"), texts)
    assert unknown.value.details["reason"] == "unknown_key"
    altered = texts[3][:-6] + ("A" if texts[3][-6] != "A" else "B") + texts[3][-5:]
    with pytest.raises(DecryptionError) as bad:
        unseal_all(c, [*texts[:3], altered])
    assert bad.value.details["reason"] == "authentication_failed"


@given(text=st.text(), key_id=st.from_regex(r"[A-Za-z0-9_.-]{1,64}", fullmatch=True))
@settings(max_examples=200)
def test_any_text_round_trips_under_any_key_id(text: str, key_id: str) -> None:
    c = AESGCMCipher(keys={key_id: K1}, active=key_id)
    sealed = seal_text(c, text)
    assert is_sealed_text(sealed)
    assert sealed.isascii()
    assert open_text(c, sealed) == text
    assert envelope_key_id(base64.b64decode(sealed[5:])) == key_id
