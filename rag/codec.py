"""Encodings the index backends share: dates as epoch microseconds, and compact JSON.

Every backend stores ``published`` and ``modified`` as integer microseconds since the Unix
epoch, so that a date range filter is an integer range and a date comes back exact to the
microsecond. A naive ``datetime`` is taken to be UTC; decoded dates are always UTC-aware.

Example::

    micros(datetime(2024, 1, 1, tzinfo=UTC))    # 1704067200000000
    from_micros(1704067200000000)               # datetime(2024, 1, 1, tzinfo=UTC)
    opt_micros(None)                            # None
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

__all__ = ["compact_json", "from_micros", "micros", "opt_micros"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)

compact_json = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
"""JSON text without spaces or ``\\u`` escapes of non-ASCII characters."""


def micros(value: datetime) -> int:
    """Microseconds since the epoch (a naive ``value`` is UTC)."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return (value - _EPOCH) // _US


def opt_micros(value: datetime | None) -> int | None:
    """:func:`micros`, passing ``None`` through."""
    return None if value is None else micros(value)


def from_micros(value: int | None) -> datetime | None:
    """The UTC datetime of epoch microseconds, passing ``None`` through."""
    return None if value is None else _EPOCH + timedelta(microseconds=int(value))
