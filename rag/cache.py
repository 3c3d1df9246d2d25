"""Answer caches in front of generation: an exact cache and a semantic one, as fresh as the index.

A question is first looked up **exactly**: the key hashes the normalised question (Unicode
NFKC, case-folded, spaces collapsed, trailing punctuation dropped) together with its
*scope*: the filters (tenant included), ``top_k``, the conversation so far, the request's
sampling overrides and a fingerprint of the settings that shape an answer (retrieval,
generator, sampling, prompt, embedder, index backends). On an exact miss it is looked up
**semantically**: the question's embedding (the deployment's embedder) against the answers
cached in the same scope, served when the cosine is at least ``cache.semantic_threshold``
and the two questions pass the ``cache.guards`` (:mod:`rag.cache_guards`): the same numbers
("Python 3.11" is not "Python 3.12", which MiniLM puts at 0.93), names, negation, question
type ("Who sequenced the first plastome?" is not "When was it sequenced?", 0.95) and
language. The threshold defaults to the embedder's measured value
(:data:`SEMANTIC_THRESHOLDS`): the highest cosine that keeps wrong hits under 1% on
near-duplicate XQuAD pairs held out from its choice (``ragqa eval cache``,
``evals/RESULTS-cache.md``).

**Freshness.** An answer lives ``cache.ttl_s`` (24 hours), unless the index changes under it:

- Each answer records the chunks its context held (all the packed passages, cited or not:
  an uncited passage still shapes an answer) and their sources. Chunk ids hash their text,
  so a reindex that edits a passage removes its id. The state database logs, in the
  transaction that replaces a document's chunks, the ids that left and how many arrived
  (:class:`rag.types.ChangeLog`); the cache applies that log before every lookup (a cheap
  ``PRAGMA data_version`` says when there is anything new) and drops exactly the answers
  built from a removed chunk. A reindex that changed nothing drops nothing.
- New content is the other way an answer goes stale: a page added (or a passage added to a
  page) that the same question would now retrieve. Each store keeps a clock, and the clock
  of each source's last addition; an answer whose sources (its filter's, or all) gained
  chunks since it was stored is **rechecked** on its next hit: the answerer retrieves and
  packs the context again (no generation), and serves the cached answer only if the context
  is the same passages in the same order, else answers afresh with that context. So the
  rule is exact, costs one retrieval (tens of milliseconds) once per answer after an
  addition, and nothing otherwise.
- On the Redis backend the dependency index, the clock and how far each state database's log
  has been applied live in Redis, so instances that share it but not a data directory see
  each other's invalidations: the ingesting process applies its own changes after each run
  (:func:`push_changes`).
- ``ragqa cache purge`` (and ``POST /admin/cache/purge``) logs a purge of one source's
  answers (or all) the same way.

Only complete answers are stored: ``finish_reason`` ``stop``, not degraded (extractive
fallback), not blocked, not empty. A hit is replayed by :class:`rag.answer.Answerer` as the
usual events (sources, the text as one delta, done) with ``cache: "hit"`` or ``"semantic"``.

The stores (:mod:`rag.cache_stores`, :class:`rag.types.AnswerCache`): :class:`MemoryAnswerCache`
(``cache.backend: memory``, the embedded default; this process's LRU dict) and
:class:`RedisAnswerCache` (``cache.backend: redis``: shared by workers and instances; a
semantic lookup compares the scope's ``cache.semantic_scan`` most recent answers). A Redis
that is down makes every lookup a quick miss, counted in ``answer_cache_errors_total``,
until it is back.

Example::

    cache = make_answer_cache(services, salt=generator.name)      # None when cache.backend is off
    lookup = cache.lookup("How do I read a file?", filters=Filters(), history=(), top_k=None)
    if lookup.answer is None or lookup.recheck:
        ...  # generate (or compare the context again), then
        cache.store(lookup, CachedAnswer(text, sources, citations, "stop", usage))
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
import time
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import numpy as np

from rag.cache_guards import same_question
from rag.cache_stores import MemoryAnswerCache, RedisAnswerCache
from rag.errors import ConfigError
from rag.lang import detect_lang, ranks
from rag.metrics import CACHE_RECHECKS
from rag.types import AnswerCache, ChangeLog, Citation, Filters

if TYPE_CHECKING:
    from rag.config import CacheSettings, Settings
    from rag.services import Services

__all__ = ["CachedAnswer", "Lookup", "MemoryAnswerCache", "RedisAnswerCache", "AnswerCacheLayer",
           "make_answer_cache", "make_store", "apply_changes", "push_changes", "normalise_question",
           "config_fingerprint"]

log = logging.getLogger(__name__)
SEMANTIC_THRESHOLDS = {"st:all-MiniLM-L6-v2": 0.91, "onnx-int8:all-MiniLM-L6-v2": 0.91, "use:multilingual-v3": 0.85}
"""Measured per embedder (``evals/RESULTS-cache.md``): on held-out XQuAD pairs with all guards,
MiniLM 93.7% of same-question pairs hit and 0.0% of different-question pairs (fp32 and int8
alike); USE 93.2% and 0.2%."""
DEFAULT_THRESHOLD = 0.95  # an embedder not measured
_NO_FILTERS = Filters()
DEFAULT_GUARDS = ("numbers", "entities", "negation", "qtype", "language")
_TRAILING = re.compile(r"[\s?？!！.。,，;；:：、…]+$")


def normalise_question(question: str) -> str:
    """The form two questions must share to be the same question to the exact cache."""
    text = unicodedata.normalize("NFKC", question).casefold()
    return _TRAILING.sub("", " ".join(text.split()))


def _digest(*parts: str) -> str:
    return hashlib.sha256("\x1f".join(parts).encode("utf-8")).hexdigest()[:40]


def _citation_dict(c: Citation) -> dict[str, Any]:
    out = asdict(c)
    out["modified"] = c.modified.isoformat() if c.modified else None
    return out


def _citation(d: Mapping[str, Any]) -> Citation:
    modified = d.get("modified")
    return Citation(**{**d, "modified": datetime.fromisoformat(modified) if modified else None})


@dataclass(frozen=True, slots=True)
class CachedAnswer:
    """What a hit replays: the text as streamed, the packed sources, the cited ones, how it ended."""

    text: str
    sources: tuple[Citation, ...]
    citations: tuple[Citation, ...]
    finish_reason: str = "stop"
    usage: dict[str, int] = field(default_factory=dict)
    question: str = ""  # normalised: the exact key's form
    created: float = 0.0
    asked: str = ""  # as typed: the semantic lookup's guards compare it (names keep their capitals)
    versions: dict[str, Any] = field(default_factory=dict)  # the answer's profile, model, prompt version, route, arm

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "sources": [_citation_dict(c) for c in self.sources],
                "citations": [_citation_dict(c) for c in self.citations], "finish_reason": self.finish_reason,
                "usage": dict(self.usage), "question": self.question, "created": self.created, "asked": self.asked,
                "versions": dict(self.versions)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CachedAnswer:
        return cls(d["text"], tuple(_citation(c) for c in d.get("sources", ())),
                   tuple(_citation(c) for c in d.get("citations", ())), d.get("finish_reason", "stop"),
                   dict(d.get("usage", {})), d.get("question", ""), float(d.get("created", 0.0)), d.get("asked", ""),
                   dict(d.get("versions") or {}))


@dataclass(slots=True)
class Lookup:
    """The outcome of :meth:`AnswerCacheLayer.lookup`; pass it to :meth:`AnswerCacheLayer.store` on a miss."""

    key: str
    scope: str
    question: str
    kind: str = "miss"  # hit | semantic | miss
    answer: CachedAnswer | None = None
    asked: str = ""  # the question as typed
    recheck: bool = False  # the answer's sources gained chunks since it was stored: compare its context first
    generation: int = 0  # the store's clock at the lookup
    added: int = 0  # the clock at the last addition to the sources the lookup covers
    entry: str = ""  # the key the answer is stored under (the lookup's own key for an exact hit)
    similarity: float | None = None
    vector: np.ndarray | None = None
    timings: dict[str, float] = field(default_factory=dict)


# -- the layer the answerer uses ---------------------------------------------------------------------
def config_fingerprint(settings: Settings, salt: str = "") -> str:
    """A hash of the settings that shape an answer (so changing them starts a fresh cache)."""
    parts = {
        "retrieval": settings.retrieval.model_dump(mode="json"),
        "generator": settings.generator.model_dump(mode="json", exclude={"api_key", "timeout_s", "connect_retries"}),
        "sampling": settings.sampling.model_dump(mode="json"),
        "prompt": settings.prompt.model_dump(mode="json"),
        "citations": settings.citations.model_dump(mode="json"),
        "injection": settings.injection.model_dump(mode="json"),
        "embedder": settings.embedder.model_dump(mode="json", include={"backend", "model", "dim"}),
        "lexical": settings.lexical.model_dump(mode="json", include={"backend", "url", "index"}),
        "vector": settings.vector.model_dump(mode="json", include={"backend", "uri", "collection"}),
        "salt": salt,
    }
    if settings.profiles:  # the other profiles shape the answers routed to them
        parts["profiles"] = {name: cfg.model_dump(mode="json", exclude={"api_key", "timeout_s", "connect_retries"})
                             for name, cfg in sorted(settings.profiles.items())}
    if settings.routing.mode != "off":  # the router's thresholds decide which profile answers
        parts["routing"] = settings.routing.model_dump(mode="json")
    return _digest(json.dumps(parts, sort_keys=True, default=str))


class AnswerCacheLayer:
    """Keys, scopes, freshness and the exact-then-semantic lookup, over any
    :class:`~rag.types.AnswerCache`.

    ``embed`` gives a question's unit vector, or ``None`` for a question it cannot rank (then,
    like with no ``embed`` at all, the lookup is exact only); ``changes`` the index's change
    log, applied to the store before each lookup and store. :meth:`lookup` does I/O and model
    work: call it from a worker thread in async code.
    """

    def __init__(self, store: AnswerCache, *, ttl_s: float = 86_400,
                 semantic_threshold: float | Callable[[], float] = DEFAULT_THRESHOLD,
                 guards: Sequence[str] = DEFAULT_GUARDS,
                 embed: Callable[[str], np.ndarray | None] | None = None, fingerprint: str = "",
                 changes: ChangeLog | None = None, default_top_k: int = 8,
                 on_change: Callable[[], None] | None = None) -> None:
        self.backend = store
        self.ttl_s = ttl_s
        self._threshold = semantic_threshold
        self.guards = tuple(guards)
        same_question("", "", self.guards)  # an unknown guard is an error now, not at the first lookup
        self.embed = embed
        self.fingerprint = fingerprint
        self.changes = changes
        self.default_top_k = default_top_k
        self._token: object = None
        # Called when the store's generation moves past the one this process last saw: an index
        # changed (here, in another process, or pushed through a shared store), so the retrieval
        # that follows must read it, not an eventually consistent copy it would then cache.
        self.on_change = on_change
        self._seen_generation: int | None = None
        self._sync_lock = threading.Lock()
        self._answers: dict[str, tuple[dict[str, Any], CachedAnswer]] = {}

    @property
    def semantic_threshold(self) -> float:
        """The least cosine (a callable threshold is asked once the embedder is loaded)."""
        if callable(self._threshold):
            self._threshold = self._threshold()
        return self._threshold

    def scope(self, *, filters: Filters | None, history: Sequence[Mapping[str, str]], top_k: int | None,
              overrides: Mapping[str, Any] | None, variant: str = "") -> str:
        # repr of the frozen Filters (tuples, datetimes, an enum) is exact and several times
        # cheaper than json.dumps(asdict(...)) on every lookup
        parts = (self.fingerprint, repr(filters or _NO_FILTERS), top_k or self.default_top_k,
                 [(t.get("role", ""), t.get("content", "")) for t in history],
                 sorted((k, v) for k, v in (overrides or {}).items() if v is not None), variant)
        return _digest(repr(parts))

    def sync(self) -> int:
        """Apply the change log's new entries to the store; returns the answers dropped. Costs
        one ``PRAGMA`` when there is nothing new."""
        if self.changes is None:
            return 0
        token = self.changes.change_token()
        if token == self._token:
            return 0
        with self._sync_lock:
            if token == self._token:
                return 0
            dropped = apply_changes(self.backend, self.changes)
            self._token = token
            return dropped

    def lookup(self, question: str, *, filters: Filters | None = None, history: Sequence[Mapping[str, str]] = (),
               top_k: int | None = None, overrides: Mapping[str, Any] | None = None, variant: str = "") -> Lookup:
        """The exact lookup, then on a miss the semantic one."""
        found = self.lookup_exact(question, filters=filters, history=history, top_k=top_k, overrides=overrides,
                                  variant=variant)
        if found.kind == "miss":
            self.lookup_semantic(found)
        return found

    def lookup_exact(self, question: str, *, filters: Filters | None = None,
                     history: Sequence[Mapping[str, str]] = (), top_k: int | None = None,
                     overrides: Mapping[str, Any] | None = None, variant: str = "") -> Lookup:
        """The exact lookup alone. With a memory store it does no I/O and no model work
        (:attr:`inline`: the answerer runs it on the event loop, tens of microseconds).
        ``variant`` names what else decides the answer (the answerer's profile, prompt version and
        experiment arm): answers of different variants are different entries, exact and semantic."""
        started = time.perf_counter()
        self.sync()
        scope = self.scope(filters=filters, history=history, top_k=top_k, overrides=overrides, variant=variant)
        normalised = normalise_question(question)
        found = Lookup(_digest(scope, normalised), scope, normalised, asked=question)
        value, clock = self.backend.get(found.key, (filters or Filters()).source)
        found.generation, found.added = clock.now, clock.added
        if clock.now != self._seen_generation:
            if self._seen_generation is not None and self.on_change is not None:
                self.on_change()
            self._seen_generation = clock.now
        if value is not None:
            found.kind, found.answer, found.similarity, found.entry = "hit", self._parsed(found.key, value), 1.0, found.key
            found.recheck = int(value.get("gen", 0)) < clock.added
            self.backend.count("hit")
        found.timings["cache_ms"] = (time.perf_counter() - started) * 1000
        return found

    def lookup_semantic(self, found: Lookup) -> Lookup:
        """After an exact miss: the closest cached question of the scope that passes the guards
        (embeds the question: call it from a worker thread in async code)."""
        started = time.perf_counter()
        if self.embed is not None and (vector := self._embed(found.asked, found)) is not None:
            for value, score in self.backend.nearest(found.scope, vector, self.semantic_threshold):
                answer = CachedAnswer.from_dict(value)
                if same_question(answer.asked or answer.question, found.asked, self.guards):
                    found.kind, found.answer, found.similarity = "semantic", answer, score
                    found.entry = value.get("key", "")
                    found.recheck = int(value.get("gen", 0)) < found.added
                    break
        self.backend.count(found.kind)
        found.timings["cache_ms"] = found.timings.get("cache_ms", 0.0) + (time.perf_counter() - started) * 1000
        return found

    @property
    def inline(self) -> bool:
        """Whether :meth:`lookup_exact` is cheap enough for the event loop (a memory store)."""
        return isinstance(self.backend, MemoryAnswerCache)

    def _parsed(self, key: str, value: dict[str, Any]) -> CachedAnswer:
        """``value`` as a :class:`CachedAnswer`, parsed once per stored object (a memory store
        hands back the same dict on every hit)."""
        cached = self._answers.get(key)
        if cached is not None and cached[0] is value:
            return cached[1]
        answer = CachedAnswer.from_dict(value)
        self._answers[key] = (value, answer)
        if len(self._answers) > 4096:
            self._answers.pop(next(iter(self._answers)))
        return answer

    def _embed(self, question: str, found: Lookup) -> np.ndarray | None:
        assert self.embed is not None
        started = time.perf_counter()
        vector = self.embed(question)
        if vector is None:
            return None
        found.vector = np.asarray(vector, dtype=np.float32)
        found.timings["embed_ms"] = (time.perf_counter() - started) * 1000
        return found.vector

    def store(self, lookup: Lookup, answer: CachedAnswer) -> bool:
        """Store a generated answer under the lookup's key; refused (``False``) when the index
        changed since the lookup (its context may already be stale)."""
        self.sync()
        answer = CachedAnswer(answer.text, answer.sources, answer.citations, answer.finish_reason, answer.usage,
                              lookup.question, time.time(), lookup.asked, answer.versions)
        return self._put(lookup.key, answer, lookup.generation,
                         scope=lookup.scope if lookup.vector is not None else None, vector=lookup.vector)

    def recheck(self, lookup: Lookup, context: Sequence[Citation]) -> bool:
        """After a recheck retrieved ``context`` again: keep the cached answer (restamped with the
        lookup's clock) when it is the same passages in the same order; else count it stale."""
        assert lookup.answer is not None
        same = [c.chunk_id for c in context] == [c.chunk_id for c in lookup.answer.sources]
        self.backend.count("kept" if same else "stale")
        CACHE_RECHECKS.labels("kept" if same else "stale").inc()
        if same and lookup.entry:
            self._put(lookup.entry, lookup.answer, lookup.generation)
        return same

    def _put(self, key: str, answer: CachedAnswer, generation: int, *, scope: str | None = None,
             vector: np.ndarray | None = None) -> bool:
        """``answer`` under ``key``, stamped with ``generation``, depending on its packed chunks
        and their sources."""
        value = {**answer.to_dict(), "gen": generation, "key": key}
        return self.backend.put(key, value, self.ttl_s, scope=scope, vector=vector,
                                deps=[c.chunk_id for c in answer.sources],
                                sources=sorted({c.source for c in answer.sources if c.source}),
                                generation=generation)

    def stats(self) -> dict[str, Any]:
        self.sync()
        return self.backend.stats()

    def clear(self) -> None:
        self.backend.clear()


def apply_changes(store: AnswerCache, changes: ChangeLog) -> int:
    """Apply the log's entries that ``store`` has not seen (it keeps a cursor per log); a store
    that never saw this log starts at its end (it holds nothing built before)."""
    cursor = store.cursor(changes.log_id)
    if cursor is None:
        store.set_cursor(changes.log_id, changes.last_change())
        return 0
    entries = changes.changes_since(cursor)
    if not entries:
        return 0
    dropped = store.apply(entries)
    store.set_cursor(changes.log_id, entries[-1].seq)
    if dropped:
        log.info("answer cache: %d answers dropped by %d index changes", dropped, len(entries))
    return dropped


def make_store(services: Services, cfg: CacheSettings | None = None) -> AnswerCache | None:
    """The store ``cache.backend`` names; ``None`` when it is ``off``."""
    cfg = cfg or services.settings.cache
    if cfg.backend == "off":
        return None
    if cfg.backend == "memory":
        return MemoryAnswerCache(cfg.max_entries, cfg.ttl_s)
    url = cfg.redis_url or services.settings.serve.redis_url
    if not url:
        raise ConfigError("cache.backend is redis but neither cache.redis_url nor serve.redis_url is set")
    return RedisAnswerCache(url, cfg.ttl_s, prefix=cfg.prefix, semantic_scan=cfg.semantic_scan)


def push_changes(services: Services) -> int:
    """After a reindex or a purge: apply this data directory's change log to a *shared* answer
    cache (Redis), so instances that share it but not the data directory drop what changed.
    A memory cache lives in the serving process, which applies the log itself. Failures are
    logged, not raised: the log keeps the changes, and the next push or lookup applies them."""
    if services.settings.cache.backend != "redis":
        return 0
    store = make_store(services)
    try:
        return apply_changes(store, services.state) if store is not None else 0
    except Exception as exc:  # noqa: BLE001 - the index is updated; the cache catches up later
        log.warning("answer cache not updated after the reindex (it will be at the next lookup): %s", exc)
        return 0
    finally:
        close = getattr(store, "close", None)
        if close is not None:
            close()


def make_answer_cache(services: Services, *, salt: str = "",
                      settings: CacheSettings | None = None) -> AnswerCacheLayer | None:
    """The cache ``cache.*`` settings ask for; ``None`` when ``cache.backend`` is ``off``.

    ``salt`` enters the fingerprint (the answerer passes its generator's name). The change log
    applied before each lookup is the state's (:attr:`rag.services.Services.query_state`); a
    process with none to read (servers only, no shared state) applies none, and a Redis store
    gets the changes from the ingesting process (:func:`push_changes`).
    """
    cfg = settings or services.settings.cache
    store = make_store(services, cfg)
    if store is None:
        return None

    def embed(question: str) -> np.ndarray | None:
        """The question's embedding; ``None`` when the model does not rank its language (an
        English-only model finds unrelated Chinese questions near-identical)."""
        embedder = services.embedder
        return embedder.embed_query(question) if ranks(embedder, detect_lang(question)) else None

    def threshold() -> float:
        return SEMANTIC_THRESHOLDS.get(services.embedder.name, DEFAULT_THRESHOLD)

    return AnswerCacheLayer(store, ttl_s=cfg.ttl_s, semantic_threshold=cfg.semantic_threshold or threshold,
                            guards=cfg.guards,
                            embed=embed if cfg.semantic else None,
                            fingerprint=config_fingerprint(services.settings, salt),
                            changes=services.query_state, default_top_k=services.settings.retrieval.top_k,
                            on_change=services.read_fresh)
