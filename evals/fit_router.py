"""Fitting the router's thresholds on two answer-evaluation runs: a small and a large profile.

Both runs answered the same questions (the same dataset, ``--limit`` and ``--seed``); every row
carries the router's signals (``route``, recorded by ``ragqa eval answers``), so nothing is
answered again. For each question:

* the **label**: the small profile is *good enough* when its F1 is at least the large one's
  minus ``tolerance`` (F1 points, 0-100);
* a **grid** of :class:`rag.config.RouterRules`: the question kinds the small profile may
  answer, and for each numeric rule the "off" value and the quantiles of the signal seen;
* the **fit**: the rules that send the most questions to the small profile while the routed
  F1 (small where routed, large elsewhere) stays no more than ``max_loss`` points below the
  large profile alone; ties go to the rules that route more *good enough* questions, then to
  the higher routed F1, then to the rule left off (a kind of question the fit saw none of
  stays on the large profile). ``max_turn`` is not fitted (the answer runs are single-turn).

The figures are **cross-validated**: the questions are split in ``folds`` (seeded), the rules
are fitted on the other folds and applied to each held-out fold, and the held-out decisions
give the share on small and the F1 delta against large alone, with a 95% paired bootstrap
interval (questions resampled). The rules to paste are then fitted on all the questions. The
trade-off curve repeats this for a range of loss budgets. Several (small, large) pairs fit one
router for all of them and also report each dataset on its own.

When the small run's rows carry the answer's confidence (``confidence``: a llamacpp or openai
small profile), the same questions and folds also fit the **cascade**'s ``routing.min_confidence``
(:mod:`evals.fit_cascade`): small's answer is kept when it does not abstain, cites something and
is confident enough, else large's F1 counts (``report["cascade"]``, ``None`` otherwise).

Example::

    report = fit_router([(load_run("runs/en-small"), load_run("runs/en-large"))], max_loss=1.0)
    report["rules"], report["cv"]["share"], report["cv"]["delta"], report["cv"]["ci"]
    print(render_fit(report))
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from evals.fit_cascade import cascade_rows, fit_cascade, render_cascade
from rag.config import RouterRules
from rag.errors import ConfigError

__all__ = ["BUDGETS", "fit_router", "paste_lines", "render_fit"]

BUDGETS = (0.0, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 100.0)
"""Loss budgets (F1 points) of the trade-off curve."""
KINDS = (("factual",), ("factual", "open"), ("factual", "open", "creative"))
QUANTILES = np.linspace(0, 1, 9)[1:-1]
OFF_MAX = 10_000  # a "most" rule that lets everything through


@dataclass
class _Data:
    """Paired questions: the signals, both profiles' F1, and which dataset each came from."""

    kind: np.ndarray
    tokens: np.ndarray
    top: np.ndarray
    margin: np.ndarray
    agreement: np.ndarray
    chunks: np.ndarray
    small: np.ndarray
    large: np.ndarray
    dataset: np.ndarray
    qids: list[str]

    @property
    def n(self) -> int:
        return len(self.qids)

    def take(self, idx: np.ndarray) -> _Data:
        return _Data(kind=self.kind[idx], tokens=self.tokens[idx], top=self.top[idx], margin=self.margin[idx],
                     agreement=self.agreement[idx], chunks=self.chunks[idx], small=self.small[idx],
                     large=self.large[idx], dataset=self.dataset[idx], qids=[self.qids[i] for i in idx])


