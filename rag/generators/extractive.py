"""The extractive answerer: no model, just the best supporting sentences of the context.

It scores each sentence of the packed passages by how many of the question's words it
holds (each CJK character counts as a word), with a small bonus for better-ranked
passages, and answers with the best few, each followed by its passage's label. When no
sentence shares enough with the question it says it does not know. It is the fallback
when the configured generator is down; the answer pipeline then flags it ``degraded``.

Example::

    generator = ExtractiveGenerator()
    async for delta in generator.stream(prompt, GenerationParams()):
        print(delta.text, end="")
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

from rag.prompts import UNKNOWN
from rag.retrieval.postprocess import words
from rag.support import STOPWORDS
from rag.text import estimate_tokens
from rag.types import GenerationDelta, GenerationParams, Prompt

__all__ = ["ExtractiveGenerator"]

_SENTENCE = re.compile(r"(?<=[.!?。！？])\s+|(?<=[。！？])|\n+")



class ExtractiveGenerator:
    """Answers with the context's best supporting sentences and their citation labels.

    ``max_sentences`` bounds the answer; ``min_overlap`` is the share of the question's
    content words a sentence must hold to count as support.

    Example::

        text = "".join([d.text async for d in ExtractiveGenerator().stream(prompt, GenerationParams())])
    """

    name = "extractive"
    context_window = 1_000_000

    def __init__(self, max_sentences: int = 3, min_overlap: float = 0.34) -> None:
        self.max_sentences = max_sentences
        self.min_overlap = min_overlap

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def count_tokens(self, text: str) -> int:
        """:func:`rag.text.estimate_tokens`: there is no model tokenizer to ask."""
        return estimate_tokens(text)

    def answer(self, prompt: Prompt) -> str:
        wanted = words(prompt.question) - STOPWORDS
        scored: list[tuple[float, int, int, str]] = []
        for rank, passage in enumerate(prompt.passages):
            for i, sentence in enumerate(s.strip() for s in _SENTENCE.split(passage.chunk.text)):
                if len(sentence) < 8:
                    continue
                mine = words(sentence)
                overlap = len(wanted & mine) / len(wanted) if wanted else 0.0
                if overlap >= self.min_overlap:
                    scored.append((overlap - 0.02 * rank, passage.label, i, sentence))
        if not scored:
            return UNKNOWN.get(prompt.lang, UNKNOWN["en"])
        best = sorted(scored, key=lambda s: -s[0])[: self.max_sentences]
        best.sort(key=lambda s: (s[1], s[2]))  # in reading order
        sep = "" if prompt.lang == "zh" else " "
        return sep.join(f"{sentence} [{label}]" for _, label, _, sentence in best)

    async def stream(self, prompt: Prompt, params: GenerationParams) -> AsyncIterator[GenerationDelta]:
        text = _before_stop(self.answer(prompt), (*params.stop, *prompt.stop))
        pieces = re.findall(r"\S+\s*|\s+", text) if prompt.lang != "zh" else re.findall(r".{1,8}", text, re.DOTALL)
        budget = params.max_tokens
        sent = 0
        for piece in pieces:
            if sent >= budget:
                yield GenerationDelta(finish_reason="length", prompt_tokens=0, completion_tokens=sent)
                return
            sent += 1
            yield GenerationDelta(text=piece)
        yield GenerationDelta(finish_reason="stop", prompt_tokens=0, completion_tokens=sent)


def _before_stop(text: str, stops: tuple[str, ...]) -> str:
    """The text up to the first stop string (``GenerationParams.stop``: it is not returned)."""
    cuts = [text.find(s) for s in stops if s and s in text]
    return text[: min(cuts)] if cuts else text
