"""Text helpers every layer shares: which characters are Chinese, a token estimate without a
tokenizer, the language of a text, and a value cut short for a one-line message.

Scripts are Unicode script properties (the ``regex`` package's ``\\p{Han}`` and friends), not
hand-kept code point ranges, so the CJK extensions and compatibility forms are all covered:

- :data:`HAN` is one Chinese (Han) character: what the language detector counts, what jieba
  segments and what the answer metrics score character by character.
- :data:`UNSPACED` is one character of a script written without spaces between words (Han,
  kana, bopomofo, Hangul): each such character counts as a word or a token.

:func:`detect_lang` tells English from Chinese by the share of a text's letters that are Han
characters: more than 30% for a question (:data:`QUESTION_ZH_SHARE`, so one Chinese name in an
English question stays English), more than 20% for a document (:data:`DOCUMENT_ZH_SHARE`, via
:func:`document_lang`, since a Chinese page can carry much English code and markup). Every
other language is treated like English. The two stay apart on purpose: on XQuAD's documents
both agree, while 0.3 reads 2 of XQuAD-zh's 1,190 questions as English ("Internet2是什么") and
8 of the cache pairs' 8,156; 0.2 would fix those but call "What is 北京?" Chinese, and the
fusion weights and the cache guards were fitted with 0.3.

:func:`estimate_tokens` counts what a tokenizer would split without asking one: a word, a
punctuation mark or one character of an unspaced script each count one; ``upper=True`` is the
over-estimate a server's limits need (one per unspaced character, one per three others).

Example::

    detect_lang("What is 北京?")              # "en": one Chinese word in an English question
    detect_lang("北京是什么 city")             # "zh"
    estimate_tokens("使用Python编程。")        # 6: 使 用 Python 编 程 。
    estimate_tokens("abcdef", upper=True)      # 2
    shorten("a   long\\nmessage", 8)           # "a long …"
"""

from __future__ import annotations

import math
import re

import regex

__all__ = ["HAN", "HAN_CLASS", "HAN_RUN", "UNSPACED", "UNSPACED_CLASS", "QUESTION_ZH_SHARE",
           "DOCUMENT_ZH_SHARE", "DOCUMENT_SAMPLE_CHARS", "detect_lang", "document_lang", "estimate_tokens",
           "shorten"]

HAN_CLASS = r"\p{Han}"
"""Chinese characters, as a character-class body for ``regex`` patterns."""
UNSPACED_CLASS = r"\p{Han}\p{Hiragana}\p{Katakana}\p{Bopomofo}\p{Hangul}"
"""Scripts written without spaces between words, as a character-class body for ``regex``."""

HAN = regex.compile(HAN_CLASS)
"""One Chinese character."""
HAN_RUN = regex.compile(rf"{HAN_CLASS}+")
"""A run of Chinese characters (what jieba segments)."""
UNSPACED = regex.compile(rf"[{UNSPACED_CLASS}]")
"""One character of a script written without spaces."""

QUESTION_ZH_SHARE = 0.3
"""A question is Chinese when more than this share of its letters are Han characters."""
DOCUMENT_ZH_SHARE = 0.2
"""A document is Chinese when more than this share of its letters are Han characters."""
DOCUMENT_SAMPLE_CHARS = 20_000
"""A document's language is read from its first this many characters."""

_LETTER = re.compile(r"[^\W\d_]")
# A character of an unspaced script, a run of letters and digits, or a punctuation mark or symbol.
_TOKEN = regex.compile(rf"[{UNSPACED_CLASS}]|[^\W_{UNSPACED_CLASS}]+|[^\w\s]|_")
# For the over-estimate: unspaced scripts plus CJK punctuation and full-width forms, one token each.
_WIDE = regex.compile(rf"[{UNSPACED_CLASS}\u3000-\u303f\uff00-\uffef]")


def detect_lang(text: str, *, threshold: float = QUESTION_ZH_SHARE, empty: str = "en") -> str:
    """``"zh"`` when more than ``threshold`` of ``text``'s letters are Han characters, else
    ``"en"``; ``empty`` for a text without letters. About a microsecond for a question."""
    letters = len(_LETTER.findall(text))
    if not letters:
        return empty
    return "zh" if len(HAN.findall(text)) / letters > threshold else "en"


def document_lang(text: str) -> str:
    """A document's language: :func:`detect_lang` at :data:`DOCUMENT_ZH_SHARE` over its first
    :data:`DOCUMENT_SAMPLE_CHARS` characters; ``"und"`` for a text without letters."""
    return detect_lang(text[:DOCUMENT_SAMPLE_CHARS], threshold=DOCUMENT_ZH_SHARE, empty="und")


def estimate_tokens(text: str, *, upper: bool = False) -> int:
    """Tokens in ``text`` without a tokenizer.

    By default one per word (a run of letters and digits), punctuation mark or symbol, and
    one per character of a script written without spaces: close to a subword tokenizer on
    prose, under it on code and rare words. ``upper=True`` over-estimates for sizing requests
    to a server's limits: one per unspaced or full-width character, one per three others.
    """
    if upper:
        wide = len(_WIDE.findall(text))
        return wide + math.ceil((len(text) - wide) / 3)
    return len(_TOKEN.findall(text))


def shorten(value: object, limit: int = 300) -> str:
    """``str(value)`` on one line (whitespace runs become one space), cut to at most ``limit``
    characters with "…" marking the cut: for error messages and reports."""
    if limit < 1:
        raise ValueError("limit must be at least 1")
    text = " ".join(str(value).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
