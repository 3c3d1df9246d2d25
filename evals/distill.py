"""Distillation data: a teacher's answers as a chat-format training set for a student model.

``ragqa eval export-distill SOURCE... --out train.jsonl`` reads the answers of a teacher
profile from ``ragqa eval answers`` run folders (``rows.jsonl`` and ``summary.json``) or from
the server's QA log (``serve.qa_log``'s JSON lines), and writes one JSON line per kept answer::

    {"messages": [{"role": "system", ...}, {"role": "user", "content": "<context>[1] ...</context>
     <question>...</question>"}, {"role": "assistant", "content": "answer with [1] labels"}],
     "provenance": {"source": "eval-run", "run": ..., "row": 3, "qid": ..., "model": ...,
                    "quantization": ..., "prompt_version": ..., "dataset": ..., "context": "index"}}

The system and user messages are the ones :func:`rag.prompts.build_prompt` makes today (the
rules and examples of the run's ``prompt`` settings), so the student learns the prompt it
will be served with; ``prompt_version`` names it. Serving the student is then a generator
profile whose model is the student's path.

**The context.** An eval row names its packed chunks; their text comes from a row's own
``context`` when it has one, else from the state database of the index the run answered from
(``<data_dir>/evals/index/*/data``, or ``--index DATA_DIR``), else from the dataset's
documents (``corpus.jsonl``: exact when a document is one chunk, as XQuAD's paragraphs are).
Whole chunks are used: the teacher may have seen the last one cut to its budget. A QA log
line holds only the *cited* chunks (ids, no text) and no gold answer: their text comes from
the data dir's state database, the passages are renumbered ``[1]..[n]`` in the answer too,
and uncited packed passages are missing, so the student sees no distractors from the log.

**Filters** (counted per reason in the report): errors, answers the fallback gave
(``degraded``), other profiles than ``--profile``, abstentions (unless ``--keep-abstentions``,
which also keeps the correct "I don't know" of the abstention pass), answers with no citation
(unless ``--keep-uncited``), F1 below ``--min-f1`` where the gold is known, and rows whose
context cannot be found. **De-duplication**: one row per normalised question (NFKC, case,
spaces, final ``?``) and context hash, the first seen kept; ``--near-dup T`` also drops a
question whose words overlap a kept one's on the same context by Jaccard ``T`` or more.

Example::

    report = export_distill(["runs/qwen15"], "train.jsonl", min_f1=0.5)
    report["kept"], report["dropped"]     # 87, {"abstained": 6, "duplicate": 2, ...}
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evals.qa_metrics import abstained
from rag.errors import ConfigError
from rag.packing import SEPARATOR, PackedContext, passage_header
from rag.prompts import EXAMPLES, PromptExample, build_prompt, prompt_version
from rag.support import LABEL, text_words
from rag.types import Chunk, Passage

__all__ = ["Candidate", "ChunkStore", "export_distill", "read_eval_run", "read_qa_log", "render_report"]


@dataclass
class Candidate:
    """One teacher answer with what it was answered from, before filtering."""

    question: str
    answer: str
    chunks: list[Chunk | None]  # the packed passages in label order; None: text not found
    provenance: dict[str, Any]
    lang: str | None = None
    f1: float | None = None
    abstention_pass: bool = False
    citations: int = 0
    error: str | None = None
    degraded: bool = False
    prompt: Mapping[str, Any] = field(default_factory=dict)  # the run's prompt settings


# Reading the sources


class ChunkStore:
    """Chunks by id from the state databases of some data dirs (or ``state.url`` databases)."""

    def __init__(self, targets: Sequence[Path | str]) -> None:
        from ingest.state import StateDB

        self._dbs = [StateDB(t if isinstance(t, str) else t / "state.db") for t in targets
                     if isinstance(t, str) or (t / "state.db").is_file()]

    def __call__(self, ids: Sequence[str]) -> dict[str, Chunk]:
        found: dict[str, Chunk] = {}
        for db in self._dbs:
            missing = [i for i in ids if i not in found]
            if not missing:
                break
            found.update(db.get_chunks(missing))
        return found

    def close(self) -> None:
        for db in self._dbs:
            db.close()


def _eval_indexes(data_dir: Path | None) -> list[Path]:
    if data_dir is None:
        return []
    root = data_dir / "evals" / "index"
    return sorted(p / "data" for p in root.glob("*") if (p / "data" / "state.db").is_file()) if root.is_dir() else []


def read_eval_run(run_dir: Path, lookup: ChunkStore) -> Iterator[Candidate]:
    """The answers of an ``eval answers`` run, their packed chunks resolved."""
    rows_file = run_dir / "rows.jsonl"
    if not rows_file.is_file():
        raise ConfigError(f"{run_dir} is not an eval answers run (no rows.jsonl)")
    summary_file = run_dir / "summary.json"
    summary = json.loads(summary_file.read_text(encoding="utf-8")) if summary_file.is_file() else {}
    corpus: dict[str, dict[str, str]] = {}
    dataset_path = Path(summary.get("dataset_path") or "")
    if summary.get("dataset_path") and (dataset_path / "corpus.jsonl").is_file():
        from evals.retrieval import load_corpus

        corpus = load_corpus(dataset_path / "corpus.jsonl")
    run_id = summary.get("mlflow_run_id") or run_dir.resolve().name
    prompt = (summary.get("config") or {}).get("prompt") or {}
    for n, line in enumerate(rows_file.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        packed = [str(c) for c in row.get("packed") or ()]
        doc_of = {str(c): str(d) for c, d in row.get("retrieved") or ()}
        found = lookup(packed) if packed and not row.get("context") else {}
        chunks: list[Chunk | None] = []
        origin = "row" if row.get("context") else "index"
        for cid in packed:
            chunk = found.get(cid)
            if chunk is None and doc_of.get(cid) in corpus:
                doc = corpus[doc_of[cid]]
                chunk = Chunk(id=cid, doc_id=doc_of[cid], source=str(summary.get("dataset") or ""),
                              text=doc["text"], hash="", title=doc["title"])
                origin = "corpus"
            chunks.append(chunk)
        if row.get("context"):
            chunks = [_context_chunk(row["context"])]
        versions = row.get("versions") or {}
        metrics = row.get("metrics") or {}
        yield Candidate(
            question=str(row.get("question") or ""), answer=str(row.get("answer") or ""), chunks=chunks,
            lang=row.get("lang"), f1=metrics.get("f1") if row.get("gold") else None,
            abstention_pass=row.get("pass") == "abstain", citations=len(row.get("citations") or ()),
            error=row.get("error"), degraded=bool(row.get("degraded")), prompt=prompt,
            provenance={"source": "eval-run", "run": run_id, "run_dir": str(run_dir), "row": n,
                        "qid": row.get("qid"), "pass": row.get("pass"),
                        "generator": versions.get("generator") or summary.get("generator"),
                        "profile": versions.get("profile"),
                        "model": versions.get("model") or summary.get("model"),
                        "quantization": versions.get("quantization") or summary.get("quantization"),
                        "prompt_version": versions.get("prompt_version"),
                        "dataset": summary.get("dataset"), "context": origin})


def _context_chunk(text: str) -> Chunk:
    """A row's recorded packed context, kept whole as one pre-rendered block."""
    return Chunk(id="context", doc_id="context", source="", text=str(text), hash="")


