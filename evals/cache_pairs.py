"""The labelled near-duplicate questions behind the semantic cache's threshold: the recipe.

    python -m evals.cache_pairs            # writes evals/cache-pairs/pairs.jsonl and the test fixture

Each line is ``{"a", "b", "same", "kind", "lang", "split"}``: two questions, whether one's
answer may be served for the other, how the pair was made, ``en``, ``zh`` or ``en-zh``, and
``dev`` or ``test`` (by XQuAD article: half of the 48 articles each, drawn with the seed, so
a threshold chosen on ``dev`` is measured on questions about other topics).

From XQuAD's 1,190 questions in English and the same questions in Chinese (``tests/data/xquad-*``,
CC BY-SA 4.0), everything deterministic under ``--seed``:

Same question (``same: true``), ``a`` the original, ``b`` rewritten by one documented rule:

- ``politeness``: a prefix ("Could you tell me:", "Quick question:", 请问, 我想知道...) or a suffix
  (", please?", "Thanks!", 呢？, 谢谢) around the question (:data:`EN_PREFIXES` ...).
- ``synonym``: one or two words swapped by :data:`EN_SYNONYMS` / :data:`ZH_SYNONYMS`
  ("largest" -> "biggest", "Which" -> "What", 什么时候 -> 何时, 位于 -> 坐落于).
- ``contraction`` (en): "What is" <-> "What's", "did not" <-> "didn't" ... (:data:`CONTRACTIONS`).
- ``word-order``: a final phrase of up to five words opened by in, during, after, before,
  since, by, on or at, that looks like a noun phrase (determiners, numbers and capitalised
  words, and one other word at the end, not a participle: not "... in Germany called?"), moved
  to the front ("... in 1990?" -> "In 1990, ...?"), and a fronted one moved to the back; in Chinese
  X是什么 <-> 什么是X and X是谁 <-> 谁是X, for questions of up to 24 characters without commas.
- ``punct-case``: lower-cased, inner punctuation dropped, spaces around marks, "??" or no
  question mark (en); full- and half-width marks swapped, commas and question marks dropped or
  doubled, spaces added or removed between Chinese and Latin letters or digits (zh).
- ``combined``: politeness, then a synonym or contraction, then word order where they apply.
- ``translation`` (en-zh): the English question and its professional Chinese translation
  (the same XQuAD id).
- ``human-paraphrase``: two questions that different crowd workers wrote for the same answer
  on the same paragraph (:data:`HUMAN_PARAPHRASES`, judged by hand), in English, in their
  Chinese translations, and the first in English against the second in Chinese. The only
  same-language positives not made by a rule: the closest to a real question log.

A rewrite that the exact cache already matches (the same after
:func:`rag.cache.normalise_question`: case, trailing marks, full-width forms) is not a pair:
those never reach the semantic lookup.

Different questions (``same: false``):

- ``same-paragraph``: two different questions written on the same paragraph, in English, in
  Chinese, and English against the Chinese of the other question (en-zh); real questions with
  shared wording, the hard negatives. Pairs whose gold answers overlap (one inside the other)
  are left out: crowd workers sometimes asked the same question twice ("How many points did
  the Broncos score in the last three minutes ..." and "... in the final three minutes ...").
- ``swap-entity``: a name in the question replaced by another name asked about in the same
  article ("... did Luke Kuechly ..." -> "... did Josh Norman ..."): in English a run of
  capitalised words, not the first, that the entity guard calls a name; in Chinese a jieba
  proper noun, swapped for one of the same tag (person, place, organisation, other).
- ``swap-number``: one number changed (a year by 1-15, others by 1-3): "Super Bowl 50" -> 51.
- ``negated``: a negation added (did -> didn't, was -> was not; 是 -> 不是, 有 -> 没有, 能 -> 不能).

The three synthetic kinds are made with the same notions of name, number and negation that
the guards of :mod:`rag.cache_guards` check, so a guard stops its own kind by construction: they
measure how close the embedder puts a minimal edit, not how good the guard is. The guards'
cost is measured on the positives, their benefit on real questions by ``same-paragraph``.

``--rgb DIR`` also writes ``rgb-related`` Chinese negatives from RGB-zh (each question and its
three most similar others by character bigrams, pairs whose answers overlap left out) to
``--rgb-out``. RGB is CC BY-NC-SA 4.0 (evaluation only), so those pairs are not committed.
"""

