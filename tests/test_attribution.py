"""Inferred citations: labels for the sentences a model left unlabelled, on a stream and in answers."""

from __future__ import annotations

import asyncio

import pytest

from rag.answer import Answerer
from rag.attribution import Attributor
from rag.generators.scripted import ScriptedGenerator
from rag.prompts import UNKNOWN
from tests.corpus import doc_text
from tests.live import run

PASSAGES = {1: "The Panthers defense gave up just 308 points, ranking sixth in the league.",
            2: "The Talbot Hughes collection was a gift from Harrods.",
            3: "黑豹队的防守只丢了308分，在联赛中排名第六。"}


def attribute(*pieces: str, **options: object) -> tuple[str, Attributor]:
    attributor = Attributor(PASSAGES, skip=UNKNOWN.values(), **options)  # type: ignore[arg-type]
    return "".join(attributor.feed(p) for p in pieces) + attributor.flush(), attributor


def test_each_unlabelled_sentence_gets_its_best_supporting_passage() -> None:
    text, a = attribute("The Panthers ", "gave up 308 points.", " Harrods gave", " the collection.")
    assert text == "The Panthers gave up 308 points. [1] Harrods gave the collection. [2]"
    assert a.inferred == [1, 2] and a.attributed == 2 and a.unsupported == 0


def test_labelled_sentences_numbers_and_labels_after_the_full_stop_are_left_alone() -> None:
    text, a = attribute("It allowed 308 points in 3.5 games [1]. Harrods gave the collection. [2] ", "The weather was fine.")
    assert text == "It allowed 308 points in 3.5 games [1]. Harrods gave the collection. [2] The weather was fine."
    assert a.inferred == [] and a.unsupported == 1  # nothing supports the weather


def test_chinese_sentences_take_the_label_without_a_space() -> None:
    text, a = attribute("黑豹队丢了308分。", "天气很好。")
    assert text == "黑豹队丢了308分。[3]天气很好。" and a.inferred == [3] and a.unsupported == 1


def test_the_unknown_reply_is_never_labelled_and_a_line_break_ends_a_sentence() -> None:
    assert attribute(UNKNOWN["en"])[0] == UNKNOWN["en"]
    text, _ = attribute("Harrods gave the collection\n\n", "The Panthers gave up 308 points")
    assert text == "Harrods gave the collection [2]\n\nThe Panthers gave up 308 points [1]"


def test_a_label_at_the_start_of_a_line_belongs_to_the_line() -> None:
    text, a = attribute("Two passages say how:\n\n", "[2]: Harrods gave the collection.\n", "The Panthers gave up 308 points.")
    assert text == "Two passages say how:\n\n[2]: Harrods gave the collection.\nThe Panthers gave up 308 points. [1]"
    assert a.inferred == [1] and a.unsupported == 1  # "Two passages say how" is supported by neither


def test_a_weak_overlap_is_not_enough() -> None:
    # content words: panthers, lost, game, tuesday, night -> passage 1 holds 1 of 5 (0.2)
    text, a = attribute("The Panthers lost the game on Tuesday night.")
    assert text == "The Panthers lost the game on Tuesday night." and a.unsupported == 1
    assert attribute("The Panthers lost the game on Tuesday night.", min_support=0.2)[0].endswith("[1]")


def test_the_answer_marks_inferred_citations_and_keeps_the_models_own(indexed, monkeypatch):
    monkeypatch.setattr(indexed.settings.retrieval, "max_context_chunks", 4)  # llamacpp's default packs one
    _, body = doc_text(3)
    first, second = body.split(". ")[:2]
    gen = ScriptedGenerator([f"{first}. ", f"{second} [2]. ", "Nothing else to add here."])
    events = run(Answerer(indexed, generator=gen).stream(first, top_k=4))
    sources = events[0].citations
    assert sources[0].doc_id == "alpha:d03.md"
    text = "".join(e.text for e in events if e.kind == "delta")
    assert text.startswith(f"{first}. [1] {second} [2].")
    done = events[-1]
    assert [(c.label, c.inferred) for c in done.citations] == [(2, False), (1, True)]
    assert done.attribution == {"inferred": 1, "unsupported": 1}


def test_inference_can_be_turned_off(indexed, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(indexed.settings.citations, "infer", False)
    _, body = doc_text(3)
    first = body.split(". ")[0]
    answer = asyncio.run(Answerer(indexed, generator=ScriptedGenerator([f"{first}."])).ask(first, top_k=4))
    assert answer.text == f"{first}." and answer.citations == ()
