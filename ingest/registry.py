"""Turns what a user typed (a folder, a site, a sitemap or a feed URL) into a ``SourceConfig``.

Example::

    cfg = source_from_argument("https://docs.example.com/", name=None, trust="high")
    assert cfg.kind == "site" and cfg.name == "docs.example.com"
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

from rag.config import SourceConfig
from rag.errors import ConfigError
from rag.types import Trust

__all__ = ["source_from_argument", "guess_kind"]

_FEED_HINT = re.compile(r"(\.rss|\.atom|/feed/?|/rss/?|/atom/?|feed\.xml|rss\.xml|atom\.xml)$", re.I)
_SITEMAP_HINT = re.compile(r"sitemap[^/]*\.xml(\.gz)?$", re.I)


def guess_kind(location: str) -> str:
    parts = urlsplit(location)
    if parts.scheme in ("http", "https"):
        path = parts.path or "/"
        if _SITEMAP_HINT.search(path):
            return "sitemap"
        if _FEED_HINT.search(path):
            return "feed"
        return "site"
    if parts.scheme not in ("", "file"):
        raise ConfigError(f"unsupported source {location!r}: use a folder path or an http(s) URL")
    return "folder"


def _default_name(location: str, kind: str) -> str:
    if kind == "folder":
        base = Path(location.removeprefix("file://")).resolve().name or "files"
    else:
        parts = urlsplit(location)
        base = parts.hostname or "site"
        if parts.port:
            base += f"-{parts.port}"
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", base).strip("-.") or "source"
    return name[:64]


def source_from_argument(location: str, *, name: str | None = None, kind: str | None = None,
                         trust: str | Trust = Trust.normal, tags: tuple[str, ...] = (),
                         tenant: str | None = None) -> SourceConfig:
    """Build a validated source; raises ``ConfigError`` with one readable line."""
    kind = kind or guess_kind(location)
    if kind == "folder":
        path = Path(location.removeprefix("file://")).expanduser()
        if not path.is_dir():
            raise ConfigError(f"folder not found: {location}")
        location = str(path.resolve())
    try:
        return SourceConfig(
            name=name or _default_name(location, kind), kind=kind, location=location,
            trust=Trust.parse(trust), tags=tags, tenant=tenant,
        )
    except ValueError as exc:
        raise ConfigError(f"invalid source: {str(exc).splitlines()[0]}") from None
