"""Answer records and user feedback, for comparing the arms of an experiment.

Every answer the service gives leaves a short record under its answer id: its versions
(profile, model, quantization, prompt version, route, arm), the experiment, and what the
arms are compared on (total time, time to first token, tokens/s, whether it abstained,
whether it cited anything). Feedback (``POST /v1/feedback``: up or down, an optional
comment) is stored with the versions of the answer it rates, looked up by that id; an id
that is not (or no longer) recorded is unknown. :func:`summarise` turns both into the
per-arm table of ``ragqa experiment report``.

Records live in Redis when ``serve.redis_url`` is set (every worker and instance sees every
answer; each record expires after ``experiment.records_ttl_s``), else in the SQLite file
``<data_dir>/experiments.db`` (WAL, shared by the workers on this data directory). Feedback
is kept until deleted.

Example::

    records = answer_records(settings)
    records.put({"answer_id": "ans-1", "experiment": "x", "arm": "small", "versions": {...}, "total_ms": 812})
    records.add_feedback(feedback_record(records.get("ans-1"), "up", "spot on"))
    print(summarise(records.answers(), records.feedback()))
"""

from __future__ import annotations

import json
import sqlite3
import statistics
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from rag.config import Settings
from rag.errors import BackendUnavailable

__all__ = ["AnswerRecords", "SQLiteRecords", "RedisRecords", "answer_records", "feedback_record", "summarise"]

MAX_FEEDBACK = 100_000  # Redis: the newest feedback kept


class AnswerRecords(Protocol):
    where: str

    def put(self, record: Mapping[str, Any]) -> None: ...

    def get(self, answer_id: str) -> dict[str, Any] | None: ...

    def add_feedback(self, feedback: Mapping[str, Any]) -> None: ...

    def answers(self) -> list[dict[str, Any]]: ...

    def feedback(self) -> list[dict[str, Any]]: ...

    def close(self) -> None: ...


def feedback_record(answer: Mapping[str, Any], rating: str, comment: str | None = None,
                    caller: str | None = None) -> dict[str, Any]:
    """Feedback on ``answer`` (its record), carrying the answer's versions and arm."""
    return {"answer_id": answer["answer_id"], "time": time.time(), "rating": rating, "comment": comment,
            "caller": caller, "experiment": answer.get("experiment"), "arm": answer.get("arm"),
            "versions": answer.get("versions"), "route": answer.get("route")}


class SQLiteRecords:
    """Records in one SQLite file; safe across threads and processes (WAL, a busy timeout)."""

    def __init__(self, path: Path, ttl_s: float) -> None:
        self.path, self.ttl_s = Path(path), ttl_s
        self.where = str(self.path)
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._pruned = 0.0

    @property
    def _db(self) -> sqlite3.Connection:
        """The connection, opened on first use (a server that never answers makes no file)."""
        if self._conn is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, timeout=10, check_same_thread=False, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("CREATE TABLE IF NOT EXISTS answers (answer_id TEXT PRIMARY KEY, time REAL NOT NULL, "
                       "record TEXT NOT NULL)")
            db.execute("CREATE INDEX IF NOT EXISTS answers_time ON answers (time)")
            db.execute("CREATE TABLE IF NOT EXISTS feedback (id INTEGER PRIMARY KEY AUTOINCREMENT, "
                       "answer_id TEXT NOT NULL, time REAL NOT NULL, record TEXT NOT NULL)")
            self._conn = db
        return self._conn

    def put(self, record: Mapping[str, Any]) -> None:
        now = time.time()
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO answers VALUES (?, ?, ?)",
                             (record["answer_id"], record.get("time", now), json.dumps(record, default=str)))
            if now - self._pruned > 60:  # expired records go once a minute, not on every answer
                self._db.execute("DELETE FROM answers WHERE time < ?", (now - self.ttl_s,))
                self._pruned = now

    def get(self, answer_id: str) -> dict[str, Any] | None:
        with self._lock:
            row = self._db.execute("SELECT record FROM answers WHERE answer_id = ? AND time >= ?",
                                   (answer_id, time.time() - self.ttl_s)).fetchone()
        return None if row is None else json.loads(row[0])

    def add_feedback(self, feedback: Mapping[str, Any]) -> None:
        with self._lock:
            self._db.execute("INSERT INTO feedback (answer_id, time, record) VALUES (?, ?, ?)",
                             (feedback["answer_id"], feedback["time"], json.dumps(feedback, default=str)))

    def answers(self) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._db.execute("SELECT record FROM answers WHERE time >= ? ORDER BY time",
                                    (time.time() - self.ttl_s,)).fetchall()
        return [json.loads(r[0]) for r in rows]

    def feedback(self) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._db.execute("SELECT record FROM feedback ORDER BY id").fetchall()
        return [json.loads(r[0]) for r in rows]

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


