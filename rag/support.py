"""How far a passage supports a sentence: content words, sentences with their labels, overlap.

A sentence's *key content* is its content words: lower-cased words and numbers without the
function words of :data:`STOPWORDS`, each CJK character one word, citation labels left out.
A passage supports a sentence by the share of that key content it holds
(:func:`support_score`). The answer evaluation (``evals.qa_metrics``) counts a cited
sentence as supported when one of its cited passages reaches :data:`SUPPORTED`; the
extractive answerer picks sentences by the same words.

Example::

    split_sentences("Paris is the capital [1]. It has 2M people. [2]")
    # ["Paris is the capital [1].", "It has 2M people. [2]"]
    support_score("Paris is the capital of France [1].", "Paris, the capital of France, ...")  # 1.0
"""

from __future__ import annotations

import re

from rag.text import HAN as _CJK

__all__ = ["LABEL", "STOPWORDS", "SUPPORTED", "content_words", "labels_of", "split_sentences",
           "strip_labels", "support_score", "support_share", "text_words"]

SUPPORTED = 0.5
"""Least share of a sentence's content words a passage must hold to support it."""

STOPWORDS = frozenset(
    ["a", "an", "the", "is", "are", "was", "were", "be", "to", "of", "in", "on", "for", "and", "or", "with",
     "what", "which", "who", "whom", "when", "where", "why", "how", "do", "does", "did", "can", "could",
     "should", "would", "i", "you", "it", "this", "that", "these", "those", "my", "your", "from", "by", "as",
     "at", "about", "的", "了", "是", "在", "吗", "呢", "吧", "和", "与", "什", "么", "哪", "谁", "怎", "样",
     "如", "何", "多", "少", "个", "有"])

# [1], [1, 2], [1][2], 【1】 (full-width brackets, as Chinese models often write)
LABEL = re.compile(r"[\[【]\s*(\d{1,3}(?:\s*[,，、]\s*\d{1,3})*)\s*[\]】]")
_WORD = re.compile(r"[^\W_]+", re.UNICODE)
# A sentence ends at . ! ? 。！？ (a "." only before a space, a label or the end: not in "3.5")
# or at a line break; the labels right after its end belong to it.
_END = re.compile(r"[.!?。！？]+[\"'”’)）]*|\n+")
_TRAILING_LABELS = re.compile(r"(?:[ \t]*" + LABEL.pattern + r")+")


def strip_labels(text: str) -> str:
    """``text`` without its citation labels (and the space before each)."""
    return re.sub(r"[ \t]*" + LABEL.pattern, "", text).strip()


def labels_of(text: str) -> list[int]:
    """The citation labels in ``text``, in order, each once."""
    out: list[int] = []
    for match in LABEL.finditer(text):
        for n in re.split(r"\s*[,，、]\s*", match.group(1).strip()):
            if int(n) not in out:
                out.append(int(n))
    return out


def text_words(text: str) -> set[str]:
    """The lower-cased words and CJK characters of ``text`` (what a passage offers as support)."""
    lowered = text.lower()
    return set(_WORD.findall(_CJK.sub(" ", lowered))) | set(_CJK.findall(lowered))


def content_words(text: str) -> set[str]:
    """The key content of ``text``: its words and CJK characters, less labels and stopwords."""
    return text_words(strip_labels(text)) - STOPWORDS


def split_sentences(text: str) -> list[str]:
    """The sentences of an answer, each with the labels that follow its end, stripped."""
    out: list[str] = []
    start = 0
    for match in _END.finditer(text):
        end = match.end()
        after = text[end:end + 1]
        if match.group(0)[0] in ".!?" and after and not after.isspace() and after not in "[【":
            continue  # "3.5", "e.g.x", "v1.2": not the end of a sentence
        labels = _TRAILING_LABELS.match(text, end)
        if labels is not None:
            end = labels.end()
        _add(out, text[start:end])
        start = end
    _add(out, text[start:])
    return out


def _add(out: list[str], piece: str) -> None:
    piece = piece.strip()
    if not piece:
        return
    if out and not content_words(piece):  # labels or punctuation alone: the last sentence's
        out[-1] = f"{out[-1]} {piece}"
    else:
        out.append(piece)


def support_share(wanted: set[str], have: set[str]) -> float:
    """The share of the content words ``wanted`` found in ``have`` (1.0 when none are wanted)."""
    return len(wanted & have) / len(wanted) if wanted else 1.0


def support_score(sentence: str, passage: str) -> float:
    """The share of ``sentence``'s content words that ``passage`` holds (1.0 when it has none)."""
    return support_share(content_words(sentence), text_words(passage))
