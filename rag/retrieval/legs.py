"""The health of each retrieval leg: a leg whose backend fails is skipped, and tried again.

The lexical leg is BM25 (tantivy or Elasticsearch); the vector leg is the query embedding and
the vector store; the reranker reorders. When one fails (:class:`~rag.errors.BackendError`,
:class:`~rag.errors.EmbedderError`, :class:`~rag.errors.RerankerError`), the retriever answers
from what is left and says so (``Retrieval.degraded``); the leg is then skipped for
``retry_s`` (5 s), so a backend that is down or hung costs one query its timeout, not every
query, and the first query after that window tries it again: recovery needs no restart.
``retrieval_leg_down_total{leg}`` counts the queries answered without a leg.

Example::

    breaker = LegBreaker("lexical")
    try:
        hits = breaker.call(lambda: index.search(query, k=100))
    except LegDown as down:
        reasons.append(str(down))
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from rag.errors import BackendError, EmbedderError, RerankerError
from rag.metrics import RETRIEVAL_LEG_DOWN

__all__ = ["LEG_ERRORS", "LegBreaker", "LegDown"]

log = logging.getLogger(__name__)
T = TypeVar("T")
LEG_ERRORS = (BackendError, EmbedderError, RerankerError)


class LegDown(Exception):
    """A leg that failed, or is skipped after a failure; ``cause`` is the backend's error."""

    def __init__(self, leg: str, cause: Exception) -> None:
        super().__init__(f"{leg} unavailable: {cause}")
        self.leg, self.cause = leg, cause


class LegBreaker:
    """Runs one leg, or refuses it for ``retry_s`` after it failed (thread-safe)."""

    def __init__(self, leg: str, retry_s: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.leg, self.retry_s, self.clock = leg, retry_s, clock
        self._until = 0.0
        self._last: Exception | None = None
        self._lock = threading.Lock()

    @property
    def down(self) -> bool:
        return self._last is not None

    def call(self, fn: Callable[[], T]) -> T:
        with self._lock:
            skipped = self._last if self._last is not None and self.clock() < self._until else None
        if skipped is not None:
            RETRIEVAL_LEG_DOWN.labels(self.leg).inc()
            raise LegDown(self.leg, skipped)
        try:
            out = fn()
        except LEG_ERRORS as exc:
            with self._lock:
                if self._last is None:
                    log.warning("retrieval: %s failed, answering without it (retried in %g s): %s",
                                self.leg, self.retry_s, exc)
                self._last, self._until = exc, self.clock() + self.retry_s
            RETRIEVAL_LEG_DOWN.labels(self.leg).inc()
            raise LegDown(self.leg, exc) from exc
        if self._last is not None:
            with self._lock:
                if self._last is not None:
                    log.warning("retrieval: %s is back", self.leg)
                self._last = None
        return out
