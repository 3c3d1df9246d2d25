"""Fitting the router on two answer runs: the labels, the fit within its loss budget, the
cross-validated figures, the settings to paste, and the signals that ragqa eval answers records."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from evals.answers import run_answer_eval
from evals.compare import load_run
from evals.fit_router import fit_router, paste_lines, render_fit
from rag.config import RouterRules, RoutingSettings
from rag.errors import ConfigError
from rag.routing import question_tokens
from rag.sampling import classify_question
from ragqa.cli import cli
from tests.fixtures.xquad import xquad_subset


def _row(qid: str, f1: float, *, margin: float, kind: str = "factual", tokens: int = 8,
         chunks: int = 1, route: bool = True) -> dict[str, Any]:
    row: dict[str, Any] = {"qid": qid, "pass": "answer", "metrics": {"f1": f1}}
    if route:
        row["route"] = {"kind": kind, "lang": "en", "question_tokens": tokens, "top_score": 0.03 + margin,
                        "margin": margin, "agreement": 0.6, "chunks": chunks, "turn": 1}
    return row


def _runs(n: int = 120, seed: int = 1) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The small profile matches the large one when the top hit leads clearly (margin >= 0.01) and
    loses 40 points when it does not; margins are spread evenly, so half the questions are easy."""
    rng = random.Random(seed)
    small, large = [], []
    for i in range(n):
        margin = rng.uniform(0, 0.02)
        good = margin >= 0.01
        big = rng.uniform(0.4, 1.0)
        large.append(_row(f"q{i}", big, margin=margin))
        small.append(_row(f"q{i}", big if good else big - 0.4, margin=margin))
    return small, large


def test_the_fit_routes_the_easy_questions_within_the_loss_budget() -> None:
    small, large = _runs()
    report = fit_router([(small, large)], names=["synthetic"], max_loss=1.0, resamples=1000)
    assert report["questions"] == 120
    assert 0.4 < report["good_share"] < 0.6
    rules = RouterRules(**report["rules"])
    assert 0.008 <= rules.min_margin <= 0.0105  # the margin rule carries the fit
    for budget in (0.0, 3.0):  # the thresholds as pasted keep the fit's loss on the questions it saw
        assert fit_router([(small, large)], max_loss=budget, resamples=1000)["in_sample"]["delta"] >= -budget
    assert report["in_sample"]["delta"] >= -1.0 and report["in_sample"]["precision"] > 0.95
    cv = report["cv"]  # held-out folds: close to the half that is easy, and close to no loss
    assert 0.3 < cv["share"] < 0.65
    assert cv["ci"][0] <= cv["delta"] <= cv["ci"][1] and cv["delta"] > -5
    assert report["per_dataset"]["synthetic"]["n"] == 120
    assert report["goal"]["met"] == (cv["share"] >= 0.3 and cv["ci"][1] >= -1)
    assert report["goal"]["point"] == (cv["share"] >= 0.3 and cv["delta"] >= -1)


def test_the_curve_trades_quality_for_share() -> None:
    small, large = _runs()
    report = fit_router([(small, large)], max_loss=1.0, budgets=(0.0, 5.0, 100.0), resamples=1000)
    curve = {c["max_loss"]: c for c in report["curve"]}
    assert set(curve) == {0.0, 1.0, 5.0, 100.0}
    assert curve[100.0]["share"] == 1.0  # any loss allowed: everything on small
    assert curve[100.0]["delta"] == report["ends"]["all_small"]["delta"] < -15
    assert curve[0.0]["share"] <= curve[5.0]["share"] <= curve[100.0]["share"]
    assert report["ends"]["all_large"]["delta"] == 0 and report["ends"]["all_large"]["share"] == 0
    assert report["ends"]["defaults"]["share"] == 1.0  # short factual questions, one passage, legs agreeing


def test_tolerance_widens_the_label() -> None:
    small, large = _runs()
    strict = fit_router([(small, large)], tolerance=0.0, resamples=1000)
    loose = fit_router([(small, large)], tolerance=50.0, resamples=1000)
    assert loose["good_share"] == 1.0 > strict["good_share"]


def test_pairs_fit_one_router_and_report_each_dataset() -> None:
    a_small, a_large = _runs(60, seed=2)
    b_small, b_large = _runs(60, seed=3)
    report = fit_router([(a_small, a_large), (b_small, b_large)], names=["en", "zh"], resamples=1000)
    assert report["questions"] == 120  # the same qids in both datasets stay apart
    assert set(report["per_dataset"]) == {"en", "zh"}
    assert sum(s["n"] for s in report["per_dataset"].values()) == 120
    text = render_fit(report)
    assert "cross-validated (5 folds" in text and "RAG_ROUTING__RULES__MIN_MARGIN=" in text


def test_paste_lines_configure_the_same_rules() -> None:
    rules = RouterRules(small_kinds=("factual", "open"), max_question_tokens=18, min_margin=0.0021)
    env = {}
    for line in paste_lines(rules):
        key, _, value = line.partition("=")
        env[key] = value.strip("'")
    assert env.pop("RAG_ROUTING__MODE") == "rules"
    loaded = RouterRules.model_validate(
        {k.removeprefix("RAG_ROUTING__RULES__").lower(): json.loads(v) if v.startswith("[") else v
         for k, v in env.items()})
    assert loaded == rules


