"""Guards of the semantic answer cache: cheap checks that two close questions are the same.

A cached answer is served for a new question when their embeddings are close *and* every
guard passes. Embeddings put "How many tackles did Luke Kuechly register?" and "... did Josh
Norman register?" at a cosine of 0.9 or more; a guard looks at what the cosine blurs:

- ``numbers``: both name the same numbers ("Python 3.11" is not "Python 3.12"), compared as
  the sorted list of digit runs after NFKC (the rule of ``rag.cache._numbers``).
- ``entities``: every proper noun of one question appears in the other. English: words with a
  capital letter that are not common function words (so "What" and "Could" at the start of a
  sentence are not names, "Denver" is); Chinese: jieba's person, place, organisation and other
  proper-noun tags (``nr``, ``ns``, ``nt``, ``nz``...), transliterated names (``马丁·路德``) and
  titles in 《》, looked up as substrings of the other question. A question without capitals (typed all
  lower- or all upper-case) names no English entities, so pass the question as typed, not the
  normalised one. Pairs in two languages pass: their names are spelt differently.
- ``negation``: both hold as many negations (not, never, no, without, n't; 不, 没有, 未, 无, 非,
  别... as whole jieba words, so 不同 "different" and 非常 "very" are not negations).
- ``qtype``: both ask for the same kind of answer by their question words: a time (when,
  what year, 什么时候, 哪一年), a place, a reason, a quantity (how many, 多少, 几), a person
  (who, 谁), a manner or a thing (what, which, 什么, 哪个). "Who sequenced the first plastome?"
  and "When was the first plastome sequenced?" are at a cosine of 0.95 for MiniLM. Works across
  languages; a question without question words ("Python 3.11 release date") passes.
- ``language``: both are in the same language (:func:`rag.lang.detect_lang`), because the
  answer is written in its question's language; ``multilingual=True`` lets a pair in two
  languages through (for a deployment that wants an English answer served to the same
  question in Chinese, with a multilingual embedder).

Measured on near-duplicate questions from XQuAD in ``evals/RESULTS-cache.md``.

Example::

    same_question("Python 3.11 release date?", "Python 3.12 release date?", ["numbers"])   # False
    same_question("How do I read a file?", "How do I not read a file?", GUARDS)            # False
    same_question("Who founded McKinsey?", "Could you tell me who founded McKinsey?", GUARDS)  # True
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Iterable
from functools import lru_cache

from rag.errors import ConfigError
from rag.lang import CJK, detect_lang
from rag.lang import jieba as load_jieba
from rag.text import HAN_RUN as _HAN_RUN

__all__ = ["GUARDS", "entities", "negated", "numbers", "qtypes", "same_entities", "same_language", "same_negation",
           "same_numbers", "same_qtype", "same_question"]

_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")  # as rag.cache._NUMBER
# Words of Latin, Greek and Cyrillic script (and digits); Han text is left to jieba.
_WORD = re.compile(r"[0-9A-Za-z\u00c0-\u024f\u0370-\u03ff\u0400-\u04ff]+")
_ENTITY_TAGS = frozenset({"nr", "nrt", "nrfg", "ns", "nt", "nz"})
_TITLE = re.compile(r"《([^《》]{1,40})》")
_NOT_HAN_NAMES = frozenset({"谢谢", "请问", "你好", "麻烦", "您好", "多谢"})  # jieba tags some as names

# Capitalised words that are not names: function words, question words and what people put in
# front of a question. Lower-cased.
_NOT_NAMES = frozenset({
    "a", "about", "above", "according", "across", "after", "again", "against", "all", "almost", "along",
    "also", "although", "always", "am", "among", "an", "and", "another", "any", "anyone", "anything",
    "approximately", "are", "around", "as", "at", "be", "because", "been", "before", "being", "below",
    "besides", "between", "both", "but", "by", "can", "could", "did", "do", "does", "doing", "down", "during",
    "each", "either", "else", "even", "ever", "every", "except", "few", "for", "from", "had", "has", "have",
    "having", "he", "her", "here", "hers", "him", "his", "how", "however", "i", "i'd", "i'm", "if", "in",
    "including", "inside", "into", "is", "it", "its", "just", "least", "less", "like", "many", "may", "me",
    "might", "more", "most", "much", "must", "my", "name", "near", "neither", "never", "no", "none", "nor",
    "not", "now", "of", "off", "on", "once", "one", "only", "onto", "or", "other", "others", "our", "out",
    "outside", "over", "own", "per", "please", "prior", "rather", "same", "she", "should", "since", "so",
    "some", "such", "than", "that", "the", "their", "them", "then", "there", "these", "they", "this", "those",
    "though", "through", "throughout", "thus", "to", "too", "toward", "towards", "under", "unlike", "until",
    "up", "upon", "us", "very", "via", "was", "we", "were", "what", "whatever", "when", "whenever", "where",
    "whereas", "whether", "which", "while", "who", "whom", "whose", "why", "will", "with", "within",
    "without", "would", "yes", "yet", "you", "your", "hi", "hello", "hey", "tell", "know", "wondering",
    "question", "quick", "explain", "list", "give", "describe", "identify", "define", "say", "s", "t", "d",
    "ll", "re", "ve", "m", "thank", "thanks", "sorry", "ok", "okay", "excuse", "pardon", "dear", "greetings"
})
_EN_NEGATION = frozenset({"not", "never", "no", "none", "nobody", "nothing", "neither", "nor", "without",
                          "cannot", "nowhere"})
_NT = re.compile(r"[a-z]n['’]t\b", re.IGNORECASE)  # don't, isn't, can't, won't
_ZH_NEGATION = frozenset({"不", "没", "没有", "无", "非", "别", "未", "未能", "未曾", "不是", "不能", "不会",
                          "不要", "不用", "不再", "并非", "并不", "无法", "从未", "从不", "没能", "决不", "绝不",
                          "毫无", "不得", "不可", "不曾", "勿", "莫", "否", "无需", "不必", "不该", "不应"})

# What a question asks for, by its question words: the first alternative that matches at a
# position wins, so "what year" is a time before "what" is a thing.
_EN_QTYPES = (
    ("time", (r"when|(?:what|which) (?:year|years|date|day|month|century|decade|time|period|era|season)"
              r"|(?:what|which) (?:is|was|are|were) the (?:\w+ ){0,2}(?:year|date|day|month|time)")),
    ("place", r"where|(?:what|which) (?:place|location)"),
    ("reason", r"why|for what reason|what (?:is|was) the reason"),
    ("quantity", (r"how (?:many|much|long|old|far|often|big|large|tall|high|fast)"
                  r"|(?:what|which) (?:number|percentage|percent|proportion|amount|share)")),
    ("person", (r"who|whom|whose|(?:last|first|full) name|(?:what|which) (?:player|person|people|man|woman|actor"
                r"|actress|poet|singer|writer|author|artist|quarterback|coach|president|king|queen|scientist|inventor)")),
    ("manner", r"how"),
    ("thing", r"what|which"),
)
_ZH_QTYPES = (
    ("time", r"什么时候|啥时候|什么时间|何时|几时|哪一?年|哪一?天|哪个时候|哪个时期|何年"),
    ("place", r"哪里|哪儿|何处|何地|什么地方|哪个地方"),
    ("reason", r"(?<![称成作认视名])(?:为什么|为何|为啥)|什么原因"),
    ("quantity", r"多少|多久|多大|多长|多远|多高|多重|几(?!乎)"),
    ("person", r"谁|姓什么|什么人|哪[个位名]?(?:人|球员|诗人|演员|歌手|作家|作者|艺术家|总统|国王|科学家|发明家)|哪位"),
    ("manner", r"怎么|如何|怎样"),
    ("thing", r"什么|啥|哪"),
)
_EN_QWORD = re.compile("|".join(f"(?P<{name}>\\b(?:{words})\\b)" for name, words in _EN_QTYPES), re.IGNORECASE)
_ZH_QWORD = re.compile("|".join(f"(?P<{name}>{words})" for name, words in _ZH_QTYPES))

# -- what each guard compares ------------------------------------------------------------------------
@lru_cache(maxsize=8192)
def numbers(text: str) -> tuple[str, ...]:
    """The digit runs of ``text`` (``3.11``, ``1,000``), sorted: the numbers guard's key."""
    return tuple(sorted(_NUMBER.findall(unicodedata.normalize("NFKC", text))))


