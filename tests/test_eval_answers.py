"""``ragqa eval answers`` on a real XQuAD subset: the real pipeline (tantivy, numpy vectors with the
hash embedder, the extractive answerer), per-question rows, sampling, resume, abstention, MLflow."""

from __future__ import annotations

import json
import logging
import statistics
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from evals.answers import load_qa, run_answer_eval, sample
from evals.qa_metrics import f1
from rag.errors import ConfigError
from rag.packing import PackedContext
from rag.prompts import build_prompt
from ragqa.cli import cli
from tests.fixtures.xquad import xquad_subset as _subset

DATA = Path(__file__).parent / "data"


def _overrides(data_dir: Path, **more: Any) -> dict[str, Any]:
    return {"data_dir": data_dir, "embedder": {"backend": "hash", "dim": 256, "progress": False},
            "vector": {"backend": "numpy"}, "generator": {"backend": "extractive"}, "cache": {"backend": "off"},
            "eval": {"tracking": False}, **more}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _subset(tmp_path_factory.mktemp("xq") / "xquad-en-30")


def _rows(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "rows.jsonl").read_text(encoding="utf-8").splitlines()]


def test_every_question_is_answered_scored_and_recorded(dataset: Path, tmp_path: Path) -> None:
    summary = run_answer_eval(dataset, overrides=_overrides(tmp_path / "data"), limit=20, seed=3,
                              out=tmp_path / "run", progress=False)
    rows = _rows(tmp_path / "run")
    answers = [r for r in rows if r["pass"] == "answer"]
    assert summary["questions"] == len(answers) == 20 and summary["abstention_questions"] == 20
    assert summary["generator"] == "extractive" and summary["index"]["documents"] == 30
    assert summary["index"]["embedder"] == "hash:d256-n3-s0:256"  # the model the index was built with
    assert summary["errors"] == 0 and summary["degraded"] == 0
    for row in answers:
        retrieved = [chunk for chunk, _ in row["retrieved"]]
        assert row["packed"] and set(row["packed"]) <= set(retrieved)
        assert {"retrieve_ms", "pack_ms", "ttft_ms", "total_ms"} <= set(row["timings"])
        assert row["metrics"]["f1"] == pytest.approx(f1(row["answer"], row["gold"], "en"), abs=1e-4)
        if row["citations"]:  # the extractive answer cites the passages it took sentences from
            assert row["metrics"]["compliance"] == 1.0
    assert summary["metrics"]["f1"] == pytest.approx(statistics.fmean(r["metrics"]["f1"] for r in answers), abs=1e-4)
    # The extractive answerer takes the best sentences of the context: it holds the gold span
    # about half the time on this subset, and the gold paragraph is nearly always retrieved.
    assert 0.3 < summary["metrics"]["contains_gold"] < 1.0
    assert summary["metrics"]["retrieval_hit"] >= 0.9
    # it cites whenever it answers, and otherwise says it does not know
    assert summary["metrics"]["compliance"] + summary["metrics"]["abstained"] == pytest.approx(1.0)
    assert summary["metrics"]["compliance"] >= 0.7
    assert summary["latency"]["total_ms"]["p50"] > 0
    # The abstention pass never sees the gold paragraph.
    gold = {row["qid"]: set(load_gold(dataset)[row["qid"]]) for row in answers}
    for row in (r for r in rows if r["pass"] == "abstain"):
        assert not {doc for _, doc in row["retrieved"]} & gold[row["qid"]]
        assert set(row["metrics"]) >= {"abstention"}


def load_gold(dataset: Path) -> dict[str, list[str]]:
    _, items = load_qa(dataset)
    return {i.qid: sorted(i.gold_docs) for i in items}


def test_the_same_seed_draws_the_same_questions(dataset: Path) -> None:
    _, items = load_qa(dataset)
    first = [i.qid for i in sample(items, 15, seed=7)]
    assert first == [i.qid for i in sample(items, 15, seed=7)]
    assert first != [i.qid for i in sample(items, 15, seed=8)]
    assert [i.qid for i in sample(items, None, seed=7)] == [i.qid for i in items]


def test_an_interrupted_run_resumes_and_the_ingest_is_reused(dataset: Path, tmp_path: Path) -> None:
    overrides = _overrides(tmp_path / "data")
    out = tmp_path / "run"
    first = run_answer_eval(dataset, overrides=overrides, limit=10, seed=1, out=out, progress=False)
    assert first["ingest"]["reused"] is False
    lines = (out / "rows.jsonl").read_text(encoding="utf-8").splitlines()
    # Stopped after four questions, in the middle of writing the fifth line.
    (out / "rows.jsonl").write_text("\n".join(lines[:4]) + "\n" + lines[4][:25], encoding="utf-8")
    (out / "summary.json").unlink()
    again = run_answer_eval(dataset, overrides=overrides, limit=10, seed=1, out=out, progress=False)
    resumed = (out / "rows.jsonl").read_text(encoding="utf-8").splitlines()
    assert resumed[:4] == lines[:4]  # kept byte for byte: not answered again
    assert len(resumed) == len(lines) == 20
    assert sorted((json.loads(x)["qid"], json.loads(x)["pass"]) for x in resumed) == \
        sorted((json.loads(x)["qid"], json.loads(x)["pass"]) for x in lines)
    assert again["ingest"]["reused"] is True and again["questions"] == 10
    with pytest.raises(ConfigError, match="holds another evaluation .*qids"):
        run_answer_eval(dataset, overrides=overrides, limit=10, seed=2, out=out, progress=False)
    other = run_answer_eval(dataset, overrides=overrides, limit=5, seed=2, out=tmp_path / "other", progress=False,
                            abstain_limit=0)
    assert other["ingest"]["reused"] is True and other["abstention_questions"] == 0