from __future__ import annotations

import argparse
import json
import random
import re
from collections import defaultdict
from collections.abc import Callable, Iterator
from itertools import combinations
from pathlib import Path
from typing import Any

from rag.cache import normalise_question

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "evals" / "cache-pairs" / "pairs.jsonl"
FIXTURE = ROOT / "tests" / "data" / "cache-pairs" / "pairs.jsonl"
SEED = 13

# How many pairs of each (lang, kind); a kind that applies to fewer questions gets them all.
COUNTS: dict[tuple[str, str], int] = {
    ("en", "politeness"): 150, ("en", "synonym"): 150, ("en", "contraction"): 150, ("en", "word-order"): 150,
    ("en", "punct-case"): 100, ("en", "combined"): 150,
    ("zh", "politeness"): 150, ("zh", "synonym"): 150, ("zh", "word-order"): 150, ("zh", "punct-case"): 100,
    ("zh", "combined"): 150,
    ("en-zh", "translation"): 300,
    ("en", "same-paragraph"): 600, ("zh", "same-paragraph"): 600, ("en-zh", "same-paragraph"): 300,
    ("en", "swap-entity"): 150, ("zh", "swap-entity"): 150, ("en", "swap-number"): 80, ("zh", "swap-number"): 80,
    ("en", "negated"): 80, ("zh", "negated"): 80,
}
FIXTURE_PER_GROUP = 3

HUMAN_PARAPHRASES = (
    ("56d6f3500d65d21400198290", "56d9992fdc89441400fdb59c"), ("56beb4343aeaaa14008c925f", "56d6f3500d65d21400198291"), ("56beb7953aeaaa14008c92ab", "56d7018a0d65d214001982c2"),
    ("56beb7953aeaaa14008c92ac", "56d7018a0d65d214001982c3"), ("56d7018a0d65d214001982c5", "56d99f99dc89441400fdb629"), ("56beb7953aeaaa14008c92af", "56bf36b93aeaaa14008c9564"),
    ("56beb86b3aeaaa14008c92bd", "56d9a0eadc89441400fdb63f"), ("56beb86b3aeaaa14008c92be", "56d704430d65d214001982e1"), ("56beb86b3aeaaa14008c92bf", "56bf3fd53aeaaa14008c9593"),
    ("56bf3fd53aeaaa14008c9594", "56d704430d65d214001982e0"), ("56bf3fd53aeaaa14008c9595", "56d704430d65d214001982de"), ("56bec6ac3aeaaa14008c93fd", "56d9c455dc89441400fdb7c5"),
    ("56d20650e7d4791d00902614", "56d7253b0d65d214001983d4"), ("56d20650e7d4791d00902614", "56d9c455dc89441400fdb7c4"), ("56d7253b0d65d214001983d4", "56d9c455dc89441400fdb7c4"),
    ("56d20650e7d4791d00902615", "56d7253b0d65d214001983d5"), ("56d20650e7d4791d00902615", "56d9c455dc89441400fdb7c6"), ("56d7253b0d65d214001983d5", "56d9c455dc89441400fdb7c6"),
    ("56d726b60d65d214001983ea", "56d9cb47dc89441400fdb833"), ("56d726b60d65d214001983eb", "56d9cb47dc89441400fdb834"), ("56beca913aeaaa14008c946f", "56d726b60d65d214001983ed"),
    ("56beca913aeaaa14008c9470", "56d9cb47dc89441400fdb836"), ("56dfa0d84a1a83140091ebb8", "56e0bb9f7aa994140058e6cd"), ("56dfb5777aa994140058e021", "56e0d6cf231d4119001ac420"),
    ("56dfb5777aa994140058e022", "56e0d6cf231d4119001ac422"), ("572651f9f1498d1400e8dbee", "5726938af1498d1400e8e447"), ("5725b81b271a42140099d099", "5729e2316aef0514001550c6"),
    ("5725b81b271a42140099d09b", "5728349dff5b5019007d9f01"), ("5728349dff5b5019007d9f00", "5729e2316aef0514001550c7"), ("5728349dff5b5019007d9f02", "5729e2316aef0514001550c8"),
    ("5725bae289a1e219009abd90", "5725c337271a42140099d165"), ("5725bae289a1e219009abd90", "5726400589a1e219009ac5ee"), ("5725c337271a42140099d165", "5726400589a1e219009ac5ee"),
    ("5725bae289a1e219009abd91", "5725c337271a42140099d163"), ("5725bae289a1e219009abd91", "5726400589a1e219009ac5f2"), ("5725c337271a42140099d163", "5726400589a1e219009ac5f2"),
    ("5725c337271a42140099d164", "5726400589a1e219009ac5ef"), ("5725c337271a42140099d167", "5726400589a1e219009ac5f0"), ("5725c91e38643c19005accec", "5726449f1125e71900ae192a"),
    ("5725c91e38643c19005acced", "5726449f1125e71900ae1928"), ("5725c91e38643c19005accee", "5726449f1125e71900ae192b"), ("5727213c708984140094da35", "5728d63c4b864d1900164f18"),
    ("5727213c708984140094da38", "5728d63c4b864d1900164f1c"), ("572f6a0ba23a5019007fc5eb", "572ff12e04bcaa1900d76eff"),
)
"""Pairs of XQuAD question ids that crowd workers wrote as the same question about one
paragraph, judged by reading each of the 109 same-paragraph pairs whose answers overlap: the
answer to one is the answer to the other, asked for the same thing ("Who lost to the Broncos
in the divisional round?", "Who did the Broncos beat in the divisional game?"). The rest share
an answer by coincidence ("Who won Super Bowl XLIX?", "Who did the Broncos defeat in the AFC
Championship game?") or only in part, and are in neither set."""