def _cascade_runs(n: int = 120, seed: int = 4) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The small answer is as good as the large one when its confidence (mean log-probability) is
    -0.3 or more and 50 points worse below; one in ten small answers abstains (worse, but the
    cascade escalates it whatever its confidence) and one in ten cites nothing."""
    rng = random.Random(seed)
    small, large = _runs(n, seed)
    for i, (s, big) in enumerate(zip(small, large, strict=True)):
        f1 = big["metrics"]["f1"]
        logprob = rng.uniform(-1.0, 0.0)
        s["metrics"] = {"f1": f1 if logprob >= -0.3 else max(0.0, f1 - 0.5)}
        s["confidence"] = {"logprob": logprob, "min_logprob": logprob - 1}
        s["answer"], s["citations"] = "Paris [1].", [{"label": 1, "doc": "d", "inferred": False}]
        if i % 10 == 0:
            s["answer"], s["metrics"] = "I don't know.", {"f1": 0.0}
        elif i % 10 == 1:
            s["citations"] = []
    return small, large


def test_the_cascade_fit_finds_the_confidence_threshold() -> None:
    small, large = _cascade_runs()
    report = fit_router([(small, large)], names=["synthetic"], max_loss=0.0, resamples=1000)
    cascade = report["cascade"]
    mean = cascade["signals"]["logprob"]
    # no loss allowed: the lowest confidence of a good, kept answer (every good answer, no bad one)
    kept = [s["confidence"]["logprob"] for s in small
            if s["citations"] and "know" not in s["answer"] and s["confidence"]["logprob"] >= -0.3]
    assert mean["threshold"] == min(kept)
    assert mean["in_sample"]["delta"] == 0.0 and mean["in_sample"]["on_small"] == len(kept)
    assert mean["auc"] == 1.0  # confidence separates the good answers from the bad perfectly
    # held out, close to the same share and no loss
    assert abs(mean["cv"]["share"] - len(kept) / 120) < 0.1 and mean["cv"]["delta"] > -3
    assert cascade["base"]["share"] == 0.8 and cascade["base"]["delta"] < -10  # no threshold: only abstentions go
    assert cascade["paste"] == ["RAG_ROUTING__MODE=cascade", f"RAG_ROUTING__MIN_CONFIDENCE={min(kept)}"]
    assert set(mean["per_dataset"]) == {"synthetic"}
    text = render_fit(report)
    assert "confidence = logprob" in text and f"RAG_ROUTING__MIN_CONFIDENCE={min(kept)}" in text
    # the pasted threshold is accepted as the setting
    assert RoutingSettings(mode="cascade", min_confidence=mean["threshold"]).min_confidence == min(kept)
    # a 1-point budget lets a few bad answers through, never more than the budget
    loose = fit_router([(small, large)], max_loss=1.0, resamples=1000)["cascade"]["signals"]["logprob"]
    assert loose["threshold"] < min(kept) and -1.0 <= loose["in_sample"]["delta"] < 0
    assert loose["in_sample"]["on_small"] > len(kept)


def test_without_confidence_the_cascade_is_not_fitted_and_the_rules_still_are() -> None:
    small, large = _runs(40)
    report = fit_router([(small, large)], resamples=1000)
    assert report["cascade"] is None and report["rules"]
    assert "cascade: not fitted" in render_fit(report)


def test_bad_input_is_a_clear_error() -> None:
    small, large = _runs(20)
    with pytest.raises(ConfigError, match="no router signals"):
        fit_router([([_row(r["qid"], 0.5, margin=0, route=False) for r in small],
                     [_row(r["qid"], 0.5, margin=0, route=False) for r in large])])
    with pytest.raises(ConfigError, match="share no answered question"):
        fit_router([(small, [dict(r, qid="other-" + r["qid"]) for r in large])])
    with pytest.raises(ConfigError, match="folds"):
        fit_router([(small, large)], folds=50)
    with pytest.raises(ConfigError, match="at least one pair"):
        fit_router([])


def test_answer_runs_record_the_signals_and_the_command_fits_them(tmp_path: Path) -> None:
    """Two real answer runs on 20 XQuAD paragraphs: the extractive answerer from the best passage
    alone ("small") and from up to eight ("large")."""
    dataset = xquad_subset(tmp_path / "xq", docs=20)
    base = {"data_dir": tmp_path / "data", "embedder": {"backend": "hash", "dim": 256, "progress": False},
            "vector": {"backend": "numpy"}, "generator": {"backend": "extractive"}, "cache": {"backend": "off"},
            "eval": {"tracking": False}}
    one = {**base, "retrieval": {"max_context_chunks": 1}}
    for name, overrides in (("small", one), ("large", base)):
        run_answer_eval(dataset, overrides=overrides, limit=30, seed=0, abstain_limit=0, out=tmp_path / name,
                        progress=False, tracking=False)
    rows = load_run(tmp_path / "large")
    assert len(rows) == 30
    for row in rows:
        route = row["route"]
        assert route["kind"] == classify_question(row["question"]) and route["lang"] == "en"
        assert route["chunks"] == len(row["packed"]) and route["turn"] == 1
        assert 0 <= route["agreement"] <= 1 and route["top_score"] >= route["margin"] >= 0
        assert route["question_tokens"] == question_tokens(row["question"]) > 0
    assert {r["route"]["chunks"] for r in load_run(tmp_path / "small")} == {1}
    result = CliRunner().invoke(cli, ["eval", "fit-router", str(tmp_path / "small"), str(tmp_path / "large"),
                                      "--max-loss", "2", "--folds", "3", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["questions"] == 30 and report["datasets"] == ["xq"] and report["folds"] == 3
    assert report["in_sample"]["delta"] >= -2.0
    assert report["paste"][0] == "RAG_ROUTING__MODE=rules"
    odd = CliRunner().invoke(cli, ["eval", "fit-router", str(tmp_path / "small")])
    assert odd.exit_code == 1 and "runs come in pairs" in odd.output
