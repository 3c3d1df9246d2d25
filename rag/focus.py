"""Query-focused passages: each retrieved chunk cut down to the few sentences around its best match.

A CPU model reads a prompt at a few dozen to a few hundred tokens a second, so every token of
context costs time before the first word of the answer. Most of a retrieved chunk is not
about the question: the answer usually sits in one sentence, with its subject in the one
before. :func:`focus_hits` keeps, of each chunk, a window of ``sentences`` consecutive
sentences around the sentence that holds the largest share of the question's content words
(:mod:`rag.support`: words and numbers less stopwords, each CJK character a word), starting one
sentence before it. A chunk that shares nothing with the question keeps its first sentences.
Cut ends are marked with "…", and the chunk keeps its id, so citations still point at it.

Example::

    focused = focus_hits("How many tackles did Kuechly make?", hits, sentences=3)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from rag.lang import detect_lang
from rag.support import content_words, split_sentences, text_words
from rag.types import Hit

__all__ = ["focus_hits", "focus_text"]

ELLIPSIS = "…"


def focus_text(question_words: set[str], text: str, sentences: int) -> str:
    """The ``sentences``-sentence window of ``text`` around its best match for the question."""
    parts = split_sentences(text)
    if len(parts) <= sentences:
        return text
    scores = [len(question_words & text_words(s)) for s in parts]
    best = max(range(len(parts)), key=lambda i: (scores[i], -i))  # the first of the best
    start = 0 if scores[best] == 0 else max(0, min(best - 1, len(parts) - sentences))
    end = start + sentences
    sep = "" if detect_lang(text) == "zh" else " "  # Chinese sentences join without a space
    body = sep.join(parts[start:end])
    return (f"{ELLIPSIS} " if start > 0 else "") + body + (f" {ELLIPSIS}" if end < len(parts) else "")


def focus_hits(question: str, hits: Sequence[Hit], sentences: int) -> list[Hit]:
    """``hits`` with each chunk's text reduced to its focused window (see the module docstring)."""
    wanted = content_words(question)
    out = []
    for hit in hits:
        if hit.chunk is None:
            out.append(hit)
            continue
        text = focus_text(wanted, hit.chunk.text, sentences)
        out.append(hit if text == hit.chunk.text else replace(hit, chunk=replace(hit.chunk, text=text)))
    return out