EN_PREFIXES = ("Could you tell me: ", "Can you tell me, ", "Quick question: ", "Please tell me: ",
               "I'd like to know: ", "Hi! ", "I was wondering, ", "Do you know: ")
EN_SUFFIXES = (", please?", "? Thanks!", "? Thank you.", " - any idea?")
ZH_PREFIXES = ("请问", "请问一下，", "我想知道", "我想问一下，", "你好，请问", "麻烦问一下，")
ZH_SUFFIXES = ("呢？", "？谢谢！", "？请告诉我。")
EN_SYNONYMS = {
    "largest": "biggest", "biggest": "largest", "large": "big", "big": "large", "begin": "start",
    "began": "started", "started": "began", "start": "begin", "begins": "starts", "called": "named",
    "named": "called", "located": "situated", "type": "kind", "kind": "type", "types": "kinds",
    "kinds": "types", "built": "constructed", "constructed": "built", "used": "employed", "use": "employ",
    "founded": "established", "established": "founded", "main": "primary", "primary": "main",
    "important": "significant", "significant": "important", "country": "nation", "purchase": "buy",
    "bought": "purchased", "died": "passed away", "often": "frequently", "frequently": "often",
    "quickly": "rapidly", "approximately": "roughly", "roughly": "approximately", "received": "got",
    "allowed": "permitted", "permitted": "allowed", "needed": "required", "required": "needed",
    "need": "require", "ended": "finished", "occurred": "happened", "happened": "occurred",
    "occur": "happen", "happen": "occur", "caused": "led to", "mostly": "mainly", "mainly": "mostly",
    "created": "made", "goal": "aim", "aim": "goal", "Which": "What", "In what year": "In which year",
    "What year": "Which year", "famous": "well-known", "well-known": "famous", "also": "",
    "amount": "quantity", "percentage": "share", "known as": "called", "made up": "composed", "consist": "be made up",
    "What kind of": "What type of", "What type of": "What kind of", "What was the name of": "What was",
}
ZH_SYNONYMS = {
    "什么时候": "何时", "何时": "什么时候", "为什么": "为何", "为何": "为什么", "哪里": "哪儿", "如何": "怎样",
    "怎样": "如何", "哪一年": "哪年", "哪年": "哪一年", "哪个": "哪一个", "哪一个": "哪个", "称为": "叫做",
    "叫做": "称为", "位于": "坐落于", "建立": "创立", "创立": "建立", "大约": "大概", "大概": "大约",
    "是什么": "是啥", "多少个": "几个", "哪些": "什么", "因为": "由于", "由于": "因为", "原因": "缘由",
    "被称为": "被叫做", "最大的": "最大", "主要": "首要", "开始": "开端",
}
CONTRACTIONS = {
    "What is": "What's", "Who is": "Who's", "Where is": "Where's", "How is": "How's", "When is": "When's",
    "What has": "What's", "did not": "didn't", "does not": "doesn't", "do not": "don't", "is not": "isn't",
    "was not": "wasn't", "were not": "weren't", "are not": "aren't", "cannot": "can't", "could not":
    "couldn't", "would not": "wouldn't", "has not": "hasn't", "have not": "haven't", "had not": "hadn't",
    "There is": "There's", "there is": "there's", "It is": "It's", "it is": "it's", "that is": "that's",
}
EN_OPENERS = frozenset({
    "what", "who", "whom", "whose", "where", "when", "why", "how", "which", "in", "during", "after", "before",
    "since", "on", "at", "by", "to", "for", "from", "of", "the", "a", "an", "is", "was", "are", "were", "did",
    "does", "do", "can", "could", "would", "should", "has", "have", "had", "approximately", "along", "name"
})
_EN_PP = re.compile(r"^(?P<body>.+?)[ ,]+(?P<pp>(?:in|during|after|before|since|by|on|at) [^,?]+?)\s*\?$")
_EN_FRONT = re.compile(r"^(?P<pp>(?:In|During|After|Before|Since|By|On|At) [^,?]+?), (?P<body>.+?)\s*\?$")
_DETERMINERS = frozenset({
    "the", "a", "an", "any", "each", "every", "his", "her", "their", "its", "this", "that", "these", "those",
    "first", "second", "third", "fourth", "fifth", "last", "final", "early", "late"
})
_PARTICIPLES = frozenset({
    "called", "known", "named", "made", "built", "found", "held", "born", "seen", "shown", "written", "given",
    "taken", "used", "situated", "based", "set", "put", "run", "sold", "kept", "led", "met", "paid", "sent",
    "spent", "told", "won"
})
_EN_AUX = re.compile(r"\b(did|does|do|can|could|would|should|has|have|had|will|is|was|are|were)\b(?! not\b|n't)")
_EN_NAME = re.compile(r"(?<![\w'’])[A-Z][\w’'-]*(?:\s+(?:of\s+|de\s+|the\s+|von\s+|van\s+)?[A-Z][\w’'-]*)*")
_NUM = re.compile(r"(?<![\d.,])\d+(?![\d.,]\d)")


