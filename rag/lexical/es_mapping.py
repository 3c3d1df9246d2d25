"""What :class:`~rag.lexical.elasticsearch.ElasticsearchIndex` stores and asks: the index
mapping, a chunk as an Elasticsearch document and back, the search body, and the check that
an existing index has our mapping.

Text is analysed here, on the client, by :mod:`rag.lexical.tokenize`, exactly as the embedded
index analyses it; Elasticsearch only splits the result on whitespace. So both backends hold
the same terms and a query means the same thing on either.

Example::

    body = search_body("黑豹队的防守", k=5, filters=Filters(lang=("zh",)))
    es.search(index="ragqa-chunks", **body)
"""

from __future__ import annotations

import re
from typing import Any

from rag.codec import from_micros, micros
from rag.lexical.tokenize import cjk_field_text, english_terms, normalize, query_terms
from rag.types import Chunk, Filters, Trust

__all__ = [
    "SCHEMA_VERSION",
    "name_problem",
    "generation",
    "MAX_RESULT_WINDOW",
    "mapping",
    "index_settings",
    "mapping_difference",
    "is_ours",
    "document",
    "decode",
    "search_body",
    "filter_clauses",
]

SCHEMA_VERSION = 1
MAX_RESULT_WINDOW = 10_000  # Elasticsearch's default index.max_result_window
_KEYWORDS = ("id", "doc_id", "source", "tenant", "tags", "lang")
_DATES = ("published", "modified")
_BODIES = ("body_en", "body_zh")
_MAX_TERMS = 128  # per field, as in the embedded index
_BAD_NAME = re.compile(r'[\\/*?"<>| ,#:A-Z]|^[-_+.]')

_PROPERTIES: dict[str, dict[str, Any]] = {
    **{name: {"type": "keyword"} for name in _KEYWORDS},
    **{name: {"type": "long"} for name in _DATES},  # epoch microseconds
    "trust": {"type": "integer"},
    # Pre-analysed terms; whitespace is the one analyser every distribution ships.
    **{name: {"type": "text", "analyzer": "whitespace", "index_options": "freqs"} for name in _BODIES},
    "meta": {"type": "object", "enabled": False},
}


def name_problem(alias: str) -> str | None:
    """Why ``alias`` cannot name an index and its ``-v<N>`` generations, or None."""
    if not alias or len(alias.encode()) > 200:
        return "1 to 200 bytes"
    if _BAD_NAME.search(alias):
        return 'lower case, no spaces or \\/*?"<>|,#:, not starting with - _ + .'
    return None


def generation(alias: str, name: str) -> int:
    """N for an index named ``<alias>-v<N>``; 0 for any other name."""
    match = re.fullmatch(re.escape(alias) + r"-v(\d{1,9})", name)
    return int(match.group(1)) if match else 0


def mapping(alias: str) -> dict[str, Any]:
    """The mapping of every physical index behind ``alias``. ``_meta`` marks it as ours."""
    return {
        "dynamic": "strict",
        "_meta": {"ragqa": {"schema": SCHEMA_VERSION, "alias": alias}},
        "_source": {"excludes": list(_BODIES)},  # derived terms; the chunk is in meta
        "properties": _PROPERTIES,
    }


def index_settings(bulk_load: bool = False) -> dict[str, Any]:
    """One replica where there is a second node; no periodic refresh while bulk loading."""
    settings: dict[str, Any] = {"auto_expand_replicas": "0-1"}
    if bulk_load:
        settings["refresh_interval"] = "-1"
    return {"index": settings}


