"""What the English embedder costs the first question: MiniLM fp32 (torch) against int8 (onnxruntime).

For each embedder, in turn and ``--rounds`` times (alternating, so both see the same load), a
fresh Python process measures

- ``first``: from the process's start of work (before importing ragqa) to the first question's
  vector, model loading included (what a new ``ragqa ask`` or a just-started server pays;
  the int8 model is already built, as it is after the first ingest);
- ``p50`` / ``p99``: the median and 99th-percentile ms of embedding each of ``--queries``
  XQuAD-en questions after that.

Every figure comes with the machine's 1-minute load average when it was taken.

    python bench/bench_query_embed.py                  # prints a Markdown table
    python bench/bench_query_embed.py --rounds 5 --queries 300
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUERIES = ROOT / "tests" / "data" / "xquad-en" / "queries.jsonl"
BACKENDS = ("sentence-transformers", "onnx-int8")

CHILD = r"""
import json, sys, time
start = time.perf_counter()
from rag.config import EmbedderSettings
from rag.embedders import make_embedder
backend, path, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
queries = [json.loads(line)["text"] for line in open(path, encoding="utf-8")][:n]
embedder = make_embedder(EmbedderSettings(backend=backend, progress=False))
embedder.embed_query(queries[0])
first = time.perf_counter() - start
times = []
for q in queries[1:]:
    t = time.perf_counter()
    embedder.embed_query(q)
    times.append((time.perf_counter() - t) * 1000)
times.sort()
print(json.dumps({"first_s": first, "p50_ms": times[len(times) // 2],
                  "p99_ms": times[min(len(times) - 1, int(len(times) * 0.99))]}))
"""


def load() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="fresh processes per embedder")
    p.add_argument("--queries", type=int, default=200, help="XQuAD-en questions per process")
    args = p.parse_args()
    results: dict[str, list[dict[str, float]]] = {b: [] for b in BACKENDS}
    loads: dict[str, list[str]] = {b: [] for b in BACKENDS}
    for _ in range(args.rounds):
        for backend in BACKENDS:
            out = subprocess.run([sys.executable, "-c", CHILD, backend, str(QUERIES), str(args.queries + 1)],
                                 cwd=ROOT, check=True, capture_output=True, text=True)
            results[backend].append(json.loads(out.stdout.strip().splitlines()[-1]))
            loads[backend].append(load())
    print("| embedder | first question s, each round | query p50 ms (each round) | query p99 ms | load |")
    print("|---|---|---|---|---|")
    for backend in BACKENDS:
        rows = results[backend]
        firsts = ", ".join(f"{r['first_s']:.2f}" for r in rows)
        p50 = statistics.median(r["p50_ms"] for r in rows)
        p99 = statistics.median(r["p99_ms"] for r in rows)
        each = ", ".join(f"{r['p50_ms']:.1f}" for r in rows)
        print(f"| {backend} | {firsts} | {p50:.1f} ({each}) | {p99:.1f} | {', '.join(loads[backend])} |")


if __name__ == "__main__":
    main()
