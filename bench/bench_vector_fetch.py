"""Vector fetch and flat search latency: Milvus Lite against NumpyVectorIndex.

Loads ``--n`` random unit vectors (dim ``--dim``) with chunk metadata into both stores,
then prints p50/p99 of ``get_vectors`` for 100 and 200 random candidate ids (what a rerank
of lexical candidates does) and of an exact top-10 search, unfiltered and filtered.
Also prints Milvus Lite's start-up time and the process's resident memory.

    python bench/bench_vector_fetch.py [--n 50000] [--dim 384] [--repeats 100] [--search-repeats 30]
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rag.types import Chunk, Filters, Trust  # noqa: E402
from rag.vectors.numpy_index import NumpyVectorIndex  # noqa: E402


def rss_mib() -> float:
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timed(fn, repeats: int) -> str:
    samples = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    samples.sort()
    p50, p99 = samples[len(samples) // 2], samples[int(len(samples) * 0.99)]
    return f"p50 {p50 * 1000:8.2f} ms   p99 {p99 * 1000:8.2f} ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=50_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--repeats", type=int, default=100, help="fetches per size")
    ap.add_argument("--search-repeats", type=int, default=30, help="searches per case")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(args.n, args.dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    chunks = [
        Chunk(id=f"{i:012x}", doc_id=f"doc{i // 8}", source=f"src{i % 5}", hash=f"h{i}",
              text=f"passage {i} " + "lorem ipsum dolor sit amet " * 30, lang="en",
              trust=Trust(i % 3), tags=("a",) if i % 2 else ())
        for i in range(args.n)
    ]
    ids = [c.id for c in chunks]
    queries = rng.normal(size=(args.search_repeats, args.dim)).astype(np.float32)
    filters = Filters(source=("src1",), min_trust=Trust.normal)
    tmp = tempfile.TemporaryDirectory()
    print(f"{args.n} vectors, dim {args.dim}; RSS at start {rss_mib():.0f} MiB")

    stores = []
    t = time.perf_counter()
    numpy_index = NumpyVectorIndex(Path(tmp.name) / "vectors.db", args.dim)
    for i in range(0, args.n, 5000):
        numpy_index.upsert(chunks[i: i + 5000], vectors[i: i + 5000])
    print(f"numpy: loaded in {time.perf_counter() - t:.1f} s, RSS {rss_mib():.0f} MiB")
    stores.append(("numpy", numpy_index))

    from rag.vectors.milvus import MilvusVectorIndex

    t = time.perf_counter()
    milvus = MilvusVectorIndex(str(Path(tmp.name) / "milvus.db"), "bench", args.dim)
    milvus.count()
    print(f"milvus lite: started and created the collection in {time.perf_counter() - t:.1f} s, "
          f"RSS {rss_mib():.0f} MiB")
    t = time.perf_counter()
    for i in range(0, args.n, 5000):
        milvus.upsert(chunks[i: i + 5000], vectors[i: i + 5000])
    print(f"milvus lite: loaded in {time.perf_counter() - t:.1f} s, RSS {rss_mib():.0f} MiB")
    t = time.perf_counter()
    milvus.flush()
    print(f"milvus lite: flushed in {time.perf_counter() - t:.1f} s, RSS {rss_mib():.0f} MiB")
    stores.append(("milvus lite", milvus))

    pick = np.random.default_rng(1)
    for name, store in stores:
        store.get_vectors(ids[:10])  # warm up
        store.search(queries[0], k=10)
        for size in (100, 200):
            def fetch(s=store, m=size) -> None:
                s.get_vectors([ids[j] for j in pick.choice(args.n, m, replace=False)])

            print(f"{name:12s} get_vectors({size})      " + timed(fetch, args.repeats))
        qs = iter(np.tile(queries, (3, 1)))
        print(f"{name:12s} search k=10            "
              + timed(lambda s=store, qs=qs: s.search(next(qs), k=10), args.search_repeats))
        print(f"{name:12s} search k=10 filtered   "
              + timed(lambda s=store, qs=qs: s.search(next(qs), k=10, filters=filters), args.search_repeats))
    print(f"RSS at end {rss_mib():.0f} MiB")
    milvus.drop()
    milvus.close()
    numpy_index.close()
    tmp.cleanup()


if __name__ == "__main__":
    main()