# -- the rules ---------------------------------------------------------------------------------------
def _lower_first(text: str) -> str:
    first = text.split(" ", 1)[0]
    return text[0].lower() + text[1:] if first.casefold() in EN_OPENERS else text


def _upper_first(text: str) -> str:
    return text[:1].upper() + text[1:]


def _strip_q(text: str) -> str:
    return re.sub(r"\s*[?？]+$", "", text.strip())


def en_politeness(q: str, rng: random.Random) -> str | None:
    if rng.random() < 0.7:
        return rng.choice(EN_PREFIXES) + _lower_first(q)
    return _strip_q(q) + rng.choice(EN_SUFFIXES)


def zh_politeness(q: str, rng: random.Random) -> str | None:
    if rng.random() < 0.7:
        return rng.choice(ZH_PREFIXES) + q
    return _strip_q(q) + rng.choice(ZH_SUFFIXES)


def _substitute(q: str, table: dict[str, str], rng: random.Random, most: int, words: bool) -> str | None:
    def pattern(key: str) -> str:
        return rf"(?<![\w'’]){re.escape(key)}(?![\w'’])" if words else re.escape(key)

    found = sorted({k for k in table if re.search(pattern(k), q)}, key=lambda k: (-len(k), k))
    chosen: list[str] = []
    for key in found:  # longest first; a key inside a chosen one is skipped
        if not any(key in c or c in key for c in chosen):
            chosen.append(key)
    if not chosen:
        return None
    for key in rng.sample(chosen, min(most, len(chosen))):
        q = re.sub(pattern(key), table[key], q, count=1)
    q = re.sub(r"\s{2,}", " ", q).strip()
    return _upper_first(q) if words else q


