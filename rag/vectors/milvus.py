"""Chunk vectors in Milvus: a server (``http://host:19530`` plus a token) or Milvus Lite (a
local ``.db`` path), through the same ``MilvusClient`` calls.

The collection has an explicit schema, one scalar field per chunk field, so filters run in
Milvus and hits come back as whole chunks (:mod:`rag.vectors.milvus_schema`). The vector
index is exact (``FLAT``, inner product on unit vectors) unless another ``index_type`` is
given. The name given is an alias of the live generation
(:mod:`rag.vectors.milvus_generations`); driver errors become :mod:`rag.errors` exceptions
(:mod:`rag.vectors.milvus_connection`).

Milvus Lite searches rows that are not yet flushed into segments by a slow scan, so with a
local file the first search after a write flushes first; a server manages its own segments.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

import grpc
import numpy as np
from pymilvus import MilvusClient
from pymilvus.client.types import LoadState
from pymilvus.exceptions import MilvusException

from rag.errors import SchemaMismatch
from rag.generations import GenerationNames
from rag.types import Chunk, Filters, Hit
from rag.vectors.milvus_connection import calling, describe, is_lite, open_client
from rag.vectors.milvus_connection import translate_error as _translate  # noqa: F401 - public here
from rag.vectors.milvus_generations import MilvusGenerations
from rag.vectors.milvus_schema import (
    NO_DATE,
    OUTPUT_FIELDS,
    chunk,
    collection_schema,
    filter_expression,
    quote,
    quoted_list,
    row,
    schema_problem,
)

__all__ = ["NO_DATE", "MilvusVectorIndex", "filter_expression", "quote"]

_MAX_TOPK = 16384
_WRITE_BATCH = 256
_DELETE_BATCH = 100
_ID_BATCH = 500
_PAGE = 4096
# A search or a vector fetch answers a question: a hung server costs it this long, not
# ``timeout_s`` (30 s), before the retriever answers without the vector leg.
QUERY_TIMEOUT_S = 5.0
# A server's reads at Strong consistency wait for the next time tick (200 ms by default, 50 ms
# under scripts/milvus.sh): measured 83 ms for a fetch of 100 vectors against 9 ms at Bounded
# (bench/RESULTS-query-path.md). Bounded reads may miss what was written in the last few
# seconds (at most common.gracefulTime, 5 s; under 0.5 s measured), so a process reads its
# own writes at Strong for this long after making them.
READ_YOUR_WRITES_S = 10.0


class MilvusVectorIndex(MilvusGenerations):
    """A :class:`~rag.types.VectorIndex` on one Milvus collection. Connects on first use.

    A full rebuild is crash-safe: :meth:`begin_rebuild` returns an index on a new, empty
    physical collection that readers do not see; :meth:`commit_rebuild` flushes it, points
    the alias at it, and only then drops the old one; :meth:`abort_rebuild` drops the new
    one instead. After a crash the alias still names the complete old collection and
    :meth:`cleanup` drops the leftover (on a server, run it when no other process is
    rebuilding the same collection).

    Every call waits at most ``timeout_s``; a search or a vector fetch, which a question
    waits for, at most ``query_timeout_s`` (5 s), so a hung server fails a query fast and the
    retriever answers from BM25. On a server, searches and fetches read at
    ``read_consistency`` (``Bounded``: no wait for a time tick; a row written by another process
    in the last moments may not be seen yet), and at ``Strong`` for :data:`READ_YOUR_WRITES_S`
    after a write through this index, so a process always reads what it wrote.

    Example::

        index = MilvusVectorIndex(".ragqa/milvus.db", "ragqa_chunks", dim=384)    # Milvus Lite
        index = MilvusVectorIndex("http://milvus:19530", "ragqa_chunks", 384, token="root:Milvus")
        index.upsert(chunks, vectors)
        hits = index.search(query_vector, k=10, filters=Filters(tags=("faq",)))

        new = index.begin_rebuild()
        new.upsert(all_chunks, all_vectors)
        index.commit_rebuild(new)     # or index.abort_rebuild(new)
    """

    def __init__(self, uri: str, collection: str, dim: int, token: str | None = None,
                 timeout_s: float = 30, *, index_type: str = "FLAT",
                 query_timeout_s: float = QUERY_TIMEOUT_S, read_consistency: str = "Bounded") -> None:
        if dim <= 0:
            raise ValueError(f"dim must be positive, got {dim}")
        if timeout_s <= 0 or query_timeout_s <= 0:
            raise ValueError(f"timeouts must be positive, got {timeout_s} and {query_timeout_s}")
        self.uri, self.collection, self.dim = uri, collection, dim
        self.timeout_s = timeout_s
        self.query_timeout_s = min(query_timeout_s, timeout_s)
        self._token = token
        self._index_type = index_type
        self.read_consistency = read_consistency
        self._wrote_at = float("-inf")  # monotonic time of this process's last write (read_level)
        self._client: MilvusClient | None = None
        self._ready = False
        self._lite = is_lite(uri)
        self._unflushed = False
        self._lock = threading.RLock()
        self._generations = GenerationNames(f"{collection}_g")
        self._origin: MilvusVectorIndex | None = None  # set on an index made by begin_rebuild
        self._owns_client = True
        self._retired = False
        self._building: set[str] = set()  # rebuilds begun here and not yet committed or aborted

    # -- connection ---------------------------------------------------------------------------
    @property
    def _where(self) -> str:
        return describe(self.uri)

    def _calling(self, action: str) -> contextlib.AbstractContextManager[None]:
        return calling(self._where, action)

    def _raw_client(self) -> MilvusClient:
        with self._lock:
            self._refuse_if_retired()
            if self._client is None:
                self._client = open_client(self.uri, self._token, self.timeout_s)
            return self._client

    def _conn(self) -> MilvusClient:
        if self._ready and self._client is not None:
            return self._client
        with self._lock:
            client = self._raw_client()
            if not self._ready:
                with self._calling(f"prepare collection {self.collection!r}"):
                    name = self.collection
                    if not client.has_collection(name, timeout=self.timeout_s):
                        if self._origin is not None:
                            self._create(client, name)
                        else:
                            self._create_alias(client)
                    described = client.describe_collection(name, timeout=self.timeout_s)
                    self._check_schema(described)
                    state = client.get_load_state(name, timeout=self.timeout_s)
                    if state.get("state") != LoadState.Loaded:
                        client.load_collection(name, timeout=self.timeout_s)
                self._ready = True
            return client

    def _create(self, client: MilvusClient, physical: str) -> None:
        index = client.prepare_index_params()
        index.add_index("vector", index_type=self._index_type, metric_type="IP")
        client.create_collection(physical, schema=collection_schema(self.dim), index_params=index,
                                 consistency_level="Strong", timeout=self.timeout_s)

    def _check_schema(self, described: dict[str, Any]) -> None:
        if (problem := schema_problem(described, self.dim)) is not None:
            raise SchemaMismatch(
                f"{self._where}: collection {self.collection!r} {problem}; "
                "drop it or set vector.collection to another name"
            )

    # -- writes --------------------------------------------------------------------------------
    def upsert(self, chunks: Sequence[Chunk], vectors: np.ndarray) -> None:
        matrix = np.asarray(vectors, dtype=np.float32)
        if matrix.ndim != 2 or matrix.shape[1] != self.dim:
            raise SchemaMismatch(f"vectors have shape {matrix.shape}; collection "
                                 f"{self.collection!r} holds {self.dim}-d vectors")
        if len(chunks) != matrix.shape[0]:
            raise ValueError(f"{len(chunks)} chunks but {matrix.shape[0]} vectors")
        rows = list({c.id: row(c, v) for c, v in zip(chunks, matrix, strict=True)}.values())
        if not rows:
            return
        client = self._conn()
        with self._calling(f"upsert into {self.collection!r}"):
            for i in range(0, len(rows), _WRITE_BATCH):
                client.upsert(self.collection, rows[i: i + _WRITE_BATCH], timeout=self.timeout_s)
        self._unflushed = self._lite
        self.wrote()

    def delete_documents(self, doc_ids: Iterable[str]) -> None:
        self._delete("doc_id", doc_ids)

    def delete_chunks(self, chunk_ids: Iterable[str]) -> None:
        self._delete("id", chunk_ids)

    def _delete(self, field: str, values: Iterable[str]) -> None:
        """Delete every chunk whose ``field`` (``id`` or ``doc_id``) is one of ``values``."""
        wanted = list(dict.fromkeys(values))
        if not wanted:
            return
        client = self._conn()
        with self._calling(f"delete from {self.collection!r}"):
            for i in range(0, len(wanted), _DELETE_BATCH):
                batch = quoted_list(wanted[i: i + _DELETE_BATCH])
                client.delete(self.collection, filter=f"{field} in {batch}", timeout=self.timeout_s)
        self._unflushed = self._lite
        self.wrote()

    def wrote(self) -> None:
        """Note a write made here (or a switch to a rebuilt generation): reads see it at once."""
        self._wrote_at = time.monotonic()
        if self._origin is not None:  # a rebuild's rows are read through the alias's index
            self._origin._wrote_at = self._wrote_at

    def _read_options(self) -> dict[str, Any]:
        """The consistency of a search or fetch that a question waits for (none on Milvus Lite)."""
        if self._lite:
            return {}
        recent = time.monotonic() - self._wrote_at < READ_YOUR_WRITES_S
        return {"consistency_level": "Strong" if recent else self.read_consistency}

    # -- reads ---------------------------------------------------------------------------------
    def search(self, vector: np.ndarray, k: int = 10, filters: Filters | None = None) -> list[Hit]:
        q = np.asarray(vector, dtype=np.float32).reshape(-1)
        if q.shape[0] != self.dim:
            raise SchemaMismatch(f"query vector has dimension {q.shape[0]}; collection "
                                 f"{self.collection!r} holds {self.dim}")
        if k <= 0:
            return []
        client = self._conn()
        if self._unflushed:  # Milvus Lite scans unflushed rows in Python: ~15x slower searches
            self.flush()
        with self._calling(f"search {self.collection!r}"):
            result = client.search(
                self.collection, data=[q.tolist()], filter=filter_expression(filters),
                limit=min(k, _MAX_TOPK), output_fields=OUTPUT_FIELDS, anns_field="vector",
                search_params={"metric_type": "IP"}, timeout=self.query_timeout_s, **self._read_options(),
            )
        hits = []
        for hit in result[0]:
            found = chunk(hit["entity"])
            hits.append(Hit(found.id, float(hit["distance"]), found.doc_id, found))
        return hits

    def get_vectors(self, chunk_ids: Sequence[str]) -> dict[str, np.ndarray]:
        ids = list(dict.fromkeys(chunk_ids))
        if not ids:
            return {}
        client = self._conn()
        out: dict[str, np.ndarray] = {}
        with self._calling(f"read vectors from {self.collection!r}"):
            for i in range(0, len(ids), _ID_BATCH):
                rows = client.query(self.collection, filter=f"id in {quoted_list(ids[i: i + _ID_BATCH])}",
                                    output_fields=["id", "vector"], timeout=self.query_timeout_s,
                                    **self._read_options())
                out.update((r["id"], np.asarray(r["vector"], dtype=np.float32)) for r in rows)
        return out

    def count(self) -> int:
        client = self._conn()
        with self._calling(f"count {self.collection!r}"):
            rows = client.query(self.collection, filter="", output_fields=["count(*)"],
                                timeout=self.timeout_s)
        return int(rows[0]["count(*)"]) if rows else 0

    def chunk_ids(self, source: str | None = None) -> set[str]:
        # A primary-key cursor, like pymilvus's query iterator, but with the key escaped.
        base = "" if source is None else f" and (source == {quote(source)})"
        client = self._conn()
        out: set[str] = set()
        cursor = ""
        with self._calling(f"list ids in {self.collection!r}"):
            while True:
                rows = client.query(self.collection, filter=f"(id > {quote(cursor)}){base}",
                                    output_fields=["id"], limit=_PAGE, iterator="True",
                                    reduce_stop_for_best="True", timeout=self.timeout_s)
                out.update(r["id"] for r in rows)
                if len(rows) < _PAGE:
                    return out
                cursor = max(r["id"] for r in rows)

    def flush(self) -> None:
        """Seal written rows into indexed segments (Milvus Lite searches them much faster)."""
        client = self._conn()
        with self._calling(f"flush {self.collection!r}"):
            client.flush(self.collection, timeout=self.timeout_s)
        self._unflushed = False

    def close(self) -> None:
        with self._lock:
            client, self._client, self._ready = self._client, None, False
            if client is not None and self._owns_client:
                with contextlib.suppress(MilvusException, grpc.RpcError):
                    client.close()
