"""The retrieval eval harness and ``ragqa eval retrieval`` on a tiny BEIR folder."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from evals.retrieval import Variant, load_beir, parse_variant, run_retrieval_eval
from rag.errors import ConfigError
from ragqa.cli import cli
from tests.corpus import doc_text

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


def test_parse_variant_names_and_errors():
    v = parse_variant("rrf:w=1,0.5:k=20")
    assert (v.mode, v.rrf_k, v.weights, v.candidates) == ("rrf", 20.0, (1.0, 0.5), 100)
    assert v.name == "rrf:rrf_k=20:weights=1,0.5" and parse_variant(v.name) == v  # the name reads back
    assert parse_variant("rrf:weights=auto:rrf_k=60:lang=1").name == "rrf"  # defaults are not named
    assert parse_variant("rrf:weights=1,1").name == "rrf:weights=1,1"  # fixed weights are named
    assert parse_variant("rrf:lang=0").name == "rrf:lang=0" and not parse_variant("rrf:lang=0").language_aware
    assert parse_variant("hybrid:candidates=200").name == "hybrid:candidates=200"
    assert parse_variant("hybrid:c=50").depth == 50 and parse_variant("bm25").depth == 200
    named = parse_variant("best=rrf:weights=2,1", rrf_k=20)  # shared defaults fill the rest
    assert (named.name, named.weights, named.rrf_k) == ("best", (2.0, 1.0), 20.0)
    for bad, msg in [("dense", "modes"), ("bm25:weights=1,1", "does not apply"), ("rrf:weights=1", "weights"),
                     ("rrf:k=-1", "rrf_k"), ("rrf:depth=3", "KEY=VALUE"), ("hybrid:c=0", "candidates"),
                     ("=rrf", "empty name"), ("rrf:lang=maybe", "lang"), ("bm25:lang=0", "does not apply")]:
        with pytest.raises(ConfigError, match=msg):
            parse_variant(bad)


def test_eval_variants_share_one_ingest(beir, tmp_path):
    report = run_retrieval_eval(
        beir, ["bm25", "rrf"], HASH, data_dir=tmp_path / "data", rrf_k=30,
        variants=["rrf:weights=1,0", "vector-heavy=rrf:w=0.5,2:k=10", "hybrid:candidates=5",
                  Variant("mine", "rrf", weights=(1.0, 1.0))])
    assert list(report["metrics"]) == ["bm25", "rrf", "rrf:rrf_k=30:weights=1,0", "vector-heavy",
                                       "hybrid:candidates=5", "mine"]
    assert report["ingest"]["documents"] == 30  # ingested once
    assert report["variants"]["rrf"] == {"mode": "rrf", "depth": 100, "candidates": 100, "rrf_k": 30.0,
                                         "weights": "auto", "language_aware": True}
    assert report["variants"]["vector-heavy"]["weights"] == [0.5, 2.0]
    assert report["variants"]["vector-heavy"]["rrf_k"] == 10.0
    assert report["variants"]["hybrid:candidates=5"]["depth"] == 5
    # With the vector leg weighted 0, fusion keeps BM25's order, which finds every document.
    bm25, bm25_only = report["metrics"]["bm25"], report["metrics"]["rrf:rrf_k=30:weights=1,0"]
    assert all(bm25[m] == bm25_only[m] for m in ("recall@1", "recall@10", "mrr@10", "ndcg@10"))
    assert report["metrics"]["hybrid:candidates=5"]["recall@100"] <= 1.0
    with pytest.raises(ConfigError, match="two variants"):
        run_retrieval_eval(beir, ["rrf"], HASH, variants=["rrf:weights=auto"])


def test_eval_queries_and_qrels_files(beir, tmp_path):
    """Other queries (as another language's would be) scored against the folder's corpus."""
    other = tmp_path / "other"
    other.mkdir()
    corpus = load_beir(beir)[0]
    picks = {f"x{i}": f"doc/{i}" for i in (2, 5, 9)}
    with open(other / "queries.jsonl", "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps({"id": q, "text": corpus[d]["text"].split(".")[0]}) + "\n" for q, d in picks.items())
    (other / "qrels.tsv").write_text("query-id\tdoc-id\trelevance\n"
                                     + "".join(f"{q}\t{d}\t1\n" for q, d in picks.items()), encoding="utf-8")
    report = run_retrieval_eval(beir, ["bm25"], HASH, queries_file=other / "queries.jsonl",
                                qrels_file=other / "qrels.tsv", variants=["rrf:w=1,0.5"], per_query=True)
    assert report["queries"] == 3 and report["queries_file"].endswith("queries.jsonl")
    assert report["per_query"]["bm25"]["recall@10"] == {"x2": 1.0, "x5": 1.0, "x9": 1.0}
    assert report["metrics"]["bm25"]["recall@10"] == 1.0 and "rrf:weights=1,0.5" in report["metrics"]
    # The folder's qrels know none of these query ids.
    with pytest.raises(ConfigError, match="no query has a relevant document"):
        run_retrieval_eval(beir, ["bm25"], HASH, queries_file=other / "queries.jsonl")
    # Judgements that name documents of another corpus are refused, not scored as zeros.
    (other / "qrels.tsv").write_text("query-id\tdoc-id\trelevance\nx2\tother/2\t1\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="is in corpus.jsonl"):
        run_retrieval_eval(beir, ["bm25"], HASH, queries_file=other / "queries.jsonl",
                           qrels_file=other / "qrels.tsv")


def test_cli_eval_variants_and_queries(beir, tmp_path):
    env = {"RAG_EMBEDDER__BACKEND": "sentence-transformers", "RAG_EMBEDDER__DIM": "256",
           "RAG_VECTOR__BACKEND": "numpy", "RAG_CONFIG": "", "RAG_DATA_DIR": str(tmp_path / "unused")}
    runner = CliRunner()
    args = ["eval", "retrieval", str(beir), "--embedder", "hash", "--queries", str(beir / "queries.jsonl"),
            "--qrels", str(beir / "qrels.tsv"), "--rrf-k", "20", "--weights", "1,0.5",
            "--variant", "rrf:w=2,1", "--variant", "h50=hybrid:c=50"]
    res = runner.invoke(cli, [*args, "--json"], env=env, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["embedder"].startswith("hash") and report["embedder"].endswith(":256")  # env still applies
    assert list(report["metrics"]) == ["rrf:rrf_k=20:weights=2,1", "h50"]  # --variant alone: no modes
    assert report["variants"]["h50"]["candidates"] == 50

    res = runner.invoke(cli, [*args, "--modes", "bm25,rrf"], env=env, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "candidates 100, rrf_k 20, weights 1,0.5" in res.stdout
    assert "rrf:rrf_k=20:weights=2,1" in res.stdout and "h50" in res.stdout and "queries from" in res.stdout

    # Without --weights/--rrf-k/--candidates, plain modes run with the settings' parameters.
    res = runner.invoke(cli, ["eval", "retrieval", str(beir), "--embedder", "hash", "--modes", "rrf",
                              "--variant", "rrf:k=20", "--json"],
                        env={**env, "RAG_RETRIEVAL__WEIGHTS": "[2, 1]", "RAG_RETRIEVAL__CANDIDATES": "40"},
                        catch_exceptions=False)
    assert res.exit_code == 0, res.output
    variants = json.loads(res.stdout)["variants"]
    assert variants["rrf"] == {"mode": "rrf", "depth": 40, "candidates": 40, "rrf_k": 60.0, "weights": [2.0, 1.0],
                               "language_aware": True}
    assert variants["rrf:candidates=40:rrf_k=20:weights=2,1"]["rrf_k"] == 20.0

    for bad, msg in [(["--weights", "1"], "--weights"), (["--variant", "rrf:x=1"], "KEY=VALUE"),
                     (["--variant", "bm25:k=3"], "does not apply")]:
        res = runner.invoke(cli, ["eval", "retrieval", str(beir), "--embedder", "hash", *bad], env=env)
        assert res.exit_code == 1 and msg in res.stderr, res.output


@pytest.mark.parametrize("command", ["retrieval", "answers"])
def test_eval_without_its_extra_says_what_to_install(beir, monkeypatch, command):
    monkeypatch.setitem(sys.modules, "ir_measures", None)  # as if ragqa[eval] were not installed
    res = CliRunner().invoke(cli, ["eval", command, str(beir)], env={"RAG_CONFIG": ""})
    assert res.exit_code != 0
    assert "ragqa eval needs ir-measures, which are not installed: pip install 'ragqa[eval]'" in res.output
    assert "unexpected" not in res.output and "Traceback" not in res.output


def test_a_document_that_is_all_boilerplate_is_counted_not_fatal(tmp_path: Path) -> None:
    """RGB-zh has passages that are one "最后更新于" (last updated) line, which the boilerplate
    filter removes whole: the corpus still ingests, and says how many had no text."""
    from evals.retrieval import ingest_corpus
    from ingest.services import open_services
    from tests.conftest import make_settings

    corpus = {f"doc/{i}": {"title": "", "text": " ".join(doc_text(i)), "lang": "en"} for i in range(4)}
    corpus["doc/empty"] = {"title": "", "text": "最后更新于 2023-05-01", "lang": "zh"}
    services = open_services(make_settings(tmp_path / "data", **HASH))
    try:
        report = ingest_corpus(services, corpus, tmp_path / "docs")
    finally:
        services.close()
    assert (report["documents"], report["empty_documents"]) == (4, 1)
