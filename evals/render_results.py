"""Render the JSON reports of ``evals/sweep_retrieval.sh`` as Markdown tables.

    python evals/render_results.py /tmp/ragqa-sweep            # every *.json there
    python evals/render_results.py /tmp/ragqa-sweep rgb-use    # one run
    python evals/render_results.py --first 300 /tmp/ragqa-sweep zh-en-use   # its first 300 queries
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from evals import stats

COLUMNS = ("ndcg@10", "recall@10", "mrr@10", "recall@100")
BASELINES = ("rrf", "bm25")  # the configured default (rrf, 100 candidates, k 60, weights 1,1), and BM25


def paired_p(a: dict[str, float], b: dict[str, float]) -> float:
    """:func:`evals.stats.paired_p` over the queries of ``a`` (per-query scores by query id)."""
    return stats.paired_p([a[q] for q in a], [b[q] for q in a])


def table(report: dict, best: int = 0) -> str:
    """One row per variant; ``best`` > 0 marks the top rows by nDCG@10 in bold."""
    order = sorted(report["metrics"], key=lambda n: -report["metrics"][n]["ndcg@10"])
    top = set(order[:best])
    per_query = report.get("per_query", {})
    bases = [b for b in BASELINES if b in per_query]
    lines = ["| variant | " + " | ".join(COLUMNS) + " | ms/query (mean / p50) |"
             + "".join(f" Δ nDCG@10 vs {b} (p) |" for b in bases),
             "|---" * (len(COLUMNS) + 2 + len(bases)) + "|"]
    for name, values in report["metrics"].items():
        label = f"**{name}**" if name in top else name
        cells = " | ".join(f"{values[c]:.3f}" for c in COLUMNS)
        timing = report["timing"][name]
        ms = f"{timing['ms_per_query']:.0f}" + (f" / {timing['p50_ms']:.0f}" if "p50_ms" in timing else "")
        row = f"| {label} | {cells} | {ms} |"
        for base in bases:
            delta = values["ndcg@10"] - report["metrics"][base]["ndcg@10"]
            p = paired_p(per_query[name]["ndcg@10"], per_query[base]["ndcg@10"])
            row += " – |" if name == base else f" {delta:+.3f} ({p:.2f}) |"
        lines.append(row)
    return "\n".join(lines)


def header(name: str, report: dict) -> str:
    extra = f", queries from `{report['queries_file']}`" if "queries_file" in report else ""
    return (f"`{name}`: {report['dataset']}{extra}: {report['queries']} queries, {report['docs']} docs, "
            f"{report['ingest']['chunks']} chunks, embedder `{report['embedder']}`, ingest "
            f"{report['ingest']['seconds']:.0f} s, whole run {report.get('wall_s', '?')} s")


def first(report: dict, n: int) -> dict:
    """The report's metrics over its first ``n`` queries only (needs ``--per-query``), to
    compare with a run that had ``--limit n``; timings stay those of the whole run."""
    out = {**report, "queries": min(n, report["queries"]), "metrics": {}, "per_query": {}}
    for name, metrics in report["per_query"].items():
        out["per_query"][name] = {m: dict(list(values.items())[:n]) for m, values in metrics.items()}
        out["metrics"][name] = {m: round(sum(v.values()) / len(v), 4) for m, v in out["per_query"][name].items()}
    return out


def main(argv: list[str]) -> None:
    n = None
    if len(argv) > 1 and argv[0] == "--first":
        n, argv = int(argv[1]), argv[2:]
    folder = Path(argv[0])
    names = argv[1:] or sorted(p.stem for p in folder.glob("*.json"))
    for name in names:
        report = json.loads((folder / f"{name}.json").read_text())
        if n is not None:
            report = first(report, n)
            name = f"{name} (first {n} queries)"
        print(f"### {name}\n\n{header(name, report)}\n\n```\n{report.get('command', '')}\n```\n")
        print(table(report, best=3) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