def _pair(small_rows: Sequence[Mapping[str, Any]], large_rows: Sequence[Mapping[str, Any]], name: str,
          signals_from: str) -> list[tuple[dict[str, Any], float, float, str]]:
    def answered(rows: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
        return {r["qid"]: r for r in rows if r.get("pass") == "answer" and r["metrics"].get("f1") is not None}

    small, large = answered(small_rows), answered(large_rows)
    common = sorted(set(small) & set(large))
    if not common:
        raise ConfigError(f"{name}: the two runs share no answered question; run both on the same dataset "
                          "with the same --limit and --seed")
    source = large if signals_from == "large" else small
    missing = [q for q in common if not source[q].get("route")]
    if missing:
        raise ConfigError(f"{name}: {len(missing)} of {len(common)} rows of the {signals_from} run have no router "
                          "signals (route): answer them again with this version of ragqa eval answers")
    return [(dict(source[q]["route"]), float(small[q]["metrics"]["f1"]), float(large[q]["metrics"]["f1"]), q)
            for q in common]


def _load(pairs: Sequence[tuple[Sequence[Mapping[str, Any]], Sequence[Mapping[str, Any]]]],
          names: Sequence[str], signals_from: str) -> _Data:
    rows: list[tuple[dict[str, Any], float, float, str, str]] = []
    for (small, large), name in zip(pairs, names, strict=True):
        rows += [(*r, name) for r in _pair(small, large, name, signals_from)]
    sig = [r[0] for r in rows]
    return _Data(
        kind=np.array([s["kind"] for s in sig]), tokens=np.array([s["question_tokens"] for s in sig], dtype=float),
        top=np.array([s["top_score"] for s in sig], dtype=float), margin=np.array([s["margin"] for s in sig], float),
        agreement=np.array([s["agreement"] for s in sig], dtype=float),
        chunks=np.array([s["chunks"] for s in sig], dtype=float),
        small=np.array([r[1] for r in rows]), large=np.array([r[2] for r in rows]),
        dataset=np.array([r[4] for r in rows]), qids=[f"{r[4]}:{r[3]}" for r in rows])


def _levels(values: np.ndarray, at_least: bool) -> np.ndarray:
    """Thresholds to try for one signal, the most permissive ("off") first."""
    cuts = np.unique(np.quantile(values, QUANTILES)) if len(values) else np.array([])
    if at_least:
        return np.concatenate([[0.0], cuts[cuts > 0]])
    return np.concatenate([[OFF_MAX], cuts[::-1]])


@dataclass
class _Grid:
    """Every combination of thresholds, and each one's gain and counts on some questions."""

    levels: dict[str, np.ndarray]

    @classmethod
    def from_data(cls, d: _Data) -> _Grid:
        return cls({"kinds": np.arange(len(KINDS)), "tokens": _levels(d.tokens, False),
                    "top": _levels(d.top, True), "margin": _levels(d.margin, True),
                    "agreement": _levels(d.agreement, True), "chunks": _levels(d.chunks, False)})

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(len(v) for v in self.levels.values())

    def masks(self, d: _Data) -> list[np.ndarray]:
        lv = self.levels
        return [np.array([np.isin(d.kind, KINDS[k]) for k in lv["kinds"]]).reshape(-1, d.n),
                d.tokens[None, :] <= lv["tokens"][:, None], d.top[None, :] >= lv["top"][:, None],
                d.margin[None, :] >= lv["margin"][:, None], d.agreement[None, :] >= lv["agreement"][:, None],
                d.chunks[None, :] <= lv["chunks"][:, None]]

    def score(self, d: _Data, good: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per combination: questions routed to small, the F1 gained by routing them (sum), and
        how many of them are labelled good enough."""
        k, t, s, m, a, c = self.masks(d)
        diff = (d.small - d.large).astype(float)
        routed = np.zeros(self.shape)
        gain = np.zeros(self.shape)
        hits = np.zeros(self.shape)
        inner = (s[:, None, None, None, :] & m[None, :, None, None, :] & a[None, None, :, None, :]
                 & c[None, None, None, :, :])  # (s, m, a, c, n)
        for i, j in itertools.product(range(k.shape[0]), range(t.shape[0])):
            mask = (inner & (k[i] & t[j])).astype(float)
            routed[i, j] = mask.sum(axis=-1)
            gain[i, j] = mask @ diff
            hits[i, j] = mask @ good.astype(float)
        return routed, gain, hits

    def pick(self, routed: np.ndarray, gain: np.ndarray, hits: np.ndarray, n: int, max_loss: float) -> tuple[int, ...]:
        """The combination with the most questions on small within the loss budget (F1 points)."""
        feasible = gain / max(n, 1) >= -max_loss / 100 - 1e-12
        key = np.where(feasible, routed * (n + 1) ** 2 + hits * (n + 1) + (gain + n) / (2 * n + 1), -1.0)
        return tuple(int(i) for i in np.unravel_index(int(np.argmax(key)), self.shape))

    def rules(self, at: tuple[int, ...]) -> RouterRules:
        lv = {name: self.levels[name][i] for name, i in zip(self.levels, at, strict=True)}
        return RouterRules(small_kinds=KINDS[int(lv["kinds"])], max_question_tokens=int(lv["tokens"]),
                           # exact: scores a rounding apart (1/61 and a hair below) route differently
                           min_top_score=float(lv["top"]), min_margin=float(lv["margin"]),
                           min_agreement=float(lv["agreement"]), max_chunks=int(lv["chunks"]))


def routed_mask(rules: RouterRules, d: _Data) -> np.ndarray:
    """Which questions ``rules`` send to the small profile."""
    return (np.isin(d.kind, rules.small_kinds) & (d.tokens <= rules.max_question_tokens)
            & (d.top >= rules.min_top_score) & (d.margin >= rules.min_margin)
            & (d.agreement >= rules.min_agreement) & (d.chunks <= rules.max_chunks))


def _fold_ids(n: int, folds: int, seed: int) -> np.ndarray:
    order = np.random.default_rng(seed).permutation(n)
    ids = np.empty(n, dtype=int)
    ids[order] = np.arange(n) % folds
    return ids


def _summary(mask: np.ndarray, d: _Data, good: np.ndarray, resamples: int, seed: int) -> dict[str, Any]:
    """Share on small, routed F1 and its delta against large alone (points) with a 95% paired bootstrap
    interval, and the routed questions' labels."""
    routed = np.where(mask, d.small, d.large)
    diff = routed - d.large
    idx = np.random.default_rng(seed).integers(0, d.n, size=(resamples, d.n))
    lo, hi = np.percentile(diff[idx].mean(axis=1), [2.5, 97.5]) * 100
    return {"n": d.n, "on_small": int(mask.sum()), "share": round(float(mask.mean()), 4),
            "f1_large": round(float(d.large.mean()) * 100, 2), "f1_small": round(float(d.small.mean()) * 100, 2),
            "f1_routed": round(float(routed.mean()) * 100, 2), "delta": round(float(diff.mean()) * 100, 2),
            "ci": [round(float(lo), 2), round(float(hi), 2)],
            "precision": round(float(good[mask].mean()), 4) if mask.any() else None,
            "recall": round(float(mask[good].mean()), 4) if good.any() else None}


def fit_router(pairs: Sequence[tuple[Sequence[Mapping[str, Any]], Sequence[Mapping[str, Any]]]], *,
               names: Sequence[str] | None = None, tolerance: float = 0.0, max_loss: float = 1.0, folds: int = 5,
               budgets: Sequence[float] = BUDGETS, resamples: int = 2000, seed: int = 0,
               signals_from: str = "large", goal_share: float = 0.3) -> dict[str, Any]:
    """Fit the router's thresholds on (small run rows, large run rows) pairs; see the module docstring.

    ``tolerance`` and ``max_loss`` are in F1 points (0-100). ``signals_from`` says which run's
    recorded signals to use (``large``: the default deployment's retrieval and packing).
    """
    if not pairs:
        raise ConfigError("give at least one pair of runs: SMALL_RUN LARGE_RUN")
    if tolerance < 0 or max_loss < 0:
        raise ConfigError("--tolerance and --max-loss must be 0 or more (F1 points)")
    if signals_from not in ("small", "large"):
        raise ConfigError(f"signals come from the small or the large run, not {signals_from!r}")
    names = list(names or [f"pair{i + 1}" for i in range(len(pairs))])
    d = _load(pairs, names, signals_from)
    if folds < 2 or folds > d.n:
        raise ConfigError(f"--folds must be between 2 and the {d.n} paired questions, got {folds}")
    good = d.small >= d.large - tolerance / 100
    budgets = sorted({*budgets, max_loss})
    fold = _fold_ids(d.n, folds, seed)
    oof = {b: np.zeros(d.n, dtype=bool) for b in budgets}
    for f in range(folds):
        train, test = np.flatnonzero(fold != f), np.flatnonzero(fold == f)
        td = d.take(train)
        grid = _Grid.from_data(td)
        scored = grid.score(td, good[train])
        for b in budgets:
            oof[b][test] = routed_mask(grid.rules(grid.pick(*scored, td.n, b)), d.take(test))
    grid = _Grid.from_data(d)
    scored = grid.score(d, good)
    fitted = {b: grid.rules(grid.pick(*scored, d.n, b)) for b in budgets}
    rules = fitted[max_loss]
    cv = _summary(oof[max_loss], d, good, resamples, seed)
    per_dataset = {}
    for name in dict.fromkeys(names):
        sel = np.flatnonzero(d.dataset == name)
        per_dataset[name] = _summary(oof[max_loss][sel], d.take(sel), good[sel], resamples, seed)
    curve = [{"max_loss": b, **_summary(oof[b], d, good, resamples, seed)} for b in budgets]
    cascade = _cascade(pairs, names, d, good, fold, budgets, max_loss, resamples, seed)
    ends = {"all_large": _summary(np.zeros(d.n, dtype=bool), d, good, resamples, seed),
            "all_small": _summary(np.ones(d.n, dtype=bool), d, good, resamples, seed),
            # the documented rules, fitted on nothing here: out of sample by construction
            "defaults": _summary(routed_mask(RouterRules(), d), d, good, resamples, seed)}
    return {
        "questions": d.n, "datasets": names, "tolerance": tolerance, "max_loss": max_loss, "folds": folds,
        "seed": seed, "resamples": resamples, "signals_from": signals_from,
        "good_enough": int(good.sum()), "good_share": round(float(good.mean()), 4),
        "rules": rules.model_dump(mode="json"), "in_sample": _summary(routed_mask(rules, d), d, good, resamples, seed),
        "cv": cv, "per_dataset": per_dataset, "curve": curve, "ends": ends,
        # the goal: goal_share on small with the F1 delta's interval reaching -1 point (or above);
        # "point" says whether the delta itself is -1 or above
        "goal": {"share": goal_share, "met": bool(cv["share"] >= goal_share and cv["ci"][1] >= -1.0),
                 "point": bool(cv["share"] >= goal_share and cv["delta"] >= -1.0)},
        "paste": paste_lines(rules), "cascade": cascade,
    }


def _cascade(pairs: Sequence[tuple[Sequence[Mapping[str, Any]], Sequence[Mapping[str, Any]]]], names: Sequence[str],
             d: _Data, good: np.ndarray, fold: np.ndarray, budgets: Sequence[float], max_loss: float,
             resamples: int, seed: int) -> dict[str, Any] | None:
    """The cascade's fit (:mod:`evals.fit_cascade`) on the same questions and folds; ``None`` when
    the small runs' rows carry no confidence."""
    small_rows = {f"{name}:{r['qid']}": r for (small, _large), name in zip(pairs, names, strict=True)
                  for r in small if r.get("pass") == "answer"}
    rows = cascade_rows(small_rows, d.qids)
    if rows is None:
        return None
    return fit_cascade(
        d.small, d.large, rows, fold, budgets=budgets, max_loss=max_loss, datasets=d.dataset, names=names,
        summary=lambda mask: _summary(mask, d, good, resamples, seed),
        summary_of=lambda mask, idx: _summary(mask, d.take(idx), good[idx], resamples, seed))


def paste_lines(rules: RouterRules) -> list[str]:
    """``rules`` as the environment variables that configure them."""
    lines = ["RAG_ROUTING__MODE=rules"]
    for key, value in rules.model_dump(mode="json").items():
        text = json.dumps(value) if isinstance(value, list) else str(value)
        lines.append(f"RAG_ROUTING__RULES__{key.upper()}={text if ' ' not in text and '[' not in text else repr(text)}")
    return lines


def _line(label: str, s: Mapping[str, Any]) -> str:
    prec = "-" if s["precision"] is None else f"{s['precision']:.2f}"
    return (f"{label:<16}{s['n']:>5}{s['share'] * 100:>8.1f}%{s['f1_large']:>9.2f}{s['f1_routed']:>9.2f}"
            f"{s['delta']:>+8.2f}  [{s['ci'][0]:+.2f}, {s['ci'][1]:+.2f}]{prec:>7}")


def render_fit(report: Mapping[str, Any]) -> str:
    """The fit as text: labels, the cross-validated result per dataset, the curve, the settings."""
    head = f"{'':<16}{'n':>5}{'on small':>9}{'F1 large':>9}{'routed':>9}{'delta':>8}  {'95% CI':<17}{'prec.':>6}"
    lines = [
        f"{report['questions']} paired questions ({', '.join(report['datasets'])}); small is good enough "
        f"(F1 >= large - {report['tolerance']:g} points) on {report['good_enough']} "
        f"({report['good_share'] * 100:.1f}%); signals from the {report['signals_from']} run",
        f"F1 in points; delta = routed - large alone, paired bootstrap ({report['resamples']} resamples); "
        f"prec. = share of routed questions labelled good enough",
        "",
        f"cross-validated ({report['folds']} folds, seed {report['seed']}) at max loss {report['max_loss']:g} points:",
        head, _line("all", report["cv"]),
        *(_line(name, s) for name, s in report["per_dataset"].items()),
        _line("in-sample", report["in_sample"]),
        _line("all on large", report["ends"]["all_large"]), _line("all on small", report["ends"]["all_small"]),
        _line("default rules", report["ends"]["defaults"]),
        "",
        "trade-off curve (cross-validated), by loss budget:",
        f"{'max loss':<16}{head[16:]}",
        *(_line(f"{c['max_loss']:g}", c) for c in report["curve"]),
        "",
        f"goal (>= {report['goal']['share'] * 100:.0f}% on small, cross-validated): with the delta's interval "
        f"reaching -1 point or above: {'met' if report['goal']['met'] else 'not met'}; with the delta itself "
        f"-1 point or above: {'met' if report['goal']['point'] else 'not met'}",
        "",
        "fitted on all the questions; paste into the environment (or the same keys under routing.rules in YAML):",
        *report["paste"],
    ]
    if report.get("cascade"):
        lines += render_cascade(report["cascade"], _line, head, report["max_loss"], report["goal"]["share"])
    else:
        lines += ["", "cascade: not fitted (the small run's rows carry no confidence: a generator without "
                  "log-probabilities, or rows from before ragqa eval answers recorded them)"]
    return "\n".join(lines)
