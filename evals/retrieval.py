"""Retrieval quality on a BEIR-style folder: recall, MRR and nDCG for each retrieval mode.

A dataset folder holds ``corpus.jsonl`` (``id``, ``title``, ``text``, ``lang``),
``queries.jsonl`` (``id``, ``text``) and ``qrels.tsv`` (a header line, then
``query-id``, ``doc-id``, ``relevance``). The corpus is ingested through the ordinary
folder source into a fresh data directory, every query runs in every mode, chunk hits are
mapped back to corpus documents (a document ranks at its best chunk), and the measures
are computed with ``ir-measures`` over every judged query (a query with no hits scores 0).

One ingest serves several *variants*: a mode with its parameters (``candidates``, ``rrf_k``,
``weights``), written ``[NAME=]MODE[:KEY=VALUE]...`` (see :func:`parse_variant`), so a sweep
of fusion weights or candidate depths does not re-embed the corpus. ``queries_file`` and
``qrels_file`` replace the folder's queries and judgements, e.g. Chinese XQuAD questions
against the English XQuAD paragraphs (the two sets share doc and query ids).

Candidate depth is honoured: ``hybrid`` and ``rrf`` are asked for at most ``candidates``
chunks, so each leg holds exactly ``candidates`` chunks as in a live query (the retriever
widens its legs to ``k`` when ``k`` is larger). With fewer than 100 candidates, recall@100
is therefore capped.

Example::

    report = run_retrieval_eval("data/xquad-en", ["bm25", "rrf"], {"embedder": {"backend": "hash"}},
                                variants=["rrf:weights=1,0.5:rrf_k=20", "hybrid:candidates=50"])
    print(report["metrics"]["rrf"]["ndcg@10"], report["timing"]["rrf"]["ms_per_query"])
    print(report["metrics"]["rrf:weights=1,0.5:rrf_k=20"]["recall@10"])
"""

from __future__ import annotations

import csv
import inspect
import json
import logging
import statistics
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ir_measures
from ir_measures import RR, R, nDCG

from ingest.services import open_services, state_db
from rag.config import Settings, SourceConfig
from rag.errors import ConfigError
from rag.retrieval import MODES, HybridRetriever
from rag.services import Services

__all__ = ["DOC_DEPTH", "METRICS", "Variant", "build_variants", "ingest_corpus", "load_beir", "load_corpus",
           "load_qrels", "load_queries", "parse_variant", "parse_weights", "read_jsonl", "run_retrieval_eval"]

log = logging.getLogger("ragqa.eval")

DOC_DEPTH = 100  # documents kept per query, the deepest cut-off measured
SOURCE = "beir"
METRICS = {
    "recall@1": R @ 1, "recall@5": R @ 5, "recall@10": R @ 10, "recall@100": R @ 100,
    "mrr@10": RR @ 10, "ndcg@10": nDCG @ 10,
}
DEFAULT_CANDIDATES = 100
DEFAULT_RRF_K = 60.0
DEFAULT_WEIGHTS: tuple[float, float] | None = None  # adaptive per query (rag.retrieval.adaptive)

Corpus = dict[str, dict[str, str]]
Qrels = dict[str, dict[str, int]]


@dataclass(frozen=True)
class Variant:
    """One retrieval mode with its parameters, under the name the report uses for it."""

    name: str
    mode: str
    candidates: int = DEFAULT_CANDIDATES
    rrf_k: float = DEFAULT_RRF_K
    weights: tuple[float, float] | None = DEFAULT_WEIGHTS
    language_aware: bool = True

    @property
    def depth(self) -> int:
        """Chunks asked of the retriever: ``hybrid`` and ``rrf`` stop at their candidates."""
        return min(2 * DOC_DEPTH, self.candidates) if self.mode in ("hybrid", "rrf") else 2 * DOC_DEPTH

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mode": self.mode, "depth": self.depth}
        if self.mode in ("hybrid", "rrf"):
            out["candidates"] = self.candidates
        if self.mode == "rrf":
            out["rrf_k"] = self.rrf_k
            out["weights"] = "auto" if self.weights is None else list(self.weights)
        if self.mode in ("hybrid", "rrf"):
            out["language_aware"] = self.language_aware
        return out


_KEYS = {"candidates": "candidates", "c": "candidates", "rrf_k": "rrf_k", "k": "rrf_k",
         "weights": "weights", "w": "weights", "lang": "language_aware", "language_aware": "language_aware"}
