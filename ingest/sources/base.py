"""The contract every source implements, and the pieces the sources share.

A source turns its configuration into a stream of :class:`Fetched` results, one per
page or file: a new or changed :class:`~rag.types.Document`, a ``not_modified`` answer to a
conditional request, a page that is ``gone`` (404, 410, ``noindex``), or an ``error``.
After the stream ends, :attr:`Source.complete` says whether the source could be listed in
full; only then may the caller delete documents that were not seen.

Example::

    source = open_source(cfg, settings.crawl)
    for item in source.crawl(known={}, conditional=False):
        if item.status == "ok":
            print(item.document.id, item.document.title)
    assert source.complete
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal, Protocol, runtime_checkable

from ingest.extract import Extracted
from rag.config import SourceConfig
from rag.types import Document

__all__ = ["Fetched", "Validator", "Source", "Status", "build_document", "path_allowed", "utcnow"]

Status = Literal["ok", "not_modified", "gone", "error"]


@dataclass(frozen=True)
class Fetched:
    """The outcome for one URL of a crawl.

    ``last_modified`` is the raw ``Last-Modified`` header, or ``"<mtime_ns>:<size>"`` for
    a file; together with ``etag`` it is what the next run sends back as a
    :class:`Validator`.

    Example::

        Fetched(url="http://h/a.html", status="error", http_status=500,
                error="HTTP 500 from http://h/a.html after 4 attempts")
    """

    url: str
    status: Status
    document: Document | None = None
    etag: str | None = None
    last_modified: str | None = None
    error: str | None = None
    http_status: int | None = None
    error_kind: str | None = None  # FetchError.kind: what the crawl_errors_total metric counts


@dataclass(frozen=True)
class Validator:
    """What the last run learnt about a URL, for a conditional request.

    Example::

        known = {"http://h/a.html": Validator(etag='"abc"', last_modified=None)}
    """

    etag: str | None
    last_modified: str | None


@runtime_checkable
class Source(Protocol):
    """A place documents come from: a folder, a web site, a sitemap or a feed.

    Example::

        source: Source = open_source(cfg, crawl)
        results = list(source.crawl(known, conditional=True))
        may_delete = source.complete
    """

    def crawl(self, known: Mapping[str, Validator], conditional: bool) -> Iterator[Fetched]: ...

    @property
    def complete(self) -> bool: ...


def utcnow() -> datetime:
    return datetime.now(UTC)


def path_allowed(path: str, include: tuple[str, ...], exclude: tuple[str, ...]) -> bool:
    """Whether ``path`` matches one of ``include`` (when given) and none of ``exclude``.

    Patterns are shell globs (``*`` also crosses ``/``), matched case-sensitively.
    """
    if include and not any(fnmatch.fnmatchcase(path, p) for p in include):
        return False
    return not any(fnmatch.fnmatchcase(path, p) for p in exclude)


def build_document(cfg: SourceConfig, *, doc_id: str, url: str, page: Extracted,
                   modified: datetime | None = None) -> Document:
    """A :class:`Document` for one extracted page, with the source's trust, tags and tenant.

    ``modified`` (from the file or the HTTP header) is used when the page declares none.
    """
    return Document(
        id=doc_id,
        source=cfg.name,
        url=url,
        title=page.title,
        text=page.text,
        lang=cfg.lang or page.lang,
        published=page.published,
        modified=page.modified or modified,
        fetched_at=utcnow(),
        trust=cfg.trust,
        tags=tuple(cfg.tags),
        tenant=cfg.tenant,
    )
