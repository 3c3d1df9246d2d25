"""Page extraction (decode, parse, normalise) in worker processes, beside the embedder.

Extracting an HTML page costs more CPU than embedding its chunks with the int8 ONNX
embedder, and Python runs one thread of it at a time, so a crawl extracts in
``crawl.extract_workers`` processes while the main process fetches, chunks and embeds.
Processes, not threads: trafilatura (lxml, libxml2) can crash the process when several
threads extract at once (trafilatura issues #840 and #925: SIGSEGV or SIGABRT, no traceback),
and a crash in a worker costs one page, not the run. Workers come from a ``forkserver`` (``spawn``
where there is none), never from a fork of a process whose torch or onnxruntime threads run.

A page whose extraction raises, or kills its worker, is that page's error: a worker that
dies breaks the pool, which is replaced, and each page that was in flight is tried again
alone in a one-process pool, so only the page that kills it again is reported.
``workers=0`` extracts inline, in the caller's thread, with the same results.

Example::

    with ExtractPool(2) as pool:
        handles = [pool.submit(Job(body, "html", url)) for url, body in replies]
        for handle in handles:
            outcome = pool.result(handle)
            print(outcome.error or outcome.page.title)
"""

from __future__ import annotations

import logging
import multiprocessing
import os
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

from ingest.extract import Extracted, Kind, extract
from rag.config import DEFAULT_BOILERPLATE
from rag.errors import FetchError

__all__ = ["ExtractPool", "Job", "Outcome", "run_job", "CRASHED"]

log = logging.getLogger("ragqa.ingest")
CRASHED = "crashed"  # FetchError kind of a page whose extraction killed its worker process


@dataclass(frozen=True)
class Job:
    """One document to extract: :func:`ingest.extract.extract`'s arguments."""

    data: bytes
    kind: Kind
    url: str
    charset: str | None = None
    fallback_title: str = ""
    boilerplate: tuple[str, ...] = DEFAULT_BOILERPLATE


@dataclass(frozen=True)
class Outcome:
    """The extracted ``page``, or the one-line ``error`` (naming the URL) and its ``kind``."""

    page: Extracted | None
    error: str | None = None
    kind: str | None = None


def run_job(job: Job) -> Outcome:
    """Extract one document; never raises (run in a worker, or inline)."""
    try:
        return Outcome(extract(job.data, job.kind, url=job.url, charset=job.charset,
                               fallback_title=job.fallback_title, boilerplate=job.boilerplate))
    except FetchError as exc:
        return Outcome(None, str(exc), exc.kind)
    except Exception as exc:  # noqa: BLE001 - a parser bug on odd input (RecursionError...): this page only
        return Outcome(None, f"{job.url}: cannot extract {job.kind}: {type(exc).__name__}: {exc}",
                       "unreadable")


@dataclass
class Handle:
    """A submitted job: its future in the pool of generation ``generation``, or none (inline)."""

    job: Job
    future: Future[Outcome] | None
    generation: int


def _context() -> Any:
    methods = multiprocessing.get_all_start_methods()
    if "forkserver" in methods:
        ctx = multiprocessing.get_context("forkserver")
        # The server imports the extractors once; each worker forks from it ready to parse.
        ctx.set_forkserver_preload(["__main__", "ingest.extract"])
        return ctx
    return multiprocessing.get_context("spawn")


class ExtractPool:
    """``workers`` extraction processes (started on first use), or inline when 0.

    :meth:`submit` returns at once; :meth:`result` waits for that job's :class:`Outcome`.
    Results may be asked for in any order. Not thread-safe: one crawl thread uses it.
    """

    def __init__(self, workers: int) -> None:
        self.workers = max(0, workers)
        self._pool: ProcessPoolExecutor | None = None
        self._alone: ProcessPoolExecutor | None = None
        self._generation = 0
        self._started = False  # a pool's workers have extracted a page
        self.crashes = 0  # worker processes that died

    def __enter__(self) -> ExtractPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def submit(self, job: Job) -> Handle:
        pool = self._start()
        if pool is None:
            return Handle(job, None, self._generation)
        try:
            future = pool.submit(run_job, job)
        except BrokenProcessPool:  # it broke since the last call
            self._replace(self._generation)
            pool = self._start()
            assert pool is not None
            future = pool.submit(run_job, job)
        return Handle(job, future, self._generation)

    def result(self, handle: Handle) -> Outcome:
        if handle.future is None:
            return run_job(handle.job)
        try:
            return handle.future.result()
        except BrokenProcessPool:
            # Some page in flight killed a worker; which one is unknown, so each is tried alone.
            self._replace(handle.generation)
            return self._run_alone(handle.job)

    def close(self) -> None:
        for pool in (self._pool, self._alone):
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
        self._pool = self._alone = None

    def _start(self) -> ProcessPoolExecutor | None:
        """The running pool, started if need be; None when its processes cannot start.

        The first pool extracts an empty page before any real one: workers that cannot even
        start (a ``__main__`` they cannot import, as under ``python -``) would make every page
        an error, so the crawl then extracts inline instead.
        """
        if self._pool is None and self.workers:
            pool = ProcessPoolExecutor(self.workers, mp_context=_context())
            if not self._started:
                try:
                    pool.submit(run_job, Job(b"", "html", "about:blank")).result()
                except BrokenProcessPool:
                    log.warning("extraction processes cannot start; extracting in the crawl's thread")
                    pool.shutdown(wait=False, cancel_futures=True)
                    self.workers = 0
                    return None
                self._started = True
            self._pool = pool
        return self._pool

    def _replace(self, generation: int) -> None:
        """Drop the broken pool of ``generation`` (once); the next submit starts a new one."""
        if generation != self._generation or self._pool is None:
            return
        self.crashes += 1
        log.warning("an extraction worker died; restarting the pool", extra={"pid": os.getpid()})
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._pool = None
        self._generation += 1

    def _run_alone(self, job: Job) -> Outcome:
        if self._alone is None:
            self._alone = ProcessPoolExecutor(1, mp_context=_context())
        try:
            return self._alone.submit(run_job, job).result()
        except BrokenProcessPool:
            self.crashes += 1
            self._alone.shutdown(wait=False, cancel_futures=True)
            self._alone = None
            return Outcome(None, f"{job.url}: cannot extract {job.kind}: the extracting process died "
                                 f"(a crash in the parser)", CRASHED)