def mapping_difference(actual: dict[str, Any]) -> str | None:
    """How an existing index's mapping differs from ours (the first field that does), or None."""
    props = actual.get("properties") or {}
    for name, want in _PROPERTIES.items():  # a field of another kind says more than a missing one
        if (have := props.get(name)) is None:
            continue
        kind = have.get("type", "object")
        if kind != want["type"]:
            return f"field {name!r} is {kind}, expected {want['type']}"
        if "analyzer" in want and have.get("analyzer", "standard") != want["analyzer"]:
            return f"field {name!r} uses the {have.get('analyzer', 'standard')} analyzer, expected whitespace"
        if name == "meta" and have.get("enabled", True) is not False:
            return "field 'meta' is indexed, expected enabled: false"
    missing = [name for name in _PROPERTIES if name not in props]
    return f"field {missing[0]!r} is missing" if missing else None


def is_ours(actual: dict[str, Any], alias: str) -> bool:
    """Whether an index was created by this adapter for ``alias`` (so cleanup may delete it)."""
    marker = (actual.get("_meta") or {}).get("ragqa") or {}
    return marker.get("alias") == alias and mapping_difference(actual) is None


def document(c: Chunk) -> dict[str, Any]:
    """The indexed form of a chunk. ``meta`` (not indexed) holds what the keyword fields do not."""
    body = normalize("\n".join(p for p in (c.title, c.heading, c.text) if p))
    doc: dict[str, Any] = {
        "id": c.id, "doc_id": c.doc_id, "source": c.source, "lang": c.lang, "tags": list(c.tags),
        "trust": int(c.trust), "body_en": " ".join(english_terms(body)), "body_zh": cjk_field_text(body),
        "meta": {"text": c.text, "hash": c.hash, "ordinal": c.ordinal, "title": c.title, "url": c.url,
                 "heading": c.heading},
    }
    if c.tenant is not None:
        doc["tenant"] = c.tenant
    for name in _DATES:
        value = getattr(c, name)
        if value is not None:
            doc[name] = micros(value)
    return doc


def decode(src: dict[str, Any]) -> Chunk:
    meta = src["meta"]
    return Chunk(
        id=src["id"], doc_id=src["doc_id"], source=src["source"], text=meta["text"], hash=meta["hash"],
        ordinal=meta["ordinal"], title=meta["title"], url=meta["url"], heading=meta["heading"],
        lang=src["lang"], published=from_micros(src.get("published")),
        modified=from_micros(src.get("modified")), trust=Trust(src["trust"]),
        tags=tuple(src.get("tags") or ()), tenant=src.get("tenant"),
    )


def search_body(query: str, k: int, filters: Filters | None = None) -> dict[str, Any] | None:
    """Keyword arguments for ``Elasticsearch.search``; None when the query has no terms.

    The term clauses are ``should`` (at least one must match) and the filters sit in
    ``filter`` context, so the score is the BM25 sum of the matched terms and nothing else.
    """
    terms = query_terms(query) if query and not query.isspace() else None
    if not terms or k <= 0:
        return None
    should = [
        {"match": {field: {"query": " ".join(words[:_MAX_TERMS])}}}
        for field, words in (("body_en", terms.english), ("body_zh", terms.cjk)) if words
    ]
    boolean: dict[str, Any] = {"should": should, "minimum_should_match": 1}
    if restrictions := filter_clauses(filters):
        boolean["filter"] = restrictions
    return {"query": {"bool": boolean}, "size": min(k, MAX_RESULT_WINDOW), "track_total_hits": False}


def filter_clauses(f: Filters | None) -> list[dict[str, Any]]:
    """:func:`rag.filters.matches` in the query DSL. A range never matches a missing field."""
    if f is None:
        return []
    out: list[dict[str, Any]] = [
        {"terms": {name: list(values)}}
        for name in ("source", "tags", "lang") if (values := getattr(f, name))
    ]
    if f.tenant is not None:
        out.append({"term": {"tenant": f.tenant}})
    if f.min_trust is not None:
        out.append({"range": {"trust": {"gte": int(f.min_trust)}}})
    for name in _DATES:
        lo, hi = getattr(f, f"{name}_from"), getattr(f, f"{name}_to")
        bounds = {op: micros(v) for op, v in (("gte", lo), ("lte", hi)) if v is not None}
        if bounds:
            out.append({"range": {name: bounds}})
    return out
