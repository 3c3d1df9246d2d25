"""Lexical search latency on a 50k-chunk corpus (TantivyIndex, in memory or on disk).

The corpus repeats the XQuAD (English) and Cranfield passages with word-level variations
until it reaches ``--chunks``, with random metadata on every chunk; ``--zh`` adds the
RGB Chinese passages. Queries are the datasets' own questions. Prints p50/p99 for top-100
search with and without filters, both for tantivy alone and for ``TantivyIndex.search``
(which also decodes the 100 stored chunks).

    python bench/bench_lexical.py [--data tests/data] [--chunks 50000] [--zh] [--disk]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rag.lexical.tantivy_index import TantivyIndex  # noqa: E402
from rag.types import Chunk, Filters, Trust  # noqa: E402


def read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def build_corpus(data: Path, n: int, zh: bool, rng: random.Random) -> list[Chunk]:
    names = ["xquad-en", "cranfield-dev"] + (["rgb-zh-dev"] if zh else [])
    rows = [row for name in names for row in read_jsonl(data / name / "corpus.jsonl")]
    chunks: list[Chunk] = []
    copy = 0
    while len(chunks) < n:
        for row in rows:
            if len(chunks) >= n:
                break
            text, words = row["text"], row["text"].split()
            if copy and len(words) > 8:  # vary the copies: drop a few words, swap a few
                words = [w for w in words if rng.random() > 0.08]
                for _ in range(3):
                    j = rng.randrange(len(words) - 1)
                    words[j], words[j + 1] = words[j + 1], words[j]
                text = " ".join(words)
            i = len(chunks)
            chunks.append(Chunk(
                id=f"{row['id']}~{copy}", doc_id=f"{row['id']}~{copy}", source=f"src{i % 5}",
                text=text, hash=str(i), title=row.get("title", ""),
                lang="en", trust=Trust(i % 3), tags=tuple(t for t in ("a", "b", "c") if rng.random() < 0.3),
                published=None if i % 4 == 0 else datetime(2020, 1, 1, tzinfo=UTC) + timedelta(days=i % 1500),
            ))
        copy += 1
    return chunks


def percentiles(samples: list[float]) -> str:
    s = sorted(samples)
    return f"p50 {s[len(s) // 2] * 1000:.3f} ms  p99 {s[int(len(s) * 0.99)] * 1000:.3f} ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=ROOT / "tests" / "data")
    ap.add_argument("--chunks", type=int, default=50_000)
    ap.add_argument("--zh", action="store_true", help="add the Chinese passages and questions")
    ap.add_argument("--disk", action="store_true", help="index on disk instead of in memory")
    ap.add_argument("--k", type=int, default=100)
    args = ap.parse_args()
    rng = random.Random(0)

    corpus = build_corpus(args.data, args.chunks, args.zh, rng)
    def questions(name: str) -> list[str]:
        return [q["text"] for q in read_jsonl(args.data / name / "queries.jsonl")]

    queries = questions("xquad-en") + questions("cranfield-dev")
    zh_queries = questions("rgb-zh-dev") if args.zh else []

    tmp = tempfile.TemporaryDirectory()
    index = TantivyIndex(Path(tmp.name) / "lexical" if args.disk else None)
    t0 = time.perf_counter()
    for i in range(0, len(corpus), 5000):
        index.upsert(corpus[i: i + 5000])
    print(f"indexed {index.count()} chunks in {time.perf_counter() - t0:.1f} s "
          f"({'disk' if args.disk else 'memory'})")

    searcher = index._idx().searcher()
    filters = Filters(source=("src1", "src2", "src3"), tags=("a", "b"), min_trust=Trust.normal,
                      published_from=datetime(2021, 1, 1, tzinfo=UTC))
    for label, qs, f in (("english", queries, None), ("english+filters", queries, filters),
                         ("chinese", zh_queries, None)):
        if not qs:
            continue
        for q in qs[:50]:  # warm up
            index.search(q, k=args.k, filters=f)
        raw, full, sizes = [], [], []
        for q in qs:
            query = index.build_query(q, f)
            if query is None:
                continue
            t = time.perf_counter()
            searcher.search(query, limit=args.k, count=False)
            raw.append(time.perf_counter() - t)
            t = time.perf_counter()
            sizes.append(len(index.search(q, k=args.k, filters=f)))
            full.append(time.perf_counter() - t)
        print(f"{label:16s} top-{args.k} over {len(qs)} queries, mean {sum(sizes) / len(sizes):.0f} hits")
        print(f"  tantivy search only        {percentiles(raw)}")
        print(f"  TantivyIndex.search        {percentiles(full)}  (analysis + search + 100 chunks)")

    t = time.perf_counter()
    ids = index.chunk_ids()
    print(f"chunk_ids(): {len(ids)} ids in {(time.perf_counter() - t) * 1000:.0f} ms")
    index.close()
    tmp.cleanup()


if __name__ == "__main__":
    main()
