"""Retrieval latency over a 50k-chunk index on the embedded default (tantivy + Milvus Lite +
the local vector cache), step by step.

The corpus repeats the Python docs (release v1, 530 pages) and the XQuAD English and
Chinese paragraphs with variations (each copy swaps some words and adds a line) until it
holds about ``--chunks`` chunks. It is indexed once with the hash embedder at MiniLM's
dimension (384): the latency of BM25, vector search, fetch, rerank and packing depends on
the number and size of vectors, not on what they mean, and embedding 50k chunks with a
real model takes an hour on two cores. Query embedding with the real models is timed
separately. The index is kept in ``--data-dir`` for reruns.

    python bench/bench_retrieval.py [--chunks 50000] [--queries 400] [--modes hybrid,rrf]

Prints p50/p99 milliseconds of each step and of the total without query embedding.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import random
import statistics
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ingest.pipeline import reindex  # noqa: E402
from ingest.services import open_services  # noqa: E402
from rag.config import Settings, SourceConfig  # noqa: E402
from rag.packing import ContextPacker  # noqa: E402
from rag.retrieval import HybridRetriever  # noqa: E402
from rag.services import Services  # noqa: E402
from rag.types import Document  # noqa: E402

PYDOCS = ROOT / "tests" / "data" / "crawl-pydocs311" / "v1.tar.xz"
SHARED = ROOT.parent / "shared" / "data"
SWAPS = [("the", "a"), ("is", "becomes"), ("function", "routine"), ("module", "package"),
         ("的", "之"), ("是", "为"), ("returns", "gives back"), ("value", "result")]


def build_corpus(folder: Path, copies: int) -> int:
    """Write ``copies`` varied copies of the pydocs pages and XQuAD paragraphs as files."""
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(PYDOCS) as tar:
            tar.extractall(tmp, filter="data")
        pages = sorted(p for p in Path(tmp).rglob("*.html"))
        html = [(p.relative_to(tmp), p.read_text(encoding="utf-8", errors="replace")) for p in pages]
    paragraphs = []
    for lang in ("en", "zh"):
        corpus = SHARED / f"xquad-{lang}" / "corpus.jsonl"
        if corpus.exists():
            paragraphs += [{**json.loads(line), "lang": lang}
                           for line in corpus.read_text(encoding="utf-8").splitlines()]
    n = 0
    for c in range(copies):
        rnd = random.Random(c)
        swaps = rnd.sample(SWAPS, 3) if c else []
        for rel, text in html:
            for a, b in swaps:
                text = text.replace(f" {a} ", f" {b} ")
            if c:
                text = text.replace("<body", f"<p>Copy {c}: {' '.join(rnd.sample(SWAPS, 2)[0])}</p><body", 1)
            out = folder / f"copy{c}" / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text, encoding="utf-8")
            n += 1
        for p in paragraphs:
            body = p["text"]
            for a, b in swaps:
                body = body.replace(a, b)
            out = folder / f"copy{c}" / "xquad" / f"{p['id']}-{p['lang']}.md"
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(f"# {p.get('title') or p['id']} ({c})\n\n{body}\n", encoding="utf-8")
            n += 1
    return n


def settings_for(data_dir: Path) -> Settings:
    return Settings.load(None, data_dir=data_dir, embedder={"backend": "hash", "dim": 384, "progress": False})


def ensure_index(data_dir: Path, chunks: int) -> Services:
    """Index one copy through the real pipeline, then add varied copies of its chunks."""
    services = open_services(settings_for(data_dir))
    have = services.lexical.count() if (data_dir / "state.db").exists() else 0
    if have >= chunks * 0.9:
        print(f"index: reusing {have} chunks in {data_dir}", file=sys.stderr)
        return services
    docs = data_dir / "docs"
    if not (docs / "copy0").exists():
        files = build_corpus(docs, 1)
    else:
        files = sum(1 for _ in docs.rglob("*.*"))
    services.state.add_source(SourceConfig(name="bench", kind="folder", location=str(docs), max_pages=files + 10))
    started = time.perf_counter()
    with services.write_lock():
        report = reindex(services, "bench", "incremental")
    base = list(services.state.iter_chunks("bench"))
    print(f"index: {files} files, {len(base)} chunks through the pipeline in "
          f"{time.perf_counter() - started:.0f} s ({report.chunks_embedded} embedded)", file=sys.stderr)
    indexes = services.indexes()
    known = {c.id for c in services.state.iter_chunks()}
    for index in indexes.values():  # left by an interrupted earlier run
        orphans = index.chunk_ids() - known
        if orphans:
            index.delete_chunks(orphans)
    copy = 1 + max((int(c.doc_id.rsplit("#", 1)[1]) for c in services.state.iter_chunks() if "#" in c.doc_id),
                   default=0)
    started = time.perf_counter()
    while services.lexical.count() < chunks:
        rnd = random.Random(copy)  # variations, not secrets
        swaps = rnd.sample(SWAPS, 3)
        batch = []
        for c in base:
            text = c.text
            for a, b in swaps:
                text = text.replace(f" {a} ", f" {b} ")
            text = f"{text} ({copy})"
            h = hashlib.sha256(text.encode()).hexdigest()
            doc_id = f"{c.doc_id}#{copy}"
            cid = hashlib.sha256(f"{doc_id}\x00{c.id}".encode()).hexdigest()[:32]
            batch.append(dataclasses.replace(c, id=cid, doc_id=doc_id, text=text, hash=h))
        for start in range(0, len(batch), 2000):
            part = batch[start:start + 2000]
            vectors = services.embedder.embed_documents([c.text for c in part])
            for name, index in indexes.items():
                if name == "lexical":
                    index.upsert(part)
                else:
                    index.upsert(part, vectors)
            by_doc: dict[str, list] = {}
            for c in part:
                by_doc.setdefault(c.doc_id, []).append(c)
            for doc_id, cs in by_doc.items():
                first = cs[0]
                services.state.save_document(
                    Document(id=doc_id, source=first.source, url=first.url, title=first.title, text="",
                             lang=first.lang, modified=first.modified), "", None, None, cs)
        print(f"index: copy {copy}, {services.lexical.count()} chunks "
              f"({time.perf_counter() - started:.0f} s)", file=sys.stderr)
        copy += 1
    return services


def queries(n: int) -> list[str]:
    out = []
    for lang in ("en", "zh"):
        path = SHARED / f"xquad-{lang}" / "queries.jsonl"
        if path.exists():
            out += [json.loads(line)["text"] for line in path.read_text(encoding="utf-8").splitlines()]
    out += ["how do I verify an ssl certificate", "asyncio gather exceptions", "json dumps indent",
            "pathlib glob recursive", "subprocess run timeout", "logging basicConfig format"]
    random.Random(0).shuffle(out)
    return out[:n]


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chunks", type=int, default=50_000)
    ap.add_argument("--queries", type=int, default=400)
    ap.add_argument("--modes", default="hybrid,rrf")
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--budget", type=int, default=3000, help="Context tokens to pack.")
    ap.add_argument("--data-dir", type=Path, default=Path.home() / ".cache" / "ragqa" / "bench-retrieval")
    args = ap.parse_args()

    services = ensure_index(args.data_dir, args.chunks)
    qs = queries(args.queries)
    from rag.embedders import SentenceTransformerEmbedder

    tokenizer = SentenceTransformerEmbedder().tokenizer  # a real tokenizer to measure the budget
    packer = ContextPacker(lambda text: len(tokenizer.encode(text, add_special_tokens=False).ids), args.budget)
    print(f"\n{services.lexical.count()} chunks, {len(qs)} queries, k={args.k}, "
          f"context budget {args.budget} tokens\n")
    for mode in args.modes.split(","):
        retriever = HybridRetriever.from_services(services, mode=mode)
        for q in qs[:20]:  # warm caches
            retriever.search(q, k=args.k)
        steps: dict[str, list[float]] = {}
        for q in qs:
            result = retriever.search(q, k=args.k)
            started = time.perf_counter()
            packer.pack(result.hits)
            timings = {**result.timings, "pack_ms": (time.perf_counter() - started) * 1000}
            timings["total_without_embed_ms"] = sum(v for s, v in timings.items() if s != "embed_ms")
            for step, v in timings.items():
                steps.setdefault(step, []).append(v)
        print(f"mode {mode} (reranker {retriever.reranker.name})")
        print(f"  {'step':<24}{'p50 ms':>9}{'p99 ms':>9}{'mean ms':>9}")
        for step, values in steps.items():
            print(f"  {step.removesuffix('_ms'):<24}{pct(values, .5):9.2f}{pct(values, .99):9.2f}"
                  f"{statistics.fmean(values):9.2f}")
        print()
    fetch = []
    ids = list(services.vector_cache.chunk_ids())[:100] if services.vector_cache is not None else []
    for _ in range(50):
        started = time.perf_counter()
        services.vector.get_vectors(ids)
        fetch.append((time.perf_counter() - started) * 1000)
    print(f"fetch 100 vectors from Milvus Lite instead of the cache: p50 {pct(fetch, .5):.1f} ms, "
          f"p99 {pct(fetch, .99):.1f} ms")
    from rag.embedders import UniversalSentenceEncoderEmbedder

    for name, factory in (("MiniLM (sentence-transformers)", SentenceTransformerEmbedder),
                          ("multilingual USE", UniversalSentenceEncoderEmbedder)):
        embedder = factory()
        embedder.embed_query("warm up")
        times = []
        for q in qs[:100]:
            started = time.perf_counter()
            embedder.embed_query(q)
            times.append((time.perf_counter() - started) * 1000)
        print(f"query embedding, {name}: p50 {pct(times, .5):.1f} ms, p99 {pct(times, .99):.1f} ms")
    services.close()


if __name__ == "__main__":
    main()
