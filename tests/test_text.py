"""rag.text: the script classes, the language detector's two thresholds, the token estimate
and the one-line shortening that the rest of the code shares."""

from __future__ import annotations

import pytest

from ingest.normalize import detect_lang as document_detect
from rag import lang
from rag.embedders.use import UniversalSentenceEncoderEmbedder
from rag.generators.extractive import ExtractiveGenerator
from rag.generators.openai_server import estimate_tokens as server_estimate
from rag.lexical.tokenize import cjk_terms
from rag.text import (
    DOCUMENT_ZH_SHARE,
    HAN,
    HAN_RUN,
    QUESTION_ZH_SHARE,
    UNSPACED,
    detect_lang,
    document_lang,
    estimate_tokens,
    shorten,
)


def test_han_covers_the_extensions_and_compatibility_forms_but_not_punctuation() -> None:
    for ch in "中文丽\u3400\u4dbf\U00020000\U0002a700\U00030000\uf900":  # URO, ext A, B, C, G, compatibility
        assert HAN.fullmatch(ch), hex(ord(ch))
    for ch in "。，！a1ひカ한":
        assert not HAN.fullmatch(ch), ch
    assert HAN_RUN.findall("用 Python 写北京的天气") == ["用", "写北京的天气"]


def test_unspaced_scripts_are_han_kana_and_hangul() -> None:
    assert all(UNSPACED.fullmatch(ch) for ch in "中ひカ한ㄅ")
    assert not any(UNSPACED.fullmatch(ch) for ch in "a1é。 ")


def test_questions_and_documents_have_their_own_thresholds() -> None:
    # 2 Han of 8 letters: 25%, between the document (20%) and question (30%) shares
    text = "What is 北京?"
    assert DOCUMENT_ZH_SHARE < 0.25 < QUESTION_ZH_SHARE
    assert detect_lang(text) == "en" and document_lang(text) == "zh"
    assert detect_lang("北京是什么 city") == "zh"
    assert detect_lang("1234 !!") == "en" and document_lang("1234 !!") == "und"
    # rag.lang and ingest.normalize are the same detector
    assert lang.detect_lang is detect_lang and lang.CJK is HAN
    assert document_detect("检索增强生成 uses a retriever 和 一个生成模型") == "zh"


def test_a_document_is_read_from_its_beginning() -> None:
    assert document_lang("中文" * 5_000 + " english" * 10_000) == "zh"  # 12.5% of all its letters
    assert document_lang("english " * 10_000 + "中文" * 100_000) == "en"


@pytest.mark.parametrize(("text", "tokens"), [
    ("", 0),
    ("The capital of France is Paris.", 7),
    ("Hello, world!", 4),
    ("北京是中国的首都。", 9),
    ("使用Python编程", 5),     # Latin inside Chinese is one word, each Han character one token
    ("snake_case x2 3.5", 7),  # snake, _, case, x2, 3, ., 5
    ("こんにちは 세계", 7),
])
def test_estimate_tokens(text: str, tokens: int) -> None:
    assert estimate_tokens(text) == tokens


def test_the_upper_estimate_is_above_a_real_tokenizer() -> None:
    assert estimate_tokens("北京是中国的首都", upper=True) == 8
    assert estimate_tokens("abcdef", upper=True) == 2
    assert estimate_tokens("（全角）", upper=True) == 4  # full-width punctuation counts one each
    assert server_estimate("The capital of France is Paris.") == estimate_tokens(
        "The capital of France is Paris.", upper=True) == 11


def test_the_answerer_and_the_embedder_fallback_use_the_one_estimate() -> None:
    text = "使用Python编程, and more words."
    assert ExtractiveGenerator().count_tokens(text) == estimate_tokens(text) == 10
    use = UniversalSentenceEncoderEmbedder()
    use._use = object()  # a package version without the tokenizer: the fallback counts
    assert use.count_tokens_batch([text, ""]) == [10, 0]


def test_jieba_segments_every_han_run() -> None:
    assert cjk_terms("北京 and 上海") == ["北京", "上海"]


def test_shorten() -> None:
    assert shorten("a   long\n message") == "a long message"
    assert shorten("a   long\nmessage", 8) == "a long …"
    assert len(shorten("x" * 1000)) == 300 and shorten("x" * 1000).endswith("…")
    assert shorten(ValueError("bad\n  value")) == "bad value"
    with pytest.raises(ValueError, match="limit"):
        shorten("x", 0)
