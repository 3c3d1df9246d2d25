"""``reindex(source, mode)``: the one idempotent ingestion entry point.

The CLI, the scheduler and the admin API all call it. A run crawls the source, hashes
each document's normalised text, and re-chunks and re-embeds only documents whose hash
changed; chunks whose text is unchanged reuse their stored vectors. Documents that the
source no longer has are deleted from every index, but only after a crawl that could see
the whole source and had no errors: a failing crawl never deletes anything, a page that
answers with no text is an error (the old version stays), and a run that would delete more
than ``crawl.max_delete_fraction`` (half) of a source deletes nothing without
``allow_mass_delete``.

Indexes are written before the state database, so a run that dies half way leaves the
old state in place and the next run redoes the unfinished documents. The state database logs
which chunks each document lost and gained, and the answer cache drops exactly the answers
built from lost ones (:mod:`rag.cache`): a run that changed nothing keeps every answer.

Example::

    report = reindex(services, "pydocs", "incremental")
    print(report.changed, report.chunks_embedded)
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from tqdm import tqdm

from ingest.chunking import Chunker
from ingest.normalize import text_hash
from ingest.progress import RunProgress
from ingest.services import state_db
from ingest.sources import open_source
from ingest.sources.base import Fetched, Validator
from ingest.vectors import vectors_for
from rag.cache import push_changes
from rag.errors import ConfigError
from rag.metrics import CHUNKS_EMBEDDED, CRAWL_ERRORS, DELETIONS_REFUSED, INDEX_LAST_SUCCESS, REINDEX_RUNS
from rag.services import Services
from rag.types import Chunk, Document

__all__ = ["reindex", "RunReport", "Mode"]

log = logging.getLogger("ragqa.ingest")
Mode = Literal["full", "incremental"]
EMBED_BATCH_CHUNKS = 256
AUTO_SAMPLE_DOCS = 50
PROGRESS_EVERY_S = 2.0  # how often a running run's progress is written to the state
"""With ``embedder.backend: auto`` and no choice yet, the first ingest holds this many
documents, chooses the embedder from their languages (``Services.choose_embedder``), then
chunks and embeds them with it."""


@dataclass
class RunReport:
    """What one run did. ``--json`` prints it as is."""

    source: str
    mode: str
    fetched: int = 0
    unchanged: int = 0
    changed: int = 0
    added: int = 0
    deleted: int = 0
    failed: int = 0
    chunks_embedded: int = 0
    chunks_reused: int = 0
    chunks_deleted: int = 0
    seconds: float = 0.0
    complete: bool = True
    deletions_skipped: bool = False
    deletions_refused: int = 0  # documents the mass-deletion guard kept
    answers_dropped: int = 0  # from a shared (Redis) answer cache; a memory cache drops its own at its next lookup
    errors: list[str] = field(default_factory=list)  # the first 20 messages, each naming its URL
    error_kinds: dict[str, int] = field(default_factory=dict)  # every failed URL, by FetchError.kind

    def fail(self, source: str, kind: str, message: str) -> None:
        self.failed += 1
        self.error_kinds[kind] = self.error_kinds.get(kind, 0) + 1
        CRAWL_ERRORS.labels(source, kind).inc()
        if len(self.errors) < 20:
            self.errors.append(message)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Pending:
    doc: Document
    hash: str
    fetched: Fetched
    chunks: list[Chunk]
    known: bool = True  # the state records an earlier version, so the indexes hold its old chunks


class _Indexer:
    """Embeds and writes changed documents in batches, then records them in the state.

    A batch is embedded and written on a thread of its own while the crawl goes on fetching,
    parsing and chunking the next one (the embedder releases the GIL while it computes), so
    the embedder does not wait for extraction. One batch at a time: :meth:`flush` waits for
    the batch before, so batches are written in order and memory holds at most two. Pages are
    parsed by the source, in ``crawl.extract_workers`` processes (:mod:`ingest.extract_pool`),
    never in threads: trafilatura and lxml can crash when several threads extract at once.
    """

    def __init__(self, services: Services, report: RunReport, progress: RunProgress, *,
                 indexes_clean: bool = False) -> None:
        self.s = services
        # Whether the indexes hold no chunks of documents the state does not record; then a new
        # document has nothing to delete first (deleting is a scan of the collection on Milvus Lite).
        self.indexes_clean = indexes_clean
        self.report = report
        self.progress = progress
        # The embedder's tokenizer sizes the chunks, so an undecided ``auto`` embedder holds
        # the first documents back until it is chosen.
        self.chunker: Chunker | None = None if services.embedder_undecided else self._chunker()
        self.held: list[tuple[Document, str, Fetched, bool]] = []
        self.pending: list[_Pending] = []
        self.pending_chunks = 0
        self._writer: ThreadPoolExecutor | None = None
        self._writing: Future[None] | None = None

    def _chunker(self) -> Chunker:
        emb = self.s.embedder
        count = getattr(emb, "count_tokens", None)
        cfg = self.s.settings.chunking
        kwargs = {"count_tokens": count} if count is not None else {}
        # A chunk longer than the model reads would be embedded truncated.
        size = min(cfg.size_tokens, getattr(emb, "max_text_tokens", None) or cfg.size_tokens)
        return Chunker(size, min(cfg.overlap_tokens, size // 2), **kwargs)

    def _choose(self) -> None:
        held, self.held = self.held, []
        choice = self.s.choose_embedder([doc.lang for doc, _, _, _ in held])
        log.info("embedder chosen", extra={"embedder": choice})
        _check_embedder(self.s)
        self.chunker = self._chunker()
        for item in held:
            self.add(*item)

    def add(self, doc: Document, h: str, fetched: Fetched, known: bool = True) -> None:
        if self.chunker is None:
            self.held.append((doc, h, fetched, known))
            if len(self.held) >= AUTO_SAMPLE_DOCS:
                self._choose()
            return
        chunks = self.chunker.chunk(doc)
        self.pending.append(_Pending(doc, h, fetched, chunks, known))
        self.pending_chunks += len(chunks)
        if self.pending_chunks >= EMBED_BATCH_CHUNKS:
            self.flush()

    def flush(self) -> None:
        """Hand the pending documents to the writer thread, once the batch before is written."""
        if self.chunker is None and self.held:
            self._choose()
        batch, self.pending, self.pending_chunks = self.pending, [], 0
        if not batch:
            return
        self.wait()
        if self._writer is None:
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ragqa-index")
        self._writing = self._writer.submit(self._write, batch)

    def wait(self) -> None:
        """Until the batch being written is done; its error, if any, is raised here."""
        writing, self._writing = self._writing, None
        if writing is not None:
            writing.result()

    def close(self) -> None:
        """Wait for the last batch (its error is raised) and stop the writer thread."""
        try:
            self.wait()
        finally:
            if self._writer is not None:
                self._writer.shutdown(wait=True)

    def _write(self, batch: list[_Pending]) -> None:
        chunks = [c for p in batch for c in p.chunks]
        matrix, embedded = vectors_for(self.s, chunks)
        self.report.chunks_embedded += embedded
        self.progress.embedded(embedded)
        self.report.chunks_reused += len(chunks) - embedded

        doc_ids = [p.doc.id for p in batch if p.known or not self.indexes_clean]
        if doc_ids:
            self.s.lexical.delete_documents(doc_ids)
        self.s.lexical.upsert(chunks)
        for index in self.s.vector_indexes():
            if doc_ids:
                index.delete_documents(doc_ids)
            if chunks:
                index.upsert(chunks, matrix)
        for p in batch:
            state_db(self.s).save_document(p.doc, p.hash, p.fetched.etag, p.fetched.last_modified, p.chunks)


def _check_embedder(services: Services) -> None:
    """Refuse to mix vectors of two models in one index."""
    emb = services.embedder
    current = f"{emb.name}:{emb.dim}"
    stored = services.state.get_meta("embedder")
    if stored is None:
        services.state.set_meta("embedder", current)
    elif stored != current:
        raise ConfigError(
            f"the index in {services.data_dir} was built with embedder {stored}, but the settings "
            f"select {current}; use another data directory (RAG_DATA_DIR) or the original embedder"
        )


def _indexes_clean(state: Any, source: str, run_id: int, window: int = 50) -> bool:
    """Whether the indexes can hold no chunks of ``source``'s documents that the state does not record.

    A run writes each batch to the indexes before the state, so only a run that failed or died
    (status ``error``, or still ``running``) can leave such chunks, and the next run that ends
    ``ok`` has rewritten every document, deleting them first. Undecided within ``window`` runs:
    not clean.
    """
    runs = [r for r in state.runs(source, limit=window + 1) if r["id"] != run_id]
    for run in runs:
        if run["status"] == "ok":
            return True
        if run["status"] in ("error", "running"):
            return False
    return len(runs) < window


def delete_documents(services: Services, doc_ids: Sequence[str]) -> int:
    """Remove documents from every index, then from the state; returns how many chunks went."""
    if not doc_ids:
        return 0
    services.lexical.delete_documents(doc_ids)
    for index in services.vector_indexes():
        index.delete_documents(doc_ids)
    return state_db(services).delete_documents(doc_ids)


def reindex(services: Services, source: str, mode: Mode = "incremental", *,
            progress: bool = False, allow_mass_delete: bool = False) -> RunReport:
    """Crawl one source and bring every index up to date. Safe to run again at any time.

    ``incremental`` sends conditional requests (and skips unmodified files), so unchanged
    pages cost a 304; ``full`` fetches and re-extracts everything. Both re-embed only
    what changed, and both delete documents that a complete, error-free crawl no longer saw,
    unless that is more than ``crawl.max_delete_fraction`` of the source (then nothing is
    deleted, the report says so, and ``allow_mass_delete`` lets it through).
    """
    if mode not in ("full", "incremental"):
        raise ConfigError(f"mode must be 'full' or 'incremental', not {mode!r}")
    state = state_db(services)
    cfg = state.source(source)
    report = RunReport(source=source, mode=mode)
    started = time.monotonic()
    run_id = state.start_run(source, mode)
    indexer: _Indexer | None = None
    try:
        if not services.embedder_undecided:  # else checked once the first documents choose it
            _check_embedder(services)
        known = state.documents(source)
        by_url = {d.url: d for d in known.values()}
        validators = {d.url: Validator(d.etag, d.last_modified) for d in known.values()}
        seen: set[str] = set()
        gone: set[str] = set()
        live = RunProgress(source, mode)
        indexer = _Indexer(services, report, live, indexes_clean=_indexes_clean(state, source, run_id))
        crawler = open_source(cfg, services.settings.crawl)
        bar = tqdm(desc=f"{source} ({mode})", unit="page", file=sys.stderr,
                   disable=None if progress else True)  # None: only on a terminal
        saved = time.monotonic()
        for item in crawler.crawl(validators, conditional=(mode == "incremental")):
            live.page(getattr(crawler, "planned", None), getattr(crawler, "planned_grows", False))
            if live.total is not None and bar.total != live.total:
                bar.total = live.total
            bar.set_postfix_str(live.postfix(), refresh=False)
            bar.update(1)
            if time.monotonic() - saved >= PROGRESS_EVERY_S:
                state.run_progress(run_id, live.as_dict())
                saved = time.monotonic()
            old = by_url.get(item.url)
            if item.status == "error":
                report.fail(source, item.error_kind or "unreadable", item.error or item.url)
                if old is not None:
                    seen.add(old.id)
            elif item.status == "gone":
                if old is not None:
                    gone.add(old.id)
            elif item.status == "not_modified":
                report.fetched += 1
                report.unchanged += 1
                if old is not None:
                    seen.add(old.id)
            else:
                report.fetched += 1
                doc = item.document
                if doc is None or not doc.text.strip():
                    # A page that answers with no text is broken for now, not gone: keep the old one.
                    report.fail(source, "no_text", f"{item.url}: no text could be extracted")
                    if old is not None:
                        seen.add(old.id)
                    continue
                repeated = doc.id in seen  # twice in one crawl: its first version may be written
                seen.add(doc.id)
                h = text_hash(doc.title, doc.text)
                previous = known.get(doc.id)
                if previous is not None and previous.text_hash == h:
                    report.unchanged += 1
                    if (previous.etag, previous.last_modified) != (item.etag, item.last_modified):
                        state.touch_document(doc.id, item.etag, item.last_modified, doc.fetched_at)
                    continue
                if previous is None:
                    report.added += 1
                else:
                    report.changed += 1
                indexer.add(doc, h, item, known=previous is not None or repeated)
        bar.close()
        indexer.flush()
        indexer.close()

        report.complete = crawler.complete
        to_delete = set(gone)
        # A feed is a rolling window: an entry that left it still exists at the source.
        deletes_missing = cfg.kind != "feed"
        if deletes_missing and report.complete and report.failed == 0:
            to_delete |= set(known) - seen
        elif deletes_missing and set(known) - seen - gone:
            report.deletions_skipped = True
        to_delete -= seen
        limit = services.settings.crawl.max_delete_fraction * len(known)
        if to_delete and len(to_delete) > max(limit, 1) and not allow_mass_delete:
            # An empty folder (a volume not mounted) or a site whose navigation broke looks
            # like a source that lost most of its pages: keep them, and say so.
            report.deletions_refused = len(to_delete)
            report.deletions_skipped = True
            report.errors.append(
                f"refused to delete {len(to_delete)} of {len(known)} documents (more than "
                f"{services.settings.crawl.max_delete_fraction:.0%}); if the source really lost them, run "
                f"`ragqa reindex --source {source} --allow-mass-delete`")
            DELETIONS_REFUSED.labels(source).inc(len(to_delete))
            to_delete = set()
        report.chunks_deleted = delete_documents(services, sorted(to_delete))
        report.deleted = len(to_delete)
    except BaseException as exc:
        if indexer is not None:  # the batch being written finishes (or fails) before the run is logged
            with contextlib.suppress(Exception):
                indexer.close()
        report.seconds = round(time.monotonic() - started, 3)
        report.errors.append(str(exc) or type(exc).__name__)
        state.finish_run(run_id, "error", report.as_dict())
        REINDEX_RUNS.labels(source, mode, "error").inc()
        push_changes(services)  # what it did change before failing
        raise
    report.seconds = round(time.monotonic() - started, 3)
    status = "ok" if report.complete and report.failed == 0 else "partial"
    state.finish_run(run_id, status, report.as_dict())
    report.answers_dropped = push_changes(services)
    REINDEX_RUNS.labels(source, mode, status).inc()
    CHUNKS_EMBEDDED.labels(source).inc(report.chunks_embedded)
    if status == "ok":
        INDEX_LAST_SUCCESS.labels(source).set(time.time())
    log.info("reindex finished", extra={"report": report.as_dict()})
    return report