_APPLIES = {"candidates": ("hybrid", "rrf"), "rrf_k": ("rrf",), "weights": ("rrf",),
            "language_aware": ("hybrid", "rrf")}


def parse_weights(text: str) -> tuple[float, float] | None:
    """``"1,0.5"`` -> ``(1.0, 0.5)``: the (BM25, vector) weights of rank fusion; ``"auto"`` ->
    ``None``, adaptive weights per query."""
    if str(text).strip().lower() == "auto":
        return None
    parts = [p.strip() for p in str(text).split(",")]
    try:
        values = tuple(float(p) for p in parts)
    except ValueError:
        values = ()
    if len(values) != 2 or any(v < 0 for v in values) or not any(values):
        raise ConfigError(f"weights must be two non-negative numbers BM25,VECTOR (not both 0), got {text!r}")
    return values


def _num(text: str) -> str:
    return f"{float(text):g}"


def parse_variant(spec: str, *, candidates: int = DEFAULT_CANDIDATES, rrf_k: float = DEFAULT_RRF_K,
                  weights: Sequence[float] | None = DEFAULT_WEIGHTS, language_aware: bool = True) -> Variant:
    """Read ``[NAME=]MODE[:KEY=VALUE]...``; keys not given take the keyword defaults.

    Keys: ``candidates`` (or ``c``; hybrid and rrf), ``rrf_k`` (or ``k``; rrf) and
    ``weights`` (or ``w``; rrf, ``BM25,VECTOR`` or ``auto``) and ``lang`` (hybrid and rrf, 1 or
    0: whether a question in a language the embedder does not cover loses the vector leg).
    Without a name, the variant is named by its mode and the parameters that differ from the
    standard ones (100 candidates, k 60, adaptive weights, lang 1), e.g.
    ``rrf:weights=1,0.5:rrf_k=20``, which reads back as the same variant.

    Example::

        parse_variant("rrf:w=2,1:k=20")  # Variant(name="rrf:rrf_k=20:weights=2,1", mode="rrf", ...)
        parse_variant("best=rrf:weights=1,0.7")
    """
    text = spec.strip()
    name: str | None = None
    first = text.split(":", 1)[0]
    if "=" in first:
        name, text = text.split("=", 1)
        name = name.strip()
        if not name:
            raise ConfigError(f"variant {spec!r}: empty name before '='")
    mode, *pairs = [p.strip() for p in text.split(":")]
    if mode not in MODES:
        raise ConfigError(f"variant {spec!r}: modes must be some of {', '.join(MODES)}, not {mode!r}")
    values: dict[str, Any] = {"candidates": int(candidates), "rrf_k": float(rrf_k),
                              "weights": None if weights is None else parse_weights(",".join(str(w) for w in weights)),
                              "language_aware": bool(language_aware)}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        key = _KEYS.get(key.strip(), "")
        if not eq or not key or not value.strip():
            raise ConfigError(f"variant {spec!r}: expected KEY=VALUE with KEY one of candidates, rrf_k, "
                              f"weights, lang, got {pair!r}")
        if mode not in _APPLIES[key]:
            raise ConfigError(f"variant {spec!r}: {key} does not apply to {mode} "
                              f"(only to {' and '.join(_APPLIES[key])})")
        try:
            if key == "candidates":
                values[key] = int(value)
                if values[key] < 1:
                    raise ValueError
            elif key == "rrf_k":
                values[key] = float(value)
                if values[key] < 0:
                    raise ValueError
            elif key == "language_aware":
                flag = {"1": True, "on": True, "true": True, "0": False, "off": False, "false": False}
                values[key] = flag[value.strip().lower()]
            else:
                values[key] = parse_weights(value)
        except (ValueError, KeyError):
            raise ConfigError(f"variant {spec!r}: bad value for {key}: {value!r}") from None
    variant = Variant(name or "", mode, values["candidates"], values["rrf_k"], values["weights"],
                      values["language_aware"])
    return variant if name else _named(variant)


