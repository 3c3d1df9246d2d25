"""The answer cache's two stores (:class:`rag.types.AnswerCache`): this process's memory, and Redis.

Both keep, beside each answer, a **dependency index**: for every chunk an answer's context
held (``deps``) and every source it came from (``sources``), the keys of the answers that
depend on it. :meth:`apply` reads changes of the index's change log
(:class:`rag.types.IndexChange`) in order and drops exactly the answers built from a chunk
that left the index (its text changed, or its document went), or from a purged source.

Each store also keeps a **clock** (:class:`rag.types.CacheGenerations`): it moves at every
applied change, and remembers when each source last gained chunks. An answer records the
clock of its lookup, so the cache layer can tell an answer that may be missing newer content
(``gen < added``) and have it checked (:mod:`rag.cache`). A store refuses an answer whose
clock moved between its lookup and its store: the index changed under it.

A Redis store that cannot be reached fails fast (:class:`rag.errors.BackendUnavailable`) and
is not tried again for ``retry_s``; the cache layer's callers answer without the cache
meanwhile, and ``answer_cache_errors_total`` counts it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rag.errors import BackendUnavailable
from rag.metrics import CACHE_DROPPED, CACHE_ERRORS
from rag.types import CacheGenerations, IndexChange

__all__ = ["MemoryAnswerCache", "RedisAnswerCache"]

log = logging.getLogger(__name__)


def _dep_keys(deps: Sequence[str], sources: Sequence[str]) -> list[str]:
    return [f"c:{d}" for d in deps] + [f"s:{s}" for s in sources]


def _tallies(counts: Mapping[str, int]) -> dict[str, Any]:
    """The counts part of :meth:`stats`, the same for every store."""
    return {"lookups": {k: counts.get(k, 0) for k in ("hit", "semantic", "miss")},
            "rechecks": {k: counts.get(k, 0) for k in ("kept", "stale")}, "dropped": counts.get("dropped", 0)}


def _stale_deps(change: IndexChange) -> list[str]:
    """The dependency keys whose answers a change drops (not for a purge of everything)."""
    if change.kind == "purge":
        return [f"s:{change.source}"]
    return [f"c:{c}" for c in change.removed]


@dataclass(slots=True)
class _Entry:
    value: dict[str, Any]
    expires: float
    scope: str | None
    vector: np.ndarray | None
    deps: list[str]


class MemoryAnswerCache:
    """This process's answers: an LRU dict with per-entry expiry, per-scope vectors for the
    semantic lookup, and the dependency index. Thread-safe (lookups run in worker threads).

    Not ``cachetools.TLRUCache``: every removal must also leave the dependency index and the
    scope's vectors, and TLRUCache removes entries inside every insert (``expire``, then
    ``popitem`` on overflow), so both would need overriding: more code than the OrderedDict."""

    def __init__(self, max_entries: int = 10_000, ttl_s: float = 86_400, clock: Callable[[], float] = time.time) -> None:
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self.clock = clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._scopes: dict[str, dict[str, np.ndarray]] = {}
        self._matrices: dict[str, tuple[list[str], np.ndarray]] = {}  # scope -> (keys, vectors), until it changes
        self._deps: dict[str, set[str]] = {}  # "c:<chunk id>" | "s:<source>" -> keys
        self._now = 0
        self._added: dict[str, int] = {}
        self._cursors: dict[str, int] = {}
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str, sources: Sequence[str] = ()) -> tuple[dict[str, Any] | None, CacheGenerations]:
        with self._lock:
            added = self._added if not sources else {s: self._added.get(s, 0) for s in sources}
            clock = CacheGenerations(self._now, max(added.values(), default=0))
            entry = self._entries.get(key)
            if entry is None:
                return None, clock
            if entry.expires <= self.clock():
                self._drop(key)
                return None, clock
            self._entries.move_to_end(key)
            return entry.value, clock

    def put(self, key: str, value: dict[str, Any], ttl_s: float | None = None, *,
            scope: str | None = None, vector: np.ndarray | None = None, deps: Sequence[str] = (),
            sources: Sequence[str] = (), generation: int | None = None) -> bool:
        with self._lock:
            if generation is not None and generation != self._now:
                return False
            self._drop(key)
            dep_keys = _dep_keys(deps, sources)
            self._entries[key] = _Entry(value, self.clock() + (ttl_s or self.ttl_s), scope, vector, dep_keys)
            for dep in dep_keys:
                self._deps.setdefault(dep, set()).add(key)
            if scope is not None and vector is not None:
                self._scopes.setdefault(scope, {})[key] = np.asarray(vector, dtype=np.float32)
                self._matrices.pop(scope, None)
            while len(self._entries) > self.max_entries:
                self._drop(next(iter(self._entries)))
            return True

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
            now, out = self.clock(), []  # type: ignore[var-annotated]
            for i in np.argsort(-scores)[: limit * 4]:
                if scores[i] < threshold or len(out) >= limit:
                    break
                entry = self._entries.get(keys[i])
                if entry is not None and entry.expires > now:
                    self._entries.move_to_end(keys[i])
                    out.append((entry.value, float(scores[i])))
            return out

    def apply(self, changes: Sequence[IndexChange]) -> int:
        dropped = 0
        with self._lock:
            for change in changes:
                self._now += 1
                if change.kind == "purge" and not change.source:
                    dropped += len(self._entries)
                    self._clear()
                    continue
                for dep in _stale_deps(change):
                    for key in list(self._deps.get(dep, ())):
                        dropped += self._drop(key)
                if change.added or change.kind == "purge":
                    self._added[change.source] = self._now
            self._counts["dropped"] += dropped
        if dropped:
            CACHE_DROPPED.inc(dropped)
        return dropped

    def cursor(self, log_id: str) -> int | None:
        return self._cursors.get(log_id)

    def set_cursor(self, log_id: str, seq: int) -> None:
        self._cursors[log_id] = seq

    def count(self, kind: str) -> None:
        with self._lock:
            self._counts[kind] += 1

    def stats(self) -> dict[str, Any]:
        with self._lock:
            size = sum(len(json.dumps(e.value, ensure_ascii=False)) + (e.vector.nbytes if e.vector is not None else 0)
                       for e in self._entries.values())
            return {"backend": "memory", "entries": len(self._entries), "bytes": size, "generation": self._now,
                    **_tallies(self._counts)}

    def clear(self) -> None:
        with self._lock:
            self._now += 1  # an answer looked up before the clear is not stored after it
            self._clear()

    def _clear(self) -> None:
        self._entries.clear()
        self._scopes.clear()
        self._matrices.clear()
        self._deps.clear()

    def _drop(self, key: str) -> int:
        entry = self._entries.pop(key, None)
        if entry is None:
            return 0
        for dep in entry.deps:
            keys = self._deps.get(dep)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._deps[dep]
        if entry.scope is not None:
            members = self._scopes.get(entry.scope)
            if members is not None and members.pop(key, None) is not None:
                self._matrices.pop(entry.scope, None)
                if not members:
                    del self._scopes[entry.scope]
        return 1


class RedisAnswerCache:
    """Answers in Redis, shared by every worker and instance (see :mod:`rag.cache`).

    Keys under ``prefix``: ``e:<key>`` a hash (``a`` the answer's JSON, ``v`` its question
    vector as float16); ``s:<scope>`` a list of the scope's most recent keys (at most
    ``semantic_scan``); ``d:c:<chunk id>`` and ``d:s:<source>`` the sets of keys that depend
    on a chunk or a source; all expire ``ttl_s`` after they were last written. And, kept:
    ``gen`` the clock, ``added`` (source -> clock of its last addition), ``cursor`` (change
    log id -> last applied sequence number) and ``stats``.
    """

    RETRY_S = 1.0

    def __init__(self, url: str, ttl_s: float = 86_400, *, prefix: str = "ragqa:cache",
                 semantic_scan: int = 256, timeout_s: float = 0.5) -> None:
        import redis

        self.url = url
        self.ttl_s = ttl_s
        self.prefix = prefix
        self.semantic_scan = semantic_scan
        self._redis = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        self._retry_at = 0.0
        self._down = False
        self._counts: Counter[str] = Counter()  # lookups counted since the last round trip, sent with the next
        self._counts_lock = threading.Lock()

    def _k(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    @contextlib.contextmanager
    def _guard(self, op: str) -> Iterator[None]:
        """Redis errors as :class:`BackendUnavailable`, and none tried for ``RETRY_S`` after one."""
        import redis

        if time.monotonic() < self._retry_at:
            CACHE_ERRORS.labels(op).inc()
            raise BackendUnavailable(f"answer cache redis at {self.url} is down (retrying every {self.RETRY_S:g} s)")
        try:
            yield
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            CACHE_ERRORS.labels(op).inc()
            self._retry_at = time.monotonic() + self.RETRY_S
            if not self._down:
                log.warning("answer cache redis at %s is down, answering without it: %s", self.url, exc)
            self._down = True
            raise BackendUnavailable(f"answer cache redis at {self.url}: {exc}") from exc
        if self._down:
            log.warning("answer cache redis at %s is back", self.url)
            self._down = False

    def get(self, key: str, sources: Sequence[str] = ()) -> tuple[dict[str, Any] | None, CacheGenerations]:
        with self._guard("get"), self._redis.pipeline(transaction=False) as pipe:
            pipe.hget(self._k("e", key), "a")
            pipe.get(self._k("gen"))
            if sources:
                pipe.hmget(self._k("added"), list(sources))
            else:
                pipe.hvals(self._k("added"))
            self._send_counts(pipe)
            raw, now, added, *_ = pipe.execute()
        clock = CacheGenerations(int(now or 0), max((int(a) for a in added if a is not None), default=0))
        return (json.loads(raw) if raw is not None else None), clock

    def put(self, key: str, value: dict[str, Any], ttl_s: float | None = None, *,
            scope: str | None = None, vector: np.ndarray | None = None, deps: Sequence[str] = (),
            sources: Sequence[str] = (), generation: int | None = None) -> bool:
        import redis

        ms = max(1, int((ttl_s or self.ttl_s) * 1000))
        fields: dict[str, Any] = {"a": json.dumps(value, ensure_ascii=False, separators=(",", ":"))}
        if vector is not None:
            fields["v"] = np.asarray(vector, dtype=np.float16).tobytes()
        entry = self._k("e", key)
        with self._guard("put"), self._redis.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(self._k("gen"))  # apply() moves the clock first: a put racing it is refused
                if generation is not None and int(pipe.get(self._k("gen")) or 0) != generation:
                    return False
                pipe.multi()
                pipe.delete(entry)
                pipe.hset(entry, mapping=fields)  # type: ignore[arg-type]
                pipe.pexpire(entry, ms)
                for dep in _dep_keys(deps, sources):
                    pipe.sadd(self._k("d", dep), key)
                    pipe.pexpire(self._k("d", dep), ms)
                if scope is not None and vector is not None:
                    pipe.lrem(self._k("s", scope), 0, key)
                    pipe.lpush(self._k("s", scope), key)
                    pipe.ltrim(self._k("s", scope), 0, self.semantic_scan - 1)
                    pipe.pexpire(self._k("s", scope), ms)
                pipe.execute()
            except redis.WatchError:
                return False
        return True

    def nearest(self, scope: str, vector: np.ndarray, threshold: float, limit: int = 3) -> list[tuple[dict[str, Any], float]]:
        with self._guard("get"):
            keys = [k.decode() for k in self._redis.lrange(self._k("s", scope), 0, self.semantic_scan - 1)]  # type: ignore[union-attr]
            if not keys:
                return []
            with self._redis.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.hget(self._k("e", key), "v")
                raws = pipe.execute()
        live = [(k, np.frombuffer(raw, dtype=np.float16)) for k, raw in zip(keys, raws, strict=True)
                if raw is not None]
        want = np.asarray(vector, dtype=np.float32)
        live = [(k, v) for k, v in live if v.shape == want.shape]
        if not live:
            return []
        scores = np.stack([v for _, v in live]).astype(np.float32) @ want
        best = [i for i in np.argsort(-scores)[:limit] if scores[i] >= threshold]
        if not best:
            return []
        with self._guard("get"), self._redis.pipeline(transaction=False) as pipe:
            for i in best:
                pipe.hget(self._k("e", live[i][0]), "a")
            values = pipe.execute()
        return [(json.loads(v), float(scores[i])) for i, v in zip(best, values, strict=True)
                if v is not None]  # (it may have expired since)

    def apply(self, changes: Sequence[IndexChange]) -> int:
        if not changes:
            return 0
        with self._guard("apply"):
            now = int(self._redis.incrby(self._k("gen"), len(changes)))  # first: in-flight puts are refused
            if any(c.kind == "purge" and not c.source for c in changes):
                dropped = self._clear()
            else:
                deps = [self._k("d", dep) for c in changes for dep in _stale_deps(c)]
                with self._redis.pipeline(transaction=False) as pipe:
                    for dep in deps:
                        pipe.smembers(dep)
                    members = pipe.execute() if deps else []
                keys = {k.decode() for group in members for k in group}
                with self._redis.pipeline(transaction=False) as pipe:
                    if keys:
                        pipe.exists(*[self._k("e", k) for k in keys])
                        pipe.unlink(*[self._k("e", k) for k in keys])
                    if deps:
                        pipe.unlink(*deps)
                    added = {c.source: now for c in changes if c.added or c.kind == "purge"}
                    if added:
                        pipe.hset(self._k("added"), mapping=added)  # type: ignore[arg-type]
                    results = pipe.execute()
                dropped = int(results[0]) if keys else 0
            if dropped:
                self._redis.hincrby(self._k("stats"), "dropped", dropped)
        if dropped:
            CACHE_DROPPED.inc(dropped)
        return dropped

    def cursor(self, log_id: str) -> int | None:
        with self._guard("apply"):
            raw = self._redis.hget(self._k("cursor"), log_id)
        return int(raw) if raw is not None else None

    def set_cursor(self, log_id: str, seq: int) -> None:
        with self._guard("apply"):
            self._redis.hset(self._k("cursor"), log_id, seq)

    def count(self, kind: str) -> None:
        """Counted here, and sent with the next lookup's round trip (no round trip of its own)."""
        with self._counts_lock:
            self._counts[kind] += 1

    def _send_counts(self, pipe: Any) -> None:
        with self._counts_lock:
            counts, self._counts = self._counts, Counter()
        for kind, n in counts.items():
            pipe.hincrby(self._k("stats"), kind, n)

    def stats(self) -> dict[str, Any]:
        with self._guard("stats"):
            with self._redis.pipeline(transaction=False) as pipe:
                self._send_counts(pipe)
                pipe.execute()
            counts = {k.decode(): int(v) for k, v in self._redis.hgetall(self._k("stats")).items()}  # type: ignore[union-attr]
            entries, size = 0, 0
            for key in self._redis.scan_iter(match=self._k("e", "*"), count=1000):
                entries += 1
                size += int(self._redis.memory_usage(key) or 0)
            now = int(self._redis.get(self._k("gen")) or 0)
        return {"backend": "redis", "url": self.url, "prefix": self.prefix, "entries": entries, "bytes": size,
                "generation": now, **_tallies(counts)}

    def clear(self) -> None:
        with self._guard("apply"):
            self._redis.incr(self._k("gen"))
            self._clear()

    def _clear(self) -> int:
        """Drop every answer and index, keeping the clock, cursors and counts; returns the answers dropped."""
        dropped, batch = 0, []
        for pattern in ("e:*", "s:*", "d:*"):
            for key in self._redis.scan_iter(match=self._k(pattern), count=1000):
                dropped += pattern == "e:*"
                batch.append(key)
                if len(batch) >= 1000:
                    self._redis.unlink(*batch)
                    batch = []
        if batch:
            self._redis.unlink(*batch)
        return dropped

    def close(self) -> None:
        self._redis.close()
