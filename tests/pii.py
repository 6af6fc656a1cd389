"""Personal data for the hygiene tests, and the check that none of it was written.

``assert_nothing_leaked`` reads every byte under a directory (and every row of every
SQLite table in it) looking for the values, in clear, JSON-escaped and in base64 at
each alignment; ``assert_found`` proves the same search finds them where they are.
"""

from __future__ import annotations

import asyncio
import base64
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from perdure import tool

EMAIL = "alice.smith@example.com"
PHONE = "+44 20 7946 0958"
CARD = "4111 1111 1111 1111"
IBAN = "DE89 3704 0044 0532 0130 00"
SECRETS = [EMAIL, PHONE, CARD, IBAN]


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def _forms(value: str) -> set[bytes]:
    """The byte strings that would give ``value`` away: clear, compact, JSON, base64."""
    clear = {value, value.replace(" ", ""), value.replace(" ", "-")}
    forms = {v.encode() for v in clear} | {json.dumps(v)[1:-1].encode() for v in clear}
    for text in clear:
        raw = text.encode()
        for shift in range(3):
            # The part of the base64 of `raw` that does not depend on what surrounds
            # it, at each of the three alignments it can have inside a longer blob.
            encoded = base64.b64encode(b"\0" * shift + raw)
            start = (shift * 4 + 2) // 3 + 1
            end = len(encoded) - 4
            forms.add(encoded[start:end])
    return forms


FORBIDDEN = {secret: _forms(secret) for secret in SECRETS}


def files_under(root: Path) -> Iterator[Path]:
    yield from (path for path in sorted(root.rglob("*")) if path.is_file())


def sqlite_rows(path: Path) -> bytes:
    """Every row of every table of a SQLite file, as bytes."""
    connection = sqlite3.connect(path)
    try:
        out = []
        names = [
            n for (n,) in connection.execute("SELECT name FROM sqlite_master WHERE type='table'")
        ]
        for name in names:
            for row in connection.execute(f'SELECT * FROM "{name}"'):
                out.append(repr(row).encode())
                out.extend(v if isinstance(v, bytes) else str(v).encode() for v in row)
        return b"\n".join(out)
    finally:
        connection.close()


def assert_nothing_leaked(root: Path) -> int:
    """Read every byte under ``root`` (and every SQLite row); return how many files."""
    files = list(files_under(root))
    assert files
    for path in files:
        blobs = [path.read_bytes()]
        if blobs[0].startswith(b"SQLite format 3"):
            blobs.append(sqlite_rows(path))
        for blob in blobs:
            for secret, forms in FORBIDDEN.items():
                for form in forms:
                    assert form not in blob, f"{secret!r} ({form!r}) found in {path}"
    return len(files)


def assert_found(data: bytes, secret: str) -> None:
    """The detector above does find a secret where one is (it checks something)."""
    assert any(form in data for form in FORBIDDEN[secret])


@tool
def find_account(card: str) -> str:
    """Find the bank account paid with a card.

    Args:
        card: the card number.
    """
    return f"card {card} pays into IBAN {IBAN}; owner {EMAIL}"


def pii_script() -> list[Any]:
    return [
        {
            "role": "assistant",
            "content": [
                {"text": f"Let me look up {CARD}."},
                {"toolUse": {"toolUseId": "t1", "name": "find_account", "input": {"card": CARD}}},
            ],
        },
        f"Found it: {IBAN}. I will call you on {PHONE} or write to {EMAIL}.",
        "You are welcome.",
        f"The user {EMAIL} ({PHONE}) asked about card {CARD}.",  # the compaction's summary
    ]