def _named(v: Variant) -> Variant:
    parts = [v.mode]
    if v.mode in _APPLIES["candidates"] and v.candidates != DEFAULT_CANDIDATES:
        parts.append(f"candidates={v.candidates}")
    if v.mode == "rrf" and v.rrf_k != DEFAULT_RRF_K:
        parts.append(f"rrf_k={_num(str(v.rrf_k))}")
    if v.mode == "rrf" and v.weights != DEFAULT_WEIGHTS:
        parts.append("weights=" + ("auto" if v.weights is None else ",".join(_num(str(w)) for w in v.weights)))
    if v.mode in _APPLIES["language_aware"] and not v.language_aware:
        parts.append("lang=0")
    return Variant(":".join(parts), v.mode, v.candidates, v.rrf_k, v.weights, v.language_aware)


def load_beir(folder: str | Path, queries: str | Path | None = None,
              qrels: str | Path | None = None) -> tuple[Corpus, dict[str, str], Qrels]:
    """Read a BEIR-style folder into ``(corpus, queries, qrels)``.

    ``corpus`` maps a doc id to ``{"title", "text", "lang"}``; ``queries`` maps a query id
    to its text; ``qrels`` maps a query id to ``{doc_id: relevance}``. ``queries`` and
    ``qrels`` name files to read instead of the folder's own (which may then be absent).
    """
    root = Path(folder)
    needed = [("corpus.jsonl", None), ("queries.jsonl", queries), ("qrels.tsv", qrels)]
    for name, other in needed:
        if other is None and not (root / name).is_file():
            raise ConfigError(f"{root} is not a BEIR-style dataset: {name} is missing")
    return (load_corpus(root / "corpus.jsonl"), load_queries(queries if queries is not None else root / "queries.jsonl"),
            load_qrels(qrels if qrels is not None else root / "qrels.tsv"))


def load_corpus(path: str | Path) -> Corpus:
    """A ``corpus.jsonl`` as ``{doc_id: {"title", "text", "lang"}}``."""
    return {str(row["id"]): {"title": str(row.get("title") or ""), "text": str(row.get("text") or ""),
                             "lang": str(row.get("lang") or "")} for row in read_jsonl(Path(path))}


def load_queries(path: str | Path) -> dict[str, str]:
    """A ``queries.jsonl`` (``id``, ``text``) as ``{query_id: text}``."""
    if not Path(path).is_file():
        raise ConfigError(f"queries file not found: {path}")
    return {str(row["id"]): str(row["text"]) for row in read_jsonl(Path(path))}


def load_qrels(path: str | Path) -> Qrels:
    """A ``qrels.tsv`` (a header line, then query id, doc id, relevance) as ``{query: {doc: rel}}``."""
    if not Path(path).is_file():
        raise ConfigError(f"qrels file not found: {path}")
    qrels: Qrels = {}
    with open(path, encoding="utf-8", newline="") as fh:
        reader = csv.reader(fh, delimiter="\t")
        next(reader, None)
        for row in reader:
            if len(row) < 3 or not row[0].strip():
                continue
            qrels.setdefault(row[0].strip(), {})[row[1].strip()] = int(row[2])
    return qrels


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def build_variants(modes: Sequence[str], variants: Sequence[str | Variant] = (), *,
                   candidates: int = DEFAULT_CANDIDATES, rrf_k: float = DEFAULT_RRF_K,
                   weights: Sequence[float] | None = DEFAULT_WEIGHTS,
                   language_aware: bool = True) -> list[Variant]:
    """The variants to run: each of ``modes`` (named by its mode) with the shared parameters,
    then each of ``variants`` (spec strings take the shared parameters as defaults)."""
    unknown = [m for m in modes if m not in MODES]
    if unknown or not (modes or variants):
        raise ConfigError(f"modes must be some of {', '.join(MODES)}, got {', '.join(modes) or 'none'}")
    shared = {"candidates": candidates, "rrf_k": rrf_k, "weights": weights, "language_aware": language_aware}
    fixed = None if weights is None else parse_weights(",".join(map(str, weights)))
    out = [Variant(m, m, int(candidates), float(rrf_k), fixed, language_aware) for m in modes]
    out += [v if isinstance(v, Variant) else parse_variant(v, **shared) for v in variants]  # type: ignore[arg-type]
    seen: set[str] = set()
    for v in out:
        if v.name in seen:
            raise ConfigError(f"two variants are named {v.name!r}: drop one, or name one NAME=MODE:...")
        seen.add(v.name)
    return out


