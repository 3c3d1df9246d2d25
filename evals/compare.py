"""Comparing two answer-evaluation runs: paired bootstrap intervals, flipped questions, the gate.

Both runs are paired question by question (the same dataset, ``--limit`` and ``--seed`` draw
the same questions). For each metric, the delta is B's statistic minus A's, over the
questions where both runs define it; its 95% interval comes from a paired bootstrap: the
paired questions are resampled with replacement ``resamples`` times (seeded), the statistic
recomputed on each resample, and the 2.5th and 97.5th percentiles of the deltas taken. A
difference is *significant* when the interval excludes 0.

The gate (:func:`gate`) fails a run when a gated metric is worse than the baseline's with its
interval excluding 0, or worse by more than the metric's tolerance.

Example::

    report = compare(load_run("runs/a"), load_run("runs/b"), resamples=2000, seed=0)
    for row in report["metrics"]:
        print(row["metric"], row["a"], row["b"], row["delta"], row["ci"], row["significant"])
    result = gate(load_run("evals/baselines/xquad-en-extractive"), load_run("runs/new"))
    result["passed"], result["failures"]
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rag.errors import ConfigError
from rag.text import shorten as _short

__all__ = ["METRICS", "Metric", "compare", "gate", "load_run", "render_compare", "render_gate"]


@dataclass(frozen=True)
class Metric:
    """A statistic over one pass's per-question values; ``gated`` ones are checked by the gate."""

    name: str
    key: str
    higher_is_better: bool = True
    stat: str = "mean"  # mean, p50 or p99
    kind: str = "answer"  # the pass: answer, or abstain (gold documents filtered out)
    gated: bool = True


METRICS: tuple[Metric, ...] = (
    Metric("em", "em"), Metric("f1", "f1"), Metric("contains_gold", "contains_gold"),
    Metric("bleu4", "bleu4"), Metric("rouge_l", "rouge_l"),
    Metric("compliance", "compliance"), Metric("explicit_compliance", "explicit_compliance", gated=False),
    Metric("citation_accuracy", "citation_accuracy"),
    Metric("citation_precision", "citation_precision", gated=False), Metric("support", "support"),
    Metric("unlabelled", "unlabelled", higher_is_better=False, gated=False),
    Metric("abstained", "abstained", higher_is_better=False, gated=False),
    Metric("abstention", "abstention", kind="abstain"),
    Metric("retrieval_hit", "retrieval_hit"), Metric("retrieval_mrr", "retrieval_mrr"),
    Metric("context_hit", "context_hit"),
    Metric("ttft_p50_ms", "ttft_ms", False, "p50", gated=False),
    Metric("ttft_p99_ms", "ttft_ms", False, "p99", gated=False),
    Metric("total_p50_ms", "total_ms", False, "p50", gated=False),
    Metric("total_p99_ms", "total_ms", False, "p99", gated=False),
    Metric("tokens_per_s_p50", "tokens_per_s", True, "p50", gated=False),
)
_BY_NAME = {m.name: m for m in METRICS}
DEFAULT_TOLERANCE = 0.02
MIN_PAIRED = 0.9  # the gate wants at least this share of the baseline's questions in the run


