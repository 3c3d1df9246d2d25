"""Prompt templates, citation post-processing and the sampling policy."""

from __future__ import annotations

import pytest

from rag.config import SamplingSettings
from rag.errors import RequestError
from rag.lang import detect_lang
from rag.packing import PackedContext
from rag.prompts import (
    UNKNOWN,
    CitationStream,
    PromptExample,
    build_prompt,
    cite,
)
from rag.sampling import SamplingPolicy, classify_question
from rag.types import Chunk, Citation, Passage

CITES = {n: Citation(n, f"c{n}", f"d{n}", f"Doc {n}", f"https://x.org/{n}") for n in (1, 2, 3)}


def packed(texts: list[str]) -> PackedContext:
    passages = tuple(Passage(i + 1, Chunk(id=f"c{i + 1}", doc_id="d", source="s", text=t, hash=t))
                     for i, t in enumerate(texts))
    text = "\n\n".join(f"[{p.label}] Doc\n{p.chunk.text}" for p in passages)
    return PackedContext(text, passages, {p.label: CITES[p.label] for p in passages}, 10, 100)


def test_english_and_chinese_templates_have_the_sections_and_rules():
    en = build_prompt("How do I open a file?", packed(["Use open()."]))
    assert en.lang == "en" and [m["role"] for m in en.messages] == ["system", "user"]
    assert "cite" in en.messages[0]["content"] and UNKNOWN["en"] in en.messages[0]["content"]
    user = en.messages[1]["content"]
    assert user.index("<context>") < user.index("[1] Doc\nUse open().") < user.index("</context>")
    assert "<question>\nHow do I open a file?\n</question>" in user
    assert en.completion.startswith("<system>\n") and en.completion.endswith("<answer>\n")
    assert en.stop == ("</answer>",)
    zh = build_prompt("如何打开文件？", packed(["使用 open()。"]))
    assert zh.lang == "zh" and UNKNOWN["zh"] in zh.messages[0]["content"] and "标签" in zh.messages[0]["content"]
    assert detect_lang("What is 北京?") == "en" and detect_lang("北京是什么 city") == "zh"


def test_history_and_few_shot_examples_go_in_order():
    examples = [PromptExample("Q?", "[1] ctx", "A [1].", "en"), PromptExample("问？", "[1] 文", "答 [1]。", "zh")]
    prompt = build_prompt("And then?", packed(["x"]), examples=examples,
                          history=[{"role": "user", "content": "First?"}, {"role": "assistant", "content": "One."},
                                   {"role": "tool", "content": "ignored"}])
    assert [m["role"] for m in prompt.messages] == ["system", "user", "assistant", "user"]
    assert "<example>" in prompt.messages[0]["content"] and "A [1]." in prompt.messages[0]["content"]
    assert "答 [1]。" not in prompt.messages[0]["content"]
    assert "<user>First?</user>\n<assistant>One.</assistant>" in prompt.completion


def test_cite_keeps_known_labels_and_drops_invented_ones():
    text, used = cite("Paris [2]. Also Lyon [7], and Nice [1, 9]【3】.", CITES)
    assert text == "Paris [2]. Also Lyon, and Nice [1][3]."
    assert [c.label for c in used] == [2, 1, 3]
    assert cite("no labels", CITES) == ("no labels", [])


def test_citation_stream_never_splits_a_label():
    stream = CitationStream(CITES)
    out = "".join(stream.feed(piece) for piece in ["Paris is the capital [", "2", "] and [", "9", "].", " Done [1"])
    out += stream.flush()
    assert out == "Paris is the capital [2] and. Done [1"  # an unclosed bracket at the end is text
    assert [c.label for c in stream.cited] == [2]
    stream = CitationStream(CITES)
    assert "".join([stream.feed("A【"), stream.feed("1】 B [3"), stream.feed("]"), stream.flush()]) == "A[1] B [3]"
    assert [c.label for c in stream.cited] == [1, 3]


@pytest.mark.parametrize(("question", "kind"), [
    ("What is the default timeout?", "factual"),
    ("When was Python 3.11 released", "factual"),
    ("Python 3.11 是什么时候发布的？", "factual"),
    ("Write a haiku about TLS", "creative"),
    ("帮我写一首关于春天的诗", "creative"),
    ("Brainstorm names for our wiki", "creative"),
    ("Thoughts on our release process", "open"),
])
def test_questions_are_classified(question, kind):
    assert classify_question(question) == kind


def test_temperature_by_kind_and_turn_with_a_floor():
    policy = SamplingPolicy(SamplingSettings())
    assert policy.params("What is the GIL?").temperature == 0.3
    assert policy.params("Write a poem about the GIL").temperature == 1.2
    assert [policy.params("Thoughts on the GIL", turn=t).temperature for t in (1, 2, 3, 8, 20)] == \
        [1.0, 0.9, 0.8, 0.3, 0.3]
    assert policy.params("Write a poem", turn=4).temperature == pytest.approx(0.9)
    p = policy.params("What is it?")
    assert (p.top_p, p.repetition_penalty, p.max_tokens) == (0.9, 1.2, 512)


def test_overrides_are_checked_against_the_limits():
    policy = SamplingPolicy(SamplingSettings(max_tokens_limit=1024, max_temperature=1.5))
    p = policy.params("What?", overrides={"temperature": 0.0, "max_tokens": 100, "stop": "END", "top_p": None})
    assert (p.temperature, p.max_tokens, p.stop, p.top_p) == (0.0, 100, ("END",), 0.9)
    for bad, field in [({"temperature": 1.9}, "temperature"), ({"max_tokens": 5000}, "max_tokens"),
                       ({"max_tokens": 1.5}, "max_tokens"), ({"top_p": 0}, "top_p"),
                       ({"repetition_penalty": 3}, "repetition_penalty"), ({"stop": ["a"] * 5}, "stop"),
                       ({"temperature": "hot"}, "temperature"), ({"logit_bias": {}}, "logit_bias")]:
        with pytest.raises(RequestError) as err:
            policy.params("What?", overrides=bad)
        assert err.value.field == field
