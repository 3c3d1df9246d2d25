"""A BM25 index of chunks on tantivy, with metadata filters run inside tantivy.

Each chunk is one tantivy document. Its title, heading and text are indexed twice: once in
an English-stemmed field and once, for Chinese, as jieba words (see
:mod:`rag.lexical.tokenize`). A query is analysed the same way and becomes a disjunction of
term queries over both fields, scored with BM25; the query parser is never used, so user
text cannot be a syntax error. Filters become term, term-set and range queries added as
``Must`` clauses with a constant score of zero beside the ``Should`` term clauses (at least
one of which must match), so tantivy applies them and scores stay pure BM25.

The whole chunk is stored beside the indexed fields (its text as UTF-8, the rest as JSON),
so hits carry the full chunk. One process writes at a time: tantivy's lock file makes a
second writer fail, which is raised as :class:`~rag.errors.DataDirLocked`. Readers need no
lock and see commits.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import tantivy
from tantivy import FieldType, Occur, Query

from rag.errors import BackendError, DataDirLocked, SchemaMismatch
from rag.lexical.tokenize import (
    CJK_TOKENIZER,
    ENGLISH_TOKENIZER,
    cjk_field_text,
    english_analyzer,
    normalize,
    query_terms,
)
from rag.types import Chunk, Filters, Hit, Trust

__all__ = ["TantivyIndex"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)
_KEYWORDS = ("id", "doc_id", "source", "tenant", "tags", "lang")
_DATES = ("published", "modified")
_MAX_TERMS = 128  # per field; a pasted page must not become a query of thousands of clauses
_json = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def _schema() -> tantivy.Schema:
    sb = tantivy.SchemaBuilder()
    for name in _KEYWORDS:
        sb.add_text_field(name, stored=name == "id", tokenizer_name="raw", index_option="basic")
    sb.add_text_field("body_en", tokenizer_name=ENGLISH_TOKENIZER, index_option="freq")
    sb.add_text_field("body_zh", tokenizer_name=CJK_TOKENIZER, index_option="freq")
    sb.add_integer_field("trust", indexed=True, fast=True)
    for name in _DATES:  # epoch microseconds; absent when the chunk has no such date
        sb.add_integer_field(name, indexed=True, fast=True)
    sb.add_bytes_field("text", stored=True)  # decoding text apart from JSON is 5x faster
    sb.add_bytes_field("meta", stored=True)
    return sb.build()


class TantivyIndex:
    """The default :class:`~rag.types.LexicalIndex`: tantivy on disk, or in memory for tests.

    Nothing is opened until first use. The writer (and its lock) is taken at the first write,
    or with :meth:`acquire_writer`, and held until :meth:`close`.

    Example::

        index = TantivyIndex(Path(".ragqa/lexical"))
        index.upsert([Chunk(id="c1", doc_id="d1", source="docs", text="Crawled pages", hash="h")])
        hits = index.search("crawling", k=5, filters=Filters(source=("docs",)))
        index.close()
    """

    def __init__(self, path: Path | None = None, *, writer_heap_bytes: int = 64_000_000) -> None:
        self.path = Path(path) if path is not None else None
        self._heap = writer_heap_bytes
        self._schema = _schema()
        self._index: tantivy.Index | None = None
        self._writer: tantivy.IndexWriter | None = None
        self._lock = threading.RLock()

    # -- opening -----------------------------------------------------------------------------
    def _idx(self) -> tantivy.Index:
        index = self._index
        if index is not None:
            return index
        with self._lock:
            if self._index is None:
                self._index = self._open()
            return self._index

    def _open(self) -> tantivy.Index:
        try:
            if self.path is None:
                index = tantivy.Index(self._schema)
            else:
                self.path.mkdir(parents=True, exist_ok=True)
                index = tantivy.Index(self._schema, path=str(self.path), reuse=True)
        except ValueError as exc:
            if "schema does not match" in str(exc):
                raise SchemaMismatch(
                    f"the lexical index at {self.path} was built with another schema; "
                    "delete that folder and reindex"
                ) from exc
            raise BackendError(f"cannot open the lexical index at {self.path}: {exc}") from exc
        except OSError as exc:
            raise BackendError(f"cannot open the lexical index at {self.path}: {exc}") from exc
        index.register_tokenizer(ENGLISH_TOKENIZER, english_analyzer())
        return index

    def acquire_writer(self) -> None:
        """Take the writer lock now; raises ``DataDirLocked`` if another writer holds it."""
        with self._lock:
            if self._writer is not None:
                return
            index = self._idx()
            threads = max(1, min(4, os.cpu_count() or 1))
            try:
                self._writer = index.writer(heap_size=max(self._heap, threads * 16_000_000),
                                            num_threads=threads)
            except ValueError as exc:
                if "LockBusy" in str(exc):
                    raise DataDirLocked(
                        f"the lexical index at {self.path} is being written by another process "
                        "(or another TantivyIndex in this one); wait for it to finish or close it"
                    ) from exc
                raise BackendError(f"cannot open a writer on the lexical index: {exc}") from exc

    # -- writes ------------------------------------------------------------------------------
    def upsert(self, chunks: Sequence[Chunk]) -> None:
        if not chunks:
            return
        docs = [self._document(c) for c in chunks]  # jieba runs outside the lock
        with self._lock:
            self.acquire_writer()
            writer = self._writer
            assert writer is not None
            try:
                for chunk, doc in zip(chunks, docs, strict=True):
                    writer.delete_documents_by_term("id", chunk.id)
                    writer.add_document(doc)
            except ValueError as exc:
                writer.rollback()
                raise BackendError(f"cannot index chunks: {exc}") from exc
            self._commit()

    def delete_documents(self, doc_ids: Iterable[str]) -> None:
        ids = list(dict.fromkeys(doc_ids))
        if not ids:
            return
        with self._lock:
            self.acquire_writer()
            writer = self._writer
            assert writer is not None
            try:
                for doc_id in ids:
                    writer.delete_documents_by_term("doc_id", doc_id)
            except ValueError as exc:
                writer.rollback()
                raise BackendError(f"cannot delete from the lexical index: {exc}") from exc
            self._commit()

    def _commit(self) -> None:
        assert self._writer is not None and self._index is not None
        try:
            self._writer.commit()
        except ValueError as exc:
            raise BackendError(f"cannot commit the lexical index: {exc}") from exc
        self._index.reload()

    def _document(self, chunk: Chunk) -> tantivy.Document:
        doc = tantivy.Document()
        doc.add_text("id", chunk.id)
        doc.add_text("doc_id", chunk.doc_id)
        doc.add_text("source", chunk.source)
        doc.add_text("lang", chunk.lang)
        if chunk.tenant is not None:
            doc.add_text("tenant", chunk.tenant)
        for tag in chunk.tags:
            doc.add_text("tags", tag)
        doc.add_integer("trust", int(chunk.trust))
        for name in _DATES:
            value = getattr(chunk, name)
            if value is not None:
                doc.add_integer(name, _micros(value))
        body = normalize("\n".join(p for p in (chunk.title, chunk.heading, chunk.text) if p))
        doc.add_text("body_en", body)
        doc.add_text("body_zh", cjk_field_text(body))
        doc.add_bytes("text", chunk.text.encode())
        doc.add_bytes("meta", _meta(chunk))
        return doc

    # -- reads -------------------------------------------------------------------------------
    def search(self, query: str, k: int = 10, filters: Filters | None = None) -> list[Hit]:
        q = self.build_query(query, filters)
        if q is None or k <= 0:
            return []
        searcher = self._idx().searcher()
        hits = []
        for score, address in searcher.search(q, limit=k, count=False).hits:
            chunk = _decode(searcher.doc(address))
            hits.append(Hit(chunk_id=chunk.id, score=float(score), doc_id=chunk.doc_id, chunk=chunk))
        return hits

    def build_query(self, query: str, filters: Filters | None = None) -> Query | None:
        """The tantivy query for a user query and filters; ``None`` when it has no terms."""
        terms = query_terms(query) if query and not query.isspace() else None
        if not terms:
            return None
        s = self._schema
        clauses = [(Occur.Should, Query.term_query(s, "body_en", t, "freq"))
                   for t in terms.english[:_MAX_TERMS]]
        clauses += [(Occur.Should, Query.term_query(s, "body_zh", t, "freq"))
                    for t in terms.cjk[:_MAX_TERMS]]
        restrictions = self._filter_queries(filters)
        if not restrictions:
            return clauses[0][1] if len(clauses) == 1 else Query.boolean_query(clauses)
        clauses += [(Occur.Must, Query.const_score_query(r, 0.0)) for r in restrictions]
        return Query.boolean_query(clauses, minimum_number_should_match=1)

    def _filter_queries(self, f: Filters | None) -> list[Query]:
        if f is None:
            return []
        s = self._schema
        out = []
        for name in ("source", "tags", "lang"):
            values = getattr(f, name)
            if values:
                out.append(Query.term_set_query(s, name, list(values)))
        if f.tenant is not None:
            out.append(Query.term_query(s, "tenant", f.tenant))
        if f.min_trust is not None:
            out.append(Query.range_query(s, "trust", FieldType.Integer, int(f.min_trust), None))
        for name in _DATES:
            lo, hi = getattr(f, f"{name}_from"), getattr(f, f"{name}_to")
            if lo is not None or hi is not None:
                out.append(Query.range_query(
                    s, name, FieldType.Integer,
                    _micros(lo) if lo is not None else None,
                    _micros(hi) if hi is not None else None,
                ))
        return out

    def count(self) -> int:
        return self._idx().searcher().num_docs

    def chunk_ids(self, source: str | None = None) -> set[str]:
        searcher = self._idx().searcher()
        total = searcher.num_docs
        if total == 0:
            return set()
        q = Query.all_query() if source is None else Query.term_query(self._schema, "source", source)
        return {searcher.doc(a).get_first("id") for _, a in searcher.search(q, limit=total, count=False).hits}

    def close(self) -> None:
        """Release the writer (and its lock). The index reopens on the next use."""
        with self._lock:
            writer, self._writer = self._writer, None
            if writer is not None:
                try:
                    writer.wait_merging_threads()
                except ValueError:
                    pass  # merges are an optimisation; the last commit is already durable
            del writer  # dropping the writer releases tantivy's lock file
            self._index = None

    def __enter__(self) -> TantivyIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _micros(value: datetime) -> int:
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return (value - _EPOCH) // _US


def _from_micros(value: int | None) -> datetime | None:
    return None if value is None else _EPOCH + timedelta(microseconds=value)



def _meta(c: Chunk) -> bytes:
    return _json([
        c.id, c.doc_id, c.source, c.hash, c.ordinal, c.title, c.url, c.heading, c.lang,
        _micros(c.published) if c.published is not None else None,
        _micros(c.modified) if c.modified is not None else None,
        int(c.trust), c.tags, c.tenant,
    ]).encode()


def _decode(doc: tantivy.Document) -> Chunk:
    (cid, doc_id, source, h, ordinal, title, url, heading, lang, published, modified, trust, tags,
     tenant) = json.loads(doc.get_first("meta"))
    return Chunk(
        id=cid, doc_id=doc_id, source=source, text=doc.get_first("text").decode(), hash=h,
        ordinal=ordinal, title=title, url=url, heading=heading, lang=lang,
        published=_from_micros(published), modified=_from_micros(modified),
        trust=Trust(trust), tags=tuple(tags), tenant=tenant,
    )
