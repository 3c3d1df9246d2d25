"""``ragqa eval``: measure retrieval and answer quality on labelled datasets, compare runs, gate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ragqa.cli.common import Context, emit, handle_errors

__all__ = ["eval_group"]

MODE_NAMES = ("bm25", "vector", "hybrid", "rrf")
EMBEDDERS = ("auto", "sentence-transformers", "onnx-int8", "use", "e5", "hash")
EVAL_PACKAGES = {"ir_measures": "ir-measures", "sacrebleu": "sacrebleu", "rouge_score": "rouge-score"}


def _require_eval_extra() -> None:
    """Fail with the install command when the ``eval`` extra is missing, not with a traceback."""
    import importlib

    from rag.errors import ConfigError

    missing = []
    for module, package in EVAL_PACKAGES.items():
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(package)
    if missing:
        raise ConfigError(f"ragqa eval needs {', '.join(missing)}, which are not installed: "
                          "pip install 'ragqa[eval]'")


@click.group("eval")
def eval_group() -> None:
    """Measure retrieval and answer quality on labelled (BEIR-style) datasets.

    `retrieval` scores the ranking alone; `answers` runs the whole answer pipeline and scores
    the answers, citations and latency; `compare` puts two answer runs side by side with
    bootstrap intervals; `gate` fails when a run is worse than a baseline; `cache` measures
    the semantic answer cache's threshold and guards on labelled question pairs; `fit-router`
    fits the router's thresholds on a small and a large profile's answer runs.
    """


@eval_group.command("retrieval")
@click.argument("dataset_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--modes", "-m", default=None,
              help="Comma-separated retrieval modes to compare, with the shared --candidates, --rrf-k "
              f"and --weights. [default: {','.join(MODE_NAMES)}, or none when --variant is given]")
@click.option("--variant", "-V", "variants", multiple=True, metavar="[NAME=]MODE[:KEY=VALUE]...",
              help="Also run this variant on the same ingest; repeatable. KEYs: candidates (c), rrf_k (k), "
              "weights (w, as BM25,VECTOR or auto), lang (1 or 0: drop the vector leg for a question in "
              "a language the embedder does not cover). E.g. 'rrf:weights=1,0.5:rrf_k=20', 'hybrid:c=200', "
              "'best=rrf:w=2,1'. Unnamed variants are named by their non-default parameters.")
@click.option("--limit", "-n", type=click.IntRange(1), help="Only the first N judged queries.")
@click.option("--candidates", type=click.IntRange(1, 10000),
              help="Candidates per leg (BM25 prefilter, rank fusion). [default: the settings' "
              "retrieval.candidates, 100]")
@click.option("--rrf-k", type=click.FloatRange(0),
              help="Damping constant of rank fusion (rrf). [default: the settings' retrieval.rrf_k, 60]")
@click.option("--weights", metavar="BM25,VECTOR",
              help="Rank-fusion weights of the BM25 and vector legs (rrf), or 'auto' for adaptive weights "
              "per query. [default: the settings' retrieval.weights, else auto]")
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
    _require_eval_extra()
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
                                language_aware=configured["language_aware"],
                                variants=list(variants), queries_file=queries_file,
                                qrels_file=qrels_file, config_file=obj.config, per_query=per_query)
    emit(report, as_json, _table)


def _configured(config: str | None, overrides: dict[str, Any]) -> dict[str, Any]:
    """The deployment's retrieval parameters (weights ``None``: adaptive per query)."""
    from rag.config import Settings

    settings = Settings.load(config, **overrides)
    cfg = settings.retrieval
    weights = cfg.weights
    return {"candidates": cfg.candidates, "rrf_k": float(cfg.rrf_k),
            "weights": None if weights is None else (float(weights[0]), float(weights[1])),
            "language_aware": cfg.language_aware}


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
            f", rrf_k {fused['rrf_k']:g}, weights " + (
                "auto" if fused["weights"] == "auto" else ",".join(f"{w:g}" for w in fused["weights"]))
            if fused else ""))
    for row in [head, *rows]:
        lines.append("  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)
                               for i, (c, w) in enumerate(zip(row, widths, strict=True))))
    return "\n".join(lines)


@eval_group.command("answers")
@click.argument("dataset_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--limit", "-n", type=click.IntRange(1), help="Draw N questions (with --seed). [default: all]")
@click.option("--seed", "-s", type=int, default=0, show_default=True,
              help="Sample seed (and generation seed): the same seed draws the same questions.")
