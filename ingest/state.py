"""The state database: what was indexed, from where, with which hashes.

One SQLite file under the data directory records sources, documents (with the hash of
their normalised text and the HTTP validators of their last fetch), chunks (id, hash and
text, so any index can be rebuilt or repaired without crawling again) and a log of runs.
The indexes are written before the state, so a run that dies half way is simply redone.

Example::

    state = StateDB(Path(".ragqa/state.db"))
    state.add_source(SourceConfig(name="docs", kind="folder", location="docs"))
    print(state.counts())
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from rag.config import SourceConfig
from rag.errors import ConfigError
from rag.types import Chunk, Document, IndexChange, Trust

__all__ = ["StateDB", "DocState", "chunk_to_json", "chunk_from_json"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sources (
    name TEXT PRIMARY KEY, config TEXT NOT NULL, created_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS documents (
    id TEXT PRIMARY KEY, source TEXT NOT NULL, url TEXT NOT NULL, title TEXT NOT NULL,
    text_hash TEXT NOT NULL, etag TEXT, last_modified TEXT, lang TEXT,
    modified TEXT, published TEXT, fetched_at TEXT, updated_at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS documents_source ON documents(source);
CREATE INDEX IF NOT EXISTS documents_url ON documents(source, url);
CREATE TABLE IF NOT EXISTS chunks (
    id TEXT PRIMARY KEY, doc_id TEXT NOT NULL, source TEXT NOT NULL, ordinal INTEGER NOT NULL,
    hash TEXT NOT NULL, data TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS chunks_doc ON chunks(doc_id);
CREATE INDEX IF NOT EXISTS chunks_source ON chunks(source);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT, source TEXT NOT NULL, mode TEXT NOT NULL,
    started_at REAL NOT NULL, finished_at REAL, status TEXT NOT NULL, report TEXT);
CREATE INDEX IF NOT EXISTS runs_source ON runs(source, started_at);
CREATE TABLE IF NOT EXISTS changes (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, source TEXT NOT NULL, kind TEXT NOT NULL,
    removed TEXT NOT NULL, added INTEGER NOT NULL);
"""
CHANGE_LOG_S = 8 * 86_400
"""How long the change log keeps an entry: longer than an answer can be cached (``cache.ttl_s``
is at most 7 days), so a cache that reads the log never misses a change to an answer it holds."""


@dataclass(frozen=True, slots=True)
class DocState:
    id: str
    url: str
    text_hash: str
    etag: str | None
    last_modified: str | None


