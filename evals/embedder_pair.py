"""Two embedders on the same questions: the paired tables behind ``bench/RESULTS-onnx.md``.

``retrieval A.json B.json``: two ``ragqa eval retrieval ... --per-query --json`` reports of the
same dataset and modes (A the baseline); per mode and metric, both means, B - A and the paired
randomization test's p (:func:`evals.stats.paired_p`).

``packed RUN_A RUN_B``: two ``ragqa eval answers`` run folders on the same questions; per pass
(answer, abstain), how many questions got the same packed context (the same chunks in the same
order, or in any order), the same first passage (all the llama.cpp default packs) and the same
answer text.

    python evals/embedder_pair.py retrieval runs/xquad-fp32.json runs/xquad-int8.json
    python evals/embedder_pair.py packed runs/ext-fp32 runs/ext-int8
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

METRICS = ("ndcg@10", "mrr@10", "recall@1", "recall@10")


def retrieval(a_path: str, b_path: str) -> None:
    from evals.stats import paired_p

    a, b = (json.loads(Path(p).read_text(encoding="utf-8")) for p in (a_path, b_path))
    print(f"{a['dataset']}: {a['queries']} queries, {a['docs']} documents; A {a['embedder']}, B {b['embedder']}")
    print(f"ingest: A {a['ingest']['seconds']:.1f} s, B {b['ingest']['seconds']:.1f} s "
          f"({a['ingest']['chunks']} / {b['ingest']['chunks']} chunks)")
    for mode in a["per_query"]:
        print(f"{mode} p50 ms/query: A {a['timing'][mode]['p50_ms']:.1f}, B {b['timing'][mode]['p50_ms']:.1f}")
    print("\n| mode | metric | A | B | B − A | p |\n|---|---|---|---|---|---|")
    for mode in a["per_query"]:
        for metric in METRICS:
            qa, qb = a["per_query"][mode][metric], b["per_query"][mode][metric]
            if set(qa) != set(qb):
                raise SystemExit(f"{mode} {metric}: the two reports scored different queries")
            keys = sorted(qa)
            x, y = [qa[k] for k in keys], [qb[k] for k in keys]
            ma, mb = sum(x) / len(x), sum(y) / len(y)
            print(f"| {mode} | {metric} | {ma:.4f} | {mb:.4f} | {mb - ma:+.4f} | {paired_p(y, x):.2f} |")


def _rows(run: str) -> dict[tuple[str, str], dict[str, Any]]:
    rows = {}
    for line in (Path(run) / "rows.jsonl").read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        rows[(row["pass"], row["qid"])] = row
    return rows


def packed(run_a: str, run_b: str) -> None:
    a, b = _rows(run_a), _rows(run_b)
    keys = set(a) & set(b)
    for kind in sorted({k[0] for k in keys}):
        ks = [k for k in keys if k[0] == kind]
        same = sum(a[k]["packed"] == b[k]["packed"] for k in ks)
        same_set = sum(set(a[k]["packed"]) == set(b[k]["packed"]) for k in ks)
        first = sum(a[k]["packed"][:1] == b[k]["packed"][:1] for k in ks)
        text = sum(a[k]["answer"] == b[k]["answer"] for k in ks)
        print(f"{kind}: {len(ks)} questions; identical packed context {same} (same chunks in any order "
              f"{same_set}); same first passage {first}; identical answer text {text}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    r = sub.add_parser("retrieval", help="paired retrieval metrics of two per-query reports")
    r.add_argument("a")
    r.add_argument("b")
    k = sub.add_parser("packed", help="identical packed contexts of two answer runs")
    k.add_argument("a")
    k.add_argument("b")
    args = p.parse_args()
    (retrieval if args.what == "retrieval" else packed)(args.a, args.b)


if __name__ == "__main__":
    main()