@click.option("--out", "-o", type=click.Path(file_okay=False),
              help="Run folder (rows.jsonl, summary.json). [default: <data_dir>/evals/runs/<name>]")
@click.option("--abstain", "abstain_limit", type=click.IntRange(0),
              help="Questions asked again with their gold documents filtered out (abstention). "
              "[default: every sampled question; 0: none]")
@click.option("--queries", "queries_file", type=click.Path(exists=True, dir_okay=False),
              help="A queries.jsonl (id, text, answers) instead of DATASET_DIR's; required for a data dir.")
@click.option("--qrels", "qrels_file", type=click.Path(exists=True, dir_okay=False),
              help="A qrels.tsv instead of DATASET_DIR's.")
@click.option("--name", help="The dataset's name in reports. [default: the folder's name]")
@click.option("--stop-after", type=click.IntRange(1),
              help="Answer only the sample's first N questions; the same command without it resumes the rest.")
@click.option("--fresh", is_flag=True, help="Discard an earlier run in the same folder instead of resuming it.")
@click.option("--no-tracking", is_flag=True, help="Do not log the run to MLflow.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON object.")
@click.pass_obj
@handle_errors
def answers(obj: Context, dataset_dir: str, limit: int | None, seed: int, out: str | None,
            abstain_limit: int | None, queries_file: str | None, qrels_file: str | None, name: str | None,
            stop_after: int | None, fresh: bool, no_tracking: bool, as_json: bool) -> None:
    """Answer DATASET_DIR's questions with the real pipeline and score them.

    DATASET_DIR is a BEIR-style folder whose queries.jsonl rows have "answers" (or RGB's
    "answer_parts"); its corpus is ingested once under <data_dir>/evals/index and reused by
    later runs with the same corpus and index settings. It may also be a ragqa data dir,
    evaluated as it is, with --queries. The generator, retriever and every other setting come
    from the settings (--config, RAG_* variables), as `ragqa serve` would use them.

    Per question: EM, F1, contains-gold, BLEU-4, ROUGE-L, citation compliance, accuracy and
    support, retrieval hits, each stage's latency, TTFT and tokens; then abstention with the
    gold documents filtered out. Rows are written as they come: run the same command again
    to resume an interrupted run.

    Example: ragqa eval answers tests/data/xquad-zh --limit 150 --seed 0 --config qwen.yaml
    """
    _require_eval_extra()
    from evals.answers import run_answer_eval
    from rag.logs import setup_logging

    setup_logging(json_logs=obj.log_json, verbose=obj.verbose)
    summary = run_answer_eval(dataset_dir, config_file=obj.config, overrides=obj.overrides(), limit=limit, seed=seed,
                              out=out, abstain_limit=abstain_limit, queries_file=queries_file,
                              qrels_file=qrels_file, fresh=fresh, tracking=not no_tracking, name=name,
                              stop_after=stop_after)
    emit(summary, as_json, _answers_table)


def _answers_table(s: dict[str, Any]) -> str:
    m = s["metrics"]
    lines = [f"{s['dataset']}: {s['questions']} questions ({s['abstention_questions']} asked again without their "
             f"gold documents), {s['generator']} {s['model'] or ''} {s['quantization'] or ''}".rstrip(),
             f"index: {s['index']['documents']} documents, {s['index']['chunks']} chunks"
             + (" (reused)" if s["ingest"].get("reused") else "")]
    groups = (("answers", ("em", "f1", "contains_gold", "bleu4", "rouge_l", "abstained")),
              ("citations", ("compliance", "citation_accuracy", "citation_precision", "support", "unlabelled")),
              ("retrieval", ("retrieval_hit", "retrieval_mrr", "context_hit")),
              ("abstention", ("abstention",)))
    for label, keys in groups:
        shown = "  ".join(f"{k} {m[k]:.3f}" for k in keys if k in m)
        if shown:
            lines.append(f"{label + ':':<12}{shown}")
    for stage, stats in s["latency"].items():
        lines.append(f"{stage + ':':<20}p50 {stats['p50']:>9.1f}  p99 {stats['p99']:>9.1f}  mean {stats['mean']:>9.1f}")
    lines.append(f"errors {s['errors']}, degraded {s['degraded']}, cache {s['cache']}")
    lines.append(f"run: {s['run_dir']}" + (f" (MLflow run {s['mlflow_run_id']})" if s.get("mlflow_run_id") else ""))
    return "\n".join(lines)