def read_qa_log(path: Path, lookup: ChunkStore) -> Iterator[Candidate]:
    """The answers in a QA log file, the cited chunks resolved and relabelled ``[1]..[n]``."""
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a crash
        cited = [c for c in rec.get("citations") or () if c.get("chunk_id")]
        order = sorted({int(c["label"]) for c in cited})
        relabel = {old: new for new, old in enumerate(order, 1)}
        by_label = {int(c["label"]): str(c["chunk_id"]) for c in cited}
        found = lookup([by_label[label] for label in order]) if order else {}
        versions = rec.get("versions") or {}
        yield Candidate(
            question=str(rec.get("question") or ""), answer=_relabel(str(rec.get("answer") or ""), relabel),
            chunks=[found.get(by_label[label]) for label in order], citations=len(order),
            error=rec.get("error") or (None if rec.get("outcome", "ok") == "ok" else str(rec.get("outcome"))),
            degraded=bool(rec.get("degraded")),
            provenance={"source": "qa-log", "log": str(path), "line": n, "time": rec.get("time"),
                        "answer_id": rec.get("answer_id"), "route": rec.get("route"),
                        "generator": versions.get("generator"), "profile": versions.get("profile"),
                        "model": versions.get("model"), "quantization": versions.get("quantization"),
                        "prompt_version": versions.get("prompt_version"), "dataset": None,
                        "context": "cited"})


