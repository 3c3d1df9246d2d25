"""Document sources: folders, web sites, sitemaps and feeds behind one small contract.

Example::

    from ingest.sources import open_source
    source = open_source(settings.source("pydocs"), settings.crawl)
    for item in source.crawl(known={}, conditional=False):
        ...
    if source.complete:
        ...  # safe to delete what was not seen
"""

from __future__ import annotations

from ingest.sources.base import Fetched, Source, Validator
from ingest.sources.feed import FeedSource
from ingest.sources.folder import FolderSource
from ingest.sources.sitemap import SitemapSource
from ingest.sources.web import SiteSource
from rag.config import CrawlSettings, SourceConfig
from rag.errors import ConfigError

__all__ = ["open_source", "Fetched", "Source", "Validator",
           "FolderSource", "SiteSource", "SitemapSource", "FeedSource"]

_KINDS = {"folder": FolderSource, "site": SiteSource, "sitemap": SitemapSource, "feed": FeedSource}


def open_source(cfg: SourceConfig, crawl: CrawlSettings) -> Source:
    """The source for ``cfg.kind``; makes no network or disk access.

    Raises ``ConfigError`` for an unknown kind or a location that kind cannot crawl.
    """
    cls = _KINDS.get(cfg.kind)
    if cls is None:
        raise ConfigError(f"source {cfg.name!r}: unknown kind {cfg.kind!r}")
    try:
        return cls(cfg, crawl)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
