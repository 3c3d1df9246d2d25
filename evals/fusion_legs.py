"""Dump each leg's ranked chunks for every judged query of a dev set, to study fusion offline.

One ingest per (set, embedder); then, per query, the BM25 and the vector top ``--depth``
chunks with their scores and documents. ``evals/fit_fusion.py`` replays fusion rules on
these files without touching an index, so a rule is tried on every set in seconds.

Example (DATA: the datasets folder of evals/README.md)::

    python evals/fusion_legs.py "$DATA/cranfield-dev" --embedder sentence-transformers \\
        --out /tmp/legs/cranfield-st.json --data-dir /tmp/legs/cranfield-st
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from evals.retrieval import ingest_corpus, load_beir
from ingest.services import open_services
from rag.config import Settings
from rag.retrieval.hybrid import HybridRetriever


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", type=Path, help="a BEIR-style folder (corpus.jsonl, queries.jsonl, qrels.tsv)")
    p.add_argument("--embedder", default="sentence-transformers", help="embedder backend")
    p.add_argument("--model", help="the embedder's model (a local folder or hub id)")
    p.add_argument("--queries", type=Path, help="replace the folder's queries.jsonl")
    p.add_argument("--qrels", type=Path, help="replace the folder's qrels.tsv")
    p.add_argument("--max-docs", type=int, help="only the corpus's first N documents (and the queries "
                   "with a relevant one among them): BM25's scores depend on the corpus's size")
    p.add_argument("--depth", type=int, default=100, help="chunks kept per leg")
    p.add_argument("--data-dir", type=Path, required=True, help="where the index is built (kept)")
    p.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    a = p.parse_args(argv)
    corpus, queries, qrels = load_beir(a.folder, a.queries, a.qrels)
    if a.max_docs is not None:
        corpus = dict(list(corpus.items())[:a.max_docs])
    judged = {q: {d: r for d, r in rels.items() if r > 0 and d in corpus} for q, rels in qrels.items()}
    settings = Settings.load(None, data_dir=a.data_dir, embedder={"backend": a.embedder, "model": a.model})
    services = open_services(settings)
    try:
        started = time.perf_counter()
        ingest = ingest_corpus(services, corpus, a.data_dir / "docs")
        doc_of = ingest.pop("doc_of")
        print(f"ingested {ingest} in {time.perf_counter() - started:.0f} s", file=sys.stderr)
        legs = {mode: HybridRetriever(services, mode=mode, candidates=a.depth, dedup_threshold=None)
                for mode in ("bm25", "vector")}
        out = []
        for qid, text in queries.items():
            if not judged.get(qid):
                continue
            row: dict = {"id": qid, "text": text, "qrels": judged[qid]}
            for mode, retriever in legs.items():
                hits = retriever.retrieve(text, k=a.depth)
                row[mode] = [[h.chunk_id, doc_of.get(h.doc_id, ""), round(float(h.explain[mode]), 5)]
                             for h in hits]
            out.append(row)
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps({"set": str(a.folder), "embedder": f"{services.embedder.name}",
                                     "queries": out}, ensure_ascii=False))
        print(f"{len(out)} queries -> {a.out}", file=sys.stderr)
    finally:
        services.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