CACHE_EMBEDDERS = {"minilm": "sentence-transformers", "use": "use", "e5": "e5", "hash": "hash"}


@eval_group.command("cache")
@click.argument("pairs", required=False, type=click.Path(allow_dash=True, dir_okay=False))
@click.option("--embedder", "-e", type=click.Choice(["configured", *CACHE_EMBEDDERS]), default="configured",
              show_default=True, help="The model that embeds the questions: the deployment's (the settings' "
              "embedder, with auto as the data directory's first ingest chose it), the packaged MiniLM, or USE.")
@click.option("--thresholds", "-t", default="0.80:0.97:0.01", show_default=True, metavar="START:STOP:STEP|T,T...",
              help="The cosine thresholds to try.")
@click.option("--guards", "-g", metavar="SET,SET...",
              help="Guard sets to compare, guards within a set joined by '+' (numbers, entities, negation, "
              "qtype, language), or none or all. [default: none, each guard alone, all]")
@click.option("--lang", "langs", metavar="LANG,...", help="Only pairs of these languages (en, zh, en-zh).")
@click.option("--split", "splits", metavar="SPLIT,...", help="Only pairs of these splits (the committed set: dev, test).")
@click.option("--kind", "kinds", metavar="KIND,...", help="Only pairs of these kinds.")
@click.option("--goal", type=click.FloatRange(0, 1, min_open=True), default=0.01, show_default=True,
              help="The wrong-hit rate the best threshold must stay under, for every kind of different questions.")
@click.option("--slack", type=click.FloatRange(0, 1), default=0.01, show_default=True,
              help="Hit rate the best threshold may give up: the highest threshold within this of the most hits.")
@click.option("--cross-lingual", is_flag=True,
              help="The language guard lets pairs in two languages through (answers are then served across "
              "languages).")
@click.option("--json", "as_json", is_flag=True, help="Print the whole report (every kind too) as one JSON object.")
@click.pass_obj
@handle_errors
def cache_cmd(obj: Context, pairs: str | None, embedder: str, thresholds: str, guards: str | None,
              langs: str | None, splits: str | None, kinds: str | None, goal: float, slack: float,
              cross_lingual: bool, as_json: bool) -> None:
    """Measure the semantic answer cache on labelled question pairs: for each threshold and
    guard set, the hit rate on pairs that are the same question and the wrong-hit rate on pairs
    that are not, per language; then the best threshold of each guard set: of those with a
    wrong-hit rate under --goal for every kind of different questions, the highest within
    --slack of the most hits.

    PAIRS is a JSONL file (- for stdin) of {"a", "b", "same": true|false}, optionally "kind",
    "lang" and "split": e.g. questions from your own log, labelled. [default: the pairs made
    from XQuAD, evals/cache-pairs/pairs.jsonl; see evals/RESULTS-cache.md]

    A pair hits as in the cache: the same question after normalisation, or a cosine at least
    the threshold, both questions in languages the model ranks (MiniLM: English only) and every
    guard passing.

    Example: ragqa eval cache my-pairs.jsonl --embedder use --thresholds 0.85,0.9,0.95
    """
    from evals.cache_eval import (
        DEFAULT_PAIRS,
        evaluate,
        guard_sets,
        load_pairs,
        parse_thresholds,
        render,
    )
    from rag.errors import ConfigError

    path = pairs or str(DEFAULT_PAIRS)
    if path != "-" and not Path(path).is_file():
        raise ConfigError(f"no pairs file at {path}" + ("" if pairs else " (it is in the source checkout; pass "
                                                         "a JSONL of labelled pairs)"))
    chosen = load_pairs(path, langs=_csv(langs), splits=_csv(splits), kinds=_csv(kinds))
    if not chosen:
        raise ConfigError(f"no pairs in {path} match --lang, --split and --kind")
    sets, values = guard_sets(guards), parse_thresholds(thresholds)
    report = evaluate(chosen, _cache_embedder(obj, embedder), thresholds=values, guards=sets,
                      multilingual=cross_lingual, goal=goal, slack=slack)
    report["file"] = path
    emit(report, as_json, render)


