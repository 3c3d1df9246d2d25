from __future__ import annotations

import itertools

import pytest

from ingest.chunking import Chunker, approx_token_count
from rag.types import Document


def _doc(text: str, doc_id: str = "s:doc") -> Document:
    return Document(id=doc_id, source="s", url="http://x/doc", title="T", text=text, lang="en")


def test_chunks_fit_the_token_budget_and_overlap():
    text = "# Guide\n\n" + " ".join(f"Sentence {i} says something useful." for i in range(200))
    chunker = Chunker(size_tokens=40, overlap_tokens=8)
    chunks = chunker.chunk(_doc(text))
    assert len(chunks) > 5
    assert all(approx_token_count(c.text) <= 40 for c in chunks)
    # Consecutive chunks share words (the overlap).
    shared = [set(a.text.split()[-6:]) & set(b.text.split()[:12]) for a, b in itertools.pairwise(chunks)]
    assert sum(1 for s in shared if s) >= len(shared) - 1


def test_headings_start_sections_and_are_recorded():
    text = "# Install\n\nRun the installer.\n\n## Linux\n\nUse the package.\n\n# Use\n\nAsk a question."
    chunks = Chunker(size_tokens=64, overlap_tokens=4).chunk(_doc(text))
    headings = [c.heading for c in chunks]
    assert headings == ["Install", "Install > Linux", "Use"]
    assert chunks[1].text.startswith("Linux")
    assert "Use the package." in chunks[1].text and "Ask" not in chunks[1].text


def test_chinese_text_without_spaces_is_split_at_sentence_ends():
    sentence = "黑豹队的防守只丢了三百零八分，在联赛中排名第六。"
    chunks = Chunker(size_tokens=60, overlap_tokens=5).chunk(_doc(sentence * 30))
    assert len(chunks) > 3
    assert all(approx_token_count(c.text) <= 60 for c in chunks)
    # Chunks end at a sentence boundary, not in the middle of a word.
    assert sum(c.text.endswith("。") for c in chunks) >= len(chunks) - 1


def test_ids_are_stable_and_depend_on_document_and_text():
    text = "# A\n\nSame paragraph.\n\n# B\n\nSame paragraph."
    first = Chunker(64, 4).chunk(_doc(text))
    again = Chunker(64, 4).chunk(_doc(text))
    other = Chunker(64, 4).chunk(_doc(text, doc_id="s:other"))
    assert [c.id for c in first] == [c.id for c in again]
    assert {c.id for c in first}.isdisjoint(c.id for c in other)
    assert len({c.id for c in first}) == len(first)


def test_overlap_must_be_smaller_than_size():
    with pytest.raises(ValueError, match="overlap"):
        Chunker(size_tokens=10, overlap_tokens=10)


def test_a_document_of_headings_only_still_has_a_chunk():
    chunks = Chunker(64, 4).chunk(_doc("# Release notes\n\n## 2.0"))
    assert [c.text for c in chunks] == ["# Release notes\n\n## 2.0"]
