"""What every :class:`rag.types.Embedder` promises. Subclass the suite and provide ``embedder``.

The Protocol asks for a ``name``, the ``languages`` it ranks well, a ``dim``, and unit-length
float32 vectors from ``embed_documents`` (one row per text) and ``embed_query``. Ingestion
also uses ``count_tokens`` (the chunker's length function) and ``max_text_tokens`` (the most
a chunk may hold) where a backend has them, so the suite checks those agree with the vectors:
a chunk of ``max_text_tokens`` is read to its end, and anything past it is cut, not an error.

Example::

    class TestMyEmbedder(EmbedderSuite):
        batch_atol = 1e-4           # how far a text's vector may move with its batch

        @pytest.fixture
        def embedder(self, my_embedder):  # a module-scoped fixture: the model loads once
            return my_embedder
"""

from __future__ import annotations

import numpy as np
import pytest

from ingest.chunking import Chunker
from rag.types import Embedder

__all__ = ["EmbedderSuite", "PARAGRAPH"]

PASSAGES = [
    "Reset your password from the account settings page.",
    "The Eiffel Tower was completed in 1889 for the World's Fair in Paris.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "北京是中华人民共和国的首都。",
    "ok",
]
QUERY, ANSWER = "how do I reset my password", 0
# A paraphrase, the text it paraphrases, and an unrelated text.
PARAPHRASE = ("Steps to reset a forgotten account password.", "How can I reset my forgotten password?",
              "Stock markets fell sharply on Monday morning.")
PARAGRAPH = (
    "Rivers carry water from the mountains to the sea. Along the way they cut valleys, "
    "move stones and sand, and feed the farms on their banks. Floods bring silt that makes "
    "the soil rich, and dams store water for the dry months and turn it into electricity. "
)


def _unit_rows(vectors: np.ndarray, dim: int) -> None:
    assert vectors.dtype == np.float32
    assert vectors.shape[-1] == dim
    assert np.isfinite(vectors).all()
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=-1), 1.0, atol=1e-5)


class EmbedderSuite:
    """Contract tests; ``embedder`` is the subclass's fixture."""

    batch_atol: float = 1e-5  # a text's vector alone vs. in a batch (int8/4-bit engines pad differently)
    long_repeats: int = 12  # PARAGRAPH repeated (about 60 tokens each): past every model's limit

    def test_is_an_embedder_with_a_name_dim_and_languages(self, embedder: Embedder) -> None:
        assert isinstance(embedder, Embedder)
        assert isinstance(embedder.name, str) and embedder.name
        assert isinstance(embedder.dim, int) and embedder.dim > 1
        langs = embedder.languages
        assert langs is None or (isinstance(langs, frozenset) and langs and all(isinstance(x, str) for x in langs))

    def test_documents_are_unit_float32_rows_in_order(self, embedder: Embedder) -> None:
        vectors = embedder.embed_documents(PASSAGES)
        assert vectors.shape == (len(PASSAGES), embedder.dim)
        _unit_rows(vectors, embedder.dim)
        # Row i is text i: every passage is nearest to itself.
        assert (np.argmax(vectors @ vectors.T, axis=1) == np.arange(len(PASSAGES))).all()

    def test_no_texts_is_an_empty_matrix(self, embedder: Embedder) -> None:
        vectors = embedder.embed_documents([])
        assert vectors.shape == (0, embedder.dim) and vectors.dtype == np.float32

    def test_a_text_gets_the_same_vector_alone_or_in_a_batch(self, embedder: Embedder) -> None:
        together = embedder.embed_documents(PASSAGES)
        alone = np.stack([embedder.embed_documents([p])[0] for p in PASSAGES])
        np.testing.assert_allclose(together, alone, atol=self.batch_atol)

    def test_a_query_is_one_unit_vector_nearest_its_answer(self, embedder: Embedder) -> None:
        query = embedder.embed_query(QUERY)
        assert query.shape == (embedder.dim,)
        _unit_rows(query, embedder.dim)
        scores = embedder.embed_documents(PASSAGES) @ query
        assert int(np.argmax(scores)) == ANSWER, scores

    def test_a_paraphrase_is_closer_than_an_unrelated_text(self, embedder: Embedder) -> None:
        text, paraphrase, unrelated = embedder.embed_documents(list(PARAPHRASE))
        assert float(text @ paraphrase) > float(text @ unrelated) + 0.05

    def test_a_long_text_is_cut_not_an_error(self, embedder: Embedder) -> None:
        long = PARAGRAPH * self.long_repeats
        vectors = embedder.embed_documents([long, PASSAGES[0]])
        assert vectors.shape == (2, embedder.dim)
        _unit_rows(vectors, embedder.dim)

    # --- tokens, where the backend counts them (the chunker's length function) ----------------

    def test_count_tokens_counts_text_alone(self, embedder: Embedder) -> None:
        count = getattr(embedder, "count_tokens", None)
        if count is None:
            pytest.skip(f"{embedder.name} does not count tokens (chunks are sized by estimate)")
        assert count("") == 0
        short, longer = count(PASSAGES[0]), count(PASSAGES[0] + " " + PASSAGES[1])
        assert isinstance(short, int) and 0 < short < longer <= short + count(PASSAGES[1]) + 2
        batch = getattr(embedder, "count_tokens_batch", None)
        if batch is not None:
            assert batch(PASSAGES) == [count(p) for p in PASSAGES]

    def test_chunks_of_max_text_tokens_are_read_whole_and_longer_text_is_cut(self, embedder: Embedder) -> None:
        limit = getattr(embedder, "max_text_tokens", None)
        count = getattr(embedder, "count_tokens", None)
        if not limit or count is None:
            pytest.skip(f"{embedder.name} reads texts of any length")
        assert isinstance(limit, int) and limit > 0
        long = PARAGRAPH * self.long_repeats
        assert count(long) > limit, "the test text must be longer than the model reads"
        chunks = [text for _, text in Chunker(size_tokens=limit, overlap_tokens=0, count_tokens=count).split(long)]
        assert len(chunks) > 1 and all(count(c) <= limit for c in chunks)
        # The chunk's last sentence is read: dropping it moves the vector.
        first = chunks[0]
        head = first[: first.rstrip(". ").rfind(". ") + 1]
        assert head and count(head) < count(first)
        whole, cut = embedder.embed_documents([first, head])
        assert float(whole @ cut) < 1 - 1e-4
        # What lies past the limit is not: more text after it changes nothing.
        a, b = embedder.embed_documents([long, long + " Deserts have no rivers at all."])
        np.testing.assert_allclose(a, b, atol=self.batch_atol)