def _csv(value: str | None) -> list[str] | None:
    return [v.strip() for v in value.split(",") if v.strip()] if value else None


def _cache_embedder(obj: Context, choice: str) -> Any:
    if choice == "configured":
        return obj.services.embedder
    from rag.config import EmbedderSettings
    from rag.embedders import make_embedder

    return make_embedder(EmbedderSettings(backend=CACHE_EMBEDDERS[choice]))


@eval_group.command("compare")
@click.argument("run_a", type=click.Path(exists=True))
@click.argument("run_b", type=click.Path(exists=True))
@click.option("--resamples", type=click.IntRange(1000), default=2000, show_default=True,
              help="Paired bootstrap resamples.")
@click.option("--seed", type=int, default=0, show_default=True, help="Bootstrap seed.")
@click.option("--flips", type=click.IntRange(0), default=10, show_default=True,
              help="Flipped questions printed with both answers.")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison (all flips) as one JSON object.")
@handle_errors
def compare_cmd(run_a: str, run_b: str, resamples: int, seed: int, flips: int, as_json: bool) -> None:
    """Compare two `eval answers` runs (folders, or their rows.jsonl) question by question.

    For every metric: A, B, the delta B - A and its paired bootstrap 95% interval, marked when
    it excludes 0; then the questions right in one run and wrong in the other (contains-gold,
    and abstention), with both answers.
    """
    from evals.compare import compare, load_run, render_compare

    report = compare(load_run(run_a), load_run(run_b), resamples=resamples, seed=seed)
    emit(report, as_json, lambda r: render_compare(r, "A", "B", flips=flips))


@eval_group.command("gate")
@click.option("--baseline", "-b", required=True, type=click.Path(exists=True),
              help="The baseline run (a folder or its rows.jsonl), e.g. evals/baselines/xquad-en-extractive.")
@click.argument("run", type=click.Path(exists=True))
@click.option("--tolerance", "-t", "tolerances", multiple=True, metavar="[METRIC=]VALUE",
              help="How much worse a metric may be without a significant interval (absolute); repeatable. "
              "[default: 0.02 for every metric]")
@click.option("--metrics", "-m", help="Comma-separated metrics to gate. [default: the quality metrics]")
@click.option("--resamples", type=click.IntRange(1000), default=2000, show_default=True,
              help="Paired bootstrap resamples.")
