"""Answer metrics: each a small pure function of an answer, its gold answers and its citations.

Text metrics score the answer with its citation labels removed, and take the best over the
gold alternatives:

- :func:`exact_match` and :func:`f1`: for English, SQuAD v1.1's official rules (lower case,
  punctuation and the articles a/an/the removed, words compared as a bag). For Chinese, the
  CMRC 2018 scorer's: the text is split into CJK characters and runs of letters or digits,
  punctuation and spaces dropped, and F1 comes from the longest common run of those tokens.
- :func:`contains_gold`: the normalised answer holds a gold alternative (as whole words in
  English); with ``answer_parts`` (RGB), every part must have one alternative in it.
- :func:`bleu4`: sacrebleu's sentence BLEU (``zh`` tokenizer for Chinese, ``13a`` otherwise,
  exponential smoothing), on a 0-1 scale.
- :func:`rouge_l`: rouge-score's ROUGE-L F-measure; Chinese is split into characters.

Citation metrics (see :func:`citation_scores`):

- *compliance*: the answer cites at least one label that was in its context (written by the
  model, or inferred by :mod:`rag.attribution`; *explicit compliance*, recorded by the runner,
  counts the model's own labels only);
- *citation accuracy*: one of its cited chunks holds a gold answer or belongs to a gold
  document (0 when it cites nothing);
- *citation precision*: the share of its cited chunks that do (undefined without citations);
- *support*: the share of its cited sentences (sentences with a label) whose cited passage
  holds at least half of the sentence's content words (:mod:`rag.support`); undefined when no
  sentence has a label. *unlabelled* is the share of its sentences without a label.

:func:`abstained` (:mod:`rag.answer_events`, the answer path's own test) says whether an answer is the "I don't know" reply.

Example::

    f1("The Panthers gave up 308 points [1].", ["308"], "en")     # 0.3333
    f1("黑豹队丢了308分。[1]", ["308分"], "zh")                       # 0.4444
    contains_gold("在南宁始发", [["南宁"]])                           # True
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from rag.answer_events import abstained
from rag.errors import ConfigError
from rag.support import SUPPORTED, labels_of, split_sentences, strip_labels, support_score

__all__ = ["abstained", "answer_scores", "bleu4", "citation_scores", "contains_gold", "exact_match", "f1",
           "normalize_en", "rouge_l", "tokens_zh"]

_PUNCT = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_CJK_CLASS = r"\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_CJK = re.compile(f"[{_CJK_CLASS}]")
_ZH_TOKEN = re.compile(rf"[{_CJK_CLASS}]|[^\W_{_CJK_CLASS}]+")


def normalize_en(text: str) -> str:
    """SQuAD v1.1: lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def tokens_zh(text: str) -> list[str]:
    """CMRC 2018's segmentation: each CJK character, and each run of letters or digits
    (lower-cased); punctuation, symbols and spaces are dropped."""
    return _ZH_TOKEN.findall(unicodedata.normalize("NFKC", text).lower())


def _tokens(text: str, lang: str) -> list[str]:
    return tokens_zh(text) if lang == "zh" else normalize_en(text).split()


def exact_match(answer: str, golds: Sequence[str], lang: str = "en") -> float:
    """1.0 when the normalised answer equals a normalised gold answer."""
    mine = _tokens(strip_labels(answer), lang)
    return float(any(mine == _tokens(g, lang) for g in golds if g.strip()))


def _longest_common_run(a: Sequence[str], b: Sequence[str]) -> int:
    best, prev = 0, [0] * (len(b) + 1)
    for x in a:
        cur = [0] * (len(b) + 1)
        for j, y in enumerate(b, 1):
            if x == y:
                cur[j] = prev[j - 1] + 1
                best = max(best, cur[j])
        prev = cur
    return best


def f1(answer: str, golds: Sequence[str], lang: str = "en") -> float:
    """Token F1, the best over ``golds``: bag of words (English), longest common run (Chinese)."""
    mine = _tokens(strip_labels(answer), lang)
    best = 0.0
    for gold in golds:
        theirs = _tokens(gold, lang)
        if not mine or not theirs:
            continue
        if lang == "zh":
            same = _longest_common_run(theirs, mine)
        else:
            same = sum((Counter(mine) & Counter(theirs)).values())
        if same:
            precision, recall = same / len(mine), same / len(theirs)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


