"""``ragqa eval``: measure retrieval quality on a labelled dataset."""

from __future__ import annotations

from typing import Any

import click

from rag.cli.common import Context, emit, handle_errors

__all__ = ["eval_group"]

MODE_NAMES = ("bm25", "vector", "hybrid", "rrf")
EMBEDDERS = ("sentence-transformers", "use", "e5", "hash")


@click.group("eval")
def eval_group() -> None:
    """Measure retrieval quality on a labelled (BEIR-style) dataset."""


@eval_group.command("retrieval")
@click.argument("dataset_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--modes", "-m", default=None,
              help="Comma-separated retrieval modes to compare, with the shared --candidates, --rrf-k "
              f"and --weights. [default: {','.join(MODE_NAMES)}, or none when --variant is given]")
@click.option("--variant", "-V", "variants", multiple=True, metavar="[NAME=]MODE[:KEY=VALUE]...",
              help="Also run this variant on the same ingest; repeatable. KEYs: candidates (c), rrf_k (k), "
              "weights (w, as BM25,VECTOR). E.g. 'rrf:weights=1,0.5:rrf_k=20', 'hybrid:c=200', "
              "'best=rrf:w=2,1'. Unnamed variants are named by their non-default parameters.")
@click.option("--limit", "-n", type=click.IntRange(1), help="Only the first N judged queries.")
@click.option("--candidates", type=click.IntRange(1, 10000),
              help="Candidates per leg (BM25 prefilter, rank fusion). [default: the settings' "
              "retrieval.candidates, 100]")
@click.option("--rrf-k", type=click.FloatRange(0),
              help="Damping constant of rank fusion (rrf). [default: the settings' retrieval.rrf_k, 60]")
@click.option("--weights", metavar="BM25,VECTOR",
              help="Rank-fusion weights of the BM25 and vector legs (rrf). [default: the settings' "
              "retrieval.weights, else the embedder's default]")
@click.option("--queries", "queries_file", type=click.Path(exists=True, dir_okay=False),
              help="A queries.jsonl to use instead of DATASET_DIR's (e.g. another language's questions).")
@click.option("--qrels", "qrels_file", type=click.Path(exists=True, dir_okay=False),
              help="A qrels.tsv to use instead of DATASET_DIR's.")
@click.option("--embedder", type=click.Choice(EMBEDDERS),
              help="Embedder backend, instead of the settings' (same as RAG_EMBEDDER__BACKEND).")
@click.option("--per-query", is_flag=True, help="With --json: every query's scores too, per variant.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
@handle_errors
def retrieval(obj: Context, dataset_dir: str, modes: str | None, variants: tuple[str, ...],
              limit: int | None, candidates: int | None, rrf_k: float | None, weights: str | None,
              queries_file: str | None, qrels_file: str | None, embedder: str | None,
              per_query: bool, as_json: bool) -> None:
    """Index DATASET_DIR (corpus.jsonl, queries.jsonl, qrels.tsv) once in a fresh data
    directory and report recall@1/5/10/100, MRR@10 and nDCG@10 for each mode and variant.

    The embedder, backends and retrieval parameters come from the settings (--config, RAG_*
    variables) unless given here, so a plain mode is measured as the deployment would run
    it; the configured data directory is not touched.

    Example: ragqa eval retrieval data/xquad-en --queries data/xquad-zh/queries.jsonl
    --embedder use --modes bm25,vector,rrf --variant 'rrf:weights=1,0.5:rrf_k=20'
    """
    from evals.retrieval import parse_weights, run_retrieval_eval
    from rag.errors import ConfigError

    if modes is None:
        modes = "" if variants else ",".join(MODE_NAMES)
    chosen = [m.strip() for m in modes.split(",") if m.strip()]
    bad = [m for m in chosen if m not in MODE_NAMES]
    if bad or not (chosen or variants):
        raise ConfigError(f"--modes: choose from {', '.join(MODE_NAMES)} (got {modes!r})")
    overrides: dict[str, Any] = {"log_json": True} if obj.log_json else {}
    if embedder is not None:
        overrides["embedder"] = {"backend": embedder}
    configured = _configured(obj.config, overrides)
    try:
        shared_weights = parse_weights(weights) if weights is not None else configured["weights"]
    except ConfigError as exc:
        raise ConfigError(f"--weights: {exc}") from None
    candidates = candidates if candidates is not None else configured["candidates"]
    rrf_k = rrf_k if rrf_k is not None else configured["rrf_k"]
    report = run_retrieval_eval(dataset_dir, chosen, overrides, limit_queries=limit,
                                candidates=candidates, rrf_k=rrf_k, weights=shared_weights,
                                variants=list(variants), queries_file=queries_file,
                                qrels_file=qrels_file, config_file=obj.config, per_query=per_query)
    emit(report, as_json, _table)


def _configured(config: str | None, overrides: dict[str, Any]) -> dict[str, Any]:
    """The deployment's retrieval parameters: the settings', with weights by embedder when unset."""
    from rag.config import Settings

    settings = Settings.load(config, **overrides)
    cfg = settings.retrieval
    weights = getattr(cfg, "weights", None)
    if weights is None:
        try:
            from rag.retrieval.hybrid import default_weights
        except ImportError:  # before per-embedder defaults
            weights = (1.0, 1.0)
        else:
            weights = default_weights(settings.embedder.backend)
    return {"candidates": cfg.candidates, "rrf_k": float(cfg.rrf_k),
            "weights": (float(weights[0]), float(weights[1]))}


def _table(r: dict[str, Any]) -> str:
    metrics = list(next(iter(r["metrics"].values())))
    head = ["variant", *metrics, "ms/query"]
    rows = [[name, *(f"{v:.4f}" for v in values.values()), f"{r['timing'][name]['ms_per_query']:.1f}"]
            for name, values in r["metrics"].items()]
    widths = [max(len(str(c)) for c in col) for col in zip(head, *rows, strict=True)]
    lines = [(f"{r['dataset']}: {r['queries']} queries, {r['docs']} documents, "
              f"{r['ingest']['chunks']} chunks, embedder {r['embedder']}")]
    for key, label in (("queries_file", "queries"), ("qrels_file", "qrels")):
        if key in r:
            lines.append(f"{label} from {r[key]}")
    if r.get("qrels_docs_not_in_corpus"):
        lines.append(f"warning: {r['qrels_docs_not_in_corpus']} judged documents are not in the corpus")
    shared = [v for name, v in r.get("variants", {}).items() if name == v["mode"]]
    if any(v["mode"] in ("hybrid", "rrf") for v in shared):
        fused = next((v for v in shared if v["mode"] == "rrf"), None)
        cand = next(v["candidates"] for v in shared if "candidates" in v)
        lines.append(f"modes: candidates {cand}" + (
            f", rrf_k {fused['rrf_k']:g}, weights {','.join(f'{w:g}' for w in fused['weights'])}"
            if fused else ""))
    for row in [head, *rows]:
        lines.append("  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)
                               for i, (c, w) in enumerate(zip(row, widths, strict=True))))
    return "\n".join(lines)
