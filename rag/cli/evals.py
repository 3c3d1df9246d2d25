"""``ragqa eval``: measure retrieval quality on a labelled dataset."""

from __future__ import annotations

from typing import Any

import click

from rag.cli.common import Context, emit, handle_errors

__all__ = ["eval_group"]

MODE_NAMES = ("bm25", "vector", "hybrid", "rrf")


@click.group("eval")
def eval_group() -> None:
    """Measure retrieval quality on a labelled (BEIR-style) dataset."""


@eval_group.command("retrieval")
@click.argument("dataset_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--modes", "-m", default=",".join(MODE_NAMES), show_default=True,
              help="Comma-separated retrieval modes to compare.")
@click.option("--limit", "-n", type=click.IntRange(1), help="Only the first N judged queries.")
@click.option("--candidates", default=100, show_default=True, type=click.IntRange(1, 10000),
              help="Candidates per leg (BM25 prefilter, rank fusion).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
@handle_errors
def retrieval(obj: Context, dataset_dir: str, modes: str, limit: int | None, candidates: int,
              as_json: bool) -> None:
    """Index DATASET_DIR (corpus.jsonl, queries.jsonl, qrels.tsv) in a fresh data directory
    and report recall@1/5/10/100, MRR@10 and nDCG@10 for each mode.

    The embedder and backends come from the settings (--config, RAG_* variables); the
    configured data directory is not touched.
    """
    from evals.retrieval import run_retrieval_eval
    from rag.errors import ConfigError

    chosen = [m.strip() for m in modes.split(",") if m.strip()]
    bad = [m for m in chosen if m not in MODE_NAMES]
    if bad or not chosen:
        raise ConfigError(f"--modes: choose from {', '.join(MODE_NAMES)} (got {modes!r})")
    overrides: dict[str, Any] = {"log_json": True} if obj.log_json else {}
    report = run_retrieval_eval(dataset_dir, chosen, overrides, limit_queries=limit,
                                candidates=candidates)
    emit(report, as_json, _table)


def _table(r: dict[str, Any]) -> str:
    metrics = list(next(iter(r["metrics"].values())))
    head = ["mode", *metrics, "ms/query"]
    rows = [[mode, *(f"{v:.4f}" for v in values.values()), f"{r['timing'][mode]['ms_per_query']:.1f}"]
            for mode, values in r["metrics"].items()]
    widths = [max(len(str(c)) for c in col) for col in zip(head, *rows, strict=True)]
    lines = [(f"{r['dataset']}: {r['queries']} queries, {r['docs']} documents, "
              f"{r['ingest']['chunks']} chunks, embedder {r['embedder']}")]
    for row in [head, *rows]:
        lines.append("  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)
                               for i, (c, w) in enumerate(zip(row, widths, strict=True))))
    return "\n".join(lines)