def run_retrieval_eval(folder: str | Path, modes: Sequence[str] = MODES,
                       settings_overrides: Mapping[str, Any] | None = None,
                       data_dir: str | Path | None = None,
                       limit_queries: int | None = None,
                       candidates: int = DEFAULT_CANDIDATES, *,
                       rrf_k: float = DEFAULT_RRF_K,
                       weights: Sequence[float] | None = DEFAULT_WEIGHTS,
                       language_aware: bool = True,
                       variants: Sequence[str | Variant] = (),
                       queries_file: str | Path | None = None,
                       qrels_file: str | Path | None = None,
                       config_file: str | Path | None = None,
                       per_query: bool = False) -> dict[str, Any]:
    """Ingest the corpus of ``folder`` once, run its judged queries in each variant, and measure.

    ``modes`` run with the shared ``candidates``, ``rrf_k`` and ``weights`` and are reported
    under their mode name; ``variants`` (``[NAME=]MODE[:KEY=VALUE]...`` strings, see
    :func:`parse_variant`, or :class:`Variant`) follow, under their names.
    Returns ``{"metrics": {name: {metric: value}}, "timing": {name: {...}},
    "variants": {name: {"mode", "depth", ...}}, ...}``. ``settings_overrides`` go to
    ``Settings.load`` (with ``config_file``; the environment still applies, so
    ``RAG_EMBEDDER__BACKEND=use`` picks the embedder); ``data_dir`` defaults to a temporary
    directory that is removed afterwards. ``queries_file``/``qrels_file`` replace the
    folder's ``queries.jsonl``/``qrels.tsv``. ``per_query`` adds
    ``report["per_query"][name][metric][query_id]``, for paired significance tests.
    """
    chosen = build_variants(modes, variants, candidates=candidates, rrf_k=rrf_k, weights=weights,
                            language_aware=language_aware)
    corpus, queries, qrels = load_beir(folder, queries_file, qrels_file)
    judged = {q: {d: r for d, r in rels.items() if r > 0} for q, rels in qrels.items()}
    qids = [q for q in queries if judged.get(q)]
    if limit_queries is not None:
        qids = qids[:limit_queries]
    if not qids:
        raise ConfigError(f"{folder}: no query has a relevant document in the qrels "
                          "(do the query ids of the queries and the qrels match?)")
    wanted = {q: judged[q] for q in qids}
    unknown_docs = {d for rels in wanted.values() for d in rels if d not in corpus}
    if all(d in unknown_docs for rels in wanted.values() for d in rels):
        raise ConfigError(f"{folder}: no relevant document of the qrels is in corpus.jsonl "
                          "(the qrels name other doc ids: map them to this corpus first)")
    with tempfile.TemporaryDirectory(prefix="ragqa-eval-") as tmp:
        data = Path(data_dir) if data_dir is not None else Path(tmp) / "data"
        settings = Settings.load(config_file, **{**dict(settings_overrides or {}), "data_dir": data})
        services = open_services(settings)
        try:
            ingest = ingest_corpus(services, corpus, Path(tmp) / "docs")
            doc_of = ingest.pop("doc_of")
            report: dict[str, Any] = {
                "dataset": str(folder), "queries": len(qids), "docs": len(corpus),
                "embedder": f"{services.embedder.name}:{services.embedder.dim}",
                "ingest": ingest, "metrics": {}, "timing": {}, "variants": {},
            }
            if queries_file is not None:
                report["queries_file"] = str(queries_file)
            if qrels_file is not None:
                report["qrels_file"] = str(qrels_file)
            if unknown_docs:
                report["qrels_docs_not_in_corpus"] = len(unknown_docs)
            texts = {q: queries[q] for q in qids}
            for variant in chosen:
                run, seconds, p50_ms = _run_variant(services, variant, texts, doc_of)
                scores: dict[str, dict[str, float]] | None = {} if per_query else None
                report["metrics"][variant.name] = _measure(wanted, run, scores)
                if scores is not None:
                    report.setdefault("per_query", {})[variant.name] = scores
                report["timing"][variant.name] = {"seconds": round(seconds, 3),
                                                  "ms_per_query": round(1000 * seconds / len(qids), 2),
                                                  "p50_ms": round(p50_ms, 2)}
                report["variants"][variant.name] = variant.describe()
        finally:
            services.close()
    return report


