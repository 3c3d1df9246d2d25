"""What :class:`~rag.vectors.milvus.MilvusVectorIndex` stores and asks: the collection
schema, a chunk as a Milvus row and back, and filters as Milvus boolean expressions.

One scalar field per chunk field, so filters run in Milvus and hits come back as whole
chunks. Dates are INT64 epoch microseconds with :data:`NO_DATE` for "no date"; a missing
tenant is stored as ``""``. Text fields longer than their VARCHAR limit are cut at a UTF-8
character boundary; an identifier or tag that does not fit is refused with ``ValueError``.
String literals in expressions are escaped with :func:`quote`, so any value is safe.

Example::

    filter_expression(Filters(source=("docs",), min_trust=Trust.high))
    # '(source in ["docs"]) and (trust >= 2)'
    f"id in {quoted_list(chunk_ids)}"
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

import numpy as np
from pymilvus import CollectionSchema, DataType, MilvusClient

from rag.codec import from_micros, micros
from rag.types import Chunk, Filters, Trust

__all__ = ["NO_DATE", "OUTPUT_FIELDS", "chunk", "collection_schema", "filter_expression", "quote",
           "quoted_list", "row", "schema_fields", "schema_problem"]

NO_DATE = -(2**62)
# name -> max bytes; keys are refused when too long, text is cut
_KEYS = {"id": 1024, "doc_id": 8192, "source": 512, "tenant": 512, "lang": 64, "hash": 256}
_TEXTS = {"title": 4096, "url": 8192, "heading": 4096, "text": 65535}
_INTS = ("trust", "published", "modified", "ordinal")
_TAGS_CAPACITY, _TAG_BYTES = 64, 512
OUTPUT_FIELDS = [*_KEYS, *_TEXTS, *_INTS, "tags"]


def schema_fields(dim: int) -> dict[str, tuple]:
    """Each field's type (and the vector's dimension, the tags' element type)."""
    fields: dict[str, tuple] = {name: (DataType.VARCHAR,) for name in (*_KEYS, *_TEXTS)}
    fields.update({name: (DataType.INT64,) for name in _INTS})
    fields["tags"] = (DataType.ARRAY, DataType.VARCHAR)
    fields["vector"] = (DataType.FLOAT_VECTOR, dim)
    return fields


def collection_schema(dim: int) -> CollectionSchema:
    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=_KEYS["id"])
    for name, size in {**_KEYS, **_TEXTS}.items():
        if name != "id":
            schema.add_field(name, DataType.VARCHAR, max_length=size)
    for name in _INTS:
        schema.add_field(name, DataType.INT64)
    schema.add_field("tags", DataType.ARRAY, element_type=DataType.VARCHAR,
                     max_capacity=_TAGS_CAPACITY, max_length=_TAG_BYTES)
    schema.add_field("vector", DataType.FLOAT_VECTOR, dim=dim)
    return schema


def schema_problem(described: dict[str, Any], dim: int) -> str | None:
    """How a collection (``describe_collection``) differs from ours, or None."""
    found: dict[str, tuple] = {}
    for f in described.get("fields", []):
        params = f.get("params", {})
        if f["type"] == DataType.FLOAT_VECTOR:
            found[f["name"]] = (f["type"], int(params.get("dim", 0)))
        elif f["type"] == DataType.ARRAY:
            found[f["name"]] = (f["type"], f.get("element_type"))
        else:
            found[f["name"]] = (f["type"],)
    expected = schema_fields(dim)
    if found == expected:
        return None
    found_dim = found.get("vector", (None, None))[-1]
    if set(found) == set(expected) and found_dim != dim:
        return f"holds {found_dim}-dimensional vectors but the embedder makes {dim}"
    diff = sorted(set(found) ^ set(expected)) or [n for n in expected if found[n] != expected[n]]
    return f"has another schema (fields differing: {', '.join(map(str, diff))})"


def _clip(value: str, max_bytes: int) -> str:
    raw = value.encode("utf-8")
    return value if len(raw) <= max_bytes else raw[:max_bytes].decode("utf-8", "ignore")


def row(c: Chunk, v: np.ndarray) -> dict[str, Any]:
    out: dict[str, Any] = {"tenant": c.tenant or ""}
    for name, limit in _KEYS.items():
        value = out["tenant"] if name == "tenant" else getattr(c, name)
        if len(value.encode("utf-8")) > limit:
            raise ValueError(f"chunk {c.id[:80]!r}: {name} is longer than {limit} bytes")
        out[name] = value
    if len(c.tags) > _TAGS_CAPACITY or any(len(t.encode("utf-8")) > _TAG_BYTES for t in c.tags):
        raise ValueError(f"chunk {c.id!r}: at most {_TAGS_CAPACITY} tags of {_TAG_BYTES} bytes each")
    out.update({name: _clip(getattr(c, name), limit) for name, limit in _TEXTS.items()})
    out.update(
        tags=list(c.tags), trust=int(c.trust), ordinal=int(c.ordinal), vector=v.tolist(),
        published=NO_DATE if c.published is None else micros(c.published),
        modified=NO_DATE if c.modified is None else micros(c.modified),
    )
    return out


def chunk(e: dict[str, Any]) -> Chunk:
    def date(value: int) -> datetime | None:
        return None if value == NO_DATE else from_micros(value)

    return Chunk(
        id=e["id"], doc_id=e["doc_id"], source=e["source"], text=e["text"], hash=e["hash"],
        ordinal=int(e["ordinal"]), title=e["title"], url=e["url"], heading=e["heading"],
        lang=e["lang"], published=date(e["published"]), modified=date(e["modified"]),
        trust=Trust(int(e["trust"])), tags=tuple(e["tags"] or ()), tenant=e["tenant"] or None,
    )


def quote(value: str) -> str:
    """A Milvus expression string literal (escapes understood by Milvus and Milvus Lite)."""
    escaped = (value.replace("\\", "\\\\").replace('"', '\\"')
               .replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t"))
    return f'"{escaped}"'


def quoted_list(values: Iterable[str]) -> str:
    """A Milvus expression list of string literals, for ``field in [...]``."""
    return "[" + ", ".join(quote(v) for v in values) + "]"


def filter_expression(f: Filters | None) -> str:
    """Translate ``Filters`` to a Milvus boolean expression (``""`` when nothing filters)."""
    if f is None:
        return ""
    parts = []
    if f.source:
        parts.append(f"source in {quoted_list(f.source)}")
    if f.tenant is not None:
        parts.append(f"tenant == {quote(f.tenant)}")
    if f.tags:
        parts.append(f"array_contains_any(tags, {quoted_list(f.tags)})")
    if f.lang:
        parts.append(f"lang in {quoted_list(f.lang)}")
    if f.min_trust is not None:
        parts.append(f"trust >= {int(f.min_trust)}")
    for name in ("published", "modified"):
        lo, hi = getattr(f, f"{name}_from"), getattr(f, f"{name}_to")
        if lo is not None or hi is not None:
            parts.append(f"{name} != {NO_DATE}")
        if lo is not None:
            parts.append(f"{name} >= {micros(lo)}")
        if hi is not None:
            parts.append(f"{name} <= {micros(hi)}")
    return " and ".join(f"({p})" for p in parts)
