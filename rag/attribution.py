"""Citations for the sentences a model left unlabelled: the packed passage that supports each.

Small models often answer without the ``[n]`` labels the prompt asks for, or with a label on
some sentences only. :class:`Attributor` reads the answer as it streams (after
:class:`rag.prompts.CitationStream` has checked its labels); when a sentence ends without a
label, it appends the label of the packed passage holding the largest share of the sentence's
content words (:func:`rag.support.support_score`; ties go to the better-ranked passage), if
that share reaches ``min_support``. Those citations are *inferred*. A sentence that no passage
supports gets no label and is counted in ``unsupported``; sentences in ``skip`` (the "I don't
know" reply) are left alone.

Text is passed on as it arrives. Only what follows a sentence's end (white space, and labels
the model put after the full stop) is held back until the next sentence starts or the answer
ends, so an inferred label lands right after its sentence: ``It is 308. [1] Next ...``.

Example::

    attributor = Attributor({1: "The Panthers allowed 308 points."})
    text = attributor.feed("They allowed 308 points. ") + attributor.feed("Go") + attributor.flush()
    # "They allowed 308 points. [1] Go"; attributor.inferred == [1]
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from rag.support import LABEL, SUPPORTED, content_words, support_share, text_words

__all__ = ["Attributor"]

_ENDS = ".!?。！？"
_CJK_ENDS = "。！？"
_CLOSERS = "\"'”’)）」』"
# What may follow a sentence's end before the next one starts: spaces and (unfinished) labels.
_TAIL = re.compile(r"(?:\s|" + LABEL.pattern + r")*(?:[\[【][\d\s,，、]*)?")


class Attributor:
    """Appends an inferred label to each unlabelled sentence that a passage supports.

    ``passages`` maps each packed label to its passage text. After the answer, ``inferred``
    lists the labels that were inferred (in order of first use), ``attributed`` counts the
    sentences that got one and ``unsupported`` those that no passage supports.
    """

    def __init__(self, passages: Mapping[int, str], *, min_support: float = SUPPORTED,
                 skip: Iterable[str] = ()) -> None:
        self._words = {label: text_words(text) for label, text in sorted(passages.items())}  # once, not per sentence
        self.min_support = min_support
        self.skip = tuple(s for s in skip if s)
        self.inferred: list[int] = []
        self.attributed = 0
        self.unsupported = 0
        self._sentence = ""
        self._tail = ""
        self._ended = False

    def feed(self, text: str) -> str:
        out: list[str] = []
        for ch in text:
            if self._ended:
                line_start = "\n" in self._tail and ch in "[【"  # "[2] ..." on a new line opens the next sentence
                if not line_start and _TAIL.fullmatch(self._tail + ch):
                    self._tail += ch
                    continue
                if not self._tail and not ch.isspace() and (self._sentence[-1] in ".!?" or ch in _CLOSERS):
                    self._ended = False  # "3.5", "e.g.", "?!", or a closing quote: the sentence goes on
                else:
                    out.append(self._close())
            if ch == "\n" and self._sentence.strip():  # a line break ends the sentence: held like a space
                self._ended, self._tail = True, ch
                continue
            out.append(ch)
            self._sentence += ch
            self._ended = ch in _ENDS or (ch in _CLOSERS and len(self._sentence) > 1 and self._sentence[-2] in _ENDS)
        return "".join(out)

    def flush(self) -> str:
        return self._close() if self._sentence.strip() else self._take_tail()

    def _take_tail(self) -> str:
        tail, self._tail, self._sentence, self._ended = self._tail, "", "", False
        return tail

    def _close(self) -> str:
        sentence = self._sentence
        tail = self._take_tail()
        wanted = content_words(sentence)
        if LABEL.search(sentence) or LABEL.search(tail) or not wanted or any(s in sentence for s in self.skip):
            return tail
        label = self._best(wanted)
        if label is None:
            self.unsupported += 1
            return tail
        self.attributed += 1
        if label not in self.inferred:
            self.inferred.append(label)
        cjk = sentence.rstrip()[-1:] in _CJK_ENDS
        return ("" if cjk else " ") + f"[{label}]" + tail

    def _best(self, wanted: set[str]) -> int | None:
        best, best_score = None, 0.0
        for label, have in self._words.items():  # in label order: ties go to the better-ranked passage
            score = support_share(wanted, have)
            if score > best_score:
                best, best_score = label, score
        return best if best is not None and best_score >= self.min_support else None