class RedisRecords:
    """Records in Redis: ``<prefix>:answer:<id>`` (expiring) and the list ``<prefix>:feedback``."""

    def __init__(self, url: str, prefix: str, ttl_s: float) -> None:
        import redis

        self.url, self.prefix, self.ttl_s = url, prefix, ttl_s
        self.where = f"Redis {prefix}:*"
        self._redis = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)

    def _call(self, fn: Any, *args: Any) -> Any:
        import redis

        try:
            return fn(*args)
        except redis.RedisError as exc:
            raise BackendUnavailable(f"cannot reach the answer records in Redis ({self.url}): {exc}") from exc

    def put(self, record: Mapping[str, Any]) -> None:
        self._call(self._redis.set, f"{self.prefix}:answer:{record['answer_id']}",
                   json.dumps(record, default=str), int(self.ttl_s))

    def get(self, answer_id: str) -> dict[str, Any] | None:
        raw = self._call(self._redis.get, f"{self.prefix}:answer:{answer_id}")
        return None if raw is None else json.loads(raw)

    def add_feedback(self, feedback: Mapping[str, Any]) -> None:
        key = f"{self.prefix}:feedback"
        pipe = self._redis.pipeline()
        pipe.rpush(key, json.dumps(feedback, default=str))
        pipe.ltrim(key, -MAX_FEEDBACK, -1)
        self._call(pipe.execute)

    def answers(self) -> list[dict[str, Any]]:
        keys = list(self._call(lambda: list(self._redis.scan_iter(match=f"{self.prefix}:answer:*", count=1000))))
        out: list[dict[str, Any]] = []
        for i in range(0, len(keys), 500):
            out += [json.loads(v) for v in self._call(self._redis.mget, keys[i:i + 500]) if v is not None]
        return sorted(out, key=lambda r: r.get("time", 0))

    def feedback(self) -> list[dict[str, Any]]:
        return [json.loads(v) for v in self._call(self._redis.lrange, f"{self.prefix}:feedback", 0, -1)]

    def close(self) -> None:
        self._redis.close()


def answer_records(settings: Settings) -> AnswerRecords:
    """Redis (``serve.redis_url``) when set, else ``<data_dir>/experiments.db``."""
    cfg = settings.experiment
    if settings.serve.redis_url:
        return RedisRecords(settings.serve.redis_url, cfg.redis_prefix, cfg.records_ttl_s)
    return SQLiteRecords(settings.data_dir / "experiments.db", cfg.records_ttl_s)


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return round(values[0], 1)
    return round(statistics.quantiles(values, n=100, method="inclusive")[int(q * 100) - 1], 1)


def summarise(answers: Iterable[Mapping[str, Any]], feedback: Iterable[Mapping[str, Any]],
              experiment: str | None = None) -> list[dict[str, Any]]:
    """Per experiment and arm: answers, latency and TTFT (p50, p95 ms; generated answers only,
    not cache hits), tokens/s (median), abstention and citation compliance (shares of
    answers), and feedback (up, down, share up). Answers outside any experiment are the arm
    ``None``."""
    groups: dict[tuple[str | None, str | None], dict[str, Any]] = {}

    def group(rec: Mapping[str, Any]) -> dict[str, Any] | None:
        key = (rec.get("experiment"), rec.get("arm"))
        if experiment is not None and key[0] != experiment:
            return None
        return groups.setdefault(key, {"total": [], "ttft": [], "tps": [], "answers": 0, "cached": 0,
                                       "abstained": 0, "cited": 0, "up": 0, "down": 0, "profiles": set()})

    for rec in answers:
        g = group(rec)
        if g is None:
            continue
        g["answers"] += 1
        g["abstained"] += bool(rec.get("abstained"))
        g["cited"] += bool(rec.get("cited"))
        g["profiles"].add((rec.get("versions") or {}).get("profile"))
        if rec.get("cache") not in (None, "miss"):
            g["cached"] += 1
            continue
        for name, field in (("total", "total_ms"), ("ttft", "ttft_ms"), ("tps", "tokens_per_s")):
            if rec.get(field) is not None:
                g[name].append(float(rec[field]))
    for fb in feedback:
        g = group(fb)
        if g is not None and fb.get("rating") in ("up", "down"):
            g[fb["rating"]] += 1
    rows = []
    for (exp, arm), g in sorted(groups.items(), key=lambda kv: (str(kv[0][0]), str(kv[0][1]))):
        n, rated = g["answers"], g["up"] + g["down"]
        rows.append({
            "experiment": exp, "arm": arm, "profiles": sorted(p for p in g["profiles"] if p), "answers": n,
            "cached": g["cached"], "latency_p50_ms": _quantile(g["total"], 0.5),
            "latency_p95_ms": _quantile(g["total"], 0.95), "ttft_p50_ms": _quantile(g["ttft"], 0.5),
            "tokens_per_s": round(statistics.median(g["tps"]), 1) if g["tps"] else None,
            "abstention": round(g["abstained"] / n, 4) if n else None,
            "citation_compliance": round(g["cited"] / n, 4) if n else None,
            "feedback_up": g["up"], "feedback_down": g["down"],
            "feedback_up_share": round(g["up"] / rated, 4) if rated else None})
    return rows
