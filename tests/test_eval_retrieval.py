"""The retrieval eval harness and ``ragqa eval retrieval`` on a tiny BEIR folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from evals.retrieval import load_beir, run_retrieval_eval
from rag.cli import cli
from rag.errors import ConfigError
from tests.test_retrieval import doc_text

HASH = {"embedder": {"backend": "hash", "dim": 256, "progress": False}, "vector": {"backend": "numpy"}}
METRICS = {"recall@1", "recall@5", "recall@10", "recall@100", "mrr@10", "ndcg@10"}


@pytest.fixture
def beir(tmp_path: Path) -> Path:
    """30 documents; 8 queries, each copying the distinctive sentence of one document."""
    root = tmp_path / "tiny"
    root.mkdir()
    with open(root / "corpus.jsonl", "w", encoding="utf-8") as fh:
        for i in range(30):
            title, body = doc_text(i)
            fh.write(json.dumps({"id": f"doc/{i}", "title": title, "text": body, "lang": "en"}) + "\n")
    queries = {f"q{i}": doc_text(i)[1].split(".")[0] for i in range(0, 30, 4)[:8]}
    with open(root / "queries.jsonl", "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps({"id": qid, "text": text}) + "\n" for qid, text in queries.items())
        fh.write(json.dumps({"id": "unjudged", "text": "river"}) + "\n")
    lines = ["query-id\tdoc-id\trelevance"]
    lines += [f"{qid}\tdoc/{qid[1:]}\t1" for qid in queries]
    lines.append("q0\tdoc/1\t0")  # judged not relevant
    (root / "qrels.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def test_load_beir(beir):
    corpus, queries, qrels = load_beir(beir)
    assert len(corpus) == 30 and corpus["doc/0"]["lang"] == "en" and corpus["doc/0"]["title"]
    assert len(queries) == 9 and qrels["q0"] == {"doc/0": 1, "doc/1": 0}
    with pytest.raises(ConfigError, match="qrels.tsv"):
        (beir / "qrels.tsv").unlink()
        load_beir(beir)


def test_eval_reports_every_metric_per_mode(beir, tmp_path):
    report = run_retrieval_eval(beir, ["bm25", "vector", "hybrid", "rrf"], HASH, data_dir=tmp_path / "data")
    assert report["queries"] == 8 and report["docs"] == 30 and report["ingest"]["documents"] == 30
    assert set(report["metrics"]) == set(report["timing"]) == {"bm25", "vector", "hybrid", "rrf"}
    for values in report["metrics"].values():
        assert set(values) == METRICS and all(0.0 <= v <= 1.0 for v in values.values())
        assert values["recall@1"] <= values["recall@5"] <= values["recall@10"] <= values["recall@100"]
    assert report["metrics"]["bm25"]["recall@10"] == 1.0
    assert report["metrics"]["bm25"]["mrr@10"] > 0.8
    assert all(t["seconds"] >= 0 for t in report["timing"].values())


def test_eval_limit_and_bad_modes(beir):
    report = run_retrieval_eval(beir, ["bm25"], HASH, limit_queries=3)
    assert report["queries"] == 3 and list(report["metrics"]) == ["bm25"]
    with pytest.raises(ConfigError, match="modes"):
        run_retrieval_eval(beir, ["dense"], HASH)


def test_cli_eval_retrieval(beir, tmp_path):
    env = {"RAG_EMBEDDER__BACKEND": "hash", "RAG_VECTOR__BACKEND": "numpy", "RAG_CONFIG": "",
           "RAG_DATA_DIR": str(tmp_path / "unused")}
    runner = CliRunner()
    res = runner.invoke(cli, ["eval", "retrieval", str(beir), "--json"], env=env, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert set(report["metrics"]) == {"bm25", "vector", "hybrid", "rrf"}
    assert report["metrics"]["bm25"]["recall@10"] == 1.0
    assert not (tmp_path / "unused").exists()  # the configured data directory is left alone

    res = runner.invoke(cli, ["eval", "retrieval", str(beir), "--modes", "bm25,rrf", "--limit", "2"],
                        env=env, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "2 queries" in res.stdout and "ndcg@10" in res.stdout and "rrf" in res.stdout

    res = runner.invoke(cli, ["eval", "retrieval", str(beir), "--modes", "bm25,dense"], env=env)
    assert res.exit_code == 1 and "--modes" in res.stderr
