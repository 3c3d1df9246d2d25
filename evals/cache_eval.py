"""The semantic answer cache's threshold and guards, measured on labelled question pairs.

Each pair (``{"a", "b", "same"}``, optionally ``kind``, ``lang`` and ``split``) is looked up as
the cache would: ``a`` is the cached question and ``b`` the new one. It is a *hit* when both
normalise to the same text (the exact cache), or when the embedder ranks both questions'
languages (:func:`rag.lang.ranks`; an English-only model skips the semantic lookup for
Chinese), their cosine is at least the threshold and every guard of the set passes
(:func:`rag.cache_guards.same_question`). A hit on a ``same`` pair is a *hit*, on another a
*wrong hit*.

For every threshold and guard set: the hit rate on the positives and the wrong-hit rate on
the negatives, over all pairs, per language (``en``, ``zh``, ``en-zh``) and per kind. The
*best* threshold of a guard set is, among those whose wrong-hit rate is under ``goal`` for
every (language, kind) of negatives (so a rare kind of near-duplicate is not drowned by an
easy one), the highest whose hit rate is within ``slack`` (one point) of the most hits.

Example::

    from rag.embedders import SentenceTransformerEmbedder
    pairs = load_pairs("evals/cache-pairs/pairs.jsonl", langs={"en"})
    report = evaluate(pairs, SentenceTransformerEmbedder(progress=False))
    report["best"]["all"]          # {"threshold": 0.9, "hit_rate": ..., "wrong_hit_rate": ...}
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rag.cache import normalise_question
from rag.cache_guards import GUARDS, same_question
from rag.errors import ConfigError
from rag.lang import detect_lang, ranks
from rag.types import Embedder

__all__ = ["DEFAULT_PAIRS", "GOAL", "Pair", "evaluate", "guard_sets", "load_pairs", "parse_thresholds", "render"]

DEFAULT_PAIRS = Path(__file__).resolve().parent / "cache-pairs" / "pairs.jsonl"
"""The committed pairs made from XQuAD by ``python -m evals.cache_pairs``."""
GOAL = 0.01
"""The wrong-hit rate a threshold must stay under (for every kind of negatives)."""
SLACK = 0.01
"""Hit rate a guard set's best threshold may give up for safety: the highest threshold within
one point of the most hits. Near the lowest threshold that meets the goal the hit rate is flat
and the wrong-hit rate steep, and on held-out questions that edge misses the goal."""
THRESHOLDS = "0.80:0.97:0.01"


@dataclass(frozen=True, slots=True)
class Pair:
    a: str
    b: str
    same: bool
    kind: str = "log"
    lang: str = "en"
    split: str = ""


def load_pairs(path: str | Path, *, langs: Iterable[str] | None = None, splits: Iterable[str] | None = None,
               kinds: Iterable[str] | None = None) -> list[Pair]:
    """The pairs of a JSONL file (``-`` is stdin), keeping only the given languages, splits and kinds.

    ``lang`` defaults to the two questions' detected languages (``en``, ``zh``, or ``en-zh``
    for one of each); ``kind`` to ``log``.
    """
    import sys

    keep_langs, keep_splits, keep_kinds = (set(x) if x else None for x in (langs, splits, kinds))
    out: list[Pair] = []
    with contextlib.nullcontext(sys.stdin) if str(path) == "-" else open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                a, b, same = str(row["a"]), str(row["b"]), row["same"]
            except (ValueError, KeyError, TypeError):
                raise ConfigError(f"{path}:{n}: expected a JSON object with a, b and same") from None
            if not isinstance(same, bool):
                raise ConfigError(f"{path}:{n}: same must be true or false")
            lang = row.get("lang") or "-".join(sorted({detect_lang(a), detect_lang(b)}))
            pair = Pair(a, b, same, row.get("kind") or "log", lang, row.get("split") or "")
            if ((keep_langs is None or pair.lang in keep_langs) and (keep_splits is None or pair.split in keep_splits)
                    and (keep_kinds is None or pair.kind in keep_kinds)):
                out.append(pair)
    return out


def parse_thresholds(spec: str) -> list[float]:
    """``"0.80:0.97:0.01"`` (start, stop inclusive, step) or ``"0.85,0.9,0.95"``."""
    try:
        if ":" in spec:
            start, stop, step = (float(x) for x in spec.split(":"))
            if step <= 0 or stop < start:
                raise ValueError
            count = round((stop - start) / step) + 1
            values = [round(start + i * step, 6) for i in range(count)]
        else:
            values = [float(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"thresholds: expected START:STOP:STEP or a comma-separated list, got {spec!r}") from None
    if not values or not all(0 < v <= 1 for v in values):
        raise ConfigError(f"thresholds: each must be in (0, 1], got {spec!r}")
    return sorted(set(values))


def guard_sets(spec: str | None = None) -> dict[str, tuple[str, ...]]:
    """The guard sets to compare, by label. Default: none, each guard alone, and all of them.

    ``spec`` is comma-separated sets, guards within a set joined by ``+``
    (``"none,numbers,numbers+entities,all"``).
    """
    if not spec:
        return {"none": (), **{name: (name,) for name in GUARDS}, "all": tuple(GUARDS)}
    out: dict[str, tuple[str, ...]] = {}
    for label in (s.strip() for s in spec.split(",") if s.strip()):
        names = () if label == "none" else tuple(GUARDS) if label == "all" else tuple(label.split("+"))
        unknown = [n for n in names if n not in GUARDS]
        if unknown:
            raise ConfigError(f"guards: unknown {', '.join(unknown)}; choose from {', '.join(GUARDS)}, none, all")
        out[label] = names
    return out


def embed_questions(embedder: Embedder, texts: Sequence[str]) -> np.ndarray:
    """The questions as the cache embeds them (``embed_query``), batched where that is the same."""
    from rag.embedders import (
        HashEmbedder,
        SentenceTransformerEmbedder,
        UniversalSentenceEncoderEmbedder,
    )

    if not texts:
        return np.zeros((0, embedder.dim), dtype=np.float32)
    alike = isinstance(embedder, (UniversalSentenceEncoderEmbedder, HashEmbedder)) or (
        isinstance(embedder, SentenceTransformerEmbedder) and embedder.query_prefix == embedder.document_prefix)
    if alike:
        return np.asarray(embedder.embed_documents(list(texts)), dtype=np.float32)
    return np.stack([np.asarray(embedder.embed_query(t), dtype=np.float32) for t in texts])


def evaluate(pairs: Sequence[Pair], embedder: Embedder, *, thresholds: Sequence[float] | None = None,
             guards: Mapping[str, Sequence[str]] | None = None, multilingual: bool = False,
             goal: float = GOAL, slack: float = SLACK) -> dict[str, Any]:
    """Hit and wrong-hit rates for every threshold and guard set, overall, per language and per
    kind, and each guard set's best threshold: the highest whose hit rate is within ``slack``
    of the most hits any threshold meeting ``goal`` gets."""
    if not pairs:
        raise ConfigError("no labelled pairs to evaluate")
    thresholds = sorted(thresholds or parse_thresholds(THRESHOLDS))
    sets = dict(guards) if guards is not None else guard_sets()
    started = time.perf_counter()
    exact = np.array([normalise_question(p.a) == normalise_question(p.b) for p in pairs])
    ranked = np.array([ranks(embedder, detect_lang(p.a)) and ranks(embedder, detect_lang(p.b)) for p in pairs])
    texts = sorted({t for p, r in zip(pairs, ranked, strict=True) if r for t in (p.a, p.b)})
    vectors = embed_questions(embedder, texts)
    row = {t: i for i, t in enumerate(texts)}
    cosine = np.full(len(pairs), -1.0, dtype=np.float32)
    for i, (p, r) in enumerate(zip(pairs, ranked, strict=True)):
        if r:
            cosine[i] = float(vectors[row[p.a]] @ vectors[row[p.b]])
    embed_s = time.perf_counter() - started
    started = time.perf_counter()
    passed = {label: np.array([same_question(p.a, p.b, names, multilingual=multilingual) for p in pairs])
              for label, names in sets.items()}
    guard_s = time.perf_counter() - started

    same = np.array([p.same for p in pairs])
    groups: dict[str, np.ndarray] = {"all": np.ones(len(pairs), dtype=bool)}
    for lang in sorted({p.lang for p in pairs}):
        groups[lang] = np.array([p.lang == lang for p in pairs])
    kinds: dict[str, np.ndarray] = {}
    for lang, kind in sorted({(p.lang, p.kind) for p in pairs}):
        kinds[f"{lang}/{kind}"] = np.array([p.lang == lang and p.kind == kind for p in pairs])

    def rates(hit: np.ndarray, mask: np.ndarray) -> dict[str, Any]:
        pos, neg = mask & same, mask & ~same
        return {"positives": int(pos.sum()), "hits": int((hit & pos).sum()),
                "hit_rate": _rate(hit & pos, pos), "negatives": int(neg.sum()),
                "wrong_hits": int((hit & neg).sum()), "wrong_hit_rate": _rate(hit & neg, neg)}

    table: dict[str, list[dict[str, Any]]] = {name: [] for name in groups}
    by_kind: dict[str, list[dict[str, Any]]] = {name: [] for name in kinds}
    best: dict[str, dict[str, Any] | None] = {}
    for label in sets:
        candidates = []
        for t in thresholds:
            hit = exact | (ranked & (cosine >= np.float32(t)) & passed[label])
            for name, mask in groups.items():
                table[name].append({"threshold": t, "guards": label, **rates(hit, mask)})
            kind_rates = {name: rates(hit, mask) for name, mask in kinds.items()}
            for name, r in kind_rates.items():
                by_kind[name].append({"threshold": t, "guards": label, **r})
            worst = max(((r["wrong_hit_rate"], name) for name, r in kind_rates.items() if r["negatives"]),
                        default=(0.0, None))
            if worst[0] < goal:
                candidates.append({"threshold": t, "guards": label, **rates(hit, groups["all"]),
                                   "worst_negative_kind": worst[1], "worst_wrong_hit_rate": worst[0]})
        if candidates:
            most = max(c["hit_rate"] for c in candidates)
            best[label] = max((c for c in candidates if c["hit_rate"] >= most - slack - 1e-9),
                              key=lambda c: c["threshold"])
        else:
            best[label] = None
    chosen = [b for b in best.values() if b is not None]
    return {
        "embedder": getattr(embedder, "name", type(embedder).__name__),
        "pairs": len(pairs), "positives": int(same.sum()), "negatives": int((~same).sum()),
        "exact": int(exact.sum()), "not_ranked": int((~ranked).sum()),
        "languages": {name: int(mask.sum()) for name, mask in groups.items() if name != "all"},
        "thresholds": list(thresholds), "guard_sets": {k: list(v) for k, v in sets.items()},
        "multilingual": multilingual, "goal": goal, "slack": slack,
        "table": table, "by_kind": by_kind, "best": best,
        # the most hits; among equals the fewest guards, then the highest threshold
        "recommended": max(chosen, key=lambda c: (c["hits"], -len(sets[c["guards"]]), c["threshold"]))
        if chosen else None,
        "seconds": {"embed": round(embed_s, 2), "guards": round(guard_s, 2)},
    }


def _rate(hit: np.ndarray, mask: np.ndarray) -> float:
    n = int(mask.sum())
    return float(hit.sum()) / n if n else 0.0


def _cell(r: dict[str, Any]) -> str:
    pos = f"{r['hit_rate']:6.1%}" if r["positives"] else "     -"
    neg = f"{r['wrong_hit_rate']:5.1%}" if r["negatives"] else "    -"
    return f"{pos} {neg}"


def render(report: dict[str, Any], *, kinds: bool = True) -> str:
    """The report as text: per language, a threshold x guard-set grid of "hit% wrong%" cells,
    then each guard set's best threshold and, at the recommended one, every kind's rates."""
    labels = list(report["guard_sets"])
    width = 13
    lines = [f"{report['pairs']} pairs ({report['positives']} same, {report['negatives']} different), "
             f"embedder {report['embedder']}; {report['exact']} exact matches"
             + (f"; {report['not_ranked']} in a language the embedder does not rank (exact lookup only)"
                if report["not_ranked"] else "")]
    lines.append("cells: hit rate on same-question pairs, wrong-hit rate on different-question pairs")
    for name, rows in report["table"].items():
        if name == "all" and len(report["table"]) == 2:
            continue  # one language: its table is the whole
        first = rows[0]
        lines.append("")
        lines.append(f"{name}: {first['positives']} same, {first['negatives']} different")
        lines.append("thresh " + "".join(label[:width].rjust(width) for label in labels))
        by_t: dict[float, dict[str, str]] = defaultdict(dict)
        for r in rows:
            by_t[r["threshold"]][r["guards"]] = _cell(r)
        for t, cells in by_t.items():
            lines.append(f"{t:6.2f} " + "".join(cells[label].rjust(width) for label in labels))
    lines.append("")
    lines.append(f"best threshold per guard set (wrong-hit rate < {report['goal']:.0%} on every kind of "
                 f"different-question pairs; the highest within {report['slack']:.0%} of the most hits):")
    for label, b in report["best"].items():
        if b is None:
            lines.append(f"  {label:<10} none meets the goal")
        else:
            lines.append(f"  {label:<10} {b['threshold']:.2f}: hit rate {b['hit_rate']:.1%}, wrong-hit rate "
                         f"{b['wrong_hit_rate']:.2%} (worst kind {b['worst_negative_kind']} "
                         f"{b['worst_wrong_hit_rate']:.1%})")
    rec = report["recommended"]
    if rec is None:
        lines.append("recommended: none (no threshold and guard set meets the goal)")
        return "\n".join(lines)
    lines.append(f"recommended: threshold {rec['threshold']:.2f} with guards {rec['guards']} "
                 f"({', '.join(report['guard_sets'][rec['guards']]) or 'no guards'})")
    if kinds:
        lines.append("")
        lines.append(f"per kind at {rec['threshold']:.2f}, guards {rec['guards']}:")
        for name, rows in report["by_kind"].items():
            r = next(r for r in rows if r["threshold"] == rec["threshold"] and r["guards"] == rec["guards"])
            if r["positives"]:
                lines.append(f"  {name:<24} same {r['positives']:5}  hit rate {r['hit_rate']:6.1%}")
            if r["negatives"]:
                lines.append(f"  {name:<24} diff {r['negatives']:5}  wrong-hit rate {r['wrong_hit_rate']:6.1%}")
    return "\n".join(lines)