def en_synonym(q: str, rng: random.Random) -> str | None:
    return _substitute(q, EN_SYNONYMS, rng, 2, words=True)


def zh_synonym(q: str, rng: random.Random) -> str | None:
    return _substitute(q, ZH_SYNONYMS, rng, 2, words=False)


def en_contraction(q: str, rng: random.Random) -> str | None:
    table = {**CONTRACTIONS, **{v: k for k, v in CONTRACTIONS.items() if v != "What's"}}
    return _substitute(q, table, rng, 3, words=True)


def en_word_order(q: str, rng: random.Random) -> str | None:
    if m := _EN_FRONT.match(q):
        return f"{_upper_first(m['body'])} {m['pp'][0].lower()}{m['pp'][1:]}?"
    m = _EN_PP.match(q)
    if m and len(m["pp"].split()) <= 5 and q.split(" ", 1)[0].casefold() in EN_OPENERS and _noun_phrase(
            m["pp"].split()[1:]):
        return f"{_upper_first(m['pp'])}, {_lower_first(m['body'])}?"
    return None


def _noun_phrase(words: list[str]) -> bool:
    """Whether ``words`` look like a short noun phrase: determiners, numbers and capitalised
    words, with at most one other word, the last ("the fourth scale" passes the test too,
    as "fourth" is a determiner here; "Europe support certain travelers" does not)."""
    plain = [i for i, w in enumerate(words) if not (w.casefold() in _DETERMINERS or w[:1].isupper() or w[:1].isdigit())]
    return bool(words) and (not plain or plain == [len(words) - 1]) and words[-1] not in _PARTICIPLES


def zh_word_order(q: str, rng: random.Random) -> str | None:
    body = _strip_q(q)
    for tail, head in (("是什么", "什么是"), ("是谁", "谁是")):
        if re.search(r"[，,、]", body) or len(body) > 24:
            return None
        if body.endswith(tail) and len(body) > len(tail) + 1:
            return f"{head}{body[:-len(tail)]}？"
        if body.startswith(head) and len(body) > len(head) + 1:
            return f"{body[len(head):]}{tail}？"
    return None


def en_punct_case(q: str, rng: random.Random) -> str | None:
    edits: list[Callable[[str], str]] = [
        str.lower,
        lambda s: re.sub(r"[,;:\"“”()'’]", "", s),
        lambda s: re.sub(r"(?<=\w)-(?=\w)", " ", s),
        lambda s: re.sub(r"\s*([,;:])", r" \1", s),
        lambda s: _strip_q(s) + rng.choice(("??", "", " ?", "?!")),
    ]
    for edit in rng.sample(edits, 2):
        q = edit(q)
    return re.sub(r"\s{2,}", " ", q).strip()


def zh_punct_case(q: str, rng: random.Random) -> str | None:
    swap = str.maketrans({"？": "?", "?": "？", "，": ",", ",": "，", "“": "\"", "”": "\"", "（": "(", "）": ")"})
    edits: list[Callable[[str], str]] = [
        lambda s: s.translate(swap),
        lambda s: re.sub(r"[，,、“”\"《》（）()·]", "", s),
        lambda s: _strip_q(s) + rng.choice(("", "？？", "?", " ？")),
        lambda s: re.sub(r"\s+", "", s),
        lambda s: re.sub(r"(?<=[\u4e00-\u9fff])(?=[0-9A-Za-z])|(?<=[0-9A-Za-z])(?=[\u4e00-\u9fff])", " ", s),
    ]
    for edit in rng.sample(edits, 2):
        q = edit(q)
    return q.strip()


def en_combined(q: str, rng: random.Random) -> str | None:
    out = en_word_order(q, rng) or q
    out = (en_synonym if rng.random() < 0.5 else en_contraction)(out, rng) or en_synonym(out, rng) or out
    return en_politeness(out, rng)


def zh_combined(q: str, rng: random.Random) -> str | None:
    out = zh_word_order(q, rng) or q
    out = zh_synonym(out, rng) or out
    return zh_politeness(out, rng)