def _relabel(answer: str, relabel: Mapping[int, int]) -> str:
    def swap(match: Any) -> str:
        labels = [int(x) for x in match.group(1).replace("，", ",").replace("、", ",").split(",")]
        kept = [str(relabel[x]) for x in labels if x in relabel]
        return f"[{', '.join(kept)}]" if kept else ""

    return LABEL.sub(swap, answer)


# Filtering, de-duplication and writing


def _examples(prompt: Mapping[str, Any]) -> tuple[PromptExample, ...]:
    chosen = prompt.get("examples")
    if chosen is None:
        return EXAMPLES
    return tuple(PromptExample(**{k: e[k] for k in ("question", "context", "answer", "lang") if k in e})
                 for e in chosen)


def _messages(c: Candidate) -> tuple[list[dict[str, str]], str, str]:
    """The chat messages, the prompt version and the rendered context of a candidate."""
    chunks = [ch for ch in c.chunks if ch is not None]
    passages: tuple[Passage, ...]
    if len(chunks) == 1 and chunks[0].id == "context":
        text, passages = chunks[0].text, ()
    else:
        text = SEPARATOR.join(f"{passage_header(i, ch)}\n{ch.text}" for i, ch in enumerate(chunks, 1))
        passages = tuple(Passage(i, ch, 0, 0.0) for i, ch in enumerate(chunks, 1))
    packed = PackedContext(text, passages, {}, 0, 0)
    examples = _examples(c.prompt)
    instructions = dict(c.prompt.get("system") or {}) or None
    prompt = build_prompt(c.question, packed, lang=c.lang if c.lang in ("en", "zh") else None,
                          examples=examples, instructions=instructions)
    messages = [dict(m) for m in prompt.messages] + [{"role": "assistant", "content": c.answer.strip()}]
    return messages, prompt_version(examples, instructions), text


def _question_key(question: str) -> str:
    text = " ".join(unicodedata.normalize("NFKC", question).casefold().split())
    return text.rstrip("?？ ")


def _verdict(c: Candidate, *, min_f1: float | None, keep_uncited: bool, keep_abstentions: bool,
             profile: str | None) -> str | None:
    """Why ``c`` is left out, or None to keep it."""
    if c.error:
        return "error"
    if c.degraded:
        return "degraded"
    if profile is not None and c.provenance.get("profile") != profile:
        return "other profile"
    if not c.question.strip() or not c.answer.strip():
        return "empty"
    if not c.chunks or any(ch is None for ch in c.chunks):
        return "no context"
    said_unknown = abstained(c.answer)
    if c.abstention_pass:
        return None if keep_abstentions and said_unknown else "abstention pass"
    if said_unknown:
        return None if keep_abstentions else "abstained"
    if not c.citations and not keep_uncited:
        return "uncited"
    if min_f1 is not None and c.f1 is not None and c.f1 < min_f1:
        return "f1 below"
    return None


