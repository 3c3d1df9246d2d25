"""An exact vector index in numpy, persisted in one SQLite file.

All vectors live in one float32 matrix; a search is one matrix-vector product (vectors are
unit length, so the inner product is the cosine). Filter fields are kept beside the matrix
as numpy arrays (strings as integer codes, dates as int64 epoch microseconds with a sentinel
for "no date", tags as per-tag row lists), so a filter is a boolean mask computed in numpy
and a selective filter only scores the rows it keeps.

SQLite holds every chunk field and the vector bytes. The file is read into memory on first
use, and again when another process has written to it (SQLite's ``data_version``); full
chunks are read back from SQLite only for the hits. Deleted or replaced rows are masked and
compacted away once they make up a quarter of the matrix.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

from rag.errors import BackendError, SchemaMismatch
from rag.types import Chunk, Filters, Hit, Trust

__all__ = ["NumpyVectorIndex"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)
_NO_DATE = np.iinfo(np.int64).min
_BATCH = 500
_json = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
_COLUMNS = ("id", "doc_id", "source", "text", "hash", "ordinal", "title", "url", "heading", "lang",
            "published", "modified", "trust", "tags", "tenant")
_DDL = f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS chunks (
    id TEXT PRIMARY KEY, doc_id TEXT NOT NULL, source TEXT NOT NULL, text TEXT NOT NULL,
    hash TEXT NOT NULL, ordinal INTEGER NOT NULL, title TEXT NOT NULL, url TEXT NOT NULL,
    heading TEXT NOT NULL, lang TEXT NOT NULL, published INTEGER, modified INTEGER,
    trust INTEGER NOT NULL, tags TEXT NOT NULL, tenant TEXT, vector BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS chunks_doc_id ON chunks (doc_id);
CREATE INDEX IF NOT EXISTS chunks_hash ON chunks (hash);
"""
_LOAD_SQL = "SELECT id, source, tenant, lang, trust, published, modified, tags, vector FROM chunks"
_SELECT_SQL = f"SELECT {', '.join(_COLUMNS)} FROM chunks"


class _Codes:
    """Interns strings to small integer codes (-1 stands for ``None``)."""

    def __init__(self) -> None:
        self.of: dict[str, int] = {}

    def code(self, value: str | None) -> int:
        return -1 if value is None else self.of.setdefault(value, len(self.of))

    def known(self, values: Iterable[str]) -> list[int]:
        return [self.of[v] for v in values if v in self.of]


