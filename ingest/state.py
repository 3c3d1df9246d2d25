"""The state database: what was indexed, from where, with which hashes.

One SQL database records sources, documents (with the hash of their normalised text and the
HTTP validators of their last fetch), chunks (id, hash and text, so any index can be rebuilt
or repaired without crawling again), a log of runs and the change log. It is SQLite in the
data directory by default (``state.db``), or a PostgreSQL database that several instances
share (``state.url``), through SQLAlchemy. The indexes are written before the state, so a run
that dies half way is simply redone.

Example::

    state = StateDB(Path(".ragqa/state.db"))          # or StateDB("postgresql+psycopg://...")
    state.add_source(SourceConfig(name="docs", kind="folder", location="docs"))
    print(state.counts())
"""

from __future__ import annotations

import contextlib
import functools
import json
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import Connection

from ingest.state_sql import (
    changes,
    create_tables,
    dialect_insert,
    documents,
    make_engine,
    meta,
    runs,
    sources,
    translated,
)
from ingest.state_sql import chunks as _chunks
from rag.config import SourceConfig
from rag.errors import ConfigError
from rag.types import Chunk, Document, IndexChange, Trust

__all__ = ["StateDB", "DocState", "chunk_to_json", "chunk_from_json"]

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


# Statements built once: building and keying a statement costs more than SQLite running it.
_CHUNK_HASHES = sa.select(_chunks.c.id, _chunks.c.hash).where(_chunks.c.doc_id == sa.bindparam("doc_id"))
_DOC_SOURCE = sa.select(documents.c.source).where(documents.c.id == sa.bindparam("doc_id"))
_DELETE_DOC_CHUNKS = sa.delete(_chunks).where(_chunks.c.doc_id == sa.bindparam("doc_id"))
_DELETE_DOC = sa.delete(documents).where(documents.c.id == sa.bindparam("doc_id"))
_TOUCH_DOC = sa.update(documents).where(documents.c.id == sa.bindparam("doc_id")).values(
    etag=sa.bindparam("new_etag"), last_modified=sa.bindparam("new_last_modified"),
    fetched_at=sa.bindparam("new_fetched_at"))
_INSERT_CHUNK = sa.insert(_chunks)
_INSERT_CHANGE = sa.insert(changes)
_INSERT_RUN = sa.insert(runs)
_RUN_PROGRESS = sa.update(runs).where(runs.c.id == sa.bindparam("run_id"), runs.c.status == "running").values(
    report=sa.bindparam("new_report"))
_FINISH_RUN = sa.update(runs).where(runs.c.id == sa.bindparam("run_id")).values(
    finished_at=sa.bindparam("new_finished_at"), status=sa.bindparam("new_status"), report=sa.bindparam("new_report"))
_TRIM_LOG = sa.delete(changes).where(changes.c.at < sa.bindparam("before"))


@functools.lru_cache(maxsize=64)
def _sqlite_sql(n: int) -> str:
    return str(_get_chunks(n).compile(dialect=sqlite.dialect()))


@functools.lru_cache(maxsize=64)
def _get_chunks(n: int) -> sa.Select[Any]:
    """``get_chunks`` of ``n`` ids, one statement per count (an expanding IN is rendered anew
    at every call, which doubles the time of a small hydration on SQLite)."""
    return sa.select(_chunks.c.id, _chunks.c.data).where(_chunks.c.id.in_([sa.bindparam(f"i{k}") for k in range(n)]))
_LAST_CHANGE = sa.select(sa.func.coalesce(sa.func.max(changes.c.seq), 0))
# Every write on PostgreSQL holds this lock until it commits, as BEGIN IMMEDIATE does on SQLite:
# change-log sequence numbers then commit in their order, so a reader that has seen seq N never
# later finds a smaller one appear, and a document's old chunks are read by one writer at a time.
_PG_WRITE_LOCK = sa.select(sa.func.pg_advisory_xact_lock(sa.func.hashtextextended(
    sa.func.concat("ragqa.state.write:", sa.func.current_schema()), 0)))


