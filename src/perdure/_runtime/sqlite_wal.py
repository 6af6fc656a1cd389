"""Find damage in a SQLite write-ahead log that SQLite itself would take for its end.

SQLite replays a ``-wal`` file frame by frame and stops at the first frame whose
salts or cumulative checksum do not match (https://sqlite.org/fileformat2.html#walformat):
for a log cut by a crash that is right, but one flipped byte in the middle makes it
silently drop every later commit. :func:`wal_damage` reads the log as SQLite would
and, where it stops, looks further: a *later, complete transaction* of the same
generation (frames carrying the header's salts, each checksum valid from the frame
before it, ending in a commit frame) proves that the frame SQLite stopped at was
written and then damaged, not torn. What it cannot tell apart from a torn tail:
damage in the last transaction of the log, a log cut at a frame boundary, a header
whose salts were damaged too.

Pure (bytes in, a description out), no perdure imports: layer 0.
"""

from __future__ import annotations

import functools
import struct
import sys
from array import array
from dataclasses import dataclass
from operator import mul

__all__ = ["WalDamage", "wal_checksum", "wal_damage"]

_HEADER = 32
_FRAME_HEADER = 24
_MAGIC = (0x377F0682, 0x377F0683)  # checksums in little- / big-endian words
_VERSION = 3007000
_MASK = 0xFFFFFFFF
_PAGE_SIZES = tuple(1 << n for n in range(9, 17))


@dataclass(frozen=True)
class WalDamage:
    """Where SQLite would stop reading the log, and the proof that it is damage.

    Attributes:
        frame: the first frame SQLite rejects (0-based; -1 for the header).
        offset: its byte offset in the ``-wal`` file.
        commits_after: complete transactions found after it, in the same generation.
        detail: a one-line description.
    """

    frame: int
    offset: int
    commits_after: int
    detail: str


def _words(data: bytes, big_endian: bool) -> array[int]:
    words = array("I")
    assert words.itemsize == 4
    words.frombytes(data)
    if big_endian != (sys.byteorder == "big"):
        words.byteswap()
    return words


def wal_checksum(data: bytes, big_endian: bool, s1: int = 0, s2: int = 0) -> tuple[int, int]:
    """SQLite's WAL checksum of ``data`` (a multiple of 8 bytes), continuing ``(s1, s2)``.

    The plain loop, as SQLite's ``walChecksumBytes`` writes it; :func:`wal_damage`
    uses an equivalent closed form that is ~20x faster in Python.
    """
    words = _words(data, big_endian)
    for i in range(0, len(words), 2):
        s1 = (s1 + words[i] + s2) & _MASK
        s2 = (s2 + words[i + 1] + s1) & _MASK
    return s1, s2


@functools.lru_cache(maxsize=8)
def _coefficients(steps: int) -> tuple[tuple[int, int, int, int], list[int], list[int]]:
    """The checksum over ``steps`` word pairs as a linear map, modulo 2**32.

    One step is ``v' = M v + (a, a + b)`` with ``M = [[1, 1], [1, 2]]``; after all
    of them ``s1 = m11*s1 + m12*s2 + sum(c1[j] * w[j])`` and likewise ``s2``.
    """
    # Walk backwards: the pair i is multiplied by M**(steps - 1 - i).
    c1 = [0] * (2 * steps)
    c2 = [0] * (2 * steps)
    p, q, r, t = 1, 0, 0, 1  # M**0
    for i in range(steps - 1, -1, -1):
        c1[2 * i], c1[2 * i + 1] = (p + q) & _MASK, q
        c2[2 * i], c2[2 * i + 1] = (r + t) & _MASK, t
        p, q, r, t = (p + r) & _MASK, (q + t) & _MASK, (p + 2 * r) & _MASK, (q + 2 * t) & _MASK
    return (p, q, r, t), c1, c2


