"""End-to-end answer evaluation: the real pipeline on labelled questions, scored per query.

``run_answer_eval`` reads a BEIR-style folder whose ``queries.jsonl`` rows carry ``answers``
(and, for RGB, ``answer_parts``), ingests its corpus once, and answers each question through
:class:`rag.answer.Answerer` exactly as ``ragqa serve`` would: retrieve, screen, pack,
generate, cite. The generator, retriever and every other setting come from ``Settings``
(``--config``, ``RAG_*``), so any configuration a user can serve can be evaluated.

- **Ingest once.** The index lives under ``<root>/index/<fingerprint>``, keyed by the corpus
  bytes and the settings that shape an index (embedder, chunking, backends); a later run with
  the same corpus and settings reuses it. Server backends get an index and collection named
  by the fingerprint, never the deployment's own.
- **A live data dir** (a folder holding ``state.db``) is evaluated as it is, with
  ``queries_file`` (and optionally ``qrels_file``, with that deployment's document ids).
- **Sample.** ``limit`` questions are drawn with ``seed``, so two configurations are
  compared on the same questions.
- **Per query** it records the retrieved and packed chunks, the answer and its citations,
  every stage's milliseconds, TTFT, token counts, cache status, the degraded flag, the
  answer's confidence (``confidence``: the generator's log-probabilities, when it reports them) and the
  router's signals (``route``, :func:`rag.routing.route_signals`: ``ragqa eval fit-router``
  fits the router on two runs' rows), and
  scores it (:mod:`evals.qa_metrics`), as one line of ``rows.jsonl`` written as soon as it is
  known: an interrupted run resumes where it stopped when started again with the same
  arguments.
- **Abstention.** A second pass asks ``abstain_limit`` of the questions again with their
  gold documents filtered out of the retrieved candidates (the retriever is asked for more
  and drops them, so the rest keep their order); the answer should be "I don't know".
- **Summary.** ``summary.json`` holds the means, stage latency p50/p99, the configuration,
  the model, the index snapshot and the sample; the run is logged to MLflow when installed
  (:mod:`evals.tracking`).

Example::

    summary = run_answer_eval("tests/data/xquad-en", limit=100, seed=0,
                              overrides={"generator": {"backend": "extractive"}})
    summary["metrics"]["f1"], summary["latency"]["ttft_ms"]["p50"]
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import random
import re
import shutil
import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from evals.qa_metrics import abstained, answer_scores, citation_scores
from evals.retrieval import Corpus, load_corpus, load_qrels, read_jsonl
from rag.config import Settings
from rag.errors import ConfigError
from rag.lang import detect_lang
from rag.routing import route_signals

__all__ = ["QAItem", "LATENCIES", "load_qa", "run_answer_eval", "sample", "summarize"]

log = logging.getLogger(__name__)

ROWS = "rows.jsonl"
SUMMARY = "summary.json"
RUN = "run.json"
METRICS_VERSION = 1
LATENCIES = ("retrieve_ms", "pack_ms", "ttft_ms", "generate_ms", "total_ms")
ABSTAIN_DEPTH = 4  # the retriever is asked for k + this many chunks per excluded document
# Settings that shape an index: an ingest is reused only when they and the corpus match.
INDEX_KEYS = ("embedder", "chunking", "lexical", "vector")


@dataclass(frozen=True)
class QAItem:
    """One labelled question: its gold answers (or answer parts) and relevant documents."""

    qid: str
    question: str
    answers: tuple[str, ...]
    parts: tuple[tuple[str, ...], ...] | None = None
    gold_docs: frozenset[str] = frozenset()
    lang: str = "en"


@dataclass
class _Dataset:
    name: str
    items: list[QAItem]
    corpus: Corpus | None  # None for a live data dir
    corpus_hash: str = ""
    live_dir: Path | None = None


def load_qa(folder: str | Path, queries_file: str | Path | None = None,
            qrels_file: str | Path | None = None) -> tuple[Corpus | None, list[QAItem]]:
    """The corpus (``None`` for a live data dir) and the answerable questions of a dataset."""
    root = Path(folder)
    live = (root / "state.db").is_file()
    queries_path = Path(queries_file) if queries_file else root / "queries.jsonl"
    qrels_path = Path(qrels_file) if qrels_file else root / "qrels.tsv"
    if live and queries_file is None:
        raise ConfigError(f"{root} is a ragqa data dir: give the questions with --queries FILE")
    if not live and not (root / "corpus.jsonl").is_file():
        raise ConfigError(f"{root} is neither a BEIR-style dataset (corpus.jsonl, queries.jsonl, qrels.tsv) "
                          "nor a ragqa data dir (state.db)")
    if not queries_path.is_file():
        raise ConfigError(f"queries file not found: {queries_path}")
    qrels = load_qrels(qrels_path) if qrels_path.is_file() else {}
    corpus = None if live else load_corpus(root / "corpus.jsonl")
    items = []
    for row in read_jsonl(queries_path):
        parts = row.get("answer_parts")
        answers = [str(a) for a in row.get("answers") or ()]
        if not answers and not parts:
            continue
        text = str(row["text"])
        qid = str(row["id"])
        items.append(QAItem(
            qid, text, tuple(answers), tuple(tuple(str(a) for a in p) for p in parts) if parts else None,
            frozenset(d for d, rel in qrels.get(qid, {}).items() if rel > 0),
            str(row.get("lang") or detect_lang(text))))
    if not items:
        raise ConfigError(f"{queries_path}: no question has gold answers (an 'answers' or 'answer_parts' field)")
    return corpus, items


def sample(items: Sequence[QAItem], limit: int | None, seed: int) -> list[QAItem]:
    """``limit`` questions drawn with ``seed`` (all when ``limit`` is None), in file order."""
    if limit is None or limit >= len(items):
        return list(items)
    chosen = set(random.Random(seed).sample(range(len(items)), limit))
    return [item for i, item in enumerate(items) if i in chosen]


def _fingerprint(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def _public_config(settings: Settings) -> dict[str, Any]:
    """The settings as JSON, secrets masked (pydantic's SecretStr dumps as '**********'), with the
    packed context's effective limits (``retrieval`` leaves them to the generator backend)."""
    config = json.loads(settings.model_dump_json(exclude={"data_dir", "sources"}))
    config["context_limits"] = list(settings.context_limits)
    return config


class _EvalRetriever:
    """Wraps the configured retriever: records each query's hits, and can leave documents out."""

    def __init__(self, base: Any) -> None:
        self.base = base
        self.exclude: frozenset[str] = frozenset()
        self.hits: list[Any] = []

    def search(self, question: str, k: int, filters: Any = None, **kwargs: Any) -> Any:
        if not self.exclude:
            found = self.base.search(question, k, filters, **kwargs)
        else:
            found = self.base.search(question, k + ABSTAIN_DEPTH * len(self.exclude), filters, **kwargs)
            found.hits = [h for h in found.hits if _doc_id(h) not in self.exclude][:k]
        self.hits = list(found.hits)
        return found

    def __getattr__(self, name: str) -> Any:
        return getattr(self.base, name)


def _doc_id(hit: Any) -> str:
    return hit.doc_id or (hit.chunk.doc_id if hit.chunk is not None else "")


def run_answer_eval(dataset: str | Path, *, config_file: str | Path | None = None,
                    overrides: Mapping[str, Any] | None = None, limit: int | None = None, seed: int = 0,
                    out: str | Path | None = None, abstain_limit: int | None = None,
                    queries_file: str | Path | None = None, qrels_file: str | Path | None = None,
                    fresh: bool = False, progress: bool = True, tracking: bool = True,
                    name: str | None = None, stop_after: int | None = None) -> dict[str, Any]:
    """Run (or resume) an answer evaluation and return its summary (see the module docstring).

    ``abstain_limit`` bounds the abstention pass (default: every sampled question that has
    gold documents; 0 turns it off). ``fresh`` discards an earlier run in ``out``.
    ``stop_after`` answers only the sample's first N questions; the same run resumes the rest.
    """
    base = Settings.load(config_file, **dict(overrides or {}))
    corpus, items = load_qa(dataset, queries_file, qrels_file)
    root = Path(dataset)
    ds = _Dataset(name or root.resolve().name, sample(items, limit, seed), corpus,
                  live_dir=None if corpus is not None else root)
    if corpus is not None:
        ds.corpus_hash = hashlib.sha256((root / "corpus.jsonl").read_bytes()).hexdigest()
    home = Path(base.data_dir) / "evals"
    config = _public_config(base)
    asked = Path(queries_file) if queries_file else root / "queries.jsonl"
    identity = {"dataset": ds.name, "corpus": ds.corpus_hash or str(root.resolve()),
                "queries": hashlib.sha256(asked.read_bytes()).hexdigest(), "qids": [i.qid for i in ds.items],
                "config": _fingerprint(config), "abstain_limit": abstain_limit, "seed": seed,
                "metrics_version": METRICS_VERSION}
    run_dir = Path(out) if out else home / "runs" / _run_name(ds.name, base, identity, limit, seed)
    done = _open_run(run_dir, identity, fresh)
    settings, doc_of, ingest = _prepare_index(base, ds, home, progress)
    summary_extra = {"config": config, "ingest": ingest, "index": _index_snapshot(settings)}
    rows = asyncio.run(_answer_all(settings, ds, doc_of, run_dir, done, abstain_limit, seed, progress,
                                   stop_after))
    summary = summarize(rows)
    summary.update({
        "dataset": ds.name, "dataset_path": str(root.resolve()), "seed": seed, "limit": limit,
        "sample": len(ds.items), "run_dir": str(run_dir), "metrics_version": METRICS_VERSION,
        **_model_info(settings), **summary_extra,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    })
    (run_dir / SUMMARY).write_text(json.dumps(summary, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    if tracking:
        from evals.tracking import log_run

        summary["mlflow_run_id"] = log_run(run_dir, summary, base)
    return summary


def _run_name(dataset: str, settings: Settings, identity: Mapping[str, Any], limit: int | None, seed: int) -> str:
    gen = settings.generator.backend + (f"-{Path(settings.generator.model).stem}" if settings.generator.model else "")
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", f"{dataset}-{gen}")[:80]
    return f"{slug}-n{limit or 'all'}-s{seed}-{_fingerprint(identity)[:8]}"


def _open_run(run_dir: Path, identity: dict[str, Any], fresh: bool) -> dict[tuple[str, str], dict[str, Any]]:
    """The rows already answered in ``run_dir`` (resume), after checking it is the same run."""
    if fresh and run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    marker = run_dir / RUN
    if marker.is_file():
        before = json.loads(marker.read_text(encoding="utf-8"))
        if before != identity:
            changed = sorted(k for k in identity if before.get(k) != identity[k])
            raise ConfigError(f"{run_dir} holds another evaluation (different {', '.join(changed)}): "
                              "use another --out, or --fresh to replace it")
    else:
        marker.write_text(json.dumps(identity) + "\n", encoding="utf-8")
    done: dict[tuple[str, str], dict[str, Any]] = {}
    rows = run_dir / ROWS
    if rows.is_file():
        good: list[str] = []
        for line in rows.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:  # the line being written when the run was stopped
                continue
            done[(row["qid"], row["pass"])] = row
            good.append(line)
        rows.write_text("".join(f"{line}\n" for line in good), encoding="utf-8")
    return done


def _prepare_index(base: Settings, ds: _Dataset, home: Path, progress: bool) -> tuple[Settings, dict[str, str], dict]:
    """Settings on the dataset's index (ingested now, or reused), and chunk doc id -> dataset doc id."""
    if ds.live_dir is not None:
        settings = base.model_copy(update={"data_dir": ds.live_dir})
        return settings, {}, {"live": str(ds.live_dir)}
    shape = {k: v for k, v in _public_config(base).items() if k in INDEX_KEYS}
    for key in ("progress", "batch_size", "threads"):
        shape.get("embedder", {}).pop(key, None)
    fp = _fingerprint({"corpus": ds.corpus_hash, "settings": shape})[:16]
    folder = home / "index" / fp
    layered = {"data_dir": folder / "data", "sources": [],
               "lexical": {**base.lexical.model_dump(), "index": f"ragqa-eval-{fp}", "path": None},
               "vector": {**base.vector.model_dump(), "collection": f"ragqa_eval_{fp}", "uri": base.vector.uri
                          if base.vector.uri and "://" in base.vector.uri else None}}
    settings = Settings.model_validate({**base.model_dump(), **layered})
    manifest = folder / "ingest.json"
    if manifest.is_file():
        saved = json.loads(manifest.read_text(encoding="utf-8"))
        return settings, saved.pop("doc_of"), {**saved, "reused": True}
    if folder.exists():  # an ingest that did not finish
        shutil.rmtree(folder)
    from evals.retrieval import ingest_corpus
    from ingest.services import open_services

    log.info("ingesting %s (%d documents) into %s", ds.name, len(ds.corpus or {}), folder)
    services = open_services(settings.model_copy(update={"embedder": settings.embedder.model_copy(
        update={"progress": progress})}))
    try:
        report = ingest_corpus(services, ds.corpus or {}, folder / "docs")
    finally:
        services.close()
    manifest.write_text(json.dumps(report) + "\n", encoding="utf-8")
    doc_of = report.pop("doc_of")
    return settings, doc_of, {**report, "reused": False}


def _index_snapshot(settings: Settings) -> dict[str, Any]:
    """Documents, chunks, the embedder (as the first ingest recorded it: ``auto`` resolves
    there) and the live lexical generation of the index the run answered from."""
    from ingest.state import StateDB

    state = StateDB(Path(settings.data_dir) / "state.db")
    try:
        documents, chunks = state.counts()
        embedder = state.get_meta("embedder")
    finally:
        state.close()
    out: dict[str, Any] = {"documents": documents, "chunks": chunks, "embedder": embedder}
    if settings.lexical.backend == "tantivy":
        from rag.lexical.tantivy_generations import live_generation

        out["lexical_generation"] = live_generation(Path(settings.lexical_path))
    else:
        out["lexical_index"] = settings.lexical.index
    return out


def _model_info(settings: Settings) -> dict[str, Any]:
    gen = settings.generator
    model, quant = gen.model, gen.quantization
    if gen.backend == "llamacpp":
        from rag.generators.gguf_models import DEFAULT_MODEL, PACKAGED_MODELS

        model = model or DEFAULT_MODEL
    if quant is None and gen.backend == "llamacpp":
        file = PACKAGED_MODELS[model].filename if model in PACKAGED_MODELS else str(model)
        found = re.search(r"(?i)(iq\d_\w+|q\d_k_[sml]|q\d_k|q\d_\d|bf16|f16|f32)", file)
        quant = found.group(1).upper() if found else None  # type: ignore[assignment]
    return {"generator": gen.backend, "model": model, "quantization": quant}


async def _answer_all(settings: Settings, ds: _Dataset, doc_of: Mapping[str, str], run_dir: Path,
                      done: dict[tuple[str, str], dict[str, Any]], abstain_limit: int | None, seed: int,
                      progress: bool, stop_after: int | None = None) -> list[dict[str, Any]]:
    from tqdm import tqdm

    from ingest.services import open_services
    from rag.answer import Answerer
    from rag.retrieval import HybridRetriever

    to_ours = {v: k for k, v in doc_of.items()}  # dataset doc id -> our doc id
    with_gold = [i for i in ds.items if i.gold_docs]
    negatives = with_gold if abstain_limit is None else with_gold[:abstain_limit]
    negative_ids = {i.qid for i in negatives}
    # Each question's abstention right after its answer: a run stopped early has both for its first questions.
    work = [(i, p) for i in ds.items[:stop_after] for p in ("answer", "abstain")
            if p == "answer" or i.qid in negative_ids]
    rows = [done[(i.qid, p)] for i, p in work if (i.qid, p) in done]
    todo = [(i, p) for i, p in work if (i.qid, p) not in done]
    if not todo:
        return rows
    services = open_services(settings)
    retriever = _EvalRetriever(HybridRetriever.from_services(services))
    answerer = Answerer(services, retriever=retriever)  # type: ignore[arg-type]
    answerer.record_confidence = True  # rows record each answer's confidence (fit-router's cascade)
    bar = tqdm(total=len(work), initial=len(rows), desc=f"eval {ds.name}", unit="q", disable=None if progress else True,
               dynamic_ncols=True)
    try:
        with open(run_dir / ROWS, "a", encoding="utf-8") as fh:
            for item, kind in todo:
                retriever.exclude = frozenset(to_ours.get(d, d) for d in item.gold_docs) if kind == "abstain" \
                    else frozenset()
                row = await _one(answerer, retriever, item, kind, doc_of, seed)
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")
                fh.flush()
                rows.append(row)
                bar.update(1)
                scored = [r["metrics"]["f1"] for r in rows if r["pass"] == "answer"]
                if scored:
                    bar.set_postfix(f1=f"{statistics.fmean(scored):.3f}")
    finally:
        bar.close()
        await answerer.close()
        services.close()
    return rows


async def _one(answerer: Any, retriever: _EvalRetriever, item: QAItem, kind: str, doc_of: Mapping[str, str],
               seed: int) -> dict[str, Any]:
    """Answer one question and score it."""
    started = time.perf_counter()
    parts: list[str] = []
    sources: tuple = ()
    done: Any = None
    error: str | None = None
    retriever.hits = []
    try:
        # the abstention pass skips the answer cache, which holds this question's answer pass
        async for event in answerer.stream(item.question, overrides={"seed": seed}, no_cache=kind == "abstain"):
            if event.kind == "sources":
                sources = event.citations
            elif event.kind == "delta":
                parts.append(event.text)
            elif event.kind == "done":
                done = event
            elif event.kind == "error":
                error = event.error
                done = event
    except Exception as exc:  # noqa: BLE001 - one failed question is recorded, the run goes on
        error = f"{type(exc).__name__}: {exc}"
    answer = "".join(parts).strip()
    dataset_doc = {h.chunk_id: doc_of.get(_doc_id(h), _doc_id(h)) for h in retriever.hits}
    texts = {h.chunk_id: h.chunk.text for h in retriever.hits if h.chunk is not None}
    cited = {c.label: (doc_of.get(c.doc_id, c.doc_id), texts.get(c.chunk_id, c.snippet))
             for c in (done.citations if done is not None else ())}
    timings = dict(done.timings) if done is not None else {}
    timings.setdefault("total_ms", round((time.perf_counter() - started) * 1000, 2))
    usage = dict(done.usage) if done is not None else {}
    row: dict[str, Any] = {
        "qid": item.qid, "pass": kind, "lang": item.lang, "question": item.question, "answer": answer,
        "gold": list(item.answers) or [list(p) for p in item.parts or ()],
        "citations": [{"label": c.label, "doc": doc_of.get(c.doc_id, c.doc_id), "inferred": c.inferred}
                      for c in (done.citations if done is not None else ())],
        "attribution": dict(getattr(done, "attribution", None) or {}),
        # the answer's confidence (logprob, min_logprob), which the cascade's fit reads
        "confidence": dict(getattr(done, "confidence", None) or {}),
        "retrieved": [[h.chunk_id, dataset_doc[h.chunk_id]] for h in retriever.hits],
        "packed": [c.chunk_id for c in sources],
        "timings": timings, "usage": usage,
        "cache": done.cache if done is not None else None,
        "degraded": bool(done.degraded) if done is not None else False,
        "finish_reason": done.finish_reason if done is not None else None, "error": error,
        # the router's signals, so that ragqa eval fit-router can fit its thresholds without a re-run
        "route": asdict(route_signals(item.question, lang=item.lang, hits=retriever.hits, legs=None,
                                      packed_chunks=len(sources), turn=1)),
    }
    metrics: dict[str, float | None]
    if kind == "abstain":
        metrics = {"abstention": float(abstained(answer))}
    else:
        golds = list(item.answers) or [g for p in item.parts or () for g in p]
        metrics = {**answer_scores(answer, item.answers, item.lang, item.parts),
                   **citation_scores(answer, cited, set(item.gold_docs), golds, item.lang),
                   "explicit_compliance": float(any(not c["inferred"] for c in row["citations"])),
                   "abstained": float(abstained(answer)), **_retrieval_scores(row, item.gold_docs, dataset_doc)}
    metrics.update(_speed(timings, usage))
    row["metrics"] = metrics
    return row


def _retrieval_scores(row: Mapping[str, Any], gold: frozenset[str], dataset_doc: Mapping[str, str]) -> dict:
    if not gold:
        return {"retrieval_hit": None, "retrieval_mrr": None, "context_hit": None}
    ranked: list[str] = []
    for _, doc in row["retrieved"]:
        if doc not in ranked:
            ranked.append(doc)
    first = next((i for i, d in enumerate(ranked) if d in gold), None)
    return {"retrieval_hit": float(first is not None),
            "retrieval_mrr": round(1 / (first + 1), 4) if first is not None else 0.0,
            "context_hit": float(any(dataset_doc.get(c) in gold for c in row["packed"]))}


def _speed(timings: Mapping[str, float], usage: Mapping[str, int]) -> dict[str, float | None]:
    out: dict[str, float | None] = {k: timings.get(k) for k in LATENCIES}
    decode_s = ((timings.get("total_ms") or 0) - (timings.get("ttft_ms") or 0)) / 1000
    tokens = usage.get("completion_tokens") or 0
    model = bool(usage.get("prompt_tokens"))  # a model read a prompt (the extractive answerer reads none)
    out["tokens_per_s"] = round((tokens - 1) / decode_s, 2) if model and tokens > 1 and decode_s > 0 else None
    out["prompt_tokens"] = usage.get("prompt_tokens")
    out["completion_tokens"] = usage.get("completion_tokens")
    return out


SPEED = (*LATENCIES, "tokens_per_s", "prompt_tokens", "completion_tokens")


def summarize(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Means of every quality metric (over the questions where it is defined), p50/p99 of every
    stage's latency on the answer pass, and the counts of errors, degraded and cached answers."""
    rows = list(rows)
    answer = [r for r in rows if r["pass"] == "answer"]
    values: dict[str, list[float]] = {}
    for r in rows:
        for key, value in r["metrics"].items():
            if value is not None and key not in SPEED:
                values.setdefault(key, []).append(float(value))
    latency: dict[str, dict[str, float]] = {}
    for key in SPEED:
        xs = [float(r["metrics"][key]) for r in answer if r["metrics"].get(key) is not None]
        if xs:
            p50, p99 = np.percentile(xs, [50, 99])  # linear interpolation between the closest ranks
            latency[key] = {"p50": round(float(p50), 2), "p99": round(float(p99), 2),
                            "mean": round(statistics.fmean(xs), 2)}
    cache: dict[str, int] = {}
    for r in answer:
        cache[str(r.get("cache"))] = cache.get(str(r.get("cache")), 0) + 1
    return {
        "questions": len(answer), "abstention_questions": sum(1 for r in rows if r["pass"] == "abstain"),
        "metrics": {k: round(statistics.fmean(v), 4) for k, v in values.items()},
        "defined": {k: len(v) for k, v in values.items()},
        "latency": latency,
        "errors": sum(1 for r in rows if r.get("error")), "degraded": sum(1 for r in rows if r.get("degraded")),
        "cache": cache,
    }