def _dt(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def _parse_dt(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def chunk_to_json(chunk: Chunk) -> str:
    data = asdict(chunk)
    data["published"] = _dt(chunk.published)
    data["modified"] = _dt(chunk.modified)
    data["trust"] = int(chunk.trust)
    data["tags"] = list(chunk.tags)
    return json.dumps(data, ensure_ascii=False)


def chunk_from_json(text: str) -> Chunk:
    data = json.loads(text)
    data["published"] = _parse_dt(data.get("published"))
    data["modified"] = _parse_dt(data.get("modified"))
    data["trust"] = Trust(data.get("trust", 1))
    data["tags"] = tuple(data.get("tags", ()))
    return Chunk(**data)


class StateDB:
    """SQLite state for sources, documents, chunks, runs and the change log. Safe to share
    between threads.

    The change log (:class:`rag.types.ChangeLog`) records, in the transaction that replaces or
    deletes a document's chunks, the chunk ids that left the index and how many arrived; the
    answer cache reads it to drop exactly the answers built from changed text.
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.RLock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)
        # A second connection, only for ``PRAGMA data_version``: it moves at every commit of any
        # other connection (this object's writes included), and reading it never waits for a
        # write transaction to finish.
        self._watch = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=30)
        self._watch_lock = threading.Lock()
        self.log_id = self.get_meta("log_id") or self._new_log_id()

    def close(self) -> None:
        with self._lock:
            self._db.close()
        with self._watch_lock:
            self._watch.close()

    def _rows(self, sql: str, args: Sequence[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            cur = self._db.execute(sql, args)
            cur.row_factory = sqlite3.Row
            return cur.fetchall()

    def _write(self, statements: Iterable[tuple[str, Sequence[Any]]]) -> None:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for sql, args in statements:
                    self._db.execute(sql, args)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    # -- meta ---------------------------------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        rows = self._rows("SELECT value FROM meta WHERE key = ?", (key,))
        return rows[0]["value"] if rows else None

    def set_meta(self, key: str, value: str) -> None:
        self._write([("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))])

    # -- sources ------------------------------------------------------------------------
    def add_source(self, cfg: SourceConfig) -> None:
        self._write(
            [
                (
                    "INSERT INTO sources (name, config, created_at) VALUES (?, ?, ?) "
                    "ON CONFLICT(name) DO UPDATE SET config = excluded.config",
                    (cfg.name, cfg.model_dump_json(), time.time()),
                )
            ]
        )

    def remove_source(self, name: str) -> None:
        self._write([("DELETE FROM sources WHERE name = ?", (name,))])

    def sources(self) -> list[SourceConfig]:
        rows = self._rows("SELECT config FROM sources ORDER BY name")
        return [SourceConfig.model_validate_json(r["config"]) for r in rows]

    def source(self, name: str) -> SourceConfig:
        rows = self._rows("SELECT config FROM sources WHERE name = ?", (name,))
        if not rows:
            known = ", ".join(s.name for s in self.sources()) or "none registered"
            raise ConfigError(f"unknown source {name!r} (known: {known})")
        return SourceConfig.model_validate_json(rows[0]["config"])

    # -- documents ----------------------------------------------------------------------
    def documents(self, source: str) -> dict[str, DocState]:
        rows = self._rows(
            "SELECT id, url, text_hash, etag, last_modified FROM documents WHERE source = ?",
            (source,),
        )
        return {r["id"]: DocState(r["id"], r["url"], r["text_hash"], r["etag"], r["last_modified"]) for r in rows}

    def document_row(self, doc_id: str) -> dict[str, Any] | None:
        rows = self._rows("SELECT * FROM documents WHERE id = ?", (doc_id,))
        return dict(rows[0]) if rows else None

    def save_document(self, doc: Document, text_hash: str, etag: str | None,
                      last_modified: str | None, chunks: Sequence[Chunk]) -> None:
        """Record a (re)indexed document and replace its chunk rows, logging the change, in one
        transaction."""
        with self._lock:
            old = set(self.chunk_hashes(doc.id))
            new = {c.id for c in chunks}
            self._write(self._save_statements(doc, text_hash, etag, last_modified, chunks)
                        + self._change(doc.source, "chunks", old - new, len(new - old)))

    def _save_statements(self, doc: Document, text_hash: str, etag: str | None, last_modified: str | None,
                         chunks: Sequence[Chunk]) -> list[tuple[str, Sequence[Any]]]:
        statements: list[tuple[str, Sequence[Any]]] = [
            (
                "INSERT OR REPLACE INTO documents (id, source, url, title, text_hash, etag, "
                "last_modified, lang, modified, published, fetched_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (doc.id, doc.source, doc.url, doc.title, text_hash, etag, last_modified, doc.lang,
                 _dt(doc.modified), _dt(doc.published), _dt(doc.fetched_at), time.time()),
            ),
            ("DELETE FROM chunks WHERE doc_id = ?", (doc.id,)),
        ]
        statements += [
            ("INSERT INTO chunks (id, doc_id, source, ordinal, hash, data) VALUES (?, ?, ?, ?, ?, ?)",
             (c.id, c.doc_id, c.source, c.ordinal, c.hash, chunk_to_json(c)))
            for c in chunks
        ]
        return statements

    def touch_document(self, doc_id: str, etag: str | None, last_modified: str | None,
                       fetched_at: datetime | None) -> None:
        """Update only the validators of a document whose text did not change."""
        self._write(
            [(
                "UPDATE documents SET etag = ?, last_modified = ?, fetched_at = ? WHERE id = ?",
                (etag, last_modified, _dt(fetched_at), doc_id),
            )]
        )

    def delete_documents(self, doc_ids: Iterable[str]) -> int:
        """Delete documents and their chunks, logging the chunks that left, in one transaction;
        returns how many chunks went."""
        ids = list(doc_ids)
        if not ids:
            return 0
        removed = 0
        with self._lock:
            statements: list[tuple[str, Sequence[Any]]] = []
            for doc_id in ids:
                row = self._rows("SELECT source FROM documents WHERE id = ?", (doc_id,))
                chunks = set(self.chunk_hashes(doc_id))
                removed += len(chunks)
                statements += self._change(row[0]["source"] if row else "", "chunks", chunks, 0)
                statements.append(("DELETE FROM chunks WHERE doc_id = ?", (doc_id,)))
                statements.append(("DELETE FROM documents WHERE id = ?", (doc_id,)))
            self._write(statements)
        return removed

    # -- the change log -----------------------------------------------------------------
    def _new_log_id(self) -> str:
        with self._lock:
            self._write([("INSERT OR IGNORE INTO meta (key, value) VALUES ('log_id', ?)", (uuid.uuid4().hex,))])
            return self.get_meta("log_id") or ""

    def _change(self, source: str, kind: str, removed: set[str], added: int) -> list[tuple[str, Sequence[Any]]]:
        if kind == "chunks" and not removed and not added:
            return []  # a reindex that changed nothing logs nothing
        return [("INSERT INTO changes (at, source, kind, removed, added) VALUES (?, ?, ?, ?, ?)",
                 (time.time(), source, kind, json.dumps(sorted(removed)), added))]

    def log_purge(self, source: str | None = None) -> int:
        """Log an operator's purge of the answers built from ``source`` (all answers when
        ``None``); every cache reading the log applies it. Returns its sequence number."""
        with self._lock:
            self._write(self._change(source or "", "purge", set(), 0))
            return self.last_change()

    def change_token(self) -> object:
        """Differs after any commit to the database, by this object or another process; a few
        microseconds, and never waits for a write in progress."""
        with self._watch_lock:
            return self._watch.execute("PRAGMA data_version").fetchone()[0]

    def changes_since(self, seq: int) -> list[IndexChange]:
        rows = self._watched("SELECT seq, source, kind, removed, added FROM changes WHERE seq > ? ORDER BY seq", (seq,))
        return [IndexChange(r[0], r[1], r[2], tuple(json.loads(r[3])), r[4]) for r in rows]

    def change_summary(self, since_s: float = 86_400) -> dict[str, Any]:
        """The change log at a glance: its last sequence number, and what the last ``since_s``
        seconds logged (document changes, chunks removed and added, purges)."""
        row = self._rows(
            "SELECT COUNT(*) FILTER (WHERE kind = 'chunks') AS documents, "
            "COALESCE(SUM(json_array_length(removed)), 0) AS removed, COALESCE(SUM(added), 0) AS added, "
            "COUNT(*) FILTER (WHERE kind = 'purge') AS purges FROM changes WHERE at >= ?", (time.time() - since_s,))[0]
        return {"last_change": self.last_change(), "window_s": since_s, "documents_changed": row["documents"],
                "chunks_removed": row["removed"], "chunks_added": row["added"], "purges": row["purges"]}

    def last_change(self) -> int:
        return int(self._watched("SELECT COALESCE(MAX(seq), 0) FROM changes")[0][0])

    def _watched(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """A read on the watching connection: the answer cache reads the log on the event loop,
        and a reindex holding the main connection for a write must not make it wait (WAL readers
        never wait for a writer)."""
        with self._watch_lock:
            return self._watch.execute(sql, args).fetchall()

    # -- chunks -------------------------------------------------------------------------
    def chunk_hashes(self, doc_id: str) -> dict[str, str]:
        """Chunk id -> text hash for one document."""
        rows = self._rows("SELECT id, hash FROM chunks WHERE doc_id = ?", (doc_id,))
        return {r["id"]: r["hash"] for r in rows}

    def get_chunks(self, chunk_ids: Sequence[str]) -> dict[str, Chunk]:
        out: dict[str, Chunk] = {}
        ids = list(chunk_ids)
        for start in range(0, len(ids), 500):
            part = ids[start:start + 500]
            marks = ",".join("?" * len(part))
            for r in self._rows(f"SELECT id, data FROM chunks WHERE id IN ({marks})", part):
                out[r["id"]] = chunk_from_json(r["data"])
        return out

    def iter_chunks(self, source: str | None = None) -> Iterator[Chunk]:
        sql, args = "SELECT data FROM chunks", tuple[str, ...]()
        if source is not None:
            sql, args = sql + " WHERE source = ?", (source,)
        for r in self._rows(sql + " ORDER BY doc_id, ordinal", args):
            yield chunk_from_json(r["data"])

    # -- runs and counts ----------------------------------------------------------------
    def start_run(self, source: str, mode: str) -> int:
        with self._lock:
            cur = self._db.execute(
                "INSERT INTO runs (source, mode, started_at, status) VALUES (?, ?, ?, 'running')",
                (source, mode, time.time()),
            )
            return int(cur.lastrowid or 0)

    def run_progress(self, run_id: int, progress: dict[str, Any]) -> None:
        """Record a running run's progress (``ingest.progress``), read back by :meth:`last_run`
        as its ``progress`` while its status is ``running``."""
        self._write([("UPDATE runs SET report = ? WHERE id = ? AND status = 'running'",
                      (json.dumps({"progress": progress}), run_id))])

    def finish_run(self, run_id: int, status: str, report: dict[str, Any]) -> None:
        now = time.time()
        self._write([
            ("UPDATE runs SET finished_at = ?, status = ?, report = ? WHERE id = ?",
             (now, status, json.dumps(report, default=str), run_id)),
            ("DELETE FROM changes WHERE at < ?", (now - CHANGE_LOG_S,)),
        ])

    def last_run(self, source: str) -> dict[str, Any] | None:
        rows = self._rows(
            "SELECT * FROM runs WHERE source = ? ORDER BY id DESC LIMIT 1", (source,)
        )
        if not rows:
            return None
        run = dict(rows[0])
        run["progress"] = None
        if run["status"] == "running" and run["report"]:
            run["progress"] = json.loads(run["report"]).get("progress")
        return run

    def source_added(self, source: str) -> float | None:
        """Unix time the source was first added, or None for an unknown source."""
        rows = self._rows("SELECT created_at FROM sources WHERE name = ?", (source,))
        return float(rows[0]["created_at"]) if rows else None

    def last_success(self, source: str) -> float | None:
        rows = self._rows(
            "SELECT MAX(finished_at) AS t FROM runs WHERE source = ? AND status = 'ok'", (source,)
        )
        return rows[0]["t"] if rows and rows[0]["t"] is not None else None

    def runs(self, source: str | None = None, limit: int = 20) -> list[dict[str, Any]]:
        sql, args = "SELECT * FROM runs", tuple[str, ...]()
        if source is not None:
            sql, args = sql + " WHERE source = ?", (source,)
        return [dict(r) for r in self._rows(sql + " ORDER BY id DESC LIMIT ?", (*args, limit))]

    def languages(self) -> dict[str, int]:
        """Documents per detected language (``Document.lang``: ``en``, ``zh``, ``und``, ...)."""
        rows = self._rows("SELECT COALESCE(lang, 'und') AS lang, COUNT(*) AS n FROM documents GROUP BY 1")
        return {row["lang"]: int(row["n"]) for row in rows}

    def counts(self, source: str | None = None) -> tuple[int, int]:
        """(documents, chunks), for one source or all."""
        where, args = ("WHERE source = ?", (source,)) if source else ("", ())
        docs = self._rows(f"SELECT COUNT(*) AS n FROM documents {where}", args)[0]["n"]
        chunks = self._rows(f"SELECT COUNT(*) AS n FROM chunks {where}", args)[0]["n"]
        return int(docs), int(chunks)


