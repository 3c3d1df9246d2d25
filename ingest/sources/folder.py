"""A folder of Markdown, text, HTML and PDF files, walked recursively.

Hidden files and folders (``.git``, ``.draft.md``) are skipped, and so are folder links,
which could loop. A file's validator is ``"<mtime_ns>:<size>"``: a conditional crawl
does not even open a file whose validator is unchanged.

Example::

    source = FolderSource(SourceConfig(name="handbook", kind="folder", location="/srv/handbook",
                                       exclude=("drafts/*",)), CrawlSettings())
    for item in source.crawl(known={}, conditional=False):
        print(item.status, item.document.id if item.document else item.url)
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import unquote, urlsplit

from ingest.extract import kind_for
from ingest.extract_pool import ExtractPool, Handle, Job
from ingest.sources.base import Fetched, Validator, build_document, path_allowed
from rag.config import CrawlSettings, SourceConfig
from rag.errors import FetchError, IngestError

__all__ = ["FolderSource", "FOLDER_EXTENSIONS"]

FOLDER_EXTENSIONS = frozenset({".md", ".markdown", ".txt", ".html", ".htm", ".pdf"})


class FolderSource:
    """Reads every supported file under ``cfg.location`` (a path or a ``file://`` URI).

    Document ids are ``"<source>:<relative/posix/path>"``; URLs are ``file://`` URIs.
    The crawl is complete when every folder could be listed and ``max_pages`` was not
    reached. A missing folder raises ``IngestError`` when the crawl starts.

    Example::

        folder = FolderSource(cfg, CrawlSettings(max_bytes=2_000_000))
        results = list(folder.crawl(known={}, conditional=True))
    """

    def __init__(self, cfg: SourceConfig, crawl: CrawlSettings) -> None:
        self.cfg = cfg
        self.settings = crawl
        location = cfg.location
        if location.startswith("file:"):
            location = unquote(urlsplit(location).path)
        self.root = Path(location).expanduser().absolute()
        self._complete = False
        self.planned: int | None = None  # files this crawl will read, once listed
        self.planned_grows = False

    @property
    def complete(self) -> bool:
        return self._complete

    def crawl(self, known: Mapping[str, Validator], conditional: bool) -> Iterator[Fetched]:
        self._complete = False
        if not self.root.is_dir():
            raise IngestError(f"source {self.cfg.name!r}: folder not found: {self.root}")
        listed, truncated, count = True, False, 0
        limit = self.cfg.max_pages or self.settings.max_pages
        walked = list(self._walk(self.root))  # listed first, so that progress has a total
        self.planned = min(limit, sum(failure is None for _, failure in walked))
        with ExtractPool(self.settings.extract_workers) as pool:
            # Files are read here and extracted in the pool, up to 2 per worker ahead of the
            # one yielded; results come in name order whatever the pool.
            reading: deque[Fetched | _Reading] = deque()
            window = 2 * pool.workers
            for path, failure in walked:
                if failure is not None:
                    listed = False
                    reading.append(Fetched(path.as_uri(), "error", error=f"{path}: cannot list folder: {failure}",
                                           error_kind="io"))
                elif count >= limit:
                    truncated = True
                    break
                else:
                    count += 1
                    reading.append(self._read(path, known, conditional, pool))
                while len(reading) > window or reading and isinstance(reading[0], Fetched):
                    yield self._finish(reading.popleft(), pool)
            while reading:
                yield self._finish(reading.popleft(), pool)
        self._complete = listed and not truncated

    def _walk(self, folder: Path) -> Iterator[tuple[Path, str | None]]:
        """Files to read in name order, or ``(folder, reason)`` for a folder that cannot be listed."""
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            yield folder, exc.strerror or str(exc)
            return
        for entry in entries:
            if entry.name.startswith("."):
                continue
            path = Path(entry.path)
            try:
                if entry.is_dir(follow_symlinks=False):
                    yield from self._walk(path)
                    continue
                is_file = entry.is_file()
            except OSError:
                is_file = False
            rel = path.relative_to(self.root).as_posix()
            if (is_file and path.suffix.lower() in FOLDER_EXTENSIONS
                    and path_allowed(rel, self.cfg.include, self.cfg.exclude)):
                yield path, None

    def _read(self, path: Path, known: Mapping[str, Validator], conditional: bool,
              pool: ExtractPool) -> Fetched | _Reading:
        """A file's result when it needs no extraction, else the file submitted to ``pool``."""
        url = path.as_uri()
        try:
            stat = path.stat()
            validator = f"{stat.st_mtime_ns}:{stat.st_size}"
            previous = known.get(url)
            if conditional and previous is not None and previous.last_modified == validator:
                return Fetched(url, "not_modified", last_modified=validator)
            if stat.st_size > self.settings.max_bytes:
                raise FetchError(url, f"larger than {self.settings.max_bytes} bytes", kind="too_large")
            data = path.read_bytes()
        except FileNotFoundError:
            return Fetched(url, "gone")
        except OSError as exc:
            return Fetched(url, "error", error=f"{path}: {exc.strerror or exc}", error_kind="io")
        except FetchError as exc:
            return Fetched(url, "error", error=str(exc), error_kind=exc.kind)
        job = Job(data, kind_for(path.name) or "text", url, None, path.stem,
                  tuple(self.settings.boilerplate_patterns))
        return _Reading(pool.submit(job), path, stat.st_mtime_ns, validator)

    def _finish(self, item: Fetched | _Reading, pool: ExtractPool) -> Fetched:
        if isinstance(item, Fetched):
            return item
        outcome = pool.result(item.handle)
        url = item.path.as_uri()
        if outcome.page is None:
            return Fetched(url, "error", error=outcome.error, error_kind=outcome.kind)
        rel = item.path.relative_to(self.root).as_posix()
        modified = datetime.fromtimestamp(item.mtime_ns / 1e9, tz=UTC)
        doc = build_document(self.cfg, doc_id=f"{self.cfg.name}:{rel}", url=url, page=outcome.page,
                             modified=modified)
        return Fetched(url, "ok", document=doc, last_modified=item.validator)


@dataclass(frozen=True)
class _Reading:
    """A file handed to the extraction pool, with what its result needs."""

    handle: Handle
    path: Path
    mtime_ns: int
    validator: str