def _frame_checksum(
    frame_head: bytes, page: bytes, big_endian: bool, s1: int, s2: int
) -> tuple[int, int]:
    (p, q, r, t), c1, c2 = _coefficients((8 + len(page)) // 8)
    words = _words(frame_head[:8] + page, big_endian)
    return (
        (p * s1 + q * s2 + sum(map(mul, c1, words))) & _MASK,
        (r * s1 + t * s2 + sum(map(mul, c2, words))) & _MASK,
    )


class _Log:
    def __init__(self, data: bytes, page_size: int, big_endian: bool, salts: bytes) -> None:
        self.data = data
        self.page_size = page_size
        self.big_endian = big_endian
        self.salts = salts
        self.size = _FRAME_HEADER + page_size
        self.frames = max(0, (len(data) - _HEADER) // self.size)

    def offset(self, index: int) -> int:
        return _HEADER + index * self.size

    def head(self, index: int) -> tuple[int, int, bytes, int, int]:
        at = self.offset(index)
        pgno, commit = struct.unpack_from(">II", self.data, at)
        s1, s2 = struct.unpack_from(">II", self.data, at + 16)
        return pgno, commit, self.data[at + 8 : at + 16], s1, s2

    def valid_after(self, index: int, s1: int, s2: int) -> bool:
        """Frame ``index`` is well-formed and its checksum continues ``(s1, s2)``."""
        at = self.offset(index)
        pgno, _, salts, c1, c2 = self.head(index)
        if pgno == 0 or salts != self.salts:
            return False
        page = self.data[at + _FRAME_HEADER : at + self.size]
        head = self.data[at : at + _FRAME_HEADER]
        return _frame_checksum(head, page, self.big_endian, s1, s2) == (c1, c2)

    def stored_checksum(self, index: int, header: tuple[int, int]) -> tuple[int, int]:
        """The checksum frame ``index`` continues: the stored one before it."""
        if index == 0:
            return header
        _, _, _, s1, s2 = self.head(index - 1)
        return s1, s2

    def commits_after(self, index: int, header: tuple[int, int]) -> int:
        """Complete transactions of this generation after the transaction of ``index``.

        The transaction holding frame ``index`` ends at the first commit frame from
        there (its own frames may have been written out of order before a power
        cut); a commit frame after that, valid from the frame before it, was
        written after that transaction was synced.
        """
        end = None
        for j in range(index, self.frames):
            _, commit, salts, _, _ = self.head(j)
            if salts == self.salts and commit != 0:
                end = j
                break
        if end is None:
            return 0
        count = 0
        for j in range(end + 1, self.frames):
            _, commit, salts, _, _ = self.head(j)
            if salts == self.salts and commit != 0:
                s1, s2 = self.stored_checksum(j, header)
                count += self.valid_after(j, s1, s2)
        return count


def wal_damage(data: bytes, accepted: int | None = None) -> WalDamage | None:
    """The damage in a ``-wal`` file's bytes that SQLite would silently roll back, if any.

    Returns None for a log SQLite reads to its end, and for one whose first bad
    frame may be a torn tail (nothing complete of the same generation follows it).

    Args:
        data: the ``-wal`` file's bytes.
        accepted: the frames SQLite accepted, when known (``PRAGMA wal_checkpoint``
            reports them): then only the frames after those are checked, which
            costs a few checksums instead of one per frame. (SQLite accepts the
            frames up to the last valid commit frame: the frames after it are
            checked up to the first bad one; a valid commit frame there was written
            after SQLite looked, by a writer still at work.)
    """
    if len(data) < _HEADER:
        return None
    magic, version, page_size, _, _, _, c1, c2 = struct.unpack_from(">8I", data)
    salts = data[16:24]
    header = (c1, c2)
    header_ok = (
        magic in _MAGIC
        and version == _VERSION
        and page_size in _PAGE_SIZES
        and wal_checksum(data[:24], magic == _MAGIC[1]) == header
    )
    if not header_ok:
        return _damaged_header(data, salts, header, page_size)
    log = _Log(data, page_size, magic == _MAGIC[1], salts)
    start = 0 if accepted is None else accepted
    if not 0 <= start < log.frames:
        return None
    s1, s2 = log.stored_checksum(start, header)
    for index in range(start, log.frames):
        if not log.valid_after(index, s1, s2):
            return _stopped_at(log, index, header)
        _, commit, _, s1, s2 = log.head(index)
        if commit and accepted is not None:
            # SQLite accepts frames up to a commit frame: one it did not accept but
            # that is valid was written after it looked.
            return None
    return None


def _stopped_at(log: _Log, index: int, header: tuple[int, int]) -> WalDamage | None:
    """SQLite stops at frame ``index``: damage if complete transactions follow it."""
    commits = log.commits_after(index, header)
    if commits == 0:
        return None  # a torn tail, or the end of this generation
    return WalDamage(
        index,
        log.offset(index),
        commits,
        f"WAL frame {index} (byte {log.offset(index)}) is damaged: SQLite stops there "
        f"and drops {commits} later committed transaction{'s' if commits > 1 else ''}",
    )


def _damaged_header(
    data: bytes, salts: bytes, header: tuple[int, int], page_size: int
) -> WalDamage | None:
    """A header SQLite rejects (it then ignores the whole log) in front of valid frames."""
    sizes = (page_size,) if page_size in _PAGE_SIZES else _PAGE_SIZES
    # The header's salts, or (when those are the damaged bytes) the first frame's.
    first_salts = data[_HEADER + 8 : _HEADER + 16]
    for size in sizes:
        for big_endian in (False, True):
            for candidate in dict.fromkeys((salts, first_salts)):
                log = _Log(data, size, big_endian, candidate)
                commits = log.commits_after(0, header)
                if commits:
                    break
            if commits:
                return WalDamage(
                    -1,
                    0,
                    commits,
                    f"the WAL header is damaged: SQLite ignores the log and drops {commits} "
                    f"committed transaction{'s' if commits > 1 else ''}",
                )
    return None