POSITIVE_RULES: dict[str, dict[str, Callable[[str, random.Random], str | None]]] = {
    "en": {"politeness": en_politeness, "synonym": en_synonym, "contraction": en_contraction,
           "word-order": en_word_order, "punct-case": en_punct_case, "combined": en_combined},
    "zh": {"politeness": zh_politeness, "synonym": zh_synonym, "word-order": zh_word_order,
           "punct-case": zh_punct_case, "combined": zh_combined},
}


# -- minimal edits that change the question -----------------------------------------------------------
def en_names(q: str) -> list[str]:
    """Runs of capitalised words that are names by :mod:`rag.cache_guards`' rule."""
    from rag.cache_guards import entities

    names = entities(q)[0]
    return [m.group(0) for m in _EN_NAME.finditer(q)
            if m.start() > 0 and len(m.group(0)) > 2 and q[m.end():m.end() + 1] != "."
            and any(w.casefold() in names for w in re.findall(r"[0-9A-Za-z\u00c0-\u024f]+", m.group(0)))]


ZH_NAME_TAGS = {"nr": "person", "nrt": "person", "nrfg": "person", "ns": "place", "nt": "organisation",
                "nz": "other"}


def zh_names(q: str) -> list[str]:
    """jieba's proper nouns of ``q`` as ``"tag:name"`` (names joined by a middle dot kept whole)."""
    from rag.lang import jieba as _jieba

    words = [(p.word, p.flag) for p in _jieba().posseg.cut(q)]
    out: list[str] = []
    i = 0
    while i < len(words):
        flag = words[i][1]
        if flag in ZH_NAME_TAGS:
            j = i
            while j + 2 < len(words) and words[j + 1][0] == "·" and words[j + 2][1] in ZH_NAME_TAGS:
                j += 2
            span = "".join(w for w, _ in words[i:j + 1])
            if len(span) > 1:
                out.append(f"{ZH_NAME_TAGS[flag]}:{span}")
            i = j + 1
        else:
            i += 1
    return out


def swap_entity(q: str, pool: list[str], names: Callable[[str], list[str]], rng: random.Random) -> str | None:
    own = names(q)
    if not own:
        return None
    tagged = rng.choice(own)
    tag, _, name = tagged.rpartition(":")  # Chinese names carry their tag; a swap keeps it
    others = [p.rpartition(":")[2] for p in pool if p.rpartition(":")[0] == tag]
    others = [p for p in others if p not in q and not set(_parts(p)) & set(_parts(name))]
    if not others:
        return None
    return q.replace(name, rng.choice(others), 1)


def _parts(name: str) -> list[str]:
    """What two names must not share to be different names: words, or Han characters."""
    return re.findall(r"[\u4e00-\u9fff]|[^\W_]+", name.casefold())


def swap_number(q: str, rng: random.Random) -> str | None:
    found = list(_NUM.finditer(q))
    if not found:
        return None
    m = rng.choice(found)
    n = int(m.group(0))
    step = rng.randint(1, 15) if 1000 <= n <= 2100 else rng.randint(1, 3)
    new = n - step if n - step > 0 and rng.random() < 0.5 else n + step
    return q[:m.start()] + str(new) + q[m.end():]


def en_negated(q: str, rng: random.Random) -> str | None:
    m = _EN_AUX.search(q)
    if not m:
        return None
    aux = m.group(1)
    if aux in ("is", "was", "are", "were"):
        return q[:m.end()] + " not" + q[m.end():]
    contracted = {"will": "won't", "can": "can't"}.get(aux, aux + "n't")
    return q[:m.start()] + contracted + q[m.end():]


def zh_negated(q: str, rng: random.Random) -> str | None:
    from rag.lang import jieba as _jieba

    words = _jieba().lcut(q)
    for word, negation in (("是", "不是"), ("有", "没有"), ("能", "不能"), ("会", "不会"), ("可以", "不可以")):
        if word in words:
            i = words.index(word)
            if i > 0 and words[i - 1] in ("不", "没", "未"):
                continue
            return "".join(words[:i] + [negation] + words[i + 1:])
    return None


