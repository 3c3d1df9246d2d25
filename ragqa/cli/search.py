"""``ragqa search``."""

from __future__ import annotations

import time
from typing import Any

import click

from ragqa.cli.common import Context, emit, handle_errors

__all__ = ["search"]


@click.command()
@click.argument("query")
@click.option("--k", "-k", default=5, show_default=True, type=click.IntRange(1, 1000))
@click.option("--source", "-s", "sources", multiple=True, help="Only these sources.")
@click.option("--since", help="Only documents modified on or after this ISO date.")
@click.option("--mode", "-m", type=click.Choice(["bm25", "vector", "hybrid", "rrf"]),
              help="bm25 or vector alone, BM25 reordered by the reranker (hybrid), or both fused by "
              "reciprocal rank (rrf). Default: retrieval.mode in the settings (rrf).")
@click.option("--explain", "-e", is_flag=True,
              help="Show the query's language, the fusion weights and why, each leg's score and rank, "
              "and the time of each step.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
@handle_errors
def search(obj: Context, query: str, k: int, sources: tuple[str, ...], since: str | None,
           mode: str | None, explain: bool, as_json: bool) -> None:
    """Search the indexed chunks with the configured retriever.

    Results are labelled [1], [2], ... as they would be cited in an answer.
    """
    from rag.filters import parse_filters
    from rag.retrieval import HybridRetriever

    filters = parse_filters({"source": list(sources) or None, "modified_from": since})
    started = time.perf_counter()
    retriever = HybridRetriever.from_services(obj.services, **({"mode": mode} if mode else {}))
    result = retriever.search(query, k=k, filters=filters)
    hits = result.hits
    ms = (time.perf_counter() - started) * 1000
    rows = [{
        "rank": i + 1, "score": round(h.score, 4), "chunk_id": h.chunk_id, "doc_id": h.doc_id,
        "title": h.chunk.title if h.chunk else "", "url": h.chunk.url if h.chunk else "",
        "heading": h.chunk.heading if h.chunk else "", "text": h.chunk.text if h.chunk else "",
        "scores": {key: round(v, 4) for key, v in h.explain.items()},
    } for i, h in enumerate(hits)]
    data = {"query": query, "mode": retriever.mode, "reranker": retriever.reranker.name, "ms": round(ms, 1),
            "timings": {step: round(v, 2) for step, v in result.timings.items()},
            "fusion": {**result.fusion, "weights": [round(w, 3) for w in result.fusion.get("weights", ())]},
            "hits": rows}
    emit(data, as_json, lambda d: _search_text(d, explain))


def _search_text(d: dict[str, Any], explain: bool = False) -> str:
    out = []
    if explain and d.get("fusion"):
        f = d["fusion"]
        out.append(f"language {f['lang']}; weights bm25 {f['weights'][0]}, vector {f['weights'][1]}: {f['why']}")
    if not d["hits"]:
        return "\n".join([*out, f"no results for {d['query']!r}"])
    for h in d["hits"]:
        snippet = " ".join(h["text"].split())[:200]
        scores = ", ".join(f"{k} {v}" for k, v in h["scores"].items() if not k.endswith("_rank"))
        out.append(f"[{h['rank']}] {h['title'] or h['doc_id']}  ({scores})\n    {h['url']}\n    {snippet}")
        if explain:
            out.append("    " + _legs(h["scores"]))
    out.append(f"({len(d['hits'])} results in {d['ms']} ms, mode {d['mode']}, reranker {d['reranker']})")
    if explain:
        out.append("steps: " + ", ".join(f"{k.removesuffix('_ms')} {v} ms" for k, v in d["timings"].items()))
    return "\n".join(out)


def _legs(scores: dict[str, float]) -> str:
    """Each leg's score and rank; in rrf mode ``-`` marks a leg that did not find the chunk."""
    parts = []
    for leg in ("bm25", "vector"):
        if leg in scores:
            parts.append(f"{leg} {scores[leg]} (rank {int(scores[f'{leg}_rank'])})")
        elif "rrf" in scores:
            parts.append(f"{leg} -")
    parts += [f"{name} {scores[name]}" for name in ("rrf", "cosine", "cohere", "cross_encoder", "recency")
              if name in scores]
    return "legs: " + "; ".join(parts)
