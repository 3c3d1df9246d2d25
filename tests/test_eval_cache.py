"""``ragqa eval cache`` with the real MiniLM on a small committed set of labelled question
pairs (tests/data/cache-pairs, made from XQuAD by evals/cache_pairs.py), and the recipe that
makes the committed sets."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from evals.cache_eval import DEFAULT_PAIRS, guard_sets, load_pairs, parse_thresholds
from evals.cache_pairs import FIXTURE, build_pairs, fixture
from rag.errors import ConfigError
from ragqa.cli import cli

DATA = Path(__file__).parent / "data"

# Always hits: the same question twice, and the same after normalisation (the exact cache).
IDENTICAL = [
    {"a": "How do I read a file?", "b": "How do I read a file?", "same": True, "kind": "identical"},
    {"a": "How many tackles did Luke Kuechly register?", "b": "how many tackles did luke kuechly register",
     "same": True, "kind": "identical"},
    {"a": "卢克·坎克利贡献了多少次擒抱？", "b": "卢克·坎克利贡献了多少次擒抱?", "same": True, "kind": "identical"},
]
# MiniLM does not rank Chinese: the cache never looks these up semantically.
CHINESE = {"a": "黑豹队的防守丢了多少分？", "b": "请问黑豹队的防守丢了多少分？", "same": True, "kind": "zh-polite"}


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    path = tmp_path_factory.mktemp("pairs") / "pairs.jsonl"
    rows = [json.loads(line) for line in FIXTURE.read_text(encoding="utf-8").splitlines()]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in [*rows, *IDENTICAL, CHINESE]),
                    encoding="utf-8")
    res = CliRunner().invoke(cli, ["eval", "cache", str(path), "--embedder", "minilm", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    out["rows"] = rows
    return out


def test_counts_and_languages(report: dict) -> None:
    rows = report["rows"]
    assert report["pairs"] == len(rows) + len(IDENTICAL) + 1
    assert report["positives"] == sum(r["same"] for r in rows) + len(IDENTICAL) + 1
    assert report["embedder"] == "st:all-MiniLM-L6-v2"
    assert report["languages"] == {"en": len(rows) + 2, "zh": 2}
    assert report["exact"] == 3 and report["not_ranked"] == 2  # the two Chinese pairs
    assert report["thresholds"][0] == 0.8 and report["thresholds"][-1] == 0.97 and len(report["thresholds"]) == 18
    assert list(report["guard_sets"]) == ["none", "numbers", "entities", "negation", "qtype", "language", "all"]


def test_rates_are_consistent(report: dict) -> None:
    sets = list(report["guard_sets"])
    for group, rows in report["table"].items():
        for label in sets:
            series = [r for r in rows if r["guards"] == label]
            assert [r["threshold"] for r in series] == report["thresholds"]
            for r in series:
                assert 0 <= r["hits"] <= r["positives"] and 0 <= r["wrong_hits"] <= r["negatives"]
                assert r["hit_rate"] == pytest.approx(r["hits"] / r["positives"] if r["positives"] else 0)
            for lower, higher in itertools.pairwise(series):  # a stricter threshold never hits more
                assert higher["hits"] <= lower["hits"] and higher["wrong_hits"] <= lower["wrong_hits"], (group, label)
        for t in report["thresholds"]:  # guards only take hits away
            at = {r["guards"]: r for r in rows if r["threshold"] == t}
            for label in sets:
                assert at[label]["hits"] <= at["none"]["hits"] and at["all"]["hits"] <= at[label]["hits"]
                assert at["all"]["wrong_hits"] <= at[label]["wrong_hits"] <= at["none"]["wrong_hits"]


def test_identical_questions_always_hit_and_chinese_only_exactly(report: dict) -> None:
    for r in report["by_kind"]["en/identical"] + report["by_kind"]["zh/identical"]:
        assert r["hit_rate"] == 1.0
    assert all(r["hits"] == 0 for r in report["by_kind"]["zh/zh-polite"])  # not exact, and MiniLM skips Chinese


def test_minimal_edits_hit_without_their_guard_and_never_with_all(report: dict) -> None:
    kinds = report["by_kind"]
    lowest = report["thresholds"][0]
    for kind, guard in (("swap-number", "numbers"), ("swap-entity", "entities"), ("negated", "negation")):
        rows = {r["guards"]: r for r in kinds[f"en/{kind}"] if r["threshold"] == lowest}
        assert rows["none"]["wrong_hits"] > 0, kind  # MiniLM puts a minimal edit above 0.8
        assert rows[guard]["wrong_hits"] == rows["all"]["wrong_hits"] == 0, kind


def test_best_threshold_meets_the_goal(report: dict) -> None:
    best = report["best"]["all"]
    assert best is not None and best["worst_wrong_hit_rate"] < report["goal"]
    assert report["recommended"]["hits"] >= best["hits"]
    for label, b in report["best"].items():
        if b is not None:
            rows = [r for r in report["table"]["all"] if r["guards"] == label and r["threshold"] == b["threshold"]]
            assert rows[0]["hits"] == b["hits"]


def test_text_table_and_filters(tmp_path: Path) -> None:
    res = CliRunner().invoke(cli, ["eval", "cache", str(FIXTURE), "-e", "minilm", "-t", "0.85,0.95",
                                   "-g", "none,numbers+entities,all", "--kind", "synonym,swap-number"])
    assert res.exit_code == 0, res.output
    text = res.stdout
    assert "6 pairs (3 same, 3 different)" in text and "numbers+entit" in text
    assert "  0.85 " in text and "  0.95 " in text and "  0.90 " not in text
    assert "recommended: threshold" in text and "en/swap-number" in text
    bad = CliRunner().invoke(cli, ["eval", "cache", str(FIXTURE), "-e", "hash", "-t", "0.9:0.8:0.01"])
    assert bad.exit_code == 1 and "error: thresholds: expected START:STOP:STEP" in bad.stderr
    bad = CliRunner().invoke(cli, ["eval", "cache", str(FIXTURE), "-e", "hash", "-g", "numbers+spelling"])
    assert bad.exit_code == 1 and "unknown spelling" in bad.stderr
    bad = CliRunner().invoke(cli, ["eval", "cache", str(FIXTURE), "-e", "hash", "--lang", "fr"])
    assert bad.exit_code == 1 and "no pairs" in bad.stderr


def test_parsers_and_loading(tmp_path: Path) -> None:
    assert parse_thresholds("0.80:0.83:0.01") == [0.8, 0.81, 0.82, 0.83]
    assert parse_thresholds("0.95,0.9") == [0.9, 0.95]
    with pytest.raises(ConfigError):
        parse_thresholds("0.8:1.2:0.1")
    assert guard_sets("none,all,numbers+qtype") == {
        "none": (), "all": ("numbers", "entities", "negation", "qtype", "language"), "numbers+qtype": ("numbers", "qtype")}
    path = tmp_path / "log.jsonl"
    path.write_text('{"a": "What is 北京?", "b": "北京是什么？", "same": true}\n\n', encoding="utf-8")
    (pair,) = load_pairs(path)
    assert (pair.lang, pair.kind, pair.split) == ("en-zh", "log", "")
    path.write_text('{"a": "x", "b": "y", "same": "yes"}\n', encoding="utf-8")
    with pytest.raises(ConfigError, match="same must be true or false"):
        load_pairs(path)


def test_the_recipe_makes_the_committed_files() -> None:
    rows = build_pairs(DATA)
    committed = DEFAULT_PAIRS.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in committed] == rows
    assert [json.loads(line) for line in FIXTURE.read_text(encoding="utf-8").splitlines()] == list(fixture(rows))
    assert DEFAULT_PAIRS.stat().st_size < 1_000_000
    assert {r["split"] for r in rows} == {"dev", "test"} and any(r["same"] for r in rows)