def ingest_corpus(services: Services, corpus: Corpus, folder: Path) -> dict[str, Any]:
    """Write each document as a Markdown file and index the folder as one source."""
    from ingest.pipeline import reindex

    folder.mkdir(parents=True, exist_ok=True)
    doc_of: dict[str, str] = {}
    for i, (doc_id, doc) in enumerate(corpus.items()):
        name = f"{i:07d}.md"
        title = " ".join(doc["title"].split())
        body = f"# {title}\n\n{doc['text']}\n" if title else f"{doc['text']}\n"
        (folder / name).write_text(body, encoding="utf-8")
        doc_of[f"{SOURCE}:{name}"] = doc_id
    langs = {doc["lang"] for doc in corpus.values()}
    lang = langs.pop() if len(langs) == 1 and "" not in langs else None
    state_db(services).add_source(SourceConfig(name=SOURCE, kind="folder", location=str(folder),
                                           lang=lang, max_pages=max(1, len(corpus))))
    started = time.perf_counter()
    with services.write_lock():
        result = reindex(services, SOURCE, "full")
    # A document that is all boilerplate (RGB-zh has passages that are one "last updated" line)
    # has nothing to index and cannot be retrieved: it is counted, not fatal. Any other failure is.
    empty = result.error_kinds.get("no_text", 0)
    if result.failed > empty:
        raise ConfigError(f"ingesting the corpus failed for {result.failed - empty} documents: {result.errors[:3]}")
    if empty:
        log.warning("%d documents of the corpus had no text to index once boilerplate was removed", empty)
    return {"seconds": round(time.perf_counter() - started, 3), "documents": result.added + result.changed,
            "chunks": result.chunks_embedded + result.chunks_reused, "empty_documents": empty, "doc_of": doc_of}


def _retriever(services: Services, variant: Variant) -> HybridRetriever:
    """The variant's retriever with only ranking on: no recency boost and no near-duplicate
    dropping (which would hide a judged document behind a near copy), where they exist."""
    options: dict[str, Any] = {"mode": variant.mode, "candidates": variant.candidates,
                               "rrf_k": variant.rrf_k, "weights": variant.weights,
                               "language_aware": variant.language_aware}
    accepted = inspect.signature(HybridRetriever).parameters
    for key in ("dedup_threshold", "recency_half_life_days"):
        if key in accepted:
            options[key] = None
    return HybridRetriever(services, **options)


def _run_variant(services: Services, variant: Variant, queries: Mapping[str, str],
                 doc_of: Mapping[str, str]) -> tuple[dict[str, dict[str, float]], float, float]:
    """The ranked documents of each query, the seconds of the whole run and the median
    milliseconds of one query (steadier than the mean on a busy machine)."""
    retriever = _retriever(services, variant)
    run: dict[str, dict[str, float]] = {}
    each: list[float] = []
    started = time.perf_counter()
    for qid, text in queries.items():
        began = time.perf_counter()
        hits = retriever.retrieve(text, k=variant.depth)  # a document can fill several slots
        each.append(time.perf_counter() - began)
        ranked: list[str] = []
        for h in hits:  # hits are best first, so a document's first chunk is its best
            doc = doc_of.get(h.doc_id or (h.chunk.doc_id if h.chunk else ""))
            if doc is not None and doc not in ranked:
                ranked.append(doc)
                if len(ranked) == DOC_DEPTH:
                    break
        # Scores that encode the rank: trec_eval would break score ties by doc id.
        run[qid] = {doc: float(len(ranked) - i) for i, doc in enumerate(ranked)}
    return run, time.perf_counter() - started, 1000 * statistics.median(each)


def _measure(qrels: Qrels, run: Mapping[str, Mapping[str, float]],
             per_query: dict[str, dict[str, float]] | None = None) -> dict[str, float]:
    """Mean of each metric over every judged query; a query with no hits counts as 0.

    ``per_query``, when given, receives ``{metric: {query_id: value}}`` for every judged query.
    """
    names = {measure: name for name, measure in METRICS.items()}
    totals = dict.fromkeys(METRICS, 0.0)
    if per_query is not None:
        per_query.update({name: dict.fromkeys(qrels, 0.0) for name in METRICS})
    for m in ir_measures.iter_calc(list(METRICS.values()), qrels, {q: dict(r) for q, r in run.items() if r}):
        totals[names[m.measure]] += m.value
        if per_query is not None:
            per_query[names[m.measure]][m.query_id] = round(m.value, 4)
    return {name: round(total / len(qrels), 4) for name, total in totals.items()}