def test_stop_after_answers_the_first_questions_and_the_run_resumes(dataset: Path, tmp_path: Path) -> None:
    overrides = _overrides(tmp_path / "data")
    out = tmp_path / "run"
    part = run_answer_eval(dataset, overrides=overrides, limit=6, seed=4, out=out, progress=False, abstain_limit=2,
                           stop_after=3)
    first = _rows(out)
    assert part["questions"] == 3 and part["sample"] == 6
    assert [(r["qid"], r["pass"]) for r in first][:2] == [(first[0]["qid"], "answer"), (first[0]["qid"], "abstain")]
    whole = run_answer_eval(dataset, overrides=overrides, limit=6, seed=4, out=out, progress=False, abstain_limit=2)
    assert whole["questions"] == 6 and _rows(out)[: len(first)] == first
    assert [r["qid"] for r in _rows(out) if r["pass"] == "answer"] == [i.qid for i in sample(load_qa(dataset)[1], 6, 4)]


def test_packing_and_prompt_settings_reach_the_answer(dataset: Path, tmp_path: Path) -> None:
    overrides = _overrides(tmp_path / "data", retrieval={"max_context_chunks": 1})
    run_answer_eval(dataset, overrides=overrides, limit=8, out=tmp_path / "run", progress=False, abstain_limit=0)
    assert all(len(r["packed"]) == 1 for r in _rows(tmp_path / "run"))
    empty = PackedContext("", (), {}, 0, 0)
    prompt = build_prompt("What is it?", empty, instructions={"en": "Answer. Unknown: {unknown}"})
    assert prompt.messages[0]["content"] == "Answer. Unknown: I don't know: the documents do not say."
    assert build_prompt("什么？", empty, instructions={"en": "x"}).messages[0]["content"].startswith("你是")


def test_a_live_data_dir_is_evaluated_as_it_is(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "orbis.md").write_text("# Orbis\n\nThe Orbis server listens on port 7341 by default.\n", encoding="utf-8")
    (docs / "tampere.md").write_text("# Office\n\nOur head office is in Tampere, Finland.\n", encoding="utf-8")
    config = tmp_path / "ragqa.yaml"
    config.write_text(yaml.safe_dump({k: (str(v) if isinstance(v, Path) else v)
                                      for k, v in _overrides(tmp_path / "live").items()}), encoding="utf-8")
    runner = CliRunner()
    ingested = runner.invoke(cli, ["--config", str(config), "ingest", str(docs), "--name", "docs"])
    assert ingested.exit_code == 0, ingested.output
    queries = tmp_path / "q.jsonl"
    queries.write_text(json.dumps({"id": "p", "text": "Which port does the Orbis server listen on?",
                                   "answers": ["7341"]}) + "\n", encoding="utf-8")
    result = runner.invoke(cli, ["--config", str(config), "eval", "answers", str(tmp_path / "live"),
                                 "--queries", str(queries), "--json", "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["questions"] == 1 and summary["metrics"]["contains_gold"] == 1.0
    assert summary["abstention_questions"] == 0  # no qrels: no gold documents to filter out
    assert "retrieval_hit" not in summary["metrics"]
    assert summary["ingest"] == {"live": str(tmp_path / "live")}
    missing = runner.invoke(cli, ["--config", str(config), "eval", "answers", str(tmp_path / "live")])
    assert missing.exit_code == 1 and "give the questions with --queries FILE" in missing.output


def test_runs_are_logged_to_mlflow(dataset: Path, tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    overrides = _overrides(tmp_path / "data", eval={"tracking": True})
    summary = run_answer_eval(dataset, overrides=overrides, limit=5, out=tmp_path / "run", progress=False,
                              abstain_limit=0)
    client = MlflowClient(tracking_uri=f"sqlite:///{(tmp_path / 'data').resolve() / 'mlflow.db'}")
    run = client.get_run(summary["mlflow_run_id"])
    assert run.data.metrics["f1"] == pytest.approx(summary["metrics"]["f1"])
    assert run.data.metrics["total_ms.p50"] == pytest.approx(summary["latency"]["total_ms"]["p50"])
    assert run.data.params["generator.backend"] == "extractive"
    assert run.data.params["retrieval.mode"] == "rrf"
    assert run.data.tags["index.chunks"] == str(summary["index"]["chunks"])
    assert run.data.tags["index.embedder"] == summary["index"]["embedder"]
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"rows.jsonl", "summary.json", "config.json"} <= artifacts


def test_without_mlflow_the_run_says_once_that_tracking_is_off(dataset: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    import evals.tracking

    monkeypatch.setitem(sys.modules, "mlflow", None)  # import mlflow now raises ImportError
    monkeypatch.setitem(sys.modules, "mlflow.tracking", None)
    monkeypatch.setitem(sys.modules, "mlflow.entities", None)
    monkeypatch.setattr(evals.tracking, "_said_off", False)
    overrides = _overrides(tmp_path / "data", eval={"tracking": True})
    with caplog.at_level(logging.WARNING, logger="evals.tracking"):
        for out in ("a", "b"):
            summary = run_answer_eval(dataset, overrides=overrides, limit=3, out=tmp_path / out, progress=False,
                                      abstain_limit=0)
            assert summary["mlflow_run_id"] is None and summary["questions"] == 3
    said = [r.getMessage() for r in caplog.records if "tracking is off" in r.getMessage()]
    assert len(said) == 1 and "pip install 'ragqa[tracking]'" in said[0]