class StateDB:
    """Sources, documents, chunks, runs and the change log, in SQLite or PostgreSQL. Safe to
    share between threads, and on PostgreSQL between processes and machines.

    The change log (:class:`rag.types.ChangeLog`) records, in the transaction that replaces or
    deletes a document's chunks, the chunk ids that left the index and how many arrived; the
    answer cache reads it to drop exactly the answers built from changed text.

    ``target`` is the SQLite file (a path) or a database URL (``sqlite:///...``,
    ``postgresql+psycopg://user@host:5432/db``; its tables go in the connection's schema).
    """

    def __init__(self, target: Path | str) -> None:
        if isinstance(target, str) and "://" in target:
            url = target
        else:
            url = f"sqlite:///{Path(target)}"
        self.url = url
        self._engine = make_engine(url)
        self._pg = self._engine.dialect.name == "postgresql"
        database = self._engine.url.database
        self.path: Path | None = None if self._pg or not database or database == ":memory:" else Path(database)
        """The SQLite file, or None."""
        self._lock = threading.RLock()
        self._watch_lock = threading.Lock()
        create_tables(self._engine)
        if self._pg:
            # Reads on a pool of their own without pre-ping, a round trip saved on each
            # (see _pg_rows); writes keep pre-ping, as a write is not retried.
            self._reader = make_engine(self.url, pre_ping=False).execution_options(isolation_level="AUTOCOMMIT")
        else:
            # One connection for writes and reads (SQLite has one writer), and a second only for
            # the change log and ``PRAGMA data_version``: that moves at every commit of any other
            # connection (this object's writes included), and reading it never waits for a write
            # transaction to finish (WAL readers never wait for a writer).
            self._db = self._engine.connect()
            self._watch = self._engine.connect()
            self._db_raw: Any = self._db.connection.dbapi_connection  # sqlite3.Connections
            self._watch_raw: Any = self._watch.connection.dbapi_connection
        upsert = dialect_insert(self._engine, documents)
        self._upsert_doc = upsert.on_conflict_do_update(
            index_elements=["id"], set_={c.name: upsert.excluded[c.name] for c in documents.c if c.name != "id"})
        self.log_id = self.get_meta("log_id") or self._new_log_id()

    def close(self) -> None:
        if not self._pg:
            with self._lock:
                self._db.close()
            with self._watch_lock:
                self._watch.close()
        else:
            self._reader.engine.dispose()
        self._engine.dispose()

    # -- connections ----------------------------------------------------------------------
    def _rows(self, stmt: sa.Executable, args: dict[str, Any] | None = None, *,
              watched: bool = False) -> list[sa.Row[Any]]:
        """A read. On SQLite ``watched`` reads the change log on the second connection: the
        answer cache reads it on the event loop, and a reindex holding the main connection for
        a write must not make it wait."""
        if self._pg:
            return self._pg_rows(stmt, args or {})
        lock, conn = (self._watch_lock, self._watch) if watched else (self._lock, self._db)
        with lock:
            return list(conn.execute(stmt, args or {}).fetchall())

    def _pg_rows(self, stmt: sa.Executable, args: dict[str, Any]) -> list[sa.Row[Any]]:
        """A read on a pooled connection. One the server dropped (a restart, an idle timeout)
        fails once, which empties the pool, and the read is retried on a fresh connection."""
        with translated(self._engine):
            for attempt in range(2):
                try:
                    with self._reader.connect() as conn:
                        return list(conn.execute(stmt, args).fetchall())
                except sa.exc.DBAPIError as exc:
                    if attempt or not exc.connection_invalidated:
                        raise
        raise AssertionError("unreachable")

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[Connection]:
        """One write transaction, the only writer of the database while it lasts."""
        if self._pg:
            with translated(self._engine), self._engine.begin() as conn:
                conn.execute(_PG_WRITE_LOCK)
                yield conn
            return
        with self._lock:
            self._db.exec_driver_sql("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.exec_driver_sql("ROLLBACK")
                raise
            self._db.exec_driver_sql("COMMIT")

    # -- meta ---------------------------------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        rows = self._rows(sa.select(meta.c.value).where(meta.c.key == key))
        return rows[0].value if rows else None

    def set_meta(self, key: str, value: str) -> None:
        stmt = dialect_insert(self._engine, meta).values(key=key, value=value)
        with self._transaction() as conn:
            conn.execute(stmt.on_conflict_do_update(index_elements=["key"], set_={"value": stmt.excluded.value}))

    # -- sources ------------------------------------------------------------------------
    def add_source(self, cfg: SourceConfig) -> None:
        stmt = dialect_insert(self._engine, sources).values(
            name=cfg.name, config=cfg.model_dump_json(), created_at=time.time())
        with self._transaction() as conn:
            conn.execute(stmt.on_conflict_do_update(index_elements=["name"], set_={"config": stmt.excluded.config}))

    def remove_source(self, name: str) -> None:
        with self._transaction() as conn:
            conn.execute(sa.delete(sources).where(sources.c.name == name))

    def sources(self) -> list[SourceConfig]:
        rows = self._rows(sa.select(sources.c.config).order_by(sources.c.name))
        return [SourceConfig.model_validate_json(r.config) for r in rows]

    def source(self, name: str) -> SourceConfig:
        rows = self._rows(sa.select(sources.c.config).where(sources.c.name == name))
        if not rows:
            known = ", ".join(s.name for s in self.sources()) or "none registered"
            raise ConfigError(f"unknown source {name!r} (known: {known})")
        return SourceConfig.model_validate_json(rows[0].config)

    # -- documents ----------------------------------------------------------------------
    def documents(self, source: str) -> dict[str, DocState]:
        d = documents.c
        rows = self._rows(sa.select(d.id, d.url, d.text_hash, d.etag, d.last_modified).where(d.source == source))
        return {r.id: DocState(r.id, r.url, r.text_hash, r.etag, r.last_modified) for r in rows}

    def document_row(self, doc_id: str) -> dict[str, Any] | None:
        rows = self._rows(sa.select(documents).where(documents.c.id == doc_id))
        return dict(rows[0]._mapping) if rows else None

    def save_document(self, doc: Document, text_hash: str, etag: str | None,
                      last_modified: str | None, chunks: Sequence[Chunk]) -> None:
        """Record a (re)indexed document and replace its chunk rows, logging the change, in one
        transaction."""
        row = {"id": doc.id, "source": doc.source, "url": doc.url, "title": doc.title, "text_hash": text_hash,
               "etag": etag, "last_modified": last_modified, "lang": doc.lang, "modified": _dt(doc.modified),
               "published": _dt(doc.published), "fetched_at": _dt(doc.fetched_at), "updated_at": time.time()}
        new = {c.id for c in chunks}
        with self._transaction() as conn:
            old = set(self._chunk_hashes(conn, doc.id))
            conn.execute(self._upsert_doc, row)
            conn.execute(_DELETE_DOC_CHUNKS, {"doc_id": doc.id})
            if chunks:
                conn.execute(_INSERT_CHUNK, [
                    {"id": c.id, "doc_id": c.doc_id, "source": c.source, "ordinal": c.ordinal, "hash": c.hash,
                     "data": chunk_to_json(c)} for c in chunks])
            self._change(conn, doc.source, "chunks", old - new, len(new - old))

    def touch_document(self, doc_id: str, etag: str | None, last_modified: str | None,
                       fetched_at: datetime | None) -> None:
        """Update only the validators of a document whose text did not change."""
        with self._transaction() as conn:
            conn.execute(_TOUCH_DOC, {"doc_id": doc_id, "new_etag": etag, "new_last_modified": last_modified,
                                      "new_fetched_at": _dt(fetched_at)})

    def delete_documents(self, doc_ids: Iterable[str]) -> int:
        """Delete documents and their chunks, logging the chunks that left, in one transaction;
        returns how many chunks went."""
        ids = list(doc_ids)
        if not ids:
            return 0
        removed = 0
        with self._transaction() as conn:
            for doc_id in ids:
                source = conn.execute(_DOC_SOURCE, {"doc_id": doc_id}).scalar()
                gone = set(self._chunk_hashes(conn, doc_id))
                removed += len(gone)
                self._change(conn, source or "", "chunks", gone, 0)
                conn.execute(_DELETE_DOC_CHUNKS, {"doc_id": doc_id})
                conn.execute(_DELETE_DOC, {"doc_id": doc_id})
        return removed

    # -- the change log -----------------------------------------------------------------
    def _new_log_id(self) -> str:
        stmt = dialect_insert(self._engine, meta).values(key="log_id", value=uuid.uuid4().hex)
        with self._transaction() as conn:
            conn.execute(stmt.on_conflict_do_nothing(index_elements=["key"]))
        return self.get_meta("log_id") or ""

    def _change(self, conn: Connection, source: str, kind: str, removed: set[str], added: int) -> int | None:
        """Log a change in the caller's transaction; returns its sequence number."""
        if kind == "chunks" and not removed and not added:
            return None  # a reindex that changed nothing logs nothing
        result = conn.execute(_INSERT_CHANGE, {"at": time.time(), "source": source, "kind": kind,
                                               "removed": json.dumps(sorted(removed)), "added": added})
        return int(result.inserted_primary_key[0])  # type: ignore[index]

    def log_purge(self, source: str | None = None) -> int:
        """Log an operator's purge of the answers built from ``source`` (all answers when
        ``None``); every cache reading the log applies it. Returns its sequence number."""
        with self._transaction() as conn:
            return self._change(conn, source or "", "purge", set(), 0) or 0

    def change_token(self) -> object:
        """Differs after any commit that logged a change, by this object or another process.
        On SQLite a few microseconds (``PRAGMA data_version``), never waiting for a write in
        progress; on PostgreSQL one indexed query."""
        if self._pg:
            return self._rows(_LAST_CHANGE)[0][0]
        with self._watch_lock:
            return self._watch_raw.execute("PRAGMA data_version").fetchone()[0]

    def changes_since(self, seq: int) -> list[IndexChange]:
        c = changes.c
        stmt = sa.select(c.seq, c.source, c.kind, c.removed, c.added).where(c.seq > seq).order_by(c.seq)
        rows = self._rows(stmt, watched=True)
        return [IndexChange(int(r.seq), r.source, r.kind, tuple(json.loads(r.removed)), int(r.added)) for r in rows]

    def change_summary(self, since_s: float = 86_400) -> dict[str, Any]:
        """The change log at a glance: its last sequence number, and what the last ``since_s``
        seconds logged (document changes, chunks removed and added, purges)."""
        c = changes.c
        removed = c.removed if not self._pg else sa.cast(c.removed, sa.JSON)
        row = self._rows(sa.select(
            sa.func.count().filter(c.kind == "chunks").label("documents"),
            sa.func.coalesce(sa.func.sum(sa.func.json_array_length(removed)), 0).label("removed"),
            sa.func.coalesce(sa.func.sum(c.added), 0).label("added"),
            sa.func.count().filter(c.kind == "purge").label("purges"),
        ).where(c.at >= time.time() - since_s))[0]
        return {"last_change": self.last_change(), "window_s": since_s, "documents_changed": int(row.documents),
                "chunks_removed": int(row.removed), "chunks_added": int(row.added), "purges": int(row.purges)}

    def last_change(self) -> int:
        return int(self._rows(_LAST_CHANGE, watched=True)[0][0] or 0)

    # -- chunks -------------------------------------------------------------------------
    @staticmethod
    def _chunk_hashes(conn: Connection, doc_id: str) -> dict[str, str]:
        return {r.id: r.hash for r in conn.execute(_CHUNK_HASHES, {"doc_id": doc_id})}

    def chunk_hashes(self, doc_id: str) -> dict[str, str]:
        """Chunk id -> text hash for one document."""
        return {r.id: r.hash for r in self._rows(_CHUNK_HASHES, {"doc_id": doc_id})}

    def get_chunks(self, chunk_ids: Sequence[str]) -> dict[str, Chunk]:
        out: dict[str, Chunk] = {}
        ids = list(chunk_ids)
        for start in range(0, len(ids), 500):
            part = ids[start:start + 500]
            if self._pg:
                rows = [tuple(r) for r in self._rows(_get_chunks(len(part)), {f"i{k}": v for k, v in enumerate(part)})]
            else:
                # The hydration of every page of hits on the embedded default: the statement's SQL
                # straight on the sqlite3 connection, as fast as the state was before SQLAlchemy.
                with self._lock:
                    rows = self._db_raw.execute(_sqlite_sql(len(part)), part).fetchall()
            for chunk_id, data in rows:
                out[chunk_id] = chunk_from_json(data)
        return out

    def iter_chunks(self, source: str | None = None) -> Iterator[Chunk]:
        stmt = sa.select(_chunks.c.data)
        if source is not None:
            stmt = stmt.where(_chunks.c.source == source)
        for r in self._rows(stmt.order_by(_chunks.c.doc_id, _chunks.c.ordinal)):
            yield chunk_from_json(r.data)

    # -- runs and counts ----------------------------------------------------------------
    def start_run(self, source: str, mode: str) -> int:
        with self._transaction() as conn:
            result = conn.execute(_INSERT_RUN, {"source": source, "mode": mode, "started_at": time.time(),
                                                "status": "running"})
            return int(result.inserted_primary_key[0])  # type: ignore[index]

    def run_progress(self, run_id: int, progress: dict[str, Any]) -> None:
        """Record a running run's progress (``ingest.progress``), read back by :meth:`last_run`
        as its ``progress`` while its status is ``running``."""
        with self._transaction() as conn:
            conn.execute(_RUN_PROGRESS, {"run_id": run_id, "new_report": json.dumps({"progress": progress})})

    def finish_run(self, run_id: int, status: str, report: dict[str, Any]) -> None:
        now = time.time()
        with self._transaction() as conn:
            conn.execute(_FINISH_RUN, {"run_id": run_id, "new_finished_at": now, "new_status": status,
                                       "new_report": json.dumps(report, default=str)})
            conn.execute(_TRIM_LOG, {"before": now - CHANGE_LOG_S})

    def last_run(self, source: str) -> dict[str, Any] | None:
        rows = self._rows(sa.select(runs).where(runs.c.source == source).order_by(runs.c.id.desc()).limit(1))
        if not rows:
            return None
        run = dict(rows[0]._mapping)
        run["progress"] = None
        if run["status"] == "running" and run["report"]:
            run["progress"] = json.loads(run["report"]).get("progress")
        return run

    def source_added(self, source: str) -> float | None:
        """Unix time the source was first added, or None for an unknown source."""
        rows = self._rows(sa.select(sources.c.created_at).where(sources.c.name == source))
        return float(rows[0].created_at) if rows else None

    def last_success(self, source: str) -> float | None:
        rows = self._rows(sa.select(sa.func.max(runs.c.finished_at)).where(
            runs.c.source == source, runs.c.status == "ok"))
        return float(rows[0][0]) if rows and rows[0][0] is not None else None

    def runs(self, source: str | None = None, limit: int = 20) -> list[dict[str, Any]]:
        stmt = sa.select(runs)
        if source is not None:
            stmt = stmt.where(runs.c.source == source)
        return [dict(r._mapping) for r in self._rows(stmt.order_by(runs.c.id.desc()).limit(limit))]

    def languages(self) -> dict[str, int]:
        """Documents per detected language (``Document.lang``: ``en``, ``zh``, ``und``, ...)."""
        lang = sa.func.coalesce(documents.c.lang, "und")
        rows = self._rows(sa.select(lang.label("lang"), sa.func.count().label("n")).group_by(lang))
        return {row.lang: int(row.n) for row in rows}

    def counts(self, source: str | None = None) -> tuple[int, int]:
        """(documents, chunks), for one source or all."""
        ndocs = sa.select(sa.func.count()).select_from(documents)
        nchunks = sa.select(sa.func.count()).select_from(_chunks)
        if source:
            ndocs, nchunks = ndocs.where(documents.c.source == source), nchunks.where(_chunks.c.source == source)
        return int(self._rows(ndocs)[0][0] or 0), int(self._rows(nchunks)[0][0] or 0)

