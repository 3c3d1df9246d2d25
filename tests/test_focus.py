"""Query-focused passages (rag.focus): the sentences around a chunk's best match for the question."""

from __future__ import annotations

from rag.focus import focus_hits, focus_text
from rag.support import content_words
from rag.types import Chunk, Hit

PANTHERS = ("The Panthers defense gave up just 308 points, ranking sixth in the league. "
            "Pro Bowl defensive tackle Kawann Short led the team in sacks with 11. "
            "Fellow lineman Mario Addison added 6½ sacks. "
            "Luke Kuechly led the team in tackles. "
            "He registered 118 tackles and forced two fumbles. "
            "The secondary featured Josh Norman.")


def hit(text: str, n: int = 0) -> Hit:
    return Hit(chunk_id=f"c{n}", score=1.0, chunk=Chunk(id=f"c{n}", doc_id=f"d{n}", source="s", text=text,
                                                        hash=f"h{n}", title="Super Bowl 50"))


def test_the_window_starts_one_sentence_before_the_best_match() -> None:
    text = focus_text(content_words("How many tackles did Luke Kuechly register?"), PANTHERS, 3)
    # the best sentence names Kuechly and tackles; the next one holds the number
    assert text == ("… Fellow lineman Mario Addison added 6½ sacks. Luke Kuechly led the team in tackles. "
                    "He registered 118 tackles and forced two fumbles. …")


def test_a_match_near_the_end_keeps_a_full_window_and_no_trailing_mark() -> None:
    text = focus_text(content_words("Which player featured in the secondary?"), PANTHERS, 2)
    assert text == "… He registered 118 tackles and forced two fumbles. The secondary featured Josh Norman."


def test_no_match_keeps_the_first_sentences_and_short_chunks_stay_whole() -> None:
    assert focus_text(content_words("What is the capital of Peru?"), PANTHERS, 2) == (
        "The Panthers defense gave up just 308 points, ranking sixth in the league. "
        "Pro Bowl defensive tackle Kawann Short led the team in sacks with 11. …")
    assert focus_text(content_words("tackles"), "One sentence. Two sentences.", 3) == "One sentence. Two sentences."


def test_chinese_sentences_join_without_spaces() -> None:
    text = "星河数据库是一个分布式数据库。它默认监听6612端口。备份每天凌晨两点进行。日志保存在/var/log目录。"
    assert focus_text(content_words("星河数据库默认使用哪个端口？"), text, 2) == (
        "星河数据库是一个分布式数据库。它默认监听6612端口。 …")


def test_focused_hits_keep_their_ids_and_order() -> None:
    hits = [hit(PANTHERS, 0), hit("Short text.", 1), Hit(chunk_id="x", score=0.5)]
    out = focus_hits("How many tackles did Luke Kuechly register?", hits, 3)
    assert [h.chunk_id for h in out] == ["c0", "c1", "x"]
    assert out[0].chunk is not None and "118 tackles" in out[0].chunk.text and "Josh Norman" not in out[0].chunk.text
    assert out[0].chunk.id == "c0" and out[0].chunk.title == "Super Bowl 50"
    assert out[1] is hits[1] and out[2] is hits[2]
