"""Replay fusion rules on dumped legs (``evals/fusion_legs.py``) and fit the adaptive one.

Reads every ``*.json`` in a folder of leg dumps, and for each set prints nDCG@10 of BM25 alone,
vector alone, RRF at fixed weights, and the adaptive rule of :mod:`rag.retrieval.adaptive`,
with the paired randomization p of each against the best single leg. ``--fit`` refits the
adaptive rule's logistic regression with each set held out in turn (the printed figures for a
set then come from a model that never saw it), and once on everything, printing the
coefficients to put in ``rag/retrieval/adaptive.py``.

Example::

    python evals/fit_fusion.py /tmp/legs            # the committed rule, per set
    python evals/fit_fusion.py /tmp/legs --fit      # leave-one-set-out, then the fit on all
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from evals.stats import paired_p
from rag.lang import covers, detect_lang, model_languages
from rag.retrieval.adaptive import FEATURES, Leg, adaptive_weights, features
from rag.retrieval.fusion import rrf
from rag.retrieval.hybrid import UNCOVERED_SHARE

DEPTH = 10


def ndcg10(ranked: Sequence[str], rels: dict[str, int]) -> float:
    gains = [rels.get(d, 0) for d in ranked[:DEPTH]]
    dcg = sum(g / math.log2(i + 2) for i, g in enumerate(gains))
    ideal = sorted(rels.values(), reverse=True)[:DEPTH]
    idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
    return dcg / idcg if idcg else 0.0


def docs_of(chunks: Sequence[str], doc: dict[str, str]) -> list[str]:
    return list(dict.fromkeys(doc[c] for c in chunks if doc.get(c)))


def fused(q: dict, weights: tuple[float, ...], k: float = 60) -> list[str]:
    lists = [[c for c, _, _ in q["bm25"]], [c for c, _, _ in q["vector"]]]
    if weights[1] <= 0:
        lists, weights = lists[:1], weights[:1]
    return [c for c, _ in rrf(lists, k=k, weights=list(weights))]


def legs(q: dict) -> tuple[Leg, Leg]:
    return (Leg([d for _, d, _ in q["bm25"]], [s for _, _, s in q["bm25"]]),
            Leg([d for _, d, _ in q["vector"]], [s for _, _, s in q["vector"]]))


def evaluate(q: dict, rule: Callable[[dict], tuple[float, float]]) -> float:
    doc = {c: d for c, d, _ in q["bm25"] + q["vector"]}
    return ndcg10(docs_of(fused(q, rule(q)), doc), q["qrels"])


def load(folder: Path) -> dict[str, dict]:
    sets = {}
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text())
        data["languages"] = model_languages(data["embedder"].split(":", 1)[1]) if data["embedder"].startswith(
            "st:") else None
        sets[path.stem] = data
    return sets


def gate(data: dict, q: dict, weights: tuple[float, float]) -> tuple[float, float]:
    """The retriever's language gate: a vector leg whose model lacks the query's language keeps
    ``UNCOVERED_SHARE`` of its weight."""
    covered = covers(data["languages"], detect_lang(q["text"]))
    return weights if covered else (weights[0], weights[1] * UNCOVERED_SHARE)


def fit(rows: list[tuple[np.ndarray, float]]) -> tuple[np.ndarray, float]:
    """Logistic regression of "the vector leg alone beats BM25 alone" on the features,
    weighted by how much it beats it (queries where the legs tie teach nothing)."""
    from sklearn.linear_model import LogisticRegression

    x = np.array([r[0] for r in rows])
    y = np.array([r[1] > 0 for r in rows])
    w = np.array([abs(r[1]) for r in rows])
    keep = w > 0
    model = LogisticRegression(C=1.0, max_iter=1000)
    model.fit(x[keep], y[keep], sample_weight=w[keep])
    return model.coef_[0], float(model.intercept_[0])


def training_rows(data: dict) -> list[tuple[np.ndarray, float]]:
    rows = []
    for q in data["queries"]:
        if not covers(data["languages"], detect_lang(q["text"])):
            continue
        b, v = (evaluate(q, lambda _q, w=w: w) for w in ((1.0, 0.0), (0.0, 1.0)))  # type: ignore[misc]
        rows.append((features(*legs(q), q["text"]), v - b))
    return rows


def report(sets: dict[str, dict], coefs: dict[str, tuple[np.ndarray, float] | None]) -> None:
    print("| set | queries | bm25 | vector | rrf 1,1 | rrf 1,0.5 | adaptive | Δ vs best leg (p) | mean w_vec |")
    # rrf and adaptive columns apply the retriever's language gate (UNCOVERED_SHARE).
    print("|---|---|---|---|---|---|---|---|---|")
    for name, data in sets.items():
        qs = data["queries"]
        coef = coefs.get(name)
        kw = {} if coef is None else {"coef": coef[0], "intercept": coef[1]}
        scores = {}
        wvec: list[float] = []
        for label, rule in (("bm25", lambda q: (1.0, 0.0)), ("vector", lambda q: (0.0, 1.0)),
                            ("rrf 1,1", lambda q, data=data: gate(data, q, (1.0, 1.0))),
                            ("rrf 1,0.5", lambda q, data=data: gate(data, q, (1.0, 0.5)))):
            scores[label] = np.array([evaluate(q, rule) for q in qs])

        def adaptive(q: dict, data: dict = data, kw: dict = kw, wvec: list = wvec) -> tuple[float, float]:
            w = gate(data, q, adaptive_weights(*legs(q), q["text"], **kw))
            wvec.append(w[1] / (w[0] + w[1]))
            return w

        scores["adaptive"] = np.array([evaluate(q, adaptive) for q in qs])
        best = max(("bm25", "vector"), key=lambda m: scores[m].mean())
        d = scores["adaptive"].mean() - scores[best].mean()
        p = paired_p(scores["adaptive"].tolist(), scores[best].tolist())
        print(f"| {name} | {len(qs)} | " + " | ".join(f"{scores[m].mean():.3f}" for m in
                                                    ("bm25", "vector", "rrf 1,1", "rrf 1,0.5", "adaptive"))
              + f" | {d:+.3f} vs {best} ({p:.2f}) | {np.mean(wvec):.2f} |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", type=Path)
    p.add_argument("--fit", action="store_true", help="leave-one-corpus-out refits, then one fit on all sets")
    p.add_argument("--test", default="e5t", help="sets whose name contains this are never fitted on, "
                   "only scored (default: the e5 runs, an embedder the rule never saw)")
    a = p.parse_args(argv)
    sets = load(a.folder)
    if not a.fit:
        report(sets, {})
        return 0
    train_sets = {name: data for name, data in sets.items() if a.test not in name}
    rows = {name: training_rows(data) for name, data in train_sets.items()}
    # Sets on one corpus (with another embedder, or a subset of it) share queries: hold out
    # by corpus, "xquad30-en-st" and "xquad-en-use" being both XQuAD-en.
    corpus = {name: re.sub(r"\d+", "", name.rsplit("-", 1)[0]) for name in sets}
    held: dict[str, tuple[np.ndarray, float] | None] = {}
    for name in train_sets:
        train = [r for other, rs in rows.items() if corpus[other] != corpus[name] for r in rs]
        held[name] = fit(train)
    print("Each set scored by a model fitted without its corpus:\n")
    report(train_sets, held)
    coef, intercept = fit([r for rs in rows.values() for r in rs])
    print("\nFitted on every set: " + ", ".join(f"{f} {c:+.3f}" for f, c in zip(FEATURES, coef, strict=True))
          + f", intercept {intercept:+.3f}")
    tests = {name: data for name, data in sets.items() if a.test in name}
    if tests:
        print("\nThat fit on the sets it never saw:\n")
        report(tests, dict.fromkeys(tests, (coef, intercept)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