@lru_cache(maxsize=8192)
def entities(text: str) -> tuple[frozenset[str], frozenset[str]]:
    """``(latin, han)``: ``text``'s capitalised non-function words (lower-cased, a final s
    dropped), and its Chinese proper nouns and 《titles》 (without middle dots)."""
    text = unicodedata.normalize("NFKC", text)
    cased = any(c.isupper() for c in text) and any(c.islower() for c in text)
    latin = frozenset(_stem(w) for w in _WORD.findall(text)
                      if not w.isdigit() and any(c.isupper() for c in w)
                      and w.casefold() not in _NOT_NAMES) if cased else frozenset()
    han = {_undotted(title) for title in _TITLE.findall(text)}  # 《护卫者》: a work's name, in any script
    if CJK.search(text):
        words = [(p.word, p.flag) for p in load_jieba().posseg.cut(_flat(text))]
        for i, (word, flag) in enumerate(words):
            if flag in _ENTITY_TAGS and len(word) > 1 and word not in _NOT_HAN_NAMES:
                han.add(word)
            elif word == "·" and 0 < i < len(words) - 1 and CJK.match(words[i - 1][0]) and CJK.match(words[i + 1][0]):
                han.add(words[i - 1][0] + words[i + 1][0])  # a transliterated name: 马丁·路德, compared undotted
    return latin, frozenset(han)


