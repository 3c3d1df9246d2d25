"""Chunk vectors in Milvus: a server (``http://host:19530`` plus a token) or Milvus Lite (a
local ``.db`` path), through the same ``MilvusClient`` calls.

The collection has an explicit schema, one scalar field per chunk field, so filters run in
Milvus and hits come back as whole chunks. Dates are INT64 epoch microseconds with
``NO_DATE`` for "no date"; a missing tenant is stored as ``""``. Text fields longer than
their VARCHAR limit are cut at a UTF-8 character boundary; an identifier or tag that does
not fit is refused with ``ValueError``. The vector index is exact (``FLAT``, inner
product on unit vectors) unless another ``index_type`` is given.

Milvus Lite searches rows that are not yet flushed into segments by a slow scan, so with a
local file the first search after a write flushes first; a server manages its own segments.

pymilvus and gRPC errors are raised as :class:`~rag.errors.BackendUnavailable`,
:class:`~rag.errors.BackendTimeout` or :class:`~rag.errors.BackendError`.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from pymilvus import DataType, MilvusClient
from pymilvus.client.types import LoadState
from pymilvus.exceptions import MilvusException

from rag.errors import (
    BackendError,
    BackendTimeout,
    BackendUnavailable,
    DataDirLocked,
    RagError,
    SchemaMismatch,
)
from rag.types import Chunk, Filters, Hit, Trust

__all__ = ["MilvusVectorIndex", "NO_DATE", "filter_expression", "quote"]

NO_DATE = -(2**62)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)
_MAX_TOPK = 16384
_WRITE_BATCH = 256
_ID_BATCH = 500
_PAGE = 4096
# name -> (type, max bytes); keys are refused when too long, text is cut
_KEYS = {"id": 1024, "doc_id": 8192, "source": 512, "tenant": 512, "lang": 64, "hash": 256}
_TEXTS = {"title": 4096, "url": 8192, "heading": 4096, "text": 65535}
_INTS = ("trust", "published", "modified", "ordinal")
_TAGS_CAPACITY, _TAG_BYTES = 64, 512
_OUTPUT = [*_KEYS, *_TEXTS, *_INTS, "tags"]
_CONNECTION_CODES = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAUTHENTICATED,
                     grpc.StatusCode.PERMISSION_DENIED}


class MilvusVectorIndex:
    """A :class:`~rag.types.VectorIndex` on one Milvus collection. Connects on first use.

    Example::

        index = MilvusVectorIndex(".ragqa/milvus.db", "ragqa_chunks", dim=384)    # Milvus Lite
        index = MilvusVectorIndex("http://milvus:19530", "ragqa_chunks", 384, token="root:Milvus")
        index.upsert(chunks, vectors)
        hits = index.search(query_vector, k=10, filters=Filters(tags=("faq",)))
    """

    def __init__(self, uri: str, collection: str, dim: int, token: str | None = None,
                 timeout_s: float = 30, *, index_type: str = "FLAT") -> None:
        if dim <= 0:
            raise ValueError(f"dim must be positive, got {dim}")
        self.uri, self.collection, self.dim = uri, collection, dim
        self.timeout_s = timeout_s
        self._token = token
        self._index_type = index_type
        self._client: MilvusClient | None = None
        self._ready = False
        self._lite = "://" not in uri
        self._unflushed = False
        self._lock = threading.RLock()

    # -- connection ---------------------------------------------------------------------------
    @property
    def _where(self) -> str:
        return f"Milvus at {re.sub(r'//[^/@]*@', '//', self.uri)}"

    @contextlib.contextmanager
    def _calling(self, action: str) -> Iterator[None]:
        try:
            yield
        except RagError:
            raise
        except (MilvusException, grpc.RpcError) as exc:
            raise _translate(exc, f"{self._where}: cannot {action}") from exc

    def _raw_client(self) -> MilvusClient:
        with self._lock:
            if self._client is None:
                if self._lite:  # Milvus Lite needs the folder of its file
                    Path(self.uri).expanduser().parent.mkdir(parents=True, exist_ok=True)
                try:
                    with self._calling("connect"):
                        self._client = MilvusClient(uri=self.uri, token=self._token or "",
                                                    timeout=self.timeout_s)
                except BackendError as exc:
                    if self._lite and _lite_file_locked(self.uri):
                        raise DataDirLocked(
                            f"Milvus Lite file {self.uri} is open in another process (Milvus Lite "
                            "allows one process per file); stop it, or run a Milvus server"
                        ) from exc
                    raise
            return self._client

    def _conn(self) -> MilvusClient:
        if self._ready and self._client is not None:
            return self._client
        with self._lock:
            client = self._raw_client()
            if not self._ready:
                with self._calling(f"prepare collection {self.collection!r}"):
                    if client.has_collection(self.collection, timeout=self.timeout_s):
                        described = client.describe_collection(self.collection, timeout=self.timeout_s)
                        self._check_schema(described)
                        state = client.get_load_state(self.collection, timeout=self.timeout_s)
                        if state.get("state") != LoadState.Loaded:
                            client.load_collection(self.collection, timeout=self.timeout_s)
                    else:
                        self._create(client)
                self._ready = True
            return client

    def _schema_fields(self) -> dict[str, tuple]:
        fields: dict[str, tuple] = {name: (DataType.VARCHAR,) for name in (*_KEYS, *_TEXTS)}
        fields.update({name: (DataType.INT64,) for name in _INTS})
        fields["tags"] = (DataType.ARRAY, DataType.VARCHAR)
        fields["vector"] = (DataType.FLOAT_VECTOR, self.dim)
        return fields

    def _create(self, client: MilvusClient) -> None:
        schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=_KEYS["id"])
        for name, size in {**_KEYS, **_TEXTS}.items():
            if name != "id":
                schema.add_field(name, DataType.VARCHAR, max_length=size)
        for name in _INTS:
            schema.add_field(name, DataType.INT64)
        schema.add_field("tags", DataType.ARRAY, element_type=DataType.VARCHAR,
                         max_capacity=_TAGS_CAPACITY, max_length=_TAG_BYTES)
        schema.add_field("vector", DataType.FLOAT_VECTOR, dim=self.dim)
        index = client.prepare_index_params()
        index.add_index("vector", index_type=self._index_type, metric_type="IP")
        client.create_collection(self.collection, schema=schema, index_params=index,
                                 consistency_level="Strong", timeout=self.timeout_s)

    def _check_schema(self, described: dict[str, Any]) -> None:
        found: dict[str, tuple] = {}
        for f in described.get("fields", []):
            params = f.get("params", {})
            if f["type"] == DataType.FLOAT_VECTOR:
                found[f["name"]] = (f["type"], int(params.get("dim", 0)))
            elif f["type"] == DataType.ARRAY:
                found[f["name"]] = (f["type"], f.get("element_type"))
            else:
                found[f["name"]] = (f["type"],)
        expected = self._schema_fields()
        if found == expected:
            return
        dim = found.get("vector", (None, None))[-1]
        if set(found) == set(expected) and dim != self.dim:
            problem = f"holds {dim}-dimensional vectors but the embedder makes {self.dim}"
        else:
            diff = sorted(set(found) ^ set(expected)) or [n for n in expected if found[n] != expected[n]]
            problem = f"has another schema (fields differing: {', '.join(map(str, diff))})"
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
        rows = list({c.id: _row(c, v) for c, v in zip(chunks, matrix, strict=True)}.values())
        if not rows:
            return
        client = self._conn()
        with self._calling(f"upsert into {self.collection!r}"):
            for i in range(0, len(rows), _WRITE_BATCH):
                client.upsert(self.collection, rows[i: i + _WRITE_BATCH], timeout=self.timeout_s)
        self._unflushed = self._lite

    def delete_documents(self, doc_ids: Iterable[str]) -> None:
        ids = list(dict.fromkeys(doc_ids))
        if not ids:
            return
        client = self._conn()
        with self._calling(f"delete from {self.collection!r}"):
            for i in range(0, len(ids), 100):
                client.delete(self.collection, filter=f"doc_id in {_list(ids[i: i + 100])}",
                              timeout=self.timeout_s)
        self._unflushed = self._lite

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
                limit=min(k, _MAX_TOPK), output_fields=_OUTPUT, anns_field="vector",
                search_params={"metric_type": "IP"}, timeout=self.timeout_s,
            )
        hits = []
        for hit in result[0]:
            chunk = _chunk(hit["entity"])
            hits.append(Hit(chunk.id, float(hit["distance"]), chunk.doc_id, chunk))
        return hits

    def get_vectors(self, chunk_ids: Sequence[str]) -> dict[str, np.ndarray]:
        ids = list(dict.fromkeys(chunk_ids))
        if not ids:
            return {}
        client = self._conn()
        out: dict[str, np.ndarray] = {}
        with self._calling(f"read vectors from {self.collection!r}"):
            for i in range(0, len(ids), _ID_BATCH):
                rows = client.query(self.collection, filter=f"id in {_list(ids[i: i + _ID_BATCH])}",
                                    output_fields=["id", "vector"], timeout=self.timeout_s)
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

    def drop(self) -> None:
        """Drop the collection and everything in it."""
        with self._lock:
            client = self._raw_client()
            with self._calling(f"drop {self.collection!r}"):
                if client.has_collection(self.collection, timeout=self.timeout_s):
                    client.drop_collection(self.collection, timeout=self.timeout_s)
            self._ready = False

    def close(self) -> None:
        with self._lock:
            client, self._client, self._ready = self._client, None, False
            if client is not None:
                with contextlib.suppress(MilvusException, grpc.RpcError):
                    client.close()


def quote(value: str) -> str:
    """A Milvus expression string literal (escapes understood by Milvus and Milvus Lite)."""
    escaped = (value.replace("\\", "\\\\").replace('"', '\\"')
               .replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t"))
    return f'"{escaped}"'


def _list(values: Iterable[str]) -> str:
    return "[" + ", ".join(quote(v) for v in values) + "]"


def filter_expression(f: Filters | None) -> str:
    """Translate ``Filters`` to a Milvus boolean expression (``""`` when nothing filters)."""
    if f is None:
        return ""
    parts = []
    if f.source:
        parts.append(f"source in {_list(f.source)}")
    if f.tenant is not None:
        parts.append(f"tenant == {quote(f.tenant)}")
    if f.tags:
        parts.append(f"array_contains_any(tags, {_list(f.tags)})")
    if f.lang:
        parts.append(f"lang in {_list(f.lang)}")
    if f.min_trust is not None:
        parts.append(f"trust >= {int(f.min_trust)}")
    for name in ("published", "modified"):
        lo, hi = getattr(f, f"{name}_from"), getattr(f, f"{name}_to")
        if lo is not None or hi is not None:
            parts.append(f"{name} != {NO_DATE}")
        if lo is not None:
            parts.append(f"{name} >= {_micros(lo)}")
        if hi is not None:
            parts.append(f"{name} <= {_micros(hi)}")
    return " and ".join(f"({p})" for p in parts)


def _translate(exc: Exception, context: str) -> BackendError:
    code: Any = exc.code() if isinstance(exc, grpc.RpcError) else getattr(exc, "code", None)
    cause = exc.__cause__
    if not isinstance(code, grpc.StatusCode) and isinstance(cause, grpc.RpcError):
        code = cause.code()
    message = exc.details() if isinstance(exc, grpc.RpcError) else getattr(exc, "message", "") or str(exc)
    text = f"{context}: {message}"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED or "timeout" in message.lower():
        return BackendTimeout(text)
    if code in _CONNECTION_CODES or code == 2 or "Fail connecting" in message:
        return BackendUnavailable(text)
    return BackendError(text)


def _lite_file_locked(uri: str) -> bool:
    """Whether another process holds Milvus Lite's lock on its data folder (Unix only)."""
    lock = Path(uri).expanduser() / "LOCK"
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        return False
    try:
        with open(lock, "rb") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return True
            fcntl.flock(fh, fcntl.LOCK_UN)
    except OSError:
        return False
    return False