# -- the data ------------------------------------------------------------------------------------------
def load_xquad(data: Path) -> dict[str, dict[str, Any]]:
    """XQuAD's questions by id: ``{"en", "zh", "paragraph", "article", "answers"}`` (English answers)."""
    out: dict[str, dict[str, Any]] = {}
    paragraphs: dict[str, str] = {}
    with open(data / "xquad-en" / "qrels.tsv", encoding="utf-8") as fh:
        for line in list(fh)[1:]:
            qid, doc, _ = line.rstrip("\n").split("\t")
            paragraphs[qid] = doc
    for lang in ("en", "zh"):
        with open(data / f"xquad-{lang}" / "queries.jsonl", encoding="utf-8") as fh:
            for line in fh:
                row = json.loads(line)
                doc = paragraphs[row["id"]]
                entry = out.setdefault(row["id"], {"paragraph": doc, "article": doc.rsplit("-", 1)[0]})
                entry[lang] = row["text"]
                if lang == "en":
                    entry["answers"] = {a.casefold().strip(" .") for a in row.get("answers", ())}
    return out


def _split_of(articles: list[str], seed: int) -> dict[str, str]:
    order = sorted(articles)
    random.Random(seed).shuffle(order)
    half = len(order) // 2
    return {a: ("dev" if i < half else "test") for i, a in enumerate(order)}


def build_pairs(data: Path, seed: int = SEED) -> list[dict[str, Any]]:
    """Every pair of the committed set, in a fixed order."""
    questions = load_xquad(data)
    ids = sorted(questions)
    split = _split_of(list({q["article"] for q in questions.values()}), seed)
    rows: list[dict[str, Any]] = []

    def add(a: str, b: str, same: bool, kind: str, lang: str, qid: str) -> None:
        rows.append({"a": a, "b": b, "same": same, "kind": kind, "lang": lang,
                     "split": split[questions[qid]["article"]]})

    def draw(lang: str, kind: str, make: Callable[[str, random.Random], tuple[str, str] | None]) -> None:
        rng = random.Random(f"{seed}:{lang}:{kind}")
        order = ids[:]
        rng.shuffle(order)
        made, seen = 0, set()
        for qid in order:
            if made >= COUNTS[(lang, kind)]:
                break
            pair = make(qid, rng)
            if pair is None or normalise_question(pair[0]) == normalise_question(pair[1]) or pair in seen:
                continue  # the exact cache serves these already
            seen.add(pair)
            add(*pair, kind not in NEGATIVE_KINDS, kind, lang, qid)
            made += 1

    for lang, rules in POSITIVE_RULES.items():
        for kind, rule in rules.items():
            draw(lang, kind, lambda qid, rng, rule=rule, lang=lang: _pair(questions[qid][lang], rule(  # type: ignore[misc]
                questions[qid][lang], rng)))
    draw("en-zh", "translation", lambda qid, rng: (questions[qid]["en"], questions[qid]["zh"]))
    for x, y in HUMAN_PARAPHRASES:
        x, y = f"xquad-{x}", f"xquad-{y}"
        for lang, (la, lb) in (("en", ("en", "en")), ("zh", ("zh", "zh")), ("en-zh", ("en", "zh"))):
            a, b = questions[x][la], questions[y][lb]
            if normalise_question(a) != normalise_question(b):
                add(a, b, True, "human-paraphrase", lang, x)

    by_paragraph: dict[str, list[str]] = defaultdict(list)
    for qid in ids:
        by_paragraph[questions[qid]["paragraph"]].append(qid)
    couples = [(x, y) for p in sorted(by_paragraph) for x, y in combinations(by_paragraph[p], 2)
               if not _overlap(questions[x]["answers"], questions[y]["answers"])]
    for lang in ("en", "zh", "en-zh"):
        rng = random.Random(f"{seed}:{lang}:same-paragraph")
        for x, y in sorted(rng.sample(couples, COUNTS[(lang, "same-paragraph")])):
            if rng.random() < 0.5:
                x, y = y, x
            la, lb = ("en", "zh") if lang == "en-zh" else (lang, lang)
            if questions[x][la] != questions[y][lb]:
                add(questions[x][la], questions[y][lb], False, "same-paragraph", lang, x)

    for lang, names in (("en", en_names), ("zh", zh_names)):
        pools: dict[str, list[str]] = defaultdict(list)
        for qid in ids:
            pools[questions[qid]["article"]].extend(names(questions[qid][lang]))
        pool = {article: sorted(set(found)) for article, found in pools.items()}
        draw(lang, "swap-entity", lambda qid, rng, lang=lang, names=names, pool=pool: _pair(  # type: ignore[misc]
            questions[qid][lang], swap_entity(questions[qid][lang], pool[questions[qid]["article"]], names, rng)))
        draw(lang, "swap-number", lambda qid, rng, lang=lang: _pair(questions[qid][lang], swap_number(  # type: ignore[misc]
            questions[qid][lang], rng)))
        negate = en_negated if lang == "en" else zh_negated
        draw(lang, "negated", lambda qid, rng, lang=lang, negate=negate: _pair(questions[qid][lang], negate(  # type: ignore[misc]
            questions[qid][lang], rng)))
    return rows


