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
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from rag.config import SourceConfig
from rag.errors import ConfigError
from rag.types import Chunk, Document, Trust

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
"""


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
    """SQLite state for sources, documents, chunks and runs. Safe to share between threads."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.RLock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

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
        """Record a (re)indexed document and replace its chunk rows, in one transaction."""
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
        self._write(statements)

    def touch_document(self, doc_id: str, etag: str | None, last_modified: str | None,
                       fetched_at: datetime | None) -> None:
        """Update only the validators of a document whose text did not change."""
        self._write(
            [(
                "UPDATE documents SET etag = ?, last_modified = ?, fetched_at = ? WHERE id = ?",
                (etag, last_modified, _dt(fetched_at), doc_id),
            )]
        )

    def delete_documents(self, doc_ids: Iterable[str]) -> None:
        ids = list(doc_ids)
        statements: list[tuple[str, Sequence[Any]]] = []
        for doc_id in ids:
            statements.append(("DELETE FROM chunks WHERE doc_id = ?", (doc_id,)))
            statements.append(("DELETE FROM documents WHERE id = ?", (doc_id,)))
        if statements:
            self._write(statements)

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
        sql, args = "SELECT data FROM chunks", ()
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

    def finish_run(self, run_id: int, status: str, report: dict[str, Any]) -> None:
        self._write([(
            "UPDATE runs SET finished_at = ?, status = ?, report = ? WHERE id = ?",
            (time.time(), status, json.dumps(report, default=str), run_id),
        )])

    def last_run(self, source: str) -> dict[str, Any] | None:
        rows = self._rows(
            "SELECT * FROM runs WHERE source = ? ORDER BY id DESC LIMIT 1", (source,)
        )
        return dict(rows[0]) if rows else None

    def last_success(self, source: str) -> float | None:
        rows = self._rows(
            "SELECT MAX(finished_at) AS t FROM runs WHERE source = ? AND status = 'ok'", (source,)
        )
        return rows[0]["t"] if rows and rows[0]["t"] is not None else None

    def runs(self, source: str | None = None, limit: int = 20) -> list[dict[str, Any]]:
        sql, args = "SELECT * FROM runs", ()
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


