"""The router: its signals from a real retrieval's hits, and its rules' decisions and reasons."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from rag.config import RouterRules, RoutingSettings, Settings
from rag.routing import Decision, Router, RouteSignals, agreement, question_tokens, route_signals
from rag.types import Hit


def routing(mode: str = "rules", **rules: Any) -> RoutingSettings:
    return RoutingSettings(mode=mode, rules=RouterRules(**rules))


def hit(cid: str, score: float, bm25: int | None = None, vector: int | None = None) -> Hit:
    explain = {}
    if bm25 is not None:
        explain["bm25_rank"] = float(bm25)
    if vector is not None:
        explain["vector_rank"] = float(vector)
    return Hit(cid, score, explain=explain)


EASY = RouteSignals(kind="factual", lang="en", question_tokens=7, top_score=0.033, margin=0.002,
                    agreement=0.8, chunks=1, turn=1)


def test_question_tokens_count_words_and_each_chinese_character() -> None:
    assert question_tokens("When was the Treaty of Rome signed?") == 7
    assert question_tokens("罗马条约是哪一年签署的？") == 11
    assert question_tokens("Python 3.11 的 GIL 是什么") == 8  # Python, 3, 11, 的, GIL, 是, 什, 么
    assert question_tokens("  ") == 0


def test_agreement_from_the_legs_ids() -> None:
    legs = {"bm25": ["a", "b", "c", "d", "e", "f"], "vector": ["b", "a", "x", "y", "c"]}
    assert agreement([], legs) == 0.6
    assert agreement([], {"bm25": ["a"], "vector": []}) == 0.0
    assert agreement([], {"bm25": ["a", "b"], "vector": ["b", "a"]}) == 1.0  # fewer than 5 found


def test_agreement_from_the_ranks_rrf_records_in_explain() -> None:
    hits = [hit("a", 0.03, 1, 2), hit("b", 0.02, 2, 9), hit("c", 0.015, None, 1), hit("d", 0.01, 3, 4),
            hit("e", 0.009, 4, None), hit("f", 0.008, 5, 3)]
    # bm25 top 5: a b d e f; vector top 5: a c d f -> common a d f
    assert agreement(hits) == 0.6
    assert agreement([hit("a", 1.0, bm25=1)]) == 0.0  # one leg only: no agreement to speak of


def test_route_signals_from_hits() -> None:
    hits = [hit("a", 0.0328, 1, 1), hit("b", 0.0310, 2, 3), hit("c", 0.02, 3, 2)]
    s = route_signals("What year was the treaty signed?", lang="en", hits=hits, legs=None, packed_chunks=1, turn=1)
    assert s.kind == "factual" and s.lang == "en" and s.question_tokens == 6
    assert s.top_score == pytest.approx(0.0328) and s.margin == pytest.approx(0.0018)
    assert s.agreement == 1.0 and s.chunks == 1 and s.turn == 1
    empty = route_signals("Write a poem about the sea", lang="en", hits=[], legs=None, packed_chunks=0, turn=0)
    assert (empty.kind, empty.top_score, empty.margin, empty.agreement, empty.turn) == ("creative", 0, 0, 0, 1)


def test_an_easy_question_goes_to_the_small_profile() -> None:
    decision = Router(routing()).decide(EASY)
    assert isinstance(decision, Decision)
    assert decision.profile == "small" and decision.signals == EASY
    assert decision.reason.startswith("small: every rule holds")


@pytest.mark.parametrize(("change", "reason"), [
    ({"kind": "creative"}, "large: creative question"),
    ({"question_tokens": 40}, "large: 40 tokens > 14"),
    ({"agreement": 0.0}, "large: leg agreement 0.00 < 0.40"),
    ({"top_score": 0.0163}, "large: top score 0.0163 < 0.01639"),
    ({"chunks": 3}, "large: 3 passages > 1"),
    ({"turn": 4}, "large: turn 4 > 1"),
])
def test_each_rule_sends_a_hard_question_to_the_large_profile(change: dict, reason: str) -> None:
    decision = Router(routing()).decide(replace(EASY, **change))
    assert decision.profile == "default"
    assert decision.reason.startswith(reason)


def test_score_thresholds() -> None:
    router = Router(routing(min_margin=0.005, min_top_score=0.02))
    assert router.decide(EASY).reason == "large: margin 0.002 < 0.005"
    assert router.decide(replace(EASY, top_score=0.01)).reason == "large: top score 0.01 < 0.02"
    assert router.decide(replace(EASY, margin=0.006)).profile == "small"


def test_off_and_cascade_modes() -> None:
    assert Router(routing("off")).decide(EASY).profile == "default"
    assert Router(routing("off")).decide(EASY).reason == "routing off"
    hard = replace(EASY, kind="open", chunks=5)
    assert Router(routing("cascade")).decide(hard).profile == "small"


def test_rules_come_from_settings_and_are_validated() -> None:
    rules = RouterRules.model_validate({"small_kinds": ["factual", "open"], "max_question_tokens": 30})
    assert rules.small_kinds == ("factual", "open")
    with pytest.raises(ValueError):
        RouterRules(min_agreement=1.5)
    with pytest.raises(ValueError):
        RouterRules.model_validate({"small_kinds": ["trivia"]})


def test_the_rules_are_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAG_PROFILES__SMALL__BACKEND", "extractive")
    monkeypatch.setenv("RAG_ROUTING__MODE", "rules")
    monkeypatch.setenv("RAG_ROUTING__RULES__SMALL_KINDS", '["factual", "open"]')
    monkeypatch.setenv("RAG_ROUTING__RULES__MIN_MARGIN", "0.0021")
    settings = Settings()
    assert settings.routing.rules.small_kinds == ("factual", "open")
    decision = Router(settings.routing).decide(replace(EASY, kind="open", margin=0.001))
    assert decision.reason == "large: margin 0.001 < 0.0021"
    assert Router(settings.routing).decide(replace(EASY, kind="open", margin=0.003)).profile == "small"