def export_distill(sources: Iterable[str | Path], out: str | Path, *, data_dir: str | Path | None = None,
                   index: Sequence[str | Path] = (), state_url: str | None = None, min_f1: float | None = None, keep_uncited: bool = False,
                   keep_abstentions: bool = False, profile: str | None = None,
                   near_dup: float | None = None) -> dict[str, Any]:
    """Write the training set of ``sources`` (eval run folders, QA log files) to ``out`` and
    return the report: rows read, kept, dropped per reason, per source."""
    if min_f1 is not None and not 0 <= min_f1 <= 1:
        raise ConfigError(f"--min-f1 is a share between 0 and 1, got {min_f1}")
    if near_dup is not None and not 0 < near_dup <= 1:
        raise ConfigError(f"--near-dup is a Jaccard threshold in (0, 1], got {near_dup}")
    paths = [Path(s) for s in sources]
    if not paths:
        raise ConfigError("give at least one eval answers run folder or QA log file")
    for p in paths:
        if not p.exists():
            raise ConfigError(f"{p} does not exist")
    dirs = [Path(d) for d in index] + _eval_indexes(Path(data_dir) if data_dir else None)
    if data_dir is not None and (Path(data_dir) / "state.db").is_file():
        dirs.append(Path(data_dir))  # a live data dir: the QA log's chunks
    lookup = ChunkStore([*dirs, *([state_url] if state_url else [])])
    dropped: Counter[str] = Counter()
    per_source: dict[str, int] = {}
    seen: set[str] = set()
    kept_words: dict[str, list[set[str]]] = {}
    read = kept = 0
    out_path = Path(out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with out_path.open("w", encoding="utf-8") as fh:
            for path in paths:
                rows = read_eval_run(path, lookup) if path.is_dir() else read_qa_log(path, lookup)
                before = kept
                for c in rows:
                    read += 1
                    reason = _verdict(c, min_f1=min_f1, keep_uncited=keep_uncited,
                                      keep_abstentions=keep_abstentions, profile=profile)
                    if reason is not None:
                        dropped[reason] += 1
                        continue
                    messages, version, context = _messages(c)
                    context_hash = hashlib.sha256(context.encode("utf-8")).hexdigest()[:16]
                    key = hashlib.sha256(f"{_question_key(c.question)}\x00{context_hash}".encode()).hexdigest()
                    if key in seen:
                        dropped["duplicate"] += 1
                        continue
                    words = text_words(c.question)
                    if near_dup is not None and any(
                            len(words & w) / max(1, len(words | w)) >= near_dup for w in kept_words.get(context_hash, ())):
                        dropped["near duplicate"] += 1
                        continue
                    seen.add(key)
                    kept_words.setdefault(context_hash, []).append(words)
                    provenance = {**c.provenance, "prompt_version": c.provenance.get("prompt_version") or version,
                                  "exported_prompt_version": version, "context_hash": context_hash,
                                  "f1": c.f1}
                    fh.write(json.dumps({"messages": messages, "provenance": provenance}, ensure_ascii=False) + "\n")
                    kept += 1
                per_source[str(path)] = per_source.get(str(path), 0) + kept - before
    finally:
        lookup.close()
    return {"out": str(out_path), "read": read, "kept": kept, "dropped": dict(sorted(dropped.items())),
            "sources": per_source, "filters": {"min_f1": min_f1, "keep_uncited": keep_uncited,
                                               "keep_abstentions": keep_abstentions, "profile": profile,
                                               "near_dup": near_dup}}


def render_report(report: Mapping[str, Any]) -> str:
    lines = [f"{report['kept']} of {report['read']} answers written to {report['out']}"]
    for reason, n in report["dropped"].items():
        lines.append(f"  dropped {n:>5}  {reason}")
    for source, n in report["sources"].items():
        lines.append(f"  kept {n:>8}  from {source}")
    return "\n".join(lines)
