"""Fitting the cascade's confidence threshold on the same (small, large) answer runs as the router.

In ``routing.mode: cascade`` every question is answered by the small profile first, and the
answer is kept only when it does not abstain, cites something and, with
``routing.min_confidence``, its confidence (the mean log-probability of its tokens, recorded as
``confidence.logprob`` in each ``ragqa eval answers`` row) is at least the threshold; otherwise
the large profile answers. So for a threshold ``t`` a question scores small's F1 when small's
row is kept at ``t``, and large's F1 otherwise (the large run's answer: the same retrieval and
prompt as the escalation).

The fit mirrors :mod:`evals.fit_router`: for each loss budget, the threshold (every confidence
seen, and "none": only abstentions and uncited answers escalate) that keeps the most questions
on small with the cascade's F1 no more than the budget below the large profile alone (ties: the
higher F1); cross-validated over the same seeded folds, with the same paired bootstrap. The
lowest token log-probability (``min_logprob``) is fitted the same way for comparison; the
setting reads the mean.

Example::

    report = fit_cascade(data, small_rows, fold_ids, budgets=(0.0, 1.0), max_loss=1.0, good=good)
    report["signals"]["logprob"]["cv"]["share"], report["paste"]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from rag.answer import abstained

__all__ = ["SIGNALS", "cascade_rows", "fit_cascade", "pick_threshold", "render_cascade"]

SIGNALS = ("logprob", "min_logprob")
"""The confidences fitted: the mean (what ``routing.min_confidence`` reads) and the lowest."""
NONE = -np.inf  # no threshold: only abstaining or uncited answers escalate


def cascade_rows(small: Mapping[str, Mapping[str, Any]], qids: Sequence[str]) -> dict[str, np.ndarray] | None:
    """Per question (``qids``, keys of ``small``: the small run's rows by question id): whether the
    small answer passes the cascade's other checks, and its confidences (NaN when missing).
    ``None`` when no row carries a confidence (a run without it: extractive, or older)."""
    base = np.array([bool(small[q].get("citations")) and not abstained(str(small[q].get("answer") or ""))
                     for q in qids], dtype=bool)
    out = {"base": base}
    for name in SIGNALS:
        out[name] = np.array([float((small[q].get("confidence") or {}).get(name, np.nan)) for q in qids])
    if np.isnan(out["logprob"]).all():
        return None
    return out


def kept(values: np.ndarray, base: np.ndarray, threshold: float) -> np.ndarray:
    """Which questions stay on small at ``threshold`` (a missing confidence never passes a set one)."""
    if threshold == NONE:
        return base.copy()
    with np.errstate(invalid="ignore"):
        return base & (values >= threshold)


def pick_threshold(values: np.ndarray, base: np.ndarray, small: np.ndarray, large: np.ndarray,
                   max_loss: float) -> float:
    """The threshold keeping the most questions on small with the mean F1 loss against large
    alone within ``max_loss`` points (ties: the higher F1); +inf (all on large) when only that is."""
    n = max(len(small), 1)
    diff = small - large
    best: tuple[int, float, float] = (-1, -np.inf, np.inf)
    for t in [NONE, *np.unique(values[base & ~np.isnan(values)]), np.inf]:
        mask = kept(values, base, float(t))
        gain = float(diff[mask].sum()) / n
        if gain < -max_loss / 100 - 1e-12:
            continue
        key = (int(mask.sum()), gain, float(t))
        if key[:2] > best[:2]:
            best = key
    return best[2]


def fit_cascade(small: np.ndarray, large: np.ndarray, rows: Mapping[str, np.ndarray], folds: np.ndarray, *,
                budgets: Sequence[float], max_loss: float, summary: Callable[[np.ndarray], dict[str, Any]],
                datasets: np.ndarray, names: Sequence[str],
                summary_of: Callable[[np.ndarray, np.ndarray], dict[str, Any]]) -> dict[str, Any]:
    """The cascade's fit for each signal of :data:`SIGNALS`; ``summary(mask)`` gives the figures of
    a decision over all questions, ``summary_of(mask, idx)`` over the questions ``idx``."""
    base = rows["base"]
    report: dict[str, Any] = {"signals": {}, "base": summary(base)}
    for name in SIGNALS:
        values = rows[name]
        oof = {b: np.zeros(len(small), dtype=bool) for b in budgets}
        for f in np.unique(folds):
            train, test = np.flatnonzero(folds != f), np.flatnonzero(folds == f)
            for b in budgets:
                t = pick_threshold(values[train], base[train], small[train], large[train], b)
                oof[b][test] = kept(values[test], base[test], t)
        fitted = pick_threshold(values, base, small, large, max_loss)
        per_dataset = {ds: summary_of(oof[max_loss][sel], sel)
                       for ds in dict.fromkeys(names) if len(sel := np.flatnonzero(datasets == ds))}
        report["signals"][name] = {
            "threshold": None if np.isinf(fitted) else float(fitted),  # exact: the boundary answer stays
            "all_on_large": bool(np.isposinf(fitted)),
            "cv": summary(oof[max_loss]), "in_sample": summary(kept(values, base, fitted)),
            "per_dataset": per_dataset,
            "curve": [{"max_loss": b, **summary(oof[b])} for b in budgets],
            "auc": _auc(values[base], (small - large)[base] >= 0),
        }
    chosen = report["signals"]["logprob"]
    report["paste"] = paste_cascade(chosen["threshold"], chosen["all_on_large"])
    return report


def _auc(values: np.ndarray, good: np.ndarray) -> float | None:
    """How well ``values`` rank good-enough answers above the rest (0.5: no better than chance)."""
    ok = ~np.isnan(values)
    values, good = values[ok], good[ok]
    if good.all() or not good.any():
        return None
    ranks = np.argsort(np.argsort(values, kind="mergesort"), kind="mergesort") + 1.0
    for v in np.unique(values):  # ties share their mean rank
        same = values == v
        ranks[same] = ranks[same].mean()
    pos = int(good.sum())
    return round(float((ranks[good].sum() - pos * (pos + 1) / 2) / (pos * (len(values) - pos))), 4)


def paste_cascade(threshold: float | None, all_on_large: bool) -> list[str]:
    """The cascade's settings as environment variables."""
    if all_on_large:
        return ["# no threshold keeps the loss within the budget: leave routing.mode off"]
    lines = ["RAG_ROUTING__MODE=cascade"]
    if threshold is not None:
        lines.append(f"RAG_ROUTING__MIN_CONFIDENCE={threshold}")
    return lines


def render_cascade(report: Mapping[str, Any], line: Callable[[str, Mapping[str, Any]], str], head: str,
                   max_loss: float, goal_share: float) -> list[str]:
    """The cascade's part of ``ragqa eval fit-router``'s text."""
    out = ["", "cascade (small first; escalated when it abstains, cites nothing or its confidence is below "
           "the threshold), cross-validated at max loss "
           f"{max_loss:g} points:", head,
           line("no threshold", report["base"])]
    for name, sig in report["signals"].items():
        auc = "-" if sig["auc"] is None else f"{sig['auc']:.3f}"
        out += ["", f"confidence = {name} (AUC of good enough among kept answers: {auc}); fitted on all: "
                    f"{'all on large' if sig['all_on_large'] else sig['threshold']}",
                head, line("all", sig["cv"]), *(line(ds, s) for ds, s in sig["per_dataset"].items()),
                line("in-sample", sig["in_sample"]),
                f"{'max loss':<16}{head[16:]}", *(line(f"{c['max_loss']:g}", c) for c in sig["curve"])]
    cv = report["signals"]["logprob"]["cv"]
    met = cv["share"] >= goal_share and cv["ci"][1] >= -1.0
    point = cv["share"] >= goal_share and cv["delta"] >= -1.0
    out += ["", f"cascade goal (>= {goal_share * 100:.0f}% on small, cross-validated, confidence = logprob): with "
                f"the delta's interval reaching -1 point or above: {'met' if met else 'not met'}; with the delta "
                f"itself -1 point or above: {'met' if point else 'not met'}",
            "", "fitted on all the questions (routing.min_confidence reads the mean, logprob):", *report["paste"]]
    return out
