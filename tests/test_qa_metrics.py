"""Answer metrics on hand-checked cases (each expected value worked out by hand in the comment)."""

from __future__ import annotations

import pytest

from evals.qa_metrics import (
    abstained,
    answer_scores,
    bleu4,
    citation_scores,
    contains_gold,
    exact_match,
    f1,
    normalize_en,
    rouge_l,
    tokens_zh,
)
from rag.prompts import UNKNOWN
from rag.support import content_words, labels_of, split_sentences, strip_labels, support_score


def test_squad_normalisation() -> None:
    assert normalize_en("The Cat, sat!  on a mat.") == "cat sat on mat"
    assert exact_match("The Panthers.", ["panthers"]) == 1.0
    assert exact_match("Panthers [2]", ["Carolina Panthers"]) == 0.0  # the label is not part of the answer


@pytest.mark.parametrize(("answer", "golds", "expected"), [
    # tokens: panthers gave up 308 points (5); gold 308 (1): p 1/5, r 1 -> 2*0.2/1.2
    ("The Panthers gave up 308 points [1].", ["308"], 1 / 3),
    # denver broncos vs broncos: p 1/2, r 1
    ("Denver Broncos", ["Broncos"], 2 / 3),
    # the best alternative counts: "the broncos" normalises to "broncos" -> 1.0
    ("Denver Broncos", ["Carolina", "the Denver Broncos"], 1.0),
    ("nothing in common", ["Broncos"], 0.0),
])
def test_english_f1(answer: str, golds: list[str], expected: float) -> None:
    assert f1(answer, golds, "en") == pytest.approx(expected)


def test_chinese_f1_is_cmrc_longest_common_run() -> None:
    # 黑 豹 队 丢 了 308 分 (7 tokens), gold 308 分 (2): common run 2 -> p 2/7, r 1 -> 4/9
    assert f1("黑豹队丢了308分。", ["308分"], "zh") == pytest.approx(4 / 9)
    # the same tokens in another order: the longest common run is 1 -> p 1/2, r 1/2 (a bag would say 1.0)
    assert f1("分308", ["308分"], "zh") == pytest.approx(0.5)
    # punctuation and spaces do not count; full-width digits fold to ASCII (NFKC)
    assert exact_match("３０８ 分！", ["308分"], "zh") == 1.0


def test_chinese_tokens() -> None:
    assert tokens_zh("黑豹队丢了308分。") == ["黑", "豹", "队", "丢", "了", "308", "分"]
    assert tokens_zh("NFL 联盟，Super Bowl") == ["nfl", "联", "盟", "super", "bowl"]


def test_contains_gold() -> None:
    assert contains_gold("They scored 308 points [1].", ["308"])
    assert not contains_gold("In 2012 the team moved.", ["12"])  # whole words in English
    assert contains_gold("首趟班列从南宁始发。[1]", ["南宁"], "zh")
    # RGB parts: every part needs one of its alternatives
    parts = [["1月3日", "1月3号"], ["北京"]]
    assert contains_gold("1月3号在北京举行", parts, "zh")
    assert not contains_gold("1月3日在上海举行", parts, "zh")
    # Chinese gold text inside an English-classified answer is still compared without spaces
    assert contains_gold("The answer is 南 宁", ["南宁"], "en")


def test_bleu4_and_rouge_l() -> None:
    assert bleu4("308", ["308"]) == pytest.approx(1.0)
    near = bleu4("the Panthers allowed 308 points", ["Panthers allowed 308 points"])
    far = bleu4("a sunny day in the park", ["Panthers allowed 308 points"])
    assert near > 0.5 > far
    # LCS "the cat sat" = 3 of 3 predicted, 3 of 6 reference -> F = 2*1*0.5/1.5
    assert rouge_l("the cat sat", ["the cat sat on the mat"]) == pytest.approx(2 / 3)
    # characters: 黑豹队 (3) against 黑豹队防守 (5): p 1, r 3/5 -> 0.75
    assert rouge_l("黑豹队", ["黑豹队防守"], "zh") == pytest.approx(0.75)
    assert bleu4("黑豹队防守", ["黑豹队防守"], "zh") == pytest.approx(1.0)


def test_abstained() -> None:
    assert abstained(UNKNOWN["en"]) and abstained(UNKNOWN["zh"])
    assert abstained("I do not know; the context does not say.")
    assert abstained("I  don’t\nknow.") and abstained("文档无法回答这个问题。")  # spacing, curly quote
    assert not abstained("The answer is 308 [1].")
    assert not abstained("Nobody knows where he went [2].")


def test_answer_scores_keys() -> None:
    scores = answer_scores("Denver Broncos [1]", ["Denver Broncos"], "en")
    assert scores == {"em": 1.0, "f1": 1.0, "contains_gold": 1.0, "bleu4": pytest.approx(1.0), "rouge_l": 1.0}
    # BLEU sees the full stop as a token (sacrebleu's 13a), the SQuAD metrics do not
    dotted = answer_scores("Denver Broncos [1].", ["Denver Broncos"], "en")
    assert dotted["em"] == 1.0 and dotted["bleu4"] < 0.9
    rgb = answer_scores("1月3号在北京", [], "zh", parts=[["1月3日", "1月3号"], ["北京"]])
    assert rgb["contains_gold"] == 1.0


def test_citation_scores() -> None:
    answer = "The Panthers allowed 308 points [1]. They won the game [2]."
    cited = {1: ("d1", "The Panthers defense gave up just 308 points."), 2: ("d2", "The weather was cold.")}
    s = citation_scores(answer, cited, {"d1"}, ["308"], "en")
    # [1] is a gold document, [2] is not: accuracy 1, precision 1/2.
    # sentence 1: panthers allowed 308 points -> 3 of 4 in passage 1 (>= 0.5); sentence 2: they won game -> 0 of 3
    assert s == {"compliance": 1.0, "citation_accuracy": 1.0, "citation_precision": 0.5, "support": 0.5,
                 "unlabelled": 0.0}
    # a chunk of another document that holds the gold answer also counts as accurate
    other = citation_scores("308 points [1].", {1: ("d9", "They allowed 308 points.")}, {"d1"}, ["308"], "en")
    assert other["citation_accuracy"] == 1.0
    none = citation_scores("The Panthers allowed 308 points.", {}, {"d1"}, ["308"], "en")
    assert none == {"compliance": 0.0, "citation_accuracy": 0.0, "citation_precision": None, "support": None,
                    "unlabelled": 1.0}
    zh = citation_scores("黑豹队丢了308分。[1]南宁很远。", {1: ("d1", "黑豹队的防守只丢了 308分")}, {"d1"}, ["308分"], "zh")
    assert zh["support"] == 1.0 and zh["unlabelled"] == 0.5


def test_sentences_and_labels() -> None:
    assert split_sentences("Paris is the capital [1]. It has 2.1M people. [2] Version 3.5 is out! 北京是首都。[3]他好")\
        == ["Paris is the capital [1].", "It has 2.1M people. [2]", "Version 3.5 is out!", "北京是首都。[3]", "他好"]
    assert split_sentences("The answer is 308 [1][2].") == ["The answer is 308 [1][2]."]
    assert split_sentences("It is 308. [1]\n[2]") == ["It is 308. [1] [2]"]  # a label alone joins the sentence
    assert labels_of("a [1, 2] b 【3】 [1]") == [1, 2, 3]
    assert strip_labels("Paris [1]. Next [2, 3]") == "Paris. Next"
    assert content_words("What is the GIL [1]?") == {"gil"}
    assert support_score("The Panthers allowed 308 points [1].", "the Panthers defense gave up 308 points") == 0.75