class _Memory:
    """The in-memory matrix and filter columns; row ``i`` belongs to ``ids[i]``."""

    def __init__(self, dim: int, capacity: int = 1024) -> None:
        self.dim, self.n = dim, 0
        self.ids: list[str | None] = []
        self.row_of: dict[str, int] = {}
        self.sources, self.tenants, self.langs = _Codes(), _Codes(), _Codes()
        self.tag_rows: dict[str, list[int]] = {}
        self._tag_cache: dict[str, np.ndarray] = {}
        self._grow(capacity)

    def _grow(self, capacity: int) -> None:
        def resized(old: np.ndarray | None, dtype: type, fill: int = 0, shape: tuple = ()) -> np.ndarray:
            new = np.full((capacity, *shape), fill, dtype=dtype)
            if old is not None:
                new[: self.n] = old[: self.n]
            return new

        get = self.__dict__.get
        self.matrix = resized(get("matrix"), np.float32, shape=(self.dim,))
        self.alive = resized(get("alive"), np.bool_)
        self.source = resized(get("source"), np.int32)
        self.tenant = resized(get("tenant"), np.int32, -1)
        self.lang = resized(get("lang"), np.int32)
        self.trust = resized(get("trust"), np.int8)
        self.published = resized(get("published"), np.int64, _NO_DATE)
        self.modified = resized(get("modified"), np.int64, _NO_DATE)

    def add(self, cid: str, source: str, tenant: str | None, lang: str, trust: int,
            published: int | None, modified: int | None, tags: Iterable[str], vector: np.ndarray) -> None:
        old = self.row_of.get(cid)
        if old is not None:
            self.kill(old)
        if self.n == len(self.alive):
            self._grow(max(1024, 2 * self.n))
        r = self.n
        self.n += 1
        self.ids.append(cid)
        self.row_of[cid] = r
        self.matrix[r] = vector
        self.alive[r] = True
        self.source[r] = self.sources.code(source)
        self.tenant[r] = self.tenants.code(tenant)
        self.lang[r] = self.langs.code(lang)
        self.trust[r] = trust
        self.published[r] = _NO_DATE if published is None else published
        self.modified[r] = _NO_DATE if modified is None else modified
        for tag in set(tags):
            self.tag_rows.setdefault(tag, []).append(r)
            self._tag_cache.pop(tag, None)

    def kill(self, row: int) -> None:
        cid = self.ids[row]
        if cid is not None:
            del self.row_of[cid]
            self.ids[row] = None
            self.alive[row] = False

    def tag_array(self, tag: str) -> np.ndarray:
        arr = self._tag_cache.get(tag)
        if arr is None:
            arr = self._tag_cache[tag] = np.asarray(self.tag_rows.get(tag, ()), dtype=np.int64)
        return arr

    def compact_if_sparse(self) -> None:
        dead = self.n - len(self.row_of)
        if dead < 1024 or dead * 4 < self.n:
            return
        keep = np.flatnonzero(self.alive[: self.n])
        remap = np.full(self.n, -1, dtype=np.int64)
        remap[keep] = np.arange(len(keep))
        for name in ("matrix", "alive", "source", "tenant", "lang", "trust", "published", "modified"):
            setattr(self, name, getattr(self, name)[keep].copy())
        self.ids = [self.ids[i] for i in keep]
        self.row_of = {cid: i for i, cid in enumerate(self.ids)}  # type: ignore[misc]
        tag_rows = {}
        for tag in self.tag_rows:
            rows = remap[self.tag_array(tag)]
            if (rows := rows[rows >= 0]).size:
                tag_rows[tag] = rows.tolist()
        self.tag_rows, self._tag_cache, self.n = tag_rows, {}, len(keep)
        self._grow(max(1024, self.n + self.n // 2))

    def mask(self, f: Filters) -> np.ndarray:
        n = self.n
        mask = self.alive[:n].copy()
        for column, codes, wanted in ((self.source, self.sources, f.source), (self.lang, self.langs, f.lang)):
            if wanted:
                mask &= _any_of(column[:n], codes.known(wanted))
        if f.tenant is not None:
            mask &= self.tenant[:n] == self.tenants.of.get(f.tenant, -2)
        if f.tags:
            has_tag = np.zeros(n, dtype=np.bool_)
            for tag in f.tags:
                has_tag[self.tag_array(tag)] = True
            mask &= has_tag
        if f.min_trust is not None:
            mask &= self.trust[:n] >= int(f.min_trust)
        for name in ("published", "modified"):
            lo, hi = getattr(f, f"{name}_from"), getattr(f, f"{name}_to")
            column = getattr(self, name)[:n]
            if lo is not None:  # also excludes _NO_DATE, the smallest int64
                mask &= column >= _micros(lo)
            elif hi is not None:
                mask &= column != _NO_DATE
            if hi is not None:
                mask &= column <= _micros(hi)
        return mask


def _any_of(column: np.ndarray, codes: list[int]) -> np.ndarray:
    if len(codes) == 1:
        return column == codes[0]
    if not codes:
        return np.zeros(len(column), dtype=np.bool_)
    out = column == codes[0]
    for code in codes[1:]:
        out |= column == code
    return out


class NumpyVectorIndex:
    """Exact (brute-force) cosine search in memory, persisted in SQLite at ``path``.

    ``path=None`` keeps everything in memory. Thread-safe: one lock serialises writers and
    readers. Opening is lazy; the first call loads the file.

    Example::

        index = NumpyVectorIndex(Path(".ragqa/vectors.db"), dim=384)
        index.upsert(chunks, vectors)               # vectors: (len(chunks), 384) float32
        hits = index.search(query_vector, k=10, filters=Filters(lang=("en",)))
        reusable = index.vectors_by_hash([c.hash for c in new_chunks])
    """

    def __init__(self, path: Path | None, dim: int) -> None:
        if dim <= 0:
            raise ValueError(f"dim must be positive, got {dim}")
        self.path = Path(path) if path is not None else None
        self.dim = dim
        self._lock = threading.RLock()
        self._db: sqlite3.Connection | None = None
        self._mem: _Memory | None = None
        self._version = -1

    # -- opening -----------------------------------------------------------------------------
    def _open(self) -> tuple[sqlite3.Connection, _Memory]:
        try:
            db = self._db or self._connect()
            version = db.execute("PRAGMA data_version").fetchone()[0] if self.path else 0
            if self._mem is None or version != self._version:  # first use, or another process wrote
                self._mem, self._version = self._load(db), version
        except sqlite3.Error as exc:
            raise BackendError(f"cannot read the vector store {self.path}: {exc}") from exc
        return db, self._mem

    def _connect(self) -> sqlite3.Connection:
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(str(self.path or ":memory:"), check_same_thread=False)
        db.executescript(_DDL)
        if self.path is not None:
            db.execute("PRAGMA journal_mode=WAL")
        row = db.execute("SELECT value FROM meta WHERE key = 'dim'").fetchone()
        if row is None:
            with db:
                db.execute("INSERT INTO meta VALUES ('dim', ?)", (str(self.dim),))
        elif int(row[0]) != self.dim:
            db.close()
            raise SchemaMismatch(
                f"{self.path} holds {row[0]}-dimensional vectors but the embedder makes "
                f"{self.dim}; use another data directory or the original embedder"
            )
        self._db = db
        return db

    def _load(self, db: sqlite3.Connection) -> _Memory:
        mem = _Memory(self.dim, capacity=max(1024, db.execute("SELECT count(*) FROM chunks").fetchone()[0]))
        for cid, source, tenant, lang, trust, published, modified, tags, blob in db.execute(_LOAD_SQL):
            mem.add(cid, source, tenant, lang, trust, published, modified, json.loads(tags),
                    np.frombuffer(blob, dtype=np.float32))
        return mem

    # -- writes ------------------------------------------------------------------------------
    def upsert(self, chunks: Sequence[Chunk], vectors: np.ndarray) -> None:
        matrix = np.ascontiguousarray(vectors, dtype=np.float32)
        if matrix.ndim != 2 or matrix.shape[1] != self.dim:
            raise SchemaMismatch(f"vectors have shape {matrix.shape}; this index holds {self.dim}-d vectors")
        if len(chunks) != matrix.shape[0]:
            raise ValueError(f"{len(chunks)} chunks but {matrix.shape[0]} vectors")
        if not chunks:
            return
        rows = [_row(c, v) for c, v in zip(chunks, matrix, strict=True)]
        with self._lock:
            db, mem = self._open()
            try:
                with db:
                    db.executemany(f"INSERT OR REPLACE INTO chunks VALUES ({', '.join('?' * 16)})", rows)
            except sqlite3.Error as exc:
                raise BackendError(f"cannot write the vector store {self.path}: {exc}") from exc
            for c, v in zip(chunks, matrix, strict=True):
                mem.add(c.id, c.source, c.tenant, c.lang, int(c.trust), _opt_micros(c.published),
                        _opt_micros(c.modified), c.tags, v)
            mem.compact_if_sparse()

    def delete_documents(self, doc_ids: Iterable[str]) -> None:
        docs = list(dict.fromkeys(doc_ids))
        with self._lock:
            db, mem = self._open()
            try:
                with db:
                    for batch in _batches(docs):
                        marks = ", ".join("?" * len(batch))
                        ids = db.execute(f"SELECT id FROM chunks WHERE doc_id IN ({marks})", batch).fetchall()
                        db.execute(f"DELETE FROM chunks WHERE doc_id IN ({marks})", batch)
                        for (cid,) in ids:
                            if (row := mem.row_of.get(cid)) is not None:
                                mem.kill(row)
            except sqlite3.Error as exc:
                raise BackendError(f"cannot write the vector store {self.path}: {exc}") from exc
            mem.compact_if_sparse()

    # -- reads -------------------------------------------------------------------------------
    def search(self, vector: np.ndarray, k: int = 10, filters: Filters | None = None) -> list[Hit]:
        q = np.asarray(vector, dtype=np.float32).reshape(-1)
        if q.shape[0] != self.dim:
            raise SchemaMismatch(f"query vector has dimension {q.shape[0]}; this index holds {self.dim}")
        if k <= 0:
            return []
        with self._lock:
            db, mem = self._open()
            n = mem.n
            if filters is None or filters.is_empty():
                rows = None if len(mem.row_of) == n else np.flatnonzero(mem.alive[:n])
            else:
                rows = np.flatnonzero(mem.mask(filters))
            if rows is None:
                scores = mem.matrix[:n] @ q
            elif rows.size * 4 < n:  # selective: score only the kept rows
                scores = mem.matrix[rows] @ q
            else:
                scores = (mem.matrix[:n] @ q)[rows]
            kk = min(k, scores.size)
            if kk == 0:
                return []
            top = np.argpartition(-scores, kk - 1)[:kk]
            top = top[np.argsort(-scores[top], kind="stable")]
            at = top if rows is None else rows[top]
            picked = [(mem.ids[int(r)], float(scores[i])) for r, i in zip(at, top, strict=True)]
            chunks = self._chunks(db, [cid for cid, _ in picked])
        return [Hit(chunk_id=cid, score=s, doc_id=chunks[cid].doc_id, chunk=chunks[cid]) for cid, s in picked]

    def _chunks(self, db: sqlite3.Connection, ids: list) -> dict[str, Chunk]:
        out: dict[str, Chunk] = {}
        for batch in _batches(ids):
            sql = f"{_SELECT_SQL} WHERE id IN ({', '.join('?' * len(batch))})"
            out.update((row[0], _chunk(row)) for row in db.execute(sql, batch))
        return out

    def get_vectors(self, chunk_ids: Sequence[str]) -> dict[str, np.ndarray]:
        with self._lock:
            _, mem = self._open()
            found = [(cid, mem.row_of[cid]) for cid in dict.fromkeys(chunk_ids) if cid in mem.row_of]
            block = mem.matrix[[r for _, r in found]]  # a copy: later writes cannot change it
        return {cid: block[i] for i, (cid, _) in enumerate(found)}

    def vectors_by_hash(self, hashes: Iterable[str]) -> dict[str, np.ndarray]:
        """Vectors stored for chunk text hashes, to reuse embeddings of unchanged text."""
        wanted = list(dict.fromkeys(hashes))
        out: dict[str, np.ndarray] = {}
        with self._lock:
            db, _ = self._open()
            for batch in _batches(wanted):
                sql = f"SELECT hash, vector FROM chunks WHERE hash IN ({', '.join('?' * len(batch))})"
                for h, blob in db.execute(sql, batch):
                    out.setdefault(h, np.frombuffer(blob, dtype=np.float32).copy())
        return out

    def count(self) -> int:
        with self._lock:
            return len(self._open()[1].row_of)

    def chunk_ids(self, source: str | None = None) -> set[str]:
        with self._lock:
            _, mem = self._open()
            if source is None:
                return set(mem.row_of)
            code = mem.sources.of.get(source)
            if code is None:
                return set()
            rows = np.flatnonzero(mem.alive[: mem.n] & (mem.source[: mem.n] == code))
            return {mem.ids[r] for r in rows}  # type: ignore[misc]

    def close(self) -> None:
        """Close the file and free the matrix; the next call loads it again."""
        with self._lock:
            if self._db is not None:
                self._db.close()
            self._db, self._mem, self._version = None, None, -1


def _batches(items: list) -> Iterable[list]:
    for i in range(0, len(items), _BATCH):
        yield items[i: i + _BATCH]


def _micros(value: datetime) -> int:
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return (value - _EPOCH) // _US


def _opt_micros(value: datetime | None) -> int | None:
    return None if value is None else _micros(value)


def _row(c: Chunk, v: np.ndarray) -> tuple:
    return (c.id, c.doc_id, c.source, c.text, c.hash, c.ordinal, c.title, c.url, c.heading, c.lang,
            _opt_micros(c.published), _opt_micros(c.modified), int(c.trust),
            _json(list(c.tags)), c.tenant, v.tobytes())


def _chunk(row: Sequence) -> Chunk:
    (cid, doc_id, source, text, h, ordinal, title, url, heading, lang,
     published, modified, trust, tags, tenant) = row
    return Chunk(
        id=cid, doc_id=doc_id, source=source, text=text, hash=h, ordinal=ordinal, title=title,
        url=url, heading=heading, lang=lang,
        published=None if published is None else _EPOCH + timedelta(microseconds=published),
        modified=None if modified is None else _EPOCH + timedelta(microseconds=modified),
        trust=Trust(trust), tags=tuple(json.loads(tags)), tenant=tenant,
    )
