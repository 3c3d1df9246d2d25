"""Retrieval quality on a BEIR-style folder: recall, MRR and nDCG for each retrieval mode.

A dataset folder holds ``corpus.jsonl`` (``id``, ``title``, ``text``, ``lang``),
``queries.jsonl`` (``id``, ``text``) and ``qrels.tsv`` (a header line, then
``query-id``, ``doc-id``, ``relevance``). The corpus is ingested through the ordinary
folder source into a fresh data directory, every query runs in every mode, chunk hits are
mapped back to corpus documents (a document ranks at its best chunk), and the measures
are computed with ``ir-measures`` over every judged query (a query with no hits scores 0).

Example::

    report = run_retrieval_eval("data/xquad-en", ["bm25", "rrf"], {"embedder": {"backend": "hash"}})
    print(report["metrics"]["rrf"]["ndcg@10"], report["timing"]["rrf"]["ms_per_query"])
"""

from __future__ import annotations

import csv
import json
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import ir_measures
from ir_measures import RR, R, nDCG

from rag.config import Settings, SourceConfig
from rag.errors import ConfigError
from rag.retrieval import MODES, HybridRetriever
from rag.services import Services

__all__ = ["DOC_DEPTH", "METRICS", "load_beir", "run_retrieval_eval"]

DOC_DEPTH = 100  # documents kept per query, the deepest cut-off measured
SOURCE = "beir"
METRICS = {
    "recall@1": R @ 1, "recall@5": R @ 5, "recall@10": R @ 10, "recall@100": R @ 100,
    "mrr@10": RR @ 10, "ndcg@10": nDCG @ 10,
}

Corpus = dict[str, dict[str, str]]
Qrels = dict[str, dict[str, int]]


def load_beir(folder: str | Path) -> tuple[Corpus, dict[str, str], Qrels]:
    """Read a BEIR-style folder into ``(corpus, queries, qrels)``.

    ``corpus`` maps a doc id to ``{"title", "text", "lang"}``; ``queries`` maps a query id
    to its text; ``qrels`` maps a query id to ``{doc_id: relevance}``.
    """
    root = Path(folder)
    for name in ("corpus.jsonl", "queries.jsonl", "qrels.tsv"):
        if not (root / name).is_file():
            raise ConfigError(f"{root} is not a BEIR-style dataset: {name} is missing")
    corpus: Corpus = {}
    for row in _jsonl(root / "corpus.jsonl"):
        corpus[str(row["id"])] = {"title": str(row.get("title") or ""), "text": str(row.get("text") or ""),
                                  "lang": str(row.get("lang") or "")}
    queries = {str(row["id"]): str(row["text"]) for row in _jsonl(root / "queries.jsonl")}
    qrels: Qrels = {}
    with open(root / "qrels.tsv", encoding="utf-8", newline="") as fh:
        reader = csv.reader(fh, delimiter="\t")
        next(reader, None)
        for row in reader:
            if len(row) < 3 or not row[0].strip():
                continue
            qrels.setdefault(row[0].strip(), {})[row[1].strip()] = int(row[2])
    return corpus, queries, qrels


