"""Which languages an embedding model ranks well, and the question's language.

ragqa serves English and Chinese. :func:`detect_lang` (from :mod:`rag.text`, where the
thresholds are explained) tells them apart by script, in about a microsecond: ``"zh"`` when
more than 30% of a text's letters are Chinese characters, else ``"en"`` (every other language
is treated like English: Latin-script models cover most of them at least as well as they
cover nothing). The prompt, the injection filter, the context focus and retrieval all use it,
so a question is in one language everywhere.

:func:`model_languages` is what an embedder declares as its ``languages``: the languages it
was trained to rank (``None``: any). Retrieval gives the vector leg no weight for a query in a
language its model does not cover, because such a ranking is close to random and drags
fusion below BM25 alone (measured in ``evals/RESULTS-retrieval.md``).

Example::

    detect_lang("What is 北京?")          # "en": one Chinese word in an English question
    detect_lang("北京是什么 city")         # "zh"
    model_languages("all-MiniLM-L6-v2")   # frozenset({"en"})
    model_languages("paraphrase-multilingual-MiniLM-L12-v2")   # None: any language
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from rag.text import HAN as CJK
from rag.text import detect_lang

__all__ = ["CJK", "LANG_NAMES", "detect_lang", "covers", "model_languages", "ranks", "jieba"]

LANG_NAMES = {"en": "English", "zh": "Chinese"}


# English-only sentence-embedding families, by a substring of the lowercased model name.
# Anything else is assumed multilingual unless the settings say otherwise
# (``embedder.languages``): a wrong "any" costs what fusion cost before, a wrong "en" would
# silence a good model.
_ENGLISH_ONLY = ("all-minilm", "all-mpnet", "all-distilroberta", "multi-qa-", "msmarco-", "paraphrase-minilm",
                 "paraphrase-mpnet", "bge-small-en", "bge-base-en", "bge-large-en",
                 "gte-small", "gte-base", "gte-large", "e5-small-v2", "e5-base-v2", "e5-large-v2",
                 "nomic-embed-text", "embed-english")


def model_languages(name: str) -> frozenset[str] | None:
    """The languages an embedding model named ``name`` covers: ``{"en"}`` for the English-only
    families ragqa knows (MiniLM, MPNet, BGE-en, GTE, e5-v2, Cohere's english models), else
    ``None`` (any language; "multilingual" in the name always means any)."""
    lowered = name.lower().replace("_", "-")
    if "multilingual" in lowered or "-zh" in lowered or "chinese" in lowered:
        return None
    return frozenset({"en"}) if any(part in lowered for part in _ENGLISH_ONLY) else None


def covers(languages: frozenset[str] | None, lang: str) -> bool:
    """Whether a model declaring ``languages`` ranks text in ``lang``."""
    return languages is None or lang in languages


def ranks(embedder: object, lang: str) -> bool:
    """Whether ``embedder`` ranks text in ``lang`` (one that declares no ``languages``: any)."""
    return covers(getattr(embedder, "languages", None), lang)


_jieba_lock = threading.Lock()
_jieba_ready = False


def jieba() -> Any:
    """The ``jieba`` Chinese word segmenter, its dictionary loaded (about a second, once per
    process, on first use); ``jieba.posseg`` is imported too."""
    global _jieba_ready
    import jieba as module
    import jieba.posseg  # the part-of-speech tagger the cache guards use

    if not _jieba_ready:
        with _jieba_lock:
            if not _jieba_ready:
                module.setLogLevel(logging.WARNING)
                module.initialize()
                _jieba_ready = True
    return module
