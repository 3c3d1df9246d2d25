"""Answer caches in front of generation: an exact cache and a semantic one.

A question is first looked up **exactly**: the key hashes the normalised question (Unicode
NFKC, case-folded, spaces collapsed, trailing punctuation dropped) together with its
*scope*: the filters (tenant included), ``top_k``, the conversation so far, the request's
sampling overrides, a fingerprint of the settings that shape an answer (retrieval,
generator, sampling, prompt, embedder, index backends) and the *index epoch* (the latest
ingest run in the state database, its status and end). So a reindex, from the API, the
scheduler or the CLI in another process, moves every question to a new scope: answers
cached before it are never served again, and age out. (Instances sharing a Redis cache but
not a data directory do not see each other's reindexes: theirs age out after ``ttl_s``.)

On an exact miss it is looked up **semantically**: the question's embedding (the
deployment's embedder) against the answers cached in the same scope, served when the cosine
is at least ``cache.semantic_threshold`` (0.95) and both questions name the same numbers
("Python 3.11" is not "Python 3.12", which MiniLM puts at 0.93).

Only complete answers are stored: ``finish_reason`` ``stop``, not degraded (extractive
fallback), not blocked, not empty. A hit is replayed by :class:`rag.answer.Answerer` as the
usual events (sources, the text as one delta, done) with ``cache: "hit"`` or ``"semantic"``.

Two stores implement :class:`rag.types.AnswerCache`:

- :class:`MemoryAnswerCache` (``cache.backend: memory``, the embedded default): this
  process's dict, least recently used dropped past ``cache.max_entries``, each entry expiring
  after ``cache.ttl_s``; a semantic lookup is one matrix product over the scope's entries.
- :class:`RedisAnswerCache` (``cache.backend: redis``): shared by workers and instances.
  Entries are hashes that expire after ``ttl_s``; each scope keeps a list of its
  ``cache.semantic_scan`` (256) most recently stored keys, and a semantic lookup fetches
  those vectors (float16, 768 bytes each for 384 dimensions) and compares them here. So a
  paraphrase of an answer older than the scope's last 256 is not found semantically (an
  exact repeat still is). Redis 7 from Debian has no vector search (no RediSearch module),
  hence the bounded scan.

Example::

    cache = make_answer_cache(services, salt=generator.name)      # None when cache.backend is off
    lookup = cache.lookup("How do I read a file?", filters=Filters(), history=(), top_k=None)
    if lookup.answer is None:
        ...  # generate, then
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
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import numpy as np

from rag.errors import ConfigError
from rag.lang import detect_lang, ranks
from rag.types import AnswerCache, Citation, Filters

if TYPE_CHECKING:
    from rag.config import CacheSettings, Settings
    from rag.services import Services

__all__ = ["CachedAnswer", "Lookup", "MemoryAnswerCache", "RedisAnswerCache", "AnswerCacheLayer",
           "make_answer_cache", "normalise_question", "config_fingerprint", "index_epoch"]

log = logging.getLogger(__name__)
_TRAILING = re.compile(r"[\s?？!！.。,，;；:：、…]+$")
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")


def normalise_question(question: str) -> str:
    """The form two questions must share to be the same question to the exact cache."""
    text = unicodedata.normalize("NFKC", question).casefold()
    return _TRAILING.sub("", " ".join(text.split()))


def _numbers(normalised: str) -> list[str]:
    return sorted(_NUMBER.findall(normalised))


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
    question: str = ""  # normalised; the semantic lookup compares its numbers
    created: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "sources": [_citation_dict(c) for c in self.sources],
                "citations": [_citation_dict(c) for c in self.citations], "finish_reason": self.finish_reason,
                "usage": dict(self.usage), "question": self.question, "created": self.created}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CachedAnswer:
        return cls(d["text"], tuple(_citation(c) for c in d.get("sources", ())),
                   tuple(_citation(c) for c in d.get("citations", ())), d.get("finish_reason", "stop"),
                   dict(d.get("usage", {})), d.get("question", ""), float(d.get("created", 0.0)))


@dataclass(slots=True)
class Lookup:
    """The outcome of :meth:`AnswerCacheLayer.lookup`; pass it to :meth:`AnswerCacheLayer.store` on a miss."""

    key: str
    scope: str
    question: str
    kind: str = "miss"  # hit | semantic | miss
    answer: CachedAnswer | None = None
    similarity: float | None = None
    vector: np.ndarray | None = None
    timings: dict[str, float] = field(default_factory=dict)


# -- the stores ------------------------------------------------------------------------------------
@dataclass(slots=True)
class _Entry:
    value: dict[str, Any]
    expires: float
    scope: str | None
    vector: np.ndarray | None


class MemoryAnswerCache:
    """This process's answers: an LRU dict with per-entry expiry, and per-scope vectors for
    the semantic lookup. Thread-safe (lookups run in worker threads)."""

    def __init__(self, max_entries: int = 10_000, ttl_s: float = 3600, clock: Callable[[], float] = time.time) -> None:
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self.clock = clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._scopes: dict[str, dict[str, np.ndarray]] = {}
        self._matrices: dict[str, tuple[list[str], np.ndarray]] = {}  # scope -> (keys, vectors), until it changes
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            if entry.expires <= self.clock():
                self._drop(key)
                return None
            self._entries.move_to_end(key)
            return entry.value

    def put(self, key: str, value: dict[str, Any], ttl_s: float | None = None, *,
            scope: str | None = None, vector: np.ndarray | None = None) -> None:
        with self._lock:
            self._drop(key)
            self._entries[key] = _Entry(value, self.clock() + (ttl_s or self.ttl_s), scope, vector)
            if scope is not None and vector is not None:
                self._scopes.setdefault(scope, {})[key] = np.asarray(vector, dtype=np.float32)
                self._matrices.pop(scope, None)
            while len(self._entries) > self.max_entries:
                self._drop(next(iter(self._entries)))

    def nearest(self, scope: str, vector: np.ndarray, threshold: float, limit: int = 3) -> list[tuple[dict[str, Any], float]]:
        with self._lock:
            members = self._scopes.get(scope)
            if not members:
                return []
            cached = self._matrices.get(scope)
            if cached is None:
                keys = list(members)
                cached = self._matrices[scope] = (keys, np.stack([members[k] for k in keys]))
            keys, matrix = cached
            scores = matrix @ np.asarray(vector, dtype=np.float32)
            now, out = self.clock(), []
            for i in np.argsort(-scores)[: limit * 4]:
                if scores[i] < threshold or len(out) >= limit:
                    break
                entry = self._entries.get(keys[i])
                if entry is not None and entry.expires > now:
                    self._entries.move_to_end(keys[i])
                    out.append((entry.value, float(scores[i])))
            return out

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._scopes.clear()
            self._matrices.clear()

    def _drop(self, key: str) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None and entry.scope is not None:
            members = self._scopes.get(entry.scope)
            if members is not None and members.pop(key, None) is not None:
                self._matrices.pop(entry.scope, None)
                if not members:
                    del self._scopes[entry.scope]


class RedisAnswerCache:
    """Answers in Redis, shared by every worker and instance (see the module docstring).

    Keys: ``<prefix>:e:<key>`` a hash (``a`` the answer's JSON, ``v`` its question vector as
    float16), and ``<prefix>:s:<scope>`` a list of the scope's most recent keys (at most
    ``semantic_scan``); both expire ``ttl_s`` after they were last written.
    """

    def __init__(self, url: str, ttl_s: float = 3600, *, prefix: str = "ragqa:cache",
                 semantic_scan: int = 256) -> None:
        import redis

        self.url = url
        self.ttl_s = ttl_s
        self.prefix = prefix
        self.semantic_scan = semantic_scan
        self._redis = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)

    def _entry(self, key: str) -> str:
        return f"{self.prefix}:e:{key}"

    def _scope(self, scope: str) -> str:
        return f"{self.prefix}:s:{scope}"

    def get(self, key: str) -> dict[str, Any] | None:
        raw = self._redis.hget(self._entry(key), "a")
        return json.loads(raw) if raw is not None else None

    def put(self, key: str, value: dict[str, Any], ttl_s: float | None = None, *,
            scope: str | None = None, vector: np.ndarray | None = None) -> None:
        ms = max(1, int((ttl_s or self.ttl_s) * 1000))
        fields: dict[str, Any] = {"a": json.dumps(value, ensure_ascii=False, separators=(",", ":"))}
        if vector is not None:
            fields["v"] = np.asarray(vector, dtype=np.float16).tobytes()
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(self._entry(key))
            pipe.hset(self._entry(key), mapping=fields)
            pipe.pexpire(self._entry(key), ms)
            if scope is not None and vector is not None:
                pipe.lrem(self._scope(scope), 0, key)
                pipe.lpush(self._scope(scope), key)
                pipe.ltrim(self._scope(scope), 0, self.semantic_scan - 1)
                pipe.pexpire(self._scope(scope), ms)
            pipe.execute()

    def nearest(self, scope: str, vector: np.ndarray, threshold: float, limit: int = 3) -> list[tuple[dict[str, Any], float]]:
        keys = [k.decode() for k in self._redis.lrange(self._scope(scope), 0, self.semantic_scan - 1)]
        if not keys:
            return []
        with self._redis.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.hget(self._entry(key), "v")
            raws = pipe.execute()
        live = [(k, np.frombuffer(raw, dtype=np.float16)) for k, raw in zip(keys, raws, strict=True)
                if raw is not None]
        want = np.asarray(vector, dtype=np.float32)
        live = [(k, v) for k, v in live if v.shape == want.shape]
        if not live:
            return []
        scores = np.stack([v for _, v in live]).astype(np.float32) @ want
        best = [i for i in np.argsort(-scores)[:limit] if scores[i] >= threshold]
        out = []
        for i in best:
            value = self.get(live[i][0])
            if value is not None:  # (it may have expired since)
                out.append((value, float(scores[i])))
        return out

    def clear(self) -> None:
        batch = []
        for key in self._redis.scan_iter(match=f"{self.prefix}:*", count=1000):
            batch.append(key)
            if len(batch) >= 1000:
                self._redis.unlink(*batch)
                batch = []
        if batch:
            self._redis.unlink(*batch)

    def close(self) -> None:
        self._redis.close()


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
    return _digest(json.dumps(parts, sort_keys=True, default=str))


def index_epoch(services: Services) -> str:
    """Changes whenever an ingest run starts or ends (any source, any process on this data dir)."""
    runs = services.state.runs(limit=1)
    if not runs:
        return "none"
    run = runs[0]
    return f"{run['id']}:{run['status']}:{run.get('finished_at')}"


class AnswerCacheLayer:
    """Keys, scopes and the exact-then-semantic lookup, over any :class:`~rag.types.AnswerCache`.

    ``embed`` gives a question's unit vector, or ``None`` for a question it cannot rank (then,
    like with no ``embed`` at all, the lookup is exact only); ``epoch`` the index
    epoch (see :func:`index_epoch`). Both are called in :meth:`lookup`, which does I/O and
    model work: call it from a worker thread in async code.
    """

    def __init__(self, store: AnswerCache, *, ttl_s: float = 3600, semantic_threshold: float = 0.95,
                 embed: Callable[[str], np.ndarray | None] | None = None, fingerprint: str = "",
                 epoch: Callable[[], str] = lambda: "", default_top_k: int = 8) -> None:
        self.backend = store
        self.ttl_s = ttl_s
        self.semantic_threshold = semantic_threshold
        self.embed = embed
        self.fingerprint = fingerprint
        self.epoch = epoch
        self.default_top_k = default_top_k

    def scope(self, *, filters: Filters | None, history: Sequence[Mapping[str, str]], top_k: int | None,
              overrides: Mapping[str, Any] | None) -> str:
        parts = {
            "config": self.fingerprint,
            "epoch": self.epoch(),
            "filters": asdict(filters or Filters()),
            "top_k": top_k or self.default_top_k,
            "history": [[t.get("role", ""), t.get("content", "")] for t in history],
            "overrides": {k: v for k, v in (overrides or {}).items() if v is not None},
        }
        return _digest(json.dumps(parts, sort_keys=True, default=str))

    def lookup(self, question: str, *, filters: Filters | None = None, history: Sequence[Mapping[str, str]] = (),
               top_k: int | None = None, overrides: Mapping[str, Any] | None = None) -> Lookup:
        started = time.perf_counter()
        scope = self.scope(filters=filters, history=history, top_k=top_k, overrides=overrides)
        normalised = normalise_question(question)
        found = Lookup(_digest(scope, normalised), scope, normalised)
        value = self.backend.get(found.key)
        if value is not None:
            found.kind, found.answer, found.similarity = "hit", CachedAnswer.from_dict(value), 1.0
        elif self.embed is not None and (vector := self._embed(question, found)) is not None:
            for value, score in self.backend.nearest(scope, vector, self.semantic_threshold):
                answer = CachedAnswer.from_dict(value)
                if _numbers(answer.question) == _numbers(normalised):
                    found.kind, found.answer, found.similarity = "semantic", answer, score
                    break
        found.timings["cache_ms"] = (time.perf_counter() - started) * 1000
        return found

    def _embed(self, question: str, found: Lookup) -> np.ndarray | None:
        assert self.embed is not None
        started = time.perf_counter()
        vector = self.embed(question)
        if vector is None:
            return None
        found.vector = np.asarray(vector, dtype=np.float32)
        found.timings["embed_ms"] = (time.perf_counter() - started) * 1000
        return found.vector

    def store(self, lookup: Lookup, answer: CachedAnswer) -> None:
        answer = CachedAnswer(answer.text, answer.sources, answer.citations, answer.finish_reason, answer.usage,
                              lookup.question, time.time())
        self.backend.put(lookup.key, answer.to_dict(), self.ttl_s, scope=lookup.scope if lookup.vector is not None
                        else None, vector=lookup.vector)

    def clear(self) -> None:
        self.backend.clear()


def make_answer_cache(services: Services, *, salt: str = "",
                      settings: CacheSettings | None = None) -> AnswerCacheLayer | None:
    """The cache ``cache.*`` settings ask for; ``None`` when ``cache.backend`` is ``off``.

    ``salt`` enters the fingerprint (the answerer passes its generator's name).
    """
    cfg = settings or services.settings.cache
    if cfg.backend == "off":
        return None
    store: AnswerCache
    if cfg.backend == "memory":
        store = MemoryAnswerCache(cfg.max_entries, cfg.ttl_s)
    else:
        url = cfg.redis_url or services.settings.serve.redis_url
        if not url:
            raise ConfigError("cache.backend is redis but neither cache.redis_url nor serve.redis_url is set")
        store = RedisAnswerCache(url, cfg.ttl_s, prefix=cfg.prefix, semantic_scan=cfg.semantic_scan)

    def embed(question: str) -> np.ndarray | None:
        """The question's embedding; ``None`` when the model does not rank its language (an
        English-only model finds unrelated Chinese questions near-identical)."""
        embedder = services.embedder
        return embedder.embed_query(question) if ranks(embedder, detect_lang(question)) else None

    return AnswerCacheLayer(store, ttl_s=cfg.ttl_s, semantic_threshold=cfg.semantic_threshold,
                            embed=embed if cfg.semantic else None,
                            fingerprint=config_fingerprint(services.settings, salt),
                            epoch=lambda: index_epoch(services), default_top_k=services.settings.retrieval.top_k)
