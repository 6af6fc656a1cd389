"""ULIDs: 128-bit ids that sort by creation time, in Crockford base32 (pure module).

A ULID is 26 characters: 10 for a 48-bit Unix time in milliseconds, then 16 for 80
random bits, in the alphabet ``0123456789ABCDEFGHJKMNPQRSTVWXYZ``. The canonical,
upper-case form sorts as a string in time order.

:class:`MonotonicUlid` makes ids that strictly increase even within one millisecond
(the random part of the previous id plus one) and even if the clock steps back, and
can be told about ids made elsewhere (:meth:`MonotonicUlid.observe`) so that its next
id sorts after them too.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable

from perdure._runtime.threads import ProcessLock

__all__ = [
    "ULID_ALPHABET",
    "MonotonicUlid",
    "decode_ulid",
    "encode_ulid",
    "is_ulid",
    "new_ulid",
    "ulid_timestamp_ms",
]

ULID_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_VALUES = {char: value for value, char in enumerate(ULID_ALPHABET)}
_TIME_MAX = (1 << 48) - 1
_RANDOM_BITS = 80
_RANDOM_MAX = (1 << _RANDOM_BITS) - 1


def encode_ulid(timestamp_ms: int, randomness: int) -> str:
    """Return the canonical ULID of a millisecond timestamp and 80 random bits.

    Raises:
        ValueError: ``timestamp_ms`` is outside 48 bits or ``randomness`` outside 80.
    """
    if not 0 <= timestamp_ms <= _TIME_MAX:
        raise ValueError(f"timestamp_ms must fit in 48 bits, got {timestamp_ms}")
    if not 0 <= randomness <= _RANDOM_MAX:
        raise ValueError(f"randomness must fit in 80 bits, got {randomness}")
    value = (timestamp_ms << _RANDOM_BITS) | randomness
    chars = []
    for _ in range(26):
        chars.append(ULID_ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(chars))


def decode_ulid(text: str) -> tuple[int, int]:
    """Return ``(timestamp_ms, randomness)`` of a canonical ULID.

    Raises:
        ValueError: ``text`` is not 26 characters of the upper-case Crockford
            alphabet, or its first character is above ``7`` (more than 128 bits).
    """
    if not is_ulid(text):
        raise ValueError(f"{text!r} is not a ULID (26 upper-case Crockford base32 characters)")
    value = 0
    for char in text:
        value = (value << 5) | _VALUES[char]
    return value >> _RANDOM_BITS, value & _RANDOM_MAX


def is_ulid(text: object) -> bool:
    """True when ``text`` is a canonical (upper-case, 26-character, ≤ 128-bit) ULID."""
    return (
        isinstance(text, str)
        and len(text) == 26
        and text[0] in "01234567"
        and all(char in _VALUES for char in text)
    )


def ulid_timestamp_ms(text: str) -> int:
    """Return the Unix time in milliseconds a ULID was made at.

    Raises:
        ValueError: ``text`` is not a ULID.
    """
    return decode_ulid(text)[0]


class MonotonicUlid:
    """A thread-safe maker of strictly increasing ULIDs.

    Args:
        clock_ms: Returns the current Unix time in milliseconds (for tests).
        random_bits: Returns ``n`` random bits as an int (for tests).
    """

    def __init__(
        self,
        clock_ms: Callable[[], int] | None = None,
        random_bits: Callable[[int], int] | None = None,
    ) -> None:
        self._clock_ms = clock_ms or (lambda: time.time_ns() // 1_000_000)
        self._random_bits = random_bits or secrets.randbits
        self._lock = ProcessLock()
        self._last: tuple[int, int] | None = None

    def observe(self, ulid: str) -> None:
        """Make every later id sort after ``ulid`` (an id made elsewhere).

        Raises:
            ValueError: ``ulid`` is not a ULID.
        """
        seen = decode_ulid(ulid)
        with self._lock:
            if self._last is None or seen > self._last:
                self._last = seen

    def new(self) -> str:
        """Return a ULID for now that sorts after every id made or observed before.

        Within one millisecond (or when the clock went back) the random part of the
        previous id is incremented; if it overflows, the timestamp moves on by 1 ms.
        """
        with self._lock:
            now = self._clock_ms()
            if self._last is None or now > self._last[0]:
                current = (now, self._random_bits(_RANDOM_BITS) & _RANDOM_MAX)
            else:
                timestamp, randomness = self._last
                current = (
                    (timestamp, randomness + 1)
                    if randomness < _RANDOM_MAX
                    else (timestamp + 1, self._random_bits(_RANDOM_BITS) & (_RANDOM_MAX >> 1))
                )
            self._last = current
            return encode_ulid(*current)


_DEFAULT = MonotonicUlid()


def new_ulid() -> str:
    """Return a new ULID from the process-wide monotonic maker."""
    return _DEFAULT.new()
