"""Memory hygiene: keep personal data out of what perdure writes (SPEC §9).

- :class:`PIIRedactor` finds emails, phone numbers, payment cards (Luhn-checked),
  IBANs (mod-97-checked) and IP addresses and replaces each with ``"[email]"``,
  ``"[phone]"``, ``"[card]"``, ``"[iban]"``, ``"[ip]"``; more kinds plug in as
  :class:`Detector` objects (:class:`PatternDetector` builds one from a regular
  expression).

- Persistence filters (:mod:`perdure.hygiene.filters`): ``filters=[...]`` on
  ``Session``, ``SnapshotSessionManager`` and ``MemoryManager`` map every message,
  agent state and memory entry about to be written to what is stored
  (:class:`PersistenceFilter`, :class:`PersistedItem`); a ``PIIRedactor`` is one.

Pure: no I/O, and nothing above ``types`` is imported.
"""

from perdure.hygiene.detectors import (
    BUILTIN_DETECTORS,
    Detector,
    PatternDetector,
    iban_is_valid,
    luhn_is_valid,
)
from perdure.hygiene.filters import (
    FilterChain,
    ItemKind,
    PersistedItem,
    PersistenceFilter,
    WriteTarget,
    check_filters,
)
from perdure.hygiene.redactor import DEFAULT_KINDS, PIIRedactor

__all__ = [
    "BUILTIN_DETECTORS",
    "DEFAULT_KINDS",
    "Detector",
    "FilterChain",
    "ItemKind",
    "PIIRedactor",
    "PatternDetector",
    "PersistedItem",
    "PersistenceFilter",
    "WriteTarget",
    "check_filters",
    "iban_is_valid",
    "luhn_is_valid",
]
