"""The semantic cache's guards (rag.cache_guards) on real near-duplicate questions."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rag.cache_guards import (
    GUARDS,
    entities,
    negated,
    numbers,
    qtypes,
    same_entities,
    same_language,
    same_negation,
    same_numbers,
    same_qtype,
    same_question,
)
from rag.errors import ConfigError

# Pairs a cache must tell apart, each stopped by the named guard (and passed by the others).
DIFFERENT = [
    ("numbers", "What is new in Python 3.11?", "What is new in Python 3.12?"),
    ("numbers", "How old was Manning when he played Super Bowl 50?", "How old was Manning when he played Super Bowl 52?"),
    ("numbers", "１９９０年有多少人？", "1991年有多少人？"),  # full-width digits are digits
    ("entities", "How many tackles did Luke Kuechly register?", "How many tackles did Josh Norman register?"),
    ("entities", "Denver beat whom?", "Carolina beat whom?"),  # a name first in the question is still a name
    ("entities", "卢克·坎克利贡献了多少次擒抱？", "乔希·诺曼贡献了多少次擒抱？"),
    ("entities", "流经宾根和波恩之间的莱茵河中游流向哪里？", "流经宾根和波恩之间的多瑙河中游流向哪里？"),
    ("entities", "电视剧《不期而至》的主演是谁？", "《护卫者》的主演是谁？"),  # RGB-zh; USE: 0.86
    ("negation", "How do I read a file?", "How do I not read a file?"),
    ("negation", "Why did Tesla finish?", "Why didn't Tesla finish?"),
    ("negation", "Were the tapes restored without damage or did some lose legitimacy?",
     "Were the tapes restored without damage or didn't some lose legitimacy?"),  # counted, not just present
    ("negation", "哪个队赢了？", "哪个队没有赢？"),
    ("qtype", "Who sequenced the first plastome?", "When was the first plastome sequenced?"),
    ("qtype", "谁发现了氧气？", "什么时候发现了氧气？"),
    ("language", "What is the capital of France?", "法国的首都是什么？"),
]

# Rephrasings every guard lets through.
SAME = [
    ("Who founded McKinsey?", "Could you tell me who founded McKinsey?"),
    ("When will Ford's manufacturing plants close?", "when will fords manufacturing plants close"),
    ("What year did Tesla die?", "In which year did Tesla die? Thanks!"),
    ("What is the hymn known as in English?", "In English, what's the hymn known as?"),
    ("How many Grammys has Lady Gaga won?", "Quick question: how many Grammys has Lady Gaga won?"),
    ("Why didn't the Panthers score?", "Why did the Panthers not score?"),
    ("Python 3.11 release date", "When was Python 3.11 released?"),  # no question word on one side
    ("卢克·坎克利贡献了多少次擒抱？", "请问卢克·坎克利贡献了多少次擒抱？"),
    ("弗里德里希•拉采尔认为帝国主义是什么？", "请问弗里德里希·拉采尔认为帝国主义是啥"),  # two kinds of middle dot
    ("这两个有什么不同？", "这两个有什么区别？"),  # 不同 "different" is not a negation
    ("他什么时候出生？", "他何时出生？"),
    ("约翰·埃尔维在第 33 届超级碗中为谁效力？", "约翰埃尔维在第 33 届超级碗中为谁效力?"),
    ("Who recovered the strip ball?", "What is the last name of the player who recovered the ball?"),
]


@pytest.mark.parametrize(("guard", "a", "b"), DIFFERENT)
def test_each_guard_stops_its_kind_of_different_question(guard: str, a: str, b: str) -> None:
    assert not GUARDS[guard](a, b) and not GUARDS[guard](b, a)
    assert not same_question(a, b, GUARDS)
    others = [name for name in GUARDS if name != guard]
    assert same_question(a, b, others), f"another guard than {guard} stopped it"


@pytest.mark.parametrize(("a", "b"), SAME)
def test_rephrasings_pass_every_guard(a: str, b: str) -> None:
    for name, guard in GUARDS.items():
        assert guard(a, b) and guard(b, a), name
    assert same_question(a, b, GUARDS)


def test_what_each_guard_compares() -> None:
    assert numbers("Python 3.11 or 3.12, in 2,024?") == ("2,024", "3.11", "3.12")
    assert numbers("没有数字") == ()
    latin, han = entities("Could you tell me how many tackles Luke Kuechly made?")
    assert latin == {"luke", "kuechly"} and han == frozenset()  # "Could" opens the question, no name
    assert entities("how many tackles did luke kuechly make")[0] == frozenset()  # no case, no names
    assert "马丁路德" in entities("在马丁·路德的时代人们需要什么？")[1]  # compared without the dot
    assert "谢谢" not in entities("玛丽·麦特琳翻译了什么？谢谢！")[1]
    assert negated("Why didn't it work without a key?") == 2
    assert negated("非常不同的两种方法") == 0 and negated("这不是问题") == 1
    assert qtypes("In what year did Tesla die?") == {"time"}
    assert qtypes("How many points did they score?") == {"quantity"}
    assert qtypes("他几乎什么都做了") == {"thing"}  # 几乎 "almost" is no 几 "how many"
    assert qtypes("Python 3.11 release date") == frozenset()
    assert qtypes("这个过程称为什么？") == {"thing"}  # 称为 + 什么, not 为什么 "why"
    assert qtypes("它是啥时候推出的？") == qtypes("它是什么时候推出的？") == {"time"}
    assert qtypes("What was the last name of the player who recovered the ball?") == {"person"}


def test_entities_across_languages_are_left_to_the_language_guard() -> None:
    a, b = "Who founded McKinsey?", "谁创立了麦肯锡公司？"
    assert same_entities(a, b) and same_numbers(a, b) and same_negation(a, b) and same_qtype(a, b)
    assert not same_language(a, b)
    assert same_language(a, b, multilingual=True)
    assert not same_question(a, b, GUARDS)
    assert same_question(a, b, GUARDS, multilingual=True)


def test_same_question_with_no_guards_and_unknown_names() -> None:
    assert same_question("Python 3.11?", "Python 3.12?", [])
    assert same_question("Python 3.11?", "Python 3.12?", ["negation"])
    with pytest.raises(ConfigError, match="unknown cache guard 'spelling'"):
        same_question("a", "b", ["numbers", "spelling"])


def test_importing_the_guards_loads_no_model_or_jieba() -> None:
    code = ("import sys, rag.cache_guards as g; g.same_question('Python 3.11?', 'Python 3.12?', g.GUARDS); "
            "print(sorted(m for m in ('jieba', 'torch', 'numpy', 'sentence_transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"  # English questions never need jieba
