"""Text normalisation, content hashing, language and date helpers.

The text of a document is normalised before it is hashed, so that a page whose markup
or build-date footer changed, but whose words did not, keeps the same hash and is not
embedded again.

Example::

    from ingest.normalize import normalize_text, text_hash
    text = normalize_text("Hello\\xa0 world\\r\\n\\n\\n\\nLast updated on May 1.", patterns)
    assert text == "Hello world"
    h = text_hash("Greeting", text)
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Sequence
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from functools import lru_cache

from rag import text as rag_text

__all__ = ["normalize_text", "text_hash", "detect_lang", "parse_datetime", "collapse_spaces"]

# Line and paragraph separators that are not "\n": vertical tab, form feed, NEL, LS, PS.
_NEWLINES = re.compile(r"\r\n?|[\v\f\x85\u2028\u2029]")
# Every other kind of whitespace (tab, no-break, thin, ideographic, ...) becomes a space.
_ODD_SPACE = re.compile(r"[^\S\n ]")
# Invisible characters that change bytes but never meaning: zero-width space, word
# joiner, BOM, soft hyphen.
_INVISIBLE = re.compile(r"[\u200b\u2060\ufeff\u00ad]")
_INNER_SPACES = re.compile(r"(?<=\S) {2,}")
_TRAILING_SPACES = re.compile(r" +$", re.MULTILINE)
_BLANK_RUNS = re.compile(r"\n{3,}")


@lru_cache(maxsize=64)
def _compile(patterns: tuple[str, ...]) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(p) for p in patterns)


def collapse_spaces(text: str) -> str:
    """All whitespace runs, newlines included, become one space."""
    return " ".join(text.split())


def normalize_text(text: str, boilerplate_patterns: Sequence[str] = ()) -> str:
    """Return ``text`` in the canonical form that is stored, hashed and indexed.

    NFKC, ``\\n`` newlines, one space between words (leading indentation is kept, it
    carries meaning in code), no trailing spaces, no line matching a boilerplate regex,
    at most one blank line in a row, nothing around the whole.
    """
    text = unicodedata.normalize("NFKC", text)
    text = _NEWLINES.sub("\n", text)
    text = _INVISIBLE.sub("", text)
    text = _ODD_SPACE.sub(" ", text)
    text = _INNER_SPACES.sub(" ", text)
    text = _TRAILING_SPACES.sub("", text)
    if boilerplate_patterns:
        regexes = _compile(tuple(boilerplate_patterns))
        text = "\n".join(
            line for line in text.split("\n") if not any(r.search(line) for r in regexes)
        )
    text = _BLANK_RUNS.sub("\n\n", text)
    return text.strip()


def text_hash(title: str, text: str) -> str:
    """SHA-256 (hex) of ``title + "\\n" + text``; ``text`` is expected to be normalised."""
    return hashlib.sha256(f"{title}\n{text}".encode()).hexdigest()


def detect_lang(text: str) -> str:
    """``"zh"`` when more than a fifth of the letters are Chinese characters, else ``"en"``
    (:func:`rag.text.document_lang`).

    ``"und"`` for text without letters. Cheap and deterministic; a source that needs
    another language sets ``lang`` in its configuration.
    """
    return rag_text.document_lang(text)


def parse_datetime(value: str | None) -> datetime | None:
    """Parse an ISO 8601 or RFC 2822 date into an aware UTC datetime, or ``None``.

    Naive values are taken as UTC.
    """
    if not value:
        return None
    value = value.strip()
    parsed: datetime | None = None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        try:
            parsed = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)
