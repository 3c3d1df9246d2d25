"""Text analysis shared by indexing and querying, so both sides always produce the same terms.

Two analyses run side by side:

* **English** (and any other space-separated script): Unicode words, lower-cased, folded to
  ASCII and stemmed with the English Snowball stemmer, like tantivy's ``en_stem`` but with
  Han characters left out. It runs inside tantivy as the tokenizer ``ragqa_en``; the same
  analyser object turns a query into terms.
* **Chinese**: runs of Han characters are segmented with jieba in search mode
  (``cut_for_search``, which also emits the shorter words inside long ones) and indexed as
  whitespace-separated, pre-tokenised text.

Both start from :func:`normalize` (NFKC, so full-width letters, ``\\xa0`` and ideographic
spaces become their plain forms).

Example::

    terms = query_terms("黑豹队的防守丢了多少分 crawling")
    terms.english  # ('crawl',)
    terms.cjk      # ('黑豹', '队', '的', '防守', '丢', '了', '多少', '分')
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache

import tantivy

from rag.lang import jieba as load_jieba
from rag.text import HAN_RUN as _HAN_RUN

__all__ = [
    "ENGLISH_TOKENIZER",
    "CJK_TOKENIZER",
    "QueryTerms",
    "normalize",
    "english_analyzer",
    "english_terms",
    "cjk_terms",
    "cjk_field_text",
    "query_terms",
]

ENGLISH_TOKENIZER = "ragqa_en"
CJK_TOKENIZER = "whitespace"  # tantivy built-in; the field holds jieba output joined by spaces

# Words are runs of letters and digits; Han is excluded because jieba handles it.
_EN_WORD = r"[\p{Alphabetic}\p{N}--\p{Han}]+"
_MAX_TERM_BYTES = 40
_SPACES = re.compile(r"\s+")


@dataclass(frozen=True, slots=True)
class QueryTerms:
    """The distinct terms of a query, per analysed field, in order of first appearance."""

    english: tuple[str, ...]
    cjk: tuple[str, ...]

    def __bool__(self) -> bool:
        return bool(self.english or self.cjk)


def normalize(text: str) -> str:
    """NFKC-normalise and collapse every run of whitespace (``\\xa0`` included) to one space."""
    return _SPACES.sub(" ", unicodedata.normalize("NFKC", text)).strip()


@lru_cache(maxsize=1)
def english_analyzer() -> tantivy.TextAnalyzer:
    """The analyser registered as ``ragqa_en`` on every index and used to analyse queries."""
    return (
        tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.regex(_EN_WORD))
        .filter(tantivy.Filter.remove_long(_MAX_TERM_BYTES))
        .filter(tantivy.Filter.lowercase())
        .filter(tantivy.Filter.ascii_fold())
        .filter(tantivy.Filter.stemmer("english"))
        .build()
    )


def english_terms(text: str) -> list[str]:
    """English terms of already normalised text, exactly as the index holds them."""
    return english_analyzer().analyze(text) if text else []


def cjk_terms(text: str) -> list[str]:
    """jieba search-mode words of every Han run in already normalised text."""
    runs = _HAN_RUN.findall(text)
    if not runs:
        return []
    jieba = load_jieba()
    out: list[str] = []
    for run in runs:
        out.extend(w for w in jieba.cut_for_search(run) if w.strip())
    return out


def cjk_field_text(text: str) -> str:
    """The pre-tokenised value of the Chinese field: the words of :func:`cjk_terms`, space-joined."""
    return " ".join(cjk_terms(text))


def query_terms(query: str) -> QueryTerms:
    """Analyse a user query like the indexed text. Query syntax characters are just separators."""
    text = normalize(query)
    return QueryTerms(
        english=tuple(dict.fromkeys(english_terms(text))),
        cjk=tuple(dict.fromkeys(cjk_terms(text))),
    )
