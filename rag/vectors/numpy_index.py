"""An exact vector index in numpy, persisted in one SQLite file.

All vectors live in one float32 matrix with its filter columns beside it
(:mod:`rag.vectors.numpy_memory`); a search is one matrix-vector product and a filter is a
boolean mask. SQLite holds every chunk field and the vector bytes
(:mod:`rag.vectors.numpy_store`). The file is read into memory on first use, and again when
another connection has changed the rows it serves (SQLite's ``data_version``, then a
per-table change token in ``meta``); full chunks are read back from SQLite only for the hits.
Generations are tables of the same file (:mod:`rag.vectors.numpy_generations`).
"""

from __future__ import annotations

import sqlite3
import threading
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np

from rag.codec import opt_micros
from rag.errors import BackendError, SchemaMismatch
from rag.types import Chunk, Filters, Hit
from rag.vectors import numpy_store as store
from rag.vectors.numpy_generations import NumpyGenerations
from rag.vectors.numpy_memory import Memory

__all__ = ["NumpyVectorIndex"]


class _Stale(Exception):
    """The live table changed under a read; it is retried on the new one."""


class NumpyVectorIndex(NumpyGenerations):
    """Exact (brute-force) cosine search in memory, persisted in SQLite at ``path``.

    ``path=None`` keeps everything in memory. Thread-safe: one lock serialises writers and
    readers. Opening is lazy; the first call loads the file.

    A full rebuild is crash-safe: :meth:`begin_rebuild` returns an index on a new, empty
    table that readers do not see; :meth:`commit_rebuild` makes it live in one transaction
    and then drops the old table, and :meth:`abort_rebuild` drops the new one instead. One
    rebuild runs at a time per file (a second gets ``DataDirLocked``). After a crash the old
    table is still live and :meth:`cleanup` drops the leftover. Other instances and processes
    switch to the new table on their next call. In memory, a rebuild is another in-memory
    index that the commit swaps in.

    Example::

        index = NumpyVectorIndex(Path(".ragqa/vectors.db"), dim=384)
        index.upsert(chunks, vectors)               # vectors: (len(chunks), 384) float32
        hits = index.search(query_vector, k=10, filters=Filters(lang=("en",)))
        reusable = index.vectors_by_hash([c.hash for c in new_chunks])

        new = index.begin_rebuild()
        new.upsert(all_chunks, all_vectors)
        index.commit_rebuild(new)     # or index.abort_rebuild(new)
    """

    def __init__(self, path: Path | None, dim: int) -> None:
        if dim <= 0:
            raise ValueError(f"dim must be positive, got {dim}")
        self.path = Path(path) if path is not None else None
        self.dim = dim
        self._lock = threading.RLock()
        self._db: sqlite3.Connection | None = None
        self._mem: Memory | None = None
        self._version = -1
        self._table = store.LEGACY  # the one served; fixed for a rebuild
        self._loaded: tuple[str, str] | None = None  # (table, change token) that _mem holds
        self._origin: NumpyVectorIndex | None = None  # set on an index made by begin_rebuild
        self._rebuilding = None
        self._retired = False

    # -- opening -----------------------------------------------------------------------------
    def _open(self) -> tuple[sqlite3.Connection, Memory]:
        self._refuse_if_retired()
        try:
            db = self._db or self._connect()
            version = db.execute("PRAGMA data_version").fetchone()[0] if self.path else 0
            if self._mem is None or version != self._version:  # first use, or another connection wrote
                self._refresh(db)
                self._version = version
        except sqlite3.Error as exc:
            raise BackendError(f"cannot read the vector store {self.path}: {exc}") from exc
        assert self._mem is not None
        return db, self._mem

    def _refresh(self, db: sqlite3.Connection) -> None:
        db.execute("BEGIN")  # one snapshot for the live pointer and the rows it names
        try:
            table = self._table if self._origin is not None else store.live(db)
            token = store.token(db, table)
            if self._mem is None or self._loaded != (table, token):
                self._mem = store.load(db, table, self.dim)
            self._table, self._loaded = table, (table, token)
        finally:
            db.rollback()

    def _connect(self) -> sqlite3.Connection:
        rebuilding_on_disk = self._origin is not None and self.path is not None  # its table exists
        self._db = store.connect(self.path, self.dim, create_legacy=not rebuilding_on_disk)
        return self._db

    # -- writes ------------------------------------------------------------------------------
    def upsert(self, chunks: Sequence[Chunk], vectors: np.ndarray) -> None:
        matrix = np.ascontiguousarray(vectors, dtype=np.float32)
        if matrix.ndim != 2 or matrix.shape[1] != self.dim:
            raise SchemaMismatch(f"vectors have shape {matrix.shape}; this index holds {self.dim}-d vectors")
        if len(chunks) != matrix.shape[0]:
            raise ValueError(f"{len(chunks)} chunks but {matrix.shape[0]} vectors")
        if not chunks:
            return
        rows = [store.row(c, v) for c, v in zip(chunks, matrix, strict=True)]
        with self._lock:
            mem = self._write(lambda db, table: store.write_rows(db, table, rows))
            for c, v in zip(chunks, matrix, strict=True):
                mem.add(c.id, c.source, c.tenant, c.lang, int(c.trust), opt_micros(c.published),
                        opt_micros(c.modified), c.tags, v)
            mem.compact_if_sparse()

    def delete_documents(self, doc_ids: Iterable[str]) -> None:
        self._delete("doc_id", doc_ids)

    def delete_chunks(self, chunk_ids: Iterable[str]) -> None:
        self._delete("id", chunk_ids)

    def _delete(self, column: str, values: Iterable[str]) -> None:
        """Delete every chunk whose ``column`` (``id`` or ``doc_id``) is one of ``values``."""
        wanted = list(dict.fromkeys(values))
        if not wanted:
            return
        gone: list[str] = []

        def write(db: sqlite3.Connection, table: str) -> None:
            gone[:] = store.delete_rows(db, table, column, wanted)

        with self._lock:
            self._write(write).remove(gone)

    def _write(self, write: Callable[[sqlite3.Connection, str], None]) -> Memory:
        """Run ``write`` in a transaction on the live table; returns the memory to update."""
        for _ in range(3):
            db, mem = self._open()
            try:
                db.execute("BEGIN IMMEDIATE")
                try:
                    if self._origin is None and store.live(db) != self._table:
                        self._version = -1  # a rebuild was committed meanwhile: reload, retry
                        continue
                    write(db, self._table)
                    token = uuid.uuid4().hex
                    db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (f"token:{self._table}", token))
                    db.commit()
                finally:
                    if db.in_transaction:
                        db.rollback()
            except sqlite3.Error as exc:
                raise BackendError(f"cannot write the vector store {self.path}: {exc}") from exc
            self._loaded = (self._table, token)
            return mem
        raise BackendError(f"the vector store {self.path} keeps switching generations")

    # -- reads -------------------------------------------------------------------------------
    def search(self, vector: np.ndarray, k: int = 10, filters: Filters | None = None) -> list[Hit]:
        q = np.asarray(vector, dtype=np.float32).reshape(-1)
        if q.shape[0] != self.dim:
            raise SchemaMismatch(f"query vector has dimension {q.shape[0]}; this index holds {self.dim}")
        if k <= 0:
            return []
        with self._lock:
            for _ in range(3):
                try:
                    return self._search(q, k, filters)
                except _Stale:  # rows went away between the check and the fetch: look again
                    self._version = -1
            raise BackendError(f"the vector store {self.path} keeps changing under reads")

    def _search(self, q: np.ndarray, k: int, filters: Filters | None) -> list[Hit]:
        db, mem = self._open()
        picked = mem.top(q, k, filters)
        if not picked:
            return []
        chunks = self._chunks(db, [cid for cid, _ in picked])
        if len(chunks) < len(picked):
            raise _Stale
        return [Hit(chunk_id=cid, score=s, doc_id=chunks[cid].doc_id, chunk=chunks[cid]) for cid, s in picked]

    def _chunks(self, db: sqlite3.Connection, ids: list[str]) -> dict[str, Chunk]:
        try:
            return store.read_chunks(db, self._table, ids)
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                raise _Stale from exc
            raise BackendError(f"cannot read the vector store {self.path}: {exc}") from exc

    def get_vectors(self, chunk_ids: Sequence[str]) -> dict[str, np.ndarray]:
        with self._lock:
            _, mem = self._open()
            found = [(cid, mem.row_of[cid]) for cid in dict.fromkeys(chunk_ids) if cid in mem.row_of]
            block = mem.matrix[[r for _, r in found]]  # a copy: later writes cannot change it
        return {cid: block[i] for i, (cid, _) in enumerate(found)}

    def vectors_by_hash(self, hashes: Iterable[str]) -> dict[str, np.ndarray]:
        """Vectors stored for chunk text hashes, to reuse embeddings of unchanged text."""
        wanted = list(dict.fromkeys(hashes))
        with self._lock:
            db, _ = self._open()
            try:
                return store.vectors_by_hash(db, self._table, wanted)
            except sqlite3.Error as exc:
                raise BackendError(f"cannot read the vector store {self.path}: {exc}") from exc

    def count(self) -> int:
        with self._lock:
            return len(self._open()[1].row_of)

    def chunk_ids(self, source: str | None = None) -> set[str]:
        with self._lock:
            _, mem = self._open()
            return set(mem.row_of) if source is None else mem.ids_of_source(source)

    def close(self) -> None:
        """Close the file and free the matrix; the next call loads it again."""
        with self._lock:
            if self._db is not None:
                self._db.close()
            self._db, self._mem, self._version, self._loaded = None, None, -1, None