@lru_cache(maxsize=8192)
def _words(text: str) -> frozenset[str]:
    return frozenset(w.casefold() for w in _WORD.findall(unicodedata.normalize("NFKC", text)))


@lru_cache(maxsize=8192)
def _stems(text: str) -> frozenset[str]:
    return frozenset(_stem(w) for w in _words(text))


def _stem(word: str) -> str:
    """A name's form for matching: lower-cased, a final s dropped ("Ford's", "Fords", "Ford")."""
    word = word.casefold()
    return word[:-1] if len(word) > 3 and word.endswith("s") else word


@lru_cache(maxsize=8192)
def negated(text: str) -> int:
    """How many negation words ``text`` holds (English, and Chinese as whole jieba words)."""
    text = unicodedata.normalize("NFKC", text)
    count = len(_NT.findall(text)) + sum(1 for w in _WORD.findall(text) if w.casefold() in _EN_NEGATION)
    runs = _HAN_RUN.findall(text)
    if runs:
        jieba = load_jieba()
        count += sum(1 for run in runs for w in jieba.lcut(run) if w in _ZH_NEGATION)
    return count


@lru_cache(maxsize=8192)
def qtypes(text: str) -> frozenset[str]:
    """What ``text`` asks for, by its question words: ``time``, ``place``, ``reason``,
    ``quantity``, ``person``, ``manner``, ``thing`` (none for a question without one; ``thing``
    only when nothing more precise is asked: "What is the last name of the player who ..." is
    a person)."""
    text = unicodedata.normalize("NFKC", text)
    found = {m.lastgroup for m in _EN_QWORD.finditer(text)} | {m.lastgroup for m in _ZH_QWORD.finditer(text)}
    found.discard(None)
    if len(found) > 1:  # "what" beside "who" or "what year" says no more than they do
        found.discard("thing")
    return frozenset(t for t in found if t)


# -- the guards ---------------------------------------------------------------------------------------
def same_numbers(a: str, b: str) -> bool:
    """Both questions name the same numbers, as many times each."""
    return numbers(a) == numbers(b)


def same_entities(a: str, b: str) -> bool:
    """Every proper noun of each question appears in the other (always true across languages)."""
    if detect_lang(a) != detect_lang(b):
        return True
    (latin_a, han_a), (latin_b, han_b) = entities(a), entities(b)
    if not (latin_a <= _stems(b) and latin_b <= _stems(a)):
        return False
    flat_a, flat_b = _undotted(a), _undotted(b)
    return all(e in flat_b for e in han_a) and all(e in flat_a for e in han_b)


def _flat(text: str) -> str:
    """``text`` for substring tests: NFKC, one kind of middle dot, no spaces."""
    text = unicodedata.normalize("NFKC", text).replace("•", "·").replace("・", "·").replace("‧", "·")
    return "".join(text.split())


def _undotted(text: str) -> str:
    """``text`` for finding names in: :func:`_flat` without the middle dots (约翰·埃尔维 is 约翰埃尔维)."""
    return _flat(text).replace("·", "")


def same_negation(a: str, b: str) -> bool:
    """Both questions hold as many negations ("without ... or didn't" is not "without ... or did")."""
    return negated(a) == negated(b)


def same_qtype(a: str, b: str) -> bool:
    """Both questions ask for the same kind of thing ("Who sequenced X?" is not "When was X
    sequenced?"), in any language; a question without question words passes."""
    ta, tb = qtypes(a), qtypes(b)
    return not ta or not tb or ta == tb


def same_language(a: str, b: str, *, multilingual: bool = False) -> bool:
    """Both questions are in one language (``multilingual``: any two languages pass)."""
    return multilingual or detect_lang(a) == detect_lang(b)


GUARDS: dict[str, Callable[[str, str], bool]] = {
    "numbers": same_numbers,
    "entities": same_entities,
    "negation": same_negation,
    "qtype": same_qtype,
    "language": same_language,
}
"""The guards by name; each takes two questions as typed and says whether they may share an answer."""


def same_question(a: str, b: str, guards: Iterable[str], *, multilingual: bool = False) -> bool:
    """Whether every guard named in ``guards`` passes for ``a`` and ``b``; call it on pairs
    already close enough by embedding. ``multilingual`` relaxes the language guard.

    Raises :class:`~rag.errors.ConfigError` for a name not in :data:`GUARDS`.
    """
    for name in guards:
        guard = GUARDS.get(name)
        if guard is None:
            raise ConfigError(f"unknown cache guard {name!r}: choose from {', '.join(GUARDS)}")
        if name == "language":
            if not same_language(a, b, multilingual=multilingual):
                return False
        elif not guard(a, b):
            return False
    return True