def load_run(path: str | Path) -> list[dict[str, Any]]:
    """The per-question rows of a run: its folder (``rows.jsonl`` inside) or the file itself."""
    p = Path(path)
    file = p / "rows.jsonl" if p.is_dir() else p
    if not file.is_file():
        raise ConfigError(f"{path}: no evaluation run here (expected a run folder with rows.jsonl, or the file)")
    rows = []
    with open(file, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    raise ConfigError(f"{file}:{n}: not a JSON line") from None
    if not rows:
        raise ConfigError(f"{file}: the run has no answered questions")
    return rows


def _values(rows: Sequence[Mapping[str, Any]], metric: Metric) -> dict[str, float]:
    return {r["qid"]: float(r["metrics"][metric.key]) for r in rows
            if r["pass"] == metric.kind and r["metrics"].get(metric.key) is not None}


def _stat(x: np.ndarray, stat: str, axis: int | None = None) -> Any:
    if stat == "mean":
        return x.mean(axis=axis)
    return np.percentile(x, 50 if stat == "p50" else 99, axis=axis)


def _paired(a_rows: Sequence[Mapping[str, Any]], b_rows: Sequence[Mapping[str, Any]], metric: Metric,
            resamples: int, rng: np.random.Generator) -> dict[str, Any] | None:
    a, b = _values(a_rows, metric), _values(b_rows, metric)
    qids = sorted(set(a) & set(b))
    if not qids:
        return None
    xa = np.array([a[q] for q in qids])
    xb = np.array([b[q] for q in qids])
    idx = rng.integers(0, len(qids), size=(resamples, len(qids)))
    deltas = _stat(xb[idx], metric.stat, axis=1) - _stat(xa[idx], metric.stat, axis=1)
    lo, hi = np.percentile(deltas, [2.5, 97.5])
    va, vb = float(_stat(xa, metric.stat)), float(_stat(xb, metric.stat))
    delta = vb - va
    worse = delta < 0 if metric.higher_is_better else delta > 0
    return {"metric": metric.name, "n": len(qids), "a": round(va, 4), "b": round(vb, 4), "delta": round(delta, 4),
            "ci": [round(float(lo), 4), round(float(hi), 4)], "significant": bool(lo > 0 or hi < 0),
            "better": None if delta == 0 else not worse, "higher_is_better": metric.higher_is_better}


def compare(a_rows: Sequence[Mapping[str, Any]], b_rows: Sequence[Mapping[str, Any]], *, resamples: int = 2000,
            seed: int = 0, metrics: Sequence[Metric] = METRICS, flips: bool = True) -> dict[str, Any]:
    """Every metric of run A against run B, with paired bootstrap intervals, and the flipped questions."""
    if resamples < 1000:
        raise ConfigError(f"resamples must be at least 1000 for a 95% interval, got {resamples}")
    rng = np.random.default_rng(seed)
    rows = [r for r in (_paired(a_rows, b_rows, m, resamples, rng) for m in metrics) if r is not None]
    a_q = {r["qid"] for r in a_rows if r["pass"] == "answer"}
    b_q = {r["qid"] for r in b_rows if r["pass"] == "answer"}
    report: dict[str, Any] = {"paired": len(a_q & b_q), "only_a": len(a_q - b_q), "only_b": len(b_q - a_q),
                              "resamples": resamples, "seed": seed, "metrics": rows}
    if flips:
        report["flips"] = _flips(a_rows, b_rows)
    return report


def _flips(a_rows: Sequence[Mapping[str, Any]], b_rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Questions right in one run and wrong in the other: contains-gold on the answer pass,
    abstention on the abstain pass."""
    key = {"answer": "contains_gold", "abstain": "abstention"}
    b_by = {(r["qid"], r["pass"]): r for r in b_rows}
    out = []
    for ra in a_rows:
        rb = b_by.get((ra["qid"], ra["pass"]))
        if rb is None:
            continue
        m = key.get(ra["pass"])
        if m is None or ra["metrics"].get(m) is None or rb["metrics"].get(m) is None:
            continue
        right_a, right_b = bool(ra["metrics"][m]), bool(rb["metrics"][m])
        if right_a != right_b:
            out.append({"qid": ra["qid"], "pass": ra["pass"], "question": ra["question"], "gold": ra.get("gold"),
                        "right": "a" if right_a else "b", "a": ra["answer"], "b": rb["answer"]})
    return out


def gate(baseline: Sequence[Mapping[str, Any]], run: Sequence[Mapping[str, Any]], *,
         tolerance: float | Mapping[str, float] = DEFAULT_TOLERANCE, metrics: Sequence[str] | None = None,
         resamples: int = 2000, seed: int = 0) -> dict[str, Any]:
    """Whether ``run`` holds up against ``baseline``: a gated metric fails when it is worse and
    its interval excludes 0, or when it is worse by more than its tolerance (absolute; a
    mapping gives per-metric tolerances, ``"*"`` the default)."""
    if metrics is None:
        chosen = [m for m in METRICS if m.gated]
    else:
        unknown = [m for m in metrics if m not in _BY_NAME]
        if unknown:
            raise ConfigError(f"unknown metric {', '.join(unknown)}; choose from {', '.join(_BY_NAME)}")
        chosen = [_BY_NAME[m] for m in metrics]
    base_q = {r["qid"] for r in baseline if r["pass"] == "answer"}
    run_q = {r["qid"] for r in run if r["pass"] == "answer"}
    if not base_q or len(base_q & run_q) < MIN_PAIRED * len(base_q):
        raise ConfigError(f"the run answered {len(base_q & run_q)} of the baseline's {len(base_q)} questions: "
                          "run it on the same dataset with the same --limit and --seed")
    tol = dict(tolerance) if isinstance(tolerance, Mapping) else {"*": float(tolerance)}
    report = compare(baseline, run, resamples=resamples, seed=seed, metrics=chosen, flips=True)
    failures = []
    for row in report["metrics"]:
        allowed = tol.get(row["metric"], tol.get("*", DEFAULT_TOLERANCE))
        if row["better"] is False and (row["significant"] or abs(row["delta"]) > allowed):
            failures.append({**row, "tolerance": allowed,
                             "why": "significantly worse" if row["significant"] else f"worse by more than {allowed:g}"})
    return {"passed": not failures, "failures": failures, **report}


def _fmt(x: float, sign: str = "") -> str:
    return f"{x:{sign}.1f}" if abs(x) >= 100 else f"{x:{sign}.4f}"


def render_compare(report: Mapping[str, Any], label_a: str = "A", label_b: str = "B", *, flips: int = 10) -> str:
    """The comparison as a table, then the flipped questions with both answers."""
    lines = [f"paired questions: {report['paired']} (only in {label_a}: {report['only_a']}, only in {label_b}: "
             f"{report['only_b']}); paired bootstrap, {report['resamples']} resamples, seed {report['seed']}",
             f"{'metric':<20}{label_a[:12]:>12}{label_b[:12]:>12}{'delta':>12}  {'95% CI':<24}", ]
    for row in report["metrics"]:
        mark = ""
        if row["significant"]:
            mark = "  * better" if row["better"] else "  * worse"
        ci = f"[{_fmt(row['ci'][0])}, {_fmt(row['ci'][1])}]"
        lines.append(f"{row['metric']:<20}{_fmt(row['a']):>12}{_fmt(row['b']):>12}{_fmt(row['delta'], '+'):>12}  "
                     f"{ci:<24}{mark}")
    lines.append("* the interval excludes 0")
    flipped = report.get("flips") or []
    if flipped:
        wins = sum(1 for f in flipped if f["right"] == "b")
        lines.append(f"\n{len(flipped)} questions flipped: {wins} right only in {label_b}, "
                     f"{len(flipped) - wins} right only in {label_a}")
        for f in flipped[:flips]:
            lines.append(f"\n[{f['pass']}] {f['qid']}: {f['question']}  (gold: {json.dumps(f['gold'], ensure_ascii=False)}; "
                         f"right in {label_a if f['right'] == 'a' else label_b})")
            lines.append(f"  {label_a}: {_short(f['a'])}")
            lines.append(f"  {label_b}: {_short(f['b'])}")
        if len(flipped) > flips:
            lines.append(f"\n... and {len(flipped) - flips} more (--json lists them all)")
    return "\n".join(lines)


def render_gate(result: Mapping[str, Any]) -> str:
    head = "gate: PASSED" if result["passed"] else f"gate: FAILED on {len(result['failures'])} metric(s)"
    lines = [head]
    for f in result["failures"]:
        lines.append(f"  {f['metric']}: {f['a']:.4f} -> {f['b']:.4f} ({f['delta']:+.4f}, 95% CI "
                     f"[{f['ci'][0]:+.4f}, {f['ci'][1]:+.4f}]): {f['why']}")
    lines.append("")
    lines.append(render_compare(result, "baseline", "run", flips=5))
    return "\n".join(lines)
