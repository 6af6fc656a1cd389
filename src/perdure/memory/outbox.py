"""ExtractionOutbox: the durable buffer of messages waiting to be distilled into memories.

A message is written (and fsynced) before the agent goes on, and deleted only after
its extraction was accepted by the store: a process killed in between leaves it
here, and the next process to open the outbox extracts it again (at least once).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from perdure._runtime.threads import ProcessLock
from perdure.crypto import Cipher, check_cipher, seal, unseal
from perdure.memory._sqlite import SQLiteConnection, stored_json, write_transaction
from perdure.types import Message, decode_bytes_values, encode_bytes_values
from perdure.types.json import compact_json_bytes

__all__ = ["ExtractionOutbox"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS perdure_extraction_outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    channel TEXT NOT NULL,
    message TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS perdure_extraction_outbox_channel
    ON perdure_extraction_outbox (channel, id);
"""


class ExtractionOutbox:
    """Buffered messages of one channel (a store, and its namespace) in a SQLite file.

    Rows are claimed by a running extraction inside this process only (claims are
    not persisted): after a crash every row is unclaimed again and is extracted by
    the next process.

    Args:
        path: the SQLite file, or ``":memory:"`` for a buffer that a crash loses.
        channel: whose messages these are; several channels may share one file.
        cipher: a :class:`~perdure.crypto.Cipher`: messages are buffered encrypted
            (the :class:`~perdure.memory.MemoryManager` passes its store's).
    """

    def __init__(self, path: Path | str, channel: str, *, cipher: Cipher | None = None) -> None:
        self.cipher = check_cipher(cipher)
        if not isinstance(channel, str) or not channel:
            raise ValueError(f"channel must be a non-empty str, got {channel!r}")
        self.path = path
        self.channel = channel
        self._db = SQLiteConnection(path, _SCHEMA, "extraction outbox")
        self._claims_lock = ProcessLock()
        self._claimed: set[int] = set()

    async def append(self, message: Message) -> int:
        """Store ``message`` durably; return how many unclaimed messages are buffered."""
        # A lone surrogate (text decoded with surrogateescape) is \u-escaped: SQLite
        # stores UTF-8 only.
        payload = seal(
            self.cipher, compact_json_bytes(encode_bytes_values(message)).decode("utf-8")
        )

        def work(conn: sqlite3.Connection) -> int:
            def insert() -> int:
                conn.execute(
                    "INSERT INTO perdure_extraction_outbox (channel, message, created_at) "
                    "VALUES (?, ?, ?)",
                    (self.channel, payload, time.time()),
                )
                row = conn.execute(
                    "SELECT count(*) FROM perdure_extraction_outbox WHERE channel = ?",
                    (self.channel,),
                ).fetchone()
                return int(row[0])

            total = write_transaction(conn, insert)
            with self._claims_lock:
                return total - len(self._claimed)

        return await self._db.run(work, "buffering a message")

    async def claim(self, limit: int) -> list[tuple[int, Message]]:
        """Claim up to ``limit`` unclaimed messages, oldest first."""

        def work(conn: sqlite3.Connection) -> list[tuple[int, Message]]:
            with self._claims_lock:
                skip = len(self._claimed)  # at most this many rows are already claimed
            rows = conn.execute(
                "SELECT id, message FROM perdure_extraction_outbox WHERE channel = ? "
                "ORDER BY id LIMIT ?",
                (self.channel, limit + skip),
            ).fetchall()
            claimed: list[tuple[int, Message]] = []
            with self._claims_lock:
                for row_id, payload in rows:
                    if row_id in self._claimed:
                        continue
                    stored = stored_json(unseal(self.cipher, payload), f"buffered message {row_id}")
                    message: Any = decode_bytes_values(stored)
                    claimed.append((row_id, message))
                    self._claimed.add(row_id)
                    if len(claimed) >= limit:
                        break
            return claimed

        return await self._db.run(work, "claiming buffered messages")

    async def ack(self, ids: Sequence[int]) -> None:
        """Delete messages whose extraction the store accepted (durably)."""

        def work(conn: sqlite3.Connection) -> None:
            write_transaction(
                conn,
                lambda: conn.executemany(
                    "DELETE FROM perdure_extraction_outbox WHERE id = ?", [(i,) for i in ids]
                ),
            )
            with self._claims_lock:
                self._claimed.difference_update(ids)

        await self._db.run(work, "acknowledging extracted messages")

    def release(self, ids: Sequence[int]) -> None:
        """Give claimed messages back (their extraction failed); they stay buffered."""
        with self._claims_lock:
            self._claimed.difference_update(ids)

    async def pending(self) -> int:
        """How many messages of this channel are buffered (claimed or not)."""

        def work(conn: sqlite3.Connection) -> int:
            row = conn.execute(
                "SELECT count(*) FROM perdure_extraction_outbox WHERE channel = ?",
                (self.channel,),
            ).fetchone()
            return int(row[0])

        return await self._db.run(work, "counting buffered messages")

    def close(self) -> None:
        """Close the file (idempotent)."""
        self._db.close()
