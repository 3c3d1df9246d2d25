"""``ragqa search``."""

from __future__ import annotations

import time
from typing import Any

import click

from rag.cli.common import Context, emit, handle_errors

__all__ = ["search"]


@click.command()
@click.argument("query")
@click.option("--k", "-k", default=5, show_default=True, type=click.IntRange(1, 1000))
@click.option("--source", "-s", "sources", multiple=True, help="Only these sources.")
@click.option("--since", help="Only documents modified on or after this ISO date.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
@handle_errors
def search(obj: Context, query: str, k: int, sources: tuple[str, ...], since: str | None,
           as_json: bool) -> None:
    """Search the indexed chunks (BM25 candidates reordered by vector similarity)."""
    from rag.filters import parse_filters
    from rag.search import search as run

    filters = parse_filters({"source": list(sources) or None, "modified_from": since})
    started = time.perf_counter()
    hits = run(obj.services, query, k=k, filters=filters)
    ms = (time.perf_counter() - started) * 1000
    rows = [{
        "rank": i + 1, "score": round(h.score, 4), "chunk_id": h.chunk_id, "doc_id": h.doc_id,
        "title": h.chunk.title if h.chunk else "", "url": h.chunk.url if h.chunk else "",
        "heading": h.chunk.heading if h.chunk else "", "text": h.chunk.text if h.chunk else "",
        "scores": {key: round(v, 4) for key, v in h.explain.items()},
    } for i, h in enumerate(hits)]
    emit({"query": query, "ms": round(ms, 1), "hits": rows}, as_json, _search_text)


def _search_text(d: dict[str, Any]) -> str:
    if not d["hits"]:
        return f"no results for {d['query']!r}"
    out = []
    for h in d["hits"]:
        snippet = " ".join(h["text"].split())[:200]
        scores = ", ".join(f"{k} {v}" for k, v in h["scores"].items())
        out.append(f"[{h['rank']}] {h['title'] or h['doc_id']}  ({scores})\n    {h['url']}\n    {snippet}")
    out.append(f"({len(d['hits'])} results in {d['ms']} ms)")
    return "\n".join(out)