@click.option("--seed", type=int, default=0, show_default=True, help="Bootstrap seed.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
@handle_errors
def gate_cmd(baseline: str, run: str, tolerances: tuple[str, ...], metrics: str | None, resamples: int, seed: int,
             as_json: bool) -> None:
    """Exit 1 when RUN is worse than the baseline on a gated metric: significantly (the paired
    bootstrap interval excludes 0) or by more than its tolerance. Prints which metric, by
    how much, and the interval.
    """
    from evals.compare import gate, load_run, render_gate
    from rag.errors import ConfigError

    tol: dict[str, float] = {}
    for spec in tolerances:
        key, eq, value = spec.rpartition("=")
        try:
            tol[key if eq else "*"] = float(value)
        except ValueError:
            raise ConfigError(f"--tolerance: expected [METRIC=]NUMBER, got {spec!r}") from None
    chosen = [m.strip() for m in metrics.split(",") if m.strip()] if metrics else None
    result = gate(load_run(baseline), load_run(run), tolerance=tol or 0.02, metrics=chosen,
                  resamples=resamples, seed=seed)
    emit(result, as_json, render_gate)
    if not result["passed"]:
        raise SystemExit(1)


@eval_group.command("fit-router")
@click.argument("runs", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--tolerance", type=click.FloatRange(0), default=0.0, show_default=True,
              help="Small is good enough when its F1 is at least the large one's minus this (F1 points, 0-100).")
@click.option("--max-loss", type=click.FloatRange(0), default=1.0, show_default=True,
              help="The most the routed F1 may fall below the large profile alone (F1 points).")
@click.option("--folds", type=click.IntRange(2), default=5, show_default=True,
              help="Cross-validation folds for the reported figures.")
@click.option("--signals", "signals_from", type=click.Choice(["large", "small"]), default="large",
              show_default=True, help="Which run's recorded router signals to use.")
@click.option("--resamples", type=click.IntRange(1000), default=2000, show_default=True,
              help="Paired bootstrap resamples.")
@click.option("--seed", type=int, default=0, show_default=True, help="Folds and bootstrap seed.")
@click.option("--json", "as_json", is_flag=True, help="Print the fit as one JSON object.")
@handle_errors
def fit_router_cmd(runs: tuple[str, ...], tolerance: float, max_loss: float, folds: int, signals_from: str,
                   resamples: int, seed: int, as_json: bool) -> None:
    """Fit the router's thresholds on SMALL_RUN LARGE_RUN (more pairs: one router for all).

    Each pair is two `eval answers` runs of the same sample, one per generator profile. A
    question is labelled "small is good enough" when the small F1 is at least the large F1
    minus --tolerance; the rules that send the most questions to the small profile with the
    routed F1 no more than --max-loss points below the large profile alone are fitted. The
    share on small and the F1 delta (95% paired bootstrap interval) are cross-validated, per
    dataset and along a trade-off curve of loss budgets; the settings to paste are fitted on
    all the questions.

    Example: ragqa eval fit-router runs/xquad-en-extractive runs/xquad-en-q15 --max-loss 1
    """
    import json

    from evals.compare import load_run
    from evals.fit_router import fit_router, render_fit
    from rag.errors import ConfigError

    if len(runs) % 2:
        raise ConfigError(f"runs come in pairs, SMALL_RUN LARGE_RUN; got {len(runs)}")
    pairs, names = [], []
    for i in range(0, len(runs), 2):
        pairs.append((load_run(runs[i]), load_run(runs[i + 1])))
        marker = Path(runs[i + 1]) / "run.json"  # written when the run starts: a partial run has it too
        name = json.loads(marker.read_text(encoding="utf-8")).get("dataset") if marker.is_file() else None
        name = str(name or Path(runs[i + 1]).name)
        names.append(name if name not in names else f"{name}#{i // 2 + 1}")
    report = fit_router(pairs, names=names, tolerance=tolerance, max_loss=max_loss, folds=folds,
                        signals_from=signals_from, resamples=resamples, seed=seed)
    emit(report, as_json, render_fit)


@eval_group.command("export-distill")
@click.argument("sources", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--out", "-o", required=True, type=click.Path(dir_okay=False),
              help="The training set to write (chat-format JSONL, one row per kept answer).")
@click.option("--min-f1", type=click.FloatRange(0, 1),
              help="Keep only answers with at least this F1 (0-1) where the gold answer is known.")
@click.option("--profile", help="Keep only answers of this generator profile (the teacher).")
@click.option("--keep-uncited", is_flag=True, help="Also keep answers that cite no passage.")
@click.option("--keep-abstentions", is_flag=True,
              help="Also keep answers that say 'I don't know' (the abstention pass's correct ones included).")
@click.option("--near-dup", type=click.FloatRange(0, 1, min_open=True),
              help="Also drop a question whose words overlap a kept one's on the same context this much (Jaccard).")
@click.option("--index", "indexes", multiple=True, type=click.Path(exists=True, file_okay=False),
              help="A data dir whose state holds the chunks the answers were given; repeatable. "
              "[default: <data_dir>/evals/index/* and the data dir itself]")
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
@click.pass_obj
@handle_errors
def export_distill_cmd(obj: Context, sources: tuple[str, ...], out: str, min_f1: float | None, profile: str | None,
                       keep_uncited: bool, keep_abstentions: bool, near_dup: float | None, indexes: tuple[str, ...],
                       as_json: bool) -> None:
    """Export a teacher's answers as a chat-format JSONL training set for a student model.

    SOURCES are `eval answers` run folders or QA log files (serve.qa_log). Each row holds the
    system, user (the packed context and the question) and assistant messages, and its
    provenance (run or log line, model, quantization, prompt version, dataset). Errors,
    fallback answers, abstentions and uncited answers are left out unless asked for, and a
    question asked again on the same context is kept once.

    Example: ragqa eval export-distill runs/qwen15-xquad-en --min-f1 0.5 --out train.jsonl
    """
    from evals.distill import export_distill, render_report
    from rag.config import Settings

    settings = Settings.load(obj.config, **obj.overrides())
    report = export_distill(sources, out, data_dir=settings.data_dir, index=indexes, state_url=settings.state.url,
                            min_f1=min_f1, keep_uncited=keep_uncited, keep_abstentions=keep_abstentions,
                            profile=profile, near_dup=near_dup)
    emit(report, as_json, render_report)
