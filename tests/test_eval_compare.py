"""Paired bootstrap comparison and the regression gate, on runs whose differences are known."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from evals.compare import compare, gate, load_run
from rag.errors import ConfigError
from ragqa.cli import cli


def _rows(right: list[int], *, f1: list[float] | None = None, ttft: list[float] | None = None,
          abstain: list[int] | None = None) -> list[dict]:
    rows = []
    for i, r in enumerate(right):
        metrics = {"contains_gold": float(r), "f1": f1[i] if f1 else float(r), "compliance": 1.0,
                   "support": None if i % 10 == 0 else 1.0, "ttft_ms": ttft[i] if ttft else 100.0}
        rows.append({"qid": f"q{i}", "pass": "answer", "question": f"question {i}?", "answer": f"answer {i}",
                     "gold": ["x"], "metrics": metrics})
    for i, a in enumerate(abstain or []):
        rows.append({"qid": f"q{i}", "pass": "abstain", "question": f"question {i}?", "answer": "?", "gold": ["x"],
                     "metrics": {"abstention": float(a)}})
    return rows


def _metric(report: dict, name: str) -> dict:
    return next(r for r in report["metrics"] if r["metric"] == name)


def test_identical_runs_have_a_zero_interval() -> None:
    rows = _rows([1, 0] * 50)
    report = compare(rows, rows)
    row = _metric(report, "contains_gold")
    assert row["delta"] == 0 and row["ci"] == [0.0, 0.0] and not row["significant"]
    assert report["flips"] == [] and report["paired"] == 100


def test_a_real_improvement_is_significant_and_its_interval_matches_the_normal_approximation() -> None:
    a = [1] * 30 + [0] * 70
    b = [1] * 30 + [1] * 40 + [0] * 30  # 40 questions fixed, none broken
    report = compare(_rows(a), _rows(b), resamples=4000, seed=1)
    row = _metric(report, "contains_gold")
    assert row["a"] == 0.3 and row["b"] == 0.7 and row["delta"] == pytest.approx(0.4)
    assert row["significant"] and row["better"]
    # paired differences are 1 for 40 of 100 questions: sd = sqrt(0.4*0.6), se = sd/10
    se = math.sqrt(0.4 * 0.6) / 10
    assert row["ci"][0] == pytest.approx(0.4 - 1.96 * se, abs=0.03)
    assert row["ci"][1] == pytest.approx(0.4 + 1.96 * se, abs=0.03)
    assert len(report["flips"]) == 40 and {f["right"] for f in report["flips"]} == {"b"}


def test_metrics_pair_only_where_both_runs_define_them_and_latency_is_lower_is_better() -> None:
    a = _rows([1] * 20, ttft=[100.0] * 20)
    b = _rows([1] * 20, ttft=[150.0] * 20)
    report = compare(a, b)
    assert _metric(report, "support")["n"] == 18  # q0 and q10 have no cited sentence
    ttft = _metric(report, "ttft_p50_ms")
    assert ttft["delta"] == 50 and ttft["better"] is False


def test_resamples_below_1000_are_refused() -> None:
    with pytest.raises(ConfigError, match="at least 1000"):
        compare(_rows([1]), _rows([1]), resamples=100)


def test_gate_passes_the_same_run_and_fails_a_worse_one_naming_the_metric() -> None:
    base = _rows([1] * 80 + [0] * 20, abstain=[1] * 50 + [0] * 50)
    assert gate(base, base)["passed"]
    worse = _rows([1] * 60 + [0] * 40, abstain=[1] * 50 + [0] * 50)
    result = gate(base, worse)
    assert not result["passed"]
    failed = {f["metric"]: f for f in result["failures"]}
    assert set(failed) == {"contains_gold", "f1"}
    assert failed["contains_gold"]["why"] == "significantly worse"
    assert failed["contains_gold"]["delta"] == pytest.approx(-0.2)


def test_gate_tolerance_catches_a_small_drop_that_is_not_significant() -> None:
    base = _rows([1] * 100)
    # 3 flips of 100: a resample misses all three with probability 0.97**100 = 4.8% > 2.5%, so the
    # interval reaches 0 (not significant), but the drop of 0.03 exceeds the default tolerance 0.02
    worse = _rows([1] * 97 + [0] * 3)
    result = gate(base, worse, metrics=["contains_gold"])
    assert not result["passed"]
    (failure,) = result["failures"]
    assert not failure["significant"] and failure["ci"][1] == 0.0
    assert failure["why"] == "worse by more than 0.02"
    assert gate(base, worse, metrics=["contains_gold"], tolerance={"contains_gold": 0.05})["passed"]


def test_gate_refuses_runs_on_other_questions() -> None:
    base = _rows([1] * 10)
    other = [dict(r, qid=f"other{i}") for i, r in enumerate(_rows([1] * 10))]
    with pytest.raises(ConfigError, match="0 of the baseline's 10 questions"):
        gate(base, other)


def test_gate_and_compare_commands(tmp_path: Path) -> None:
    def write(name: str, rows: list[dict]) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        return folder

    base = write("base", _rows([1] * 80 + [0] * 20))
    worse = write("worse", _rows([1] * 50 + [0] * 50))
    runner = CliRunner()
    ok = runner.invoke(cli, ["eval", "gate", "--baseline", str(base), str(base)])
    assert ok.exit_code == 0, ok.output
    assert "gate: PASSED" in ok.output
    bad = runner.invoke(cli, ["eval", "gate", "--baseline", str(base), str(worse)])
    assert bad.exit_code == 1
    assert "contains_gold: 1.0000 -> 0.5000" not in bad.output  # the baseline has 0.8
    assert "contains_gold: 0.8000 -> 0.5000 (-0.3000, 95% CI [" in bad.output
    assert "significantly worse" in bad.output
    shown = runner.invoke(cli, ["eval", "compare", str(base), str(worse), "--flips", "2"])
    assert shown.exit_code == 0, shown.output
    assert "30 questions flipped: 0 right only in B, 30 right only in A" in shown.output
    assert "question 50?" in shown.output and "... and 28 more" in shown.output
    as_json = json.loads(runner.invoke(cli, ["eval", "compare", str(base), str(worse), "--json"]).stdout)
    assert _metric(as_json, "contains_gold")["delta"] == pytest.approx(-0.3)
    missing = runner.invoke(cli, ["eval", "compare", str(base), str(tmp_path)])
    assert missing.exit_code == 1 and "no evaluation run here" in missing.output
    assert load_run(base / "rows.jsonl") == load_run(base)
