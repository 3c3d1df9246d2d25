"""Query-path latency: retrieval (with hydration and rerank) and a whole extractive answer,
on the embedded default and on the scale-out servers with and without the local vector store.

The corpus is the Python 3.11 docs (release v1, 526 pages) and the XQuAD English and Chinese
paragraphs, about 15k chunks, indexed once through the real pipeline with the hash embedder
at MiniLM's dimension (384): what is timed here (BM25, vector search, fetching 100 candidate
vectors for the reranker, chunk text, packing) depends on the number and size of vectors,
not on what they mean. The questions are XQuAD-en's. The answer cache is off, so every
question retrieves.

Setups (``--setup``):

* ``embedded``: tantivy, Milvus Lite and the local exact vector store (the default).
* ``servers``: Elasticsearch and a Milvus server, no local vector store and a data
  directory that does not exist: what an API instance on the scale-out settings reads.
* ``servers-cache``: the same with the local vector store (``vector.cache: true``) as an
  accelerator for the vector leg and the reranker's vectors.

    python bench/bench_query_path.py --setup embedded
    python bench/bench_query_path.py --setup servers,servers-cache \\
        --es http://127.0.0.1:9200 --milvus http://127.0.0.1:19530

To time another revision of the code on the same index, extract it and point
``RAGQA_CODE`` at it (``git archive REV | tar -x -C /tmp/rev``; ``RAGQA_CODE=/tmp/rev``).

Prints p50/p95 milliseconds of retrieval and its steps, and of the whole answer, per mode.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CODE = Path(os.environ.get("RAGQA_CODE") or ROOT)
sys.path.insert(0, str(CODE))

from ingest.pipeline import reindex  # noqa: E402
from ingest.services import open_services  # noqa: E402
from rag.answer import Answerer  # noqa: E402
from rag.config import Settings, SourceConfig  # noqa: E402
from rag.retrieval import HybridRetriever  # noqa: E402
from rag.services import Services  # noqa: E402

PYDOCS = ROOT / "tests" / "data" / "crawl-pydocs311" / "v1.tar.xz"
SHARED = ROOT.parent / "shared" / "data"
INDEX, COLLECTION = "ragqa-bench-query-path", "ragqa_bench_query_path"


def write_corpus(folder: Path) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(PYDOCS) as tar:
            tar.extractall(tmp, filter="data")
        n = 0
        for page in sorted(Path(tmp).rglob("*.html")):
            out = folder / "pydocs" / page.relative_to(tmp)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(page.read_bytes())
            n += 1
    for lang in ("en", "zh"):
        for line in (SHARED / f"xquad-{lang}" / "corpus.jsonl").read_text(encoding="utf-8").splitlines():
            p = json.loads(line)
            out = folder / "xquad" / f"{p['id']}-{lang}.md"
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(f"# {p.get('title') or p['id']}\n\n{p['text']}\n", encoding="utf-8")
            n += 1
    return n


def settings(setup: str, work: Path, es: str | None, milvus: str | None) -> Settings:
    common = {"embedder": {"backend": "hash", "dim": 384, "progress": False},
              "generator": {"backend": "extractive"}, "cache": {"backend": "off"}}
    if setup == "embedded":
        return Settings.load(None, data_dir=work / "embedded", **common)
    if not (es and milvus):
        raise SystemExit("--es and --milvus are needed for the server setups")
    servers = {"lexical": {"backend": "elasticsearch", "url": es, "index": INDEX},
               "vector": {"backend": "milvus", "uri": milvus, "collection": COLLECTION,
                          "cache": setup != "servers"}}
    # The servers-only instance gets a data directory that does not exist: it must not need one.
    data_dir = work / "servers" if setup != "servers" else work / "absent" / "data"
    return Settings.load(None, data_dir=data_dir, **servers, **common)


def ensure_index(setup: str, work: Path, es: str | None, milvus: str | None) -> None:
    """Index the corpus once: into the embedded data directory, or into Elasticsearch and
    Milvus with the local vector store beside them (so both server setups have what they read)."""
    name = "embedded" if setup == "embedded" else "servers-cache"
    services = open_services(settings(name, work, es, milvus))
    try:
        if services.state.sources() and services.lexical.count() > 0:
            return
        docs = work / "docs"
        files = write_corpus(docs) if not docs.exists() else sum(1 for _ in docs.rglob("*.*"))
        services.state.add_source(SourceConfig(name="bench", kind="folder", location=str(docs), max_pages=files + 10))
        started = time.perf_counter()
        with services.write_lock():
            report = reindex(services, "bench", "full")
        print(f"index ({name}): {files} files, {services.lexical.count()} chunks in "
              f"{time.perf_counter() - started:.0f} s ({report.chunks_embedded} embedded)", file=sys.stderr)
    finally:
        services.close()


def questions(n: int) -> list[str]:
    path = SHARED / "xquad-en" / "queries.jsonl"
    out = [json.loads(line)["text"] for line in path.read_text(encoding="utf-8").splitlines()]
    random.Random(0).shuffle(out)
    return out[:n]


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def measure(services: Services, mode: str, qs: list[str], k: int) -> dict[str, list[float]]:
    retriever = HybridRetriever.from_services(services, mode=mode)
    answerer = Answerer(services, retriever=retriever)
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(answerer.start())
        for q in qs[:10]:  # warm: connections, the collection load, the tantivy searcher
            retriever.search(q, k=k)
            loop.run_until_complete(answerer.ask(q))
        steps: dict[str, list[float]] = {}
        for q in qs:
            started = time.perf_counter()
            result = retriever.search(q, k=k)
            steps.setdefault("retrieval", []).append((time.perf_counter() - started) * 1000)
            for step, ms in result.timings.items():
                steps.setdefault(step.removesuffix("_ms"), []).append(ms)
            if result.degraded:
                raise SystemExit(f"degraded retrieval: {result.degraded}")
            started = time.perf_counter()
            answer = loop.run_until_complete(answerer.ask(q))
            steps.setdefault("answer", []).append((time.perf_counter() - started) * 1000)
            if not answer.citations:
                steps.setdefault("uncited", []).append(1.0)
        loop.run_until_complete(answerer.close())
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
    return steps


def fetches(services: Services, qs: list[str], k: int) -> None:
    """The reranker's fetch of 100 candidates' vectors from the Milvus server, at each read
    consistency (the time ``rerank`` spends without the local vector store)."""
    index = services.vector
    if not hasattr(index, "read_consistency"):
        return
    ids = [[h.chunk_id for h in services.lexical.search(q, k=100)] for q in qs[:50]]
    default = index.read_consistency
    for level in (default, "Strong"):
        index.read_consistency = level
        times = []
        for batch in ids:
            started = time.perf_counter()
            index.get_vectors(batch)
            times.append((time.perf_counter() - started) * 1000)
        print(f"  fetch 100 vectors from Milvus at {level}: p50 {pct(times, .5):.1f} ms, p95 {pct(times, .95):.1f} ms")
    index.read_consistency = default


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--setup", default="embedded", help="embedded, servers, servers-cache (comma-separated)")
    ap.add_argument("--modes", default="rrf,hybrid")
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--es", help="Elasticsearch URL for the server setups")
    ap.add_argument("--milvus", help="Milvus server URI for the server setups")
    ap.add_argument("--work", type=Path, default=Path.home() / ".cache" / "ragqa" / "bench-query-path")
    ap.add_argument("--index-only", action="store_true", help="Build the index and stop.")
    args = ap.parse_args()
    qs = questions(args.queries)
    print(f"code: {CODE}; {len(qs)} XQuAD-en questions, k={args.k}, answer cache off, extractive answers; "
          f"load average {os.getloadavg()[0]:.2f}")
    for setup in args.setup.split(","):
        ensure_index(setup, args.work, args.es, args.milvus)
        if args.index_only:
            continue
        cfg = settings(setup, args.work, args.es, args.milvus)
        services = open_services(cfg)
        try:
            chunks = services.lexical.count()
            for mode in args.modes.split(","):
                steps = measure(services, mode, qs, args.k)
                print(f"\n{setup} ({chunks} chunks; vector cache {services.backend_names()['vector_cache']}), "
                      f"mode {mode}; load average {os.getloadavg()[0]:.2f}")
                print(f"  {'step':<12}{'p50 ms':>9}{'p95 ms':>9}")
                for step, values in steps.items():
                    if step != "uncited":
                        print(f"  {step:<12}{pct(values, .5):9.2f}{pct(values, .95):9.2f}")
                if steps.get("uncited"):
                    print(f"  ({len(steps['uncited'])} answers without a citation)")
            if setup != "embedded":
                fetches(services, qs, args.k)
            opened = "state" in services.__dict__
            print(f"  the state was {'opened' if opened else 'never opened'}; data directory "
                  f"{'exists' if Path(cfg.data_dir).exists() else 'absent'}")
        finally:
            services.close()


if __name__ == "__main__":
    main()
