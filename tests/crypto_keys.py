"""Test keys and ciphers (fixed bytes: tests look for them nowhere but here)."""

from __future__ import annotations

from perdure.crypto import AESGCMCipher

K1 = bytes(range(32))
K2 = bytes(range(100, 132))


def cipher(active: str = "k1") -> AESGCMCipher:
    """A cipher holding k1 and k2, encrypting with ``active``."""
    return AESGCMCipher(keys={"k1": K1, "k2": K2}, active=active)