def _jsonl(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def run_retrieval_eval(folder: str | Path, modes: Sequence[str] = MODES,
                       settings_overrides: Mapping[str, Any] | None = None,
                       data_dir: str | Path | None = None,
                       limit_queries: int | None = None,
                       candidates: int = 100) -> dict[str, Any]:
    """Ingest the corpus of ``folder``, run its judged queries in each mode, and measure.

    Returns ``{"metrics": {mode: {metric: value}}, "timing": {mode: {...}}, ...}``.
    ``settings_overrides`` go to ``Settings.load`` (the environment still applies, so
    ``RAG_EMBEDDER__BACKEND=use`` picks the embedder); ``data_dir`` defaults to a
    temporary directory that is removed afterwards.
    """
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise ConfigError(f"modes must be some of {', '.join(MODES)}, got {', '.join(modes) or 'none'}")
    corpus, queries, qrels = load_beir(folder)
    judged = {q: {d: r for d, r in rels.items() if r > 0} for q, rels in qrels.items()}
    qids = [q for q in queries if judged.get(q)]
    if limit_queries is not None:
        qids = qids[:limit_queries]
    if not qids:
        raise ConfigError(f"{folder}: no query has a relevant document in qrels.tsv")
    with tempfile.TemporaryDirectory(prefix="ragqa-eval-") as tmp:
        data = Path(data_dir) if data_dir is not None else Path(tmp) / "data"
        settings = Settings.load(None, **{**dict(settings_overrides or {}), "data_dir": data})
        services = Services(settings)
        try:
            ingest = _ingest(services, corpus, Path(tmp) / "docs")
            doc_of = ingest.pop("doc_of")
            report: dict[str, Any] = {
                "dataset": str(folder), "queries": len(qids), "docs": len(corpus),
                "embedder": f"{services.embedder.name}:{services.embedder.dim}",
                "ingest": ingest, "metrics": {}, "timing": {},
            }
            wanted = {q: judged[q] for q in qids}
            for mode in modes:
                run, seconds = _run_mode(services, mode, {q: queries[q] for q in qids}, doc_of, candidates)
                report["metrics"][mode] = _measure(wanted, run)
                report["timing"][mode] = {"seconds": round(seconds, 3),
                                          "ms_per_query": round(1000 * seconds / len(qids), 2)}
        finally:
            services.close()
    return report


def _ingest(services: Services, corpus: Corpus, folder: Path) -> dict[str, Any]:
    """Write each document as a Markdown file and index the folder as one source."""
    from ingest.pipeline import reindex

    folder.mkdir(parents=True, exist_ok=True)
    doc_of: dict[str, str] = {}
    for i, (doc_id, doc) in enumerate(corpus.items()):
        name = f"{i:07d}.md"
        title = " ".join(doc["title"].split())
        body = f"# {title}\n\n{doc['text']}\n" if title else f"{doc['text']}\n"
        (folder / name).write_text(body, encoding="utf-8")
        doc_of[f"{SOURCE}:{name}"] = doc_id
    langs = {doc["lang"] for doc in corpus.values()}
    lang = langs.pop() if len(langs) == 1 and "" not in langs else None
    services.state.add_source(SourceConfig(name=SOURCE, kind="folder", location=str(folder),
                                           lang=lang, max_pages=max(1, len(corpus))))
    started = time.perf_counter()
    with services.write_lock():
        result = reindex(services, SOURCE, "full")
    if result.failed:
        raise ConfigError(f"ingesting the corpus failed for {result.failed} documents: {result.errors[:3]}")
    return {"seconds": round(time.perf_counter() - started, 3), "documents": result.added + result.changed,
            "chunks": result.chunks_embedded + result.chunks_reused, "doc_of": doc_of}


def _run_mode(services: Services, mode: str, queries: Mapping[str, str], doc_of: Mapping[str, str],
              candidates: int) -> tuple[dict[str, dict[str, float]], float]:
    retriever = HybridRetriever(services, mode=mode, candidates=candidates)
    run: dict[str, dict[str, float]] = {}
    started = time.perf_counter()
    for qid, text in queries.items():
        hits = retriever.retrieve(text, k=2 * DOC_DEPTH)  # a document can fill several slots
        ranked: list[str] = []
        for h in hits:  # hits are best first, so a document's first chunk is its best
            doc = doc_of.get(h.doc_id or (h.chunk.doc_id if h.chunk else ""))
            if doc is not None and doc not in ranked:
                ranked.append(doc)
                if len(ranked) == DOC_DEPTH:
                    break
        # Scores that encode the rank: trec_eval would break score ties by doc id.
        run[qid] = {doc: float(len(ranked) - i) for i, doc in enumerate(ranked)}
    return run, time.perf_counter() - started


def _measure(qrels: Qrels, run: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """Mean of each metric over every judged query; a query with no hits counts as 0."""
    names = {measure: name for name, measure in METRICS.items()}
    totals = dict.fromkeys(METRICS, 0.0)
    for m in ir_measures.iter_calc(list(METRICS.values()), qrels, {q: dict(r) for q, r in run.items() if r}):
        totals[names[m.measure]] += m.value
    return {name: round(total / len(qrels), 4) for name, total in totals.items()}