def _holds(answer: str, gold: str, lang: str) -> bool:
    if lang == "zh" or _CJK.search(gold):  # Chinese gold text: compared without spaces
        needle = "".join(tokens_zh(gold))
        return bool(needle) and needle in "".join(tokens_zh(answer))
    needle = normalize_en(gold)
    return bool(needle) and f" {needle} " in f" {normalize_en(answer)} "


def contains_gold(answer: str, golds: Sequence[str] | Sequence[Sequence[str]], lang: str = "en") -> bool:
    """The answer holds a gold alternative; with parts (a list of lists), one of each part."""
    text = strip_labels(answer)
    if golds and not isinstance(golds[0], str):
        parts = [list(p) for p in golds]
        return bool(parts) and all(any(_holds(text, g, lang) for g in part) for part in parts)
    return any(_holds(text, g, lang) for g in golds if isinstance(g, str))


_NEEDS = "the answer metrics need sacrebleu and rouge-score: pip install 'ragqa[eval]'"


@lru_cache(maxsize=4)
def _bleu(lang: str) -> Any:
    try:
        from sacrebleu.metrics import BLEU
    except ImportError as exc:
        raise ConfigError(_NEEDS) from exc

    return BLEU(tokenize="zh" if lang == "zh" else "13a", effective_order=True)


def bleu4(answer: str, golds: Sequence[str], lang: str = "en") -> float:
    """Sentence BLEU-4 against all gold answers as references (0-1)."""
    refs = [g for g in golds if g.strip()]
    text = strip_labels(answer)
    if not refs or not text:
        return 0.0
    return _bleu(lang).sentence_score(text, refs).score / 100


class _Chars:
    """rouge-score tokenizer for Chinese: one token per character, punctuation and spaces dropped."""

    def tokenize(self, text: str) -> list[str]:
        return tokens_zh(text)


@lru_cache(maxsize=4)
def _rouge(lang: str) -> Any:
    try:
        from rouge_score import rouge_scorer
    except ImportError as exc:
        raise ConfigError(_NEEDS) from exc

    return rouge_scorer.RougeScorer(["rougeL"], tokenizer=_Chars() if lang == "zh" else None)


def rouge_l(answer: str, golds: Sequence[str], lang: str = "en") -> float:
    """ROUGE-L F-measure, the best over ``golds``."""
    text = strip_labels(answer)
    refs = [g for g in golds if g.strip()]
    if not refs or not text:
        return 0.0
    scorer = _rouge(lang)
    return max(scorer.score(ref, text)["rougeL"].fmeasure for ref in refs)


def answer_scores(answer: str, golds: Sequence[str], lang: str,
                  parts: Sequence[Sequence[str]] | None = None) -> dict[str, float]:
    """Every text metric of one answer: em, f1, contains_gold, bleu4, rouge_l."""
    flat = list(golds) or [g for p in parts or () for g in p]
    return {
        "em": exact_match(answer, flat, lang),
        "f1": round(f1(answer, flat, lang), 4),
        "contains_gold": float(contains_gold(answer, parts if parts else flat, lang)),
        "bleu4": round(bleu4(answer, flat, lang), 4),
        "rouge_l": round(rouge_l(answer, flat, lang), 4),
    }


def citation_scores(answer: str, cited: Mapping[int, tuple[str, str]], gold_docs: set[str],
                    golds: Sequence[str], lang: str) -> dict[str, float | None]:
    """Citation metrics of one answer (see the module docstring).

    ``cited`` maps each label the answer cites (and that was in its context) to the cited
    chunk's ``(doc id, text)``; ``gold_docs`` are the dataset's relevant documents.
    """
    good = [label for label in cited
            if cited[label][0] in gold_docs or any(_holds(cited[label][1], g, lang) for g in golds if g.strip())]
    sentences = split_sentences(answer)
    labelled = [(s, [n for n in labels_of(s) if n in cited]) for s in sentences]
    with_labels = [(s, ns) for s, ns in labelled if ns]
    supported = sum(1 for s, ns in with_labels if max(support_score(s, cited[n][1]) for n in ns) >= SUPPORTED)
    return {
        "compliance": float(bool(cited)),
        "citation_accuracy": float(bool(good)),
        "citation_precision": round(len(good) / len(cited), 4) if cited else None,
        "support": round(supported / len(with_labels), 4) if with_labels else None,
        "unlabelled": round(1 - len(with_labels) / len(sentences), 4) if sentences else None,
    }