NEGATIVE_KINDS = frozenset({"same-paragraph", "swap-entity", "swap-number", "negated", "rgb-related"})


def _overlap(a: set[str], b: set[str]) -> bool:
    """Whether two questions share an answer (one answer inside another counts): such pairs
    may be the same question asked twice, so they are no negatives."""
    return any(x in y or y in x for x in a for y in b)


def _pair(a: str, b: str | None) -> tuple[str, str] | None:
    return None if b is None else (a, b)


def rgb_pairs(folder: Path, per_question: int = 3) -> list[dict[str, Any]]:
    """RGB-zh negatives: each question with its most similar others by character bigrams."""
    with open(folder / "queries.jsonl", encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh]

    def grams(text: str) -> set[str]:
        text = re.sub(r"\W", "", text)
        return {text[i:i + 2] for i in range(len(text) - 1)}

    def answers(row: dict[str, Any]) -> set[str]:
        return {a.casefold() for a in row.get("answers", ())}

    g = [grams(r["text"]) for r in rows]
    seen: set[tuple[int, int]] = set()
    out = []
    for i, row in enumerate(rows):
        scored = sorted(((len(g[i] & g[j]) / max(1, len(g[i] | g[j])), j) for j in range(len(rows)) if j != i),
                        reverse=True)
        for _, j in scored[:per_question]:
            key = (min(i, j), max(i, j))
            if key in seen or answers(row) & answers(rows[j]) or row["text"] == rows[j]["text"]:
                continue
            seen.add(key)
            out.append({"a": row["text"], "b": rows[j]["text"], "same": False, "kind": "rgb-related", "lang": "zh",
                        "split": "test"})
    return out


def fixture(rows: list[dict[str, Any]], per_group: int = FIXTURE_PER_GROUP) -> Iterator[dict[str, Any]]:
    """The first ``per_group`` English pairs of each kind: the tests' small set (MiniLM is English)."""
    taken: dict[str, int] = defaultdict(int)
    for row in rows:
        if row["lang"] == "en" and taken[row["kind"]] < per_group:
            taken[row["kind"]] += 1
            yield row


def write_jsonl(path: Path, rows: Iterator[dict[str, Any]] | list[dict[str, Any]]) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with open(path, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n")
            n += 1
    return n


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=ROOT / "tests" / "data", help="holds xquad-en/ and xquad-zh/")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--fixture", type=Path, default=FIXTURE)
    parser.add_argument("--rgb", type=Path, help="an RGB-zh folder (queries.jsonl) for rgb-related negatives")
    parser.add_argument("--rgb-out", type=Path, default=Path("cache-pairs-rgb.jsonl"))
    args = parser.parse_args(argv)
    rows = build_pairs(args.data, args.seed)
    counts: dict[tuple[str, str, bool], int] = defaultdict(int)
    for row in rows:
        counts[(row["lang"], row["kind"], row["same"])] += 1
    print(f"{write_jsonl(args.out, rows)} pairs -> {args.out}")
    for (lang, kind, same), n in sorted(counts.items(), key=lambda kv: (not kv[0][2], kv[0][0], kv[0][1])):
        print(f"  {lang:6} {kind:15} {'same' if same else 'different':9} {n}")
    print(f"{write_jsonl(args.fixture, fixture(rows))} pairs -> {args.fixture}")
    if args.rgb:
        print(f"{write_jsonl(args.rgb_out, rgb_pairs(args.rgb))} pairs -> {args.rgb_out}")


if __name__ == "__main__":
    main()
