"""What :class:`~rag.lexical.tantivy_index.TantivyIndex` stores and asks: the tantivy schema,
a chunk as a tantivy document and back, and the query for a user query and filters.

Each chunk is one tantivy document. Its title, heading and text are indexed twice: once in
an English-stemmed field and once, for Chinese, as jieba words (see
:mod:`rag.lexical.tokenize`). A query is analysed the same way and becomes a disjunction of
term queries over both fields, scored with BM25; the query parser is never used, so user
text cannot be a syntax error. Filters become term, term-set and range queries added as
``Must`` clauses with a constant score of zero beside the ``Should`` term clauses (at least
one of which must match), so tantivy applies them and scores stay pure BM25.

The whole chunk is stored beside the indexed fields (its text as UTF-8, the rest as JSON),
so hits carry the full chunk.

Example::

    s = schema()
    doc = document(chunk)             # decode(searcher.doc(address)) == chunk
    q = build_query(s, "crawling", Filters(source=("docs",)))
"""

from __future__ import annotations

import json

import tantivy
from tantivy import FieldType, Occur, Query

from rag.codec import compact_json, from_micros, micros, opt_micros
from rag.lexical.tokenize import (
    CJK_TOKENIZER,
    ENGLISH_TOKENIZER,
    cjk_field_text,
    normalize,
    query_terms,
)
from rag.types import Chunk, Filters, Trust

__all__ = ["build_query", "decode", "document", "filter_queries", "schema"]

_KEYWORDS = ("id", "doc_id", "source", "tenant", "tags", "lang")
_DATES = ("published", "modified")
_MAX_TERMS = 128  # per field; a pasted page must not become a query of thousands of clauses


def schema() -> tantivy.Schema:
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


def document(chunk: Chunk) -> tantivy.Document:
    """The indexed and stored form of a chunk (jieba runs here: call it outside locks)."""
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
            doc.add_integer(name, micros(value))
    body = normalize("\n".join(p for p in (chunk.title, chunk.heading, chunk.text) if p))
    doc.add_text("body_en", body)
    doc.add_text("body_zh", cjk_field_text(body))
    doc.add_bytes("text", chunk.text.encode())
    doc.add_bytes("meta", _meta(chunk))
    return doc


def _meta(c: Chunk) -> bytes:
    return compact_json([
        c.id, c.doc_id, c.source, c.hash, c.ordinal, c.title, c.url, c.heading, c.lang,
        opt_micros(c.published), opt_micros(c.modified), int(c.trust), c.tags, c.tenant,
    ]).encode()


def decode(doc: tantivy.Document) -> Chunk:
    (cid, doc_id, source, h, ordinal, title, url, heading, lang, published, modified, trust, tags,
     tenant) = json.loads(doc.get_first("meta"))  # type: ignore[arg-type]
    return Chunk(
        id=cid, doc_id=doc_id, source=source, text=doc.get_first("text").decode(), hash=h,  # type: ignore[union-attr]
        ordinal=ordinal, title=title, url=url, heading=heading, lang=lang,
        published=from_micros(published), modified=from_micros(modified),
        trust=Trust(trust), tags=tuple(tags), tenant=tenant,
    )


def build_query(s: tantivy.Schema, query: str, filters: Filters | None = None) -> Query | None:
    """The tantivy query for a user query and filters; ``None`` when it has no terms."""
    terms = query_terms(query) if query and not query.isspace() else None
    if not terms:
        return None
    clauses = [(Occur.Should, Query.term_query(s, "body_en", t, "freq"))
               for t in terms.english[:_MAX_TERMS]]
    clauses += [(Occur.Should, Query.term_query(s, "body_zh", t, "freq"))
                for t in terms.cjk[:_MAX_TERMS]]
    restrictions = filter_queries(s, filters)
    if not restrictions:
        return clauses[0][1] if len(clauses) == 1 else Query.boolean_query(clauses)
    clauses += [(Occur.Must, Query.const_score_query(r, 0.0)) for r in restrictions]
    return Query.boolean_query(clauses, minimum_number_should_match=1)


def filter_queries(s: tantivy.Schema, f: Filters | None) -> list[Query]:
    """:func:`rag.filters.matches` as tantivy queries, one per filtering field."""
    if f is None:
        return []
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
            out.append(Query.range_query(s, name, FieldType.Integer, opt_micros(lo), opt_micros(hi)))
    return out
