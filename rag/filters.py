"""Build and check :class:`~rag.types.Filters`.

``parse_filters`` turns user input (a CLI option set, a JSON body) into a validated
``Filters``; ``matches`` is the reference semantics that every backend's own filter
language must agree with (the shared backend suite checks that).

Example::

    f = parse_filters({"source": "pydocs", "modified_from": "2024-01-01", "min_trust": "normal"})
    assert matches(chunk, f) is True
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, date, datetime
from typing import Any

from rag.errors import FilterError
from rag.types import Chunk, Filters, Trust

__all__ = ["parse_filters", "parse_datetime", "matches", "FILTER_FIELDS"]

FILTER_FIELDS = (
    "source",
    "tenant",
    "tags",
    "lang",
    "published_from",
    "published_to",
    "modified_from",
    "modified_to",
    "min_trust",
)


def parse_datetime(value: object, field: str = "date") -> datetime:
    """Parse an ISO date or datetime (or epoch seconds) into an aware UTC datetime."""
    if isinstance(value, datetime):
        dt = value
    elif isinstance(value, date):
        dt = datetime(value.year, value.month, value.day)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        try:
            dt = datetime.fromtimestamp(value, UTC)
        except (OverflowError, OSError, ValueError):  # past year 9999, or NaN
            raise FilterError(f"{field}: epoch seconds out of range: {value!r}") from None
    elif isinstance(value, str) and value.strip():
        text = value.strip().replace("Z", "+00:00")
        try:
            dt = datetime.fromisoformat(text)
        except ValueError:
            raise FilterError(f"{field}: not an ISO 8601 date or datetime: {value!r}") from None
    else:
        raise FilterError(f"{field}: expected a date, got {value!r}")
    try:
        return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt.astimezone(UTC)
    except OverflowError:  # an offset that pushes it past year 1 or 9999
        raise FilterError(f"{field}: out of range in UTC: {value!r}") from None


def _strings(value: object, field: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        items = [value]
    elif isinstance(value, list | tuple | set | frozenset):
        items = list(value)
    else:
        raise FilterError(f"{field}: expected a string or a list of strings, got {value!r}")
    out = []
    for item in items:
        if not isinstance(item, str) or not item.strip():
            raise FilterError(f"{field}: expected non-empty strings, got {item!r}")
        out.append(item.strip())
    return tuple(dict.fromkeys(out))


def parse_filters(data: Mapping[str, Any] | Filters | None) -> Filters:
    """Validate user-supplied filters. Raises ``FilterError`` naming the offending field."""
    if data is None:
        return Filters()
    if isinstance(data, Filters):
        _check_ranges(data)
        return data
    if not isinstance(data, Mapping):
        raise FilterError(f"filters must be an object, got {type(data).__name__}")
    unknown = sorted(set(data) - set(FILTER_FIELDS))
    if unknown:
        raise FilterError(
            f"unknown filter field {unknown[0]!r}; known fields: {', '.join(FILTER_FIELDS)}"
        )
    kwargs: dict[str, Any] = {}
    for key in ("source", "tags", "lang"):
        kwargs[key] = _strings(data.get(key), key)
    tenant = data.get("tenant")
    if tenant is not None:
        if not isinstance(tenant, str) or not tenant.strip():
            raise FilterError(f"tenant: expected a non-empty string, got {tenant!r}")
        kwargs["tenant"] = tenant.strip()
    for key in ("published_from", "published_to", "modified_from", "modified_to"):
        if data.get(key) not in (None, ""):
            kwargs[key] = parse_datetime(data[key], key)
    if data.get("min_trust") not in (None, ""):
        try:
            kwargs["min_trust"] = Trust.parse(data["min_trust"])
        except ValueError as exc:
            raise FilterError(f"min_trust: {exc}") from None
    filters = Filters(**kwargs)
    _check_ranges(filters)
    return filters


def _check_ranges(f: Filters) -> None:
    for name in ("published", "modified"):
        lo, hi = getattr(f, f"{name}_from"), getattr(f, f"{name}_to")
        if lo is not None and hi is not None and lo > hi:
            raise FilterError(f"{name}_from ({lo.isoformat()}) is after {name}_to ({hi.isoformat()})")


def matches(chunk: Chunk, f: Filters | None) -> bool:
    """The reference meaning of a filter: every set field must hold.

    A date range excludes chunks that have no such date; ``tags`` match if the chunk has
    any of them; ``source`` and ``lang`` match any of the listed values.
    """
    if f is None:
        return True
    if f.source and chunk.source not in f.source:
        return False
    if f.tenant is not None and chunk.tenant != f.tenant:
        return False
    if f.tags and not set(f.tags) & set(chunk.tags):
        return False
    if f.lang and chunk.lang not in f.lang:
        return False
    if f.min_trust is not None and chunk.trust < f.min_trust:
        return False
    for name in ("published", "modified"):
        lo, hi = getattr(f, f"{name}_from"), getattr(f, f"{name}_to")
        if lo is None and hi is None:
            continue
        value = getattr(chunk, name)
        if value is None or (lo is not None and value < lo) or (hi is not None and value > hi):
            return False
    return True