def _micros(value: datetime) -> int:
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return (value - _EPOCH) // _US


def _clip(value: str, max_bytes: int) -> str:
    raw = value.encode("utf-8")
    return value if len(raw) <= max_bytes else raw[:max_bytes].decode("utf-8", "ignore")


def _row(c: Chunk, v: np.ndarray) -> dict[str, Any]:
    row: dict[str, Any] = {"tenant": c.tenant or ""}
    for name, limit in _KEYS.items():
        value = row["tenant"] if name == "tenant" else getattr(c, name)
        if len(value.encode("utf-8")) > limit:
            raise ValueError(f"chunk {c.id[:80]!r}: {name} is longer than {limit} bytes")
        row[name] = value
    if len(c.tags) > _TAGS_CAPACITY or any(len(t.encode("utf-8")) > _TAG_BYTES for t in c.tags):
        raise ValueError(f"chunk {c.id!r}: at most {_TAGS_CAPACITY} tags of {_TAG_BYTES} bytes each")
    row.update({name: _clip(getattr(c, name), limit) for name, limit in _TEXTS.items()})
    row.update(
        tags=list(c.tags), trust=int(c.trust), ordinal=int(c.ordinal), vector=v.tolist(),
        published=NO_DATE if c.published is None else _micros(c.published),
        modified=NO_DATE if c.modified is None else _micros(c.modified),
    )
    return row


def _chunk(e: dict[str, Any]) -> Chunk:
    def date(value: int) -> datetime | None:
        return None if value == NO_DATE else _EPOCH + timedelta(microseconds=int(value))

    return Chunk(
        id=e["id"], doc_id=e["doc_id"], source=e["source"], text=e["text"], hash=e["hash"],
        ordinal=int(e["ordinal"]), title=e["title"], url=e["url"], heading=e["heading"],
        lang=e["lang"], published=date(e["published"]), modified=date(e["modified"]),
        trust=Trust(int(e["trust"])), tags=tuple(e["tags"] or ()), tenant=e["tenant"] or None,
    )
