"""Retrieval that is right in both languages without settings: the language detector, the
language gate of the vector leg, adaptive fusion weights and the automatic embedder choice,
on real XQuAD paragraphs with the packaged models."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from evals.retrieval import parse_variant
from ingest.pipeline import reindex
from ingest.services import open_services
from rag.config import SourceConfig
from rag.errors import ConfigError
from rag.lang import detect_lang, model_languages
from rag.retrieval import HybridRetriever
from rag.retrieval.adaptive import Leg, adaptive_weights
from rag.retrieval.hybrid import UNCOVERED_SHARE
from rag.services import Services
from ragqa.cli import cli
from tests.conftest import make_settings

DATA = Path(__file__).parent / "data"
PARAGRAPHS = 30


def _xquad(lang: str, folder: Path) -> list[tuple[str, str]]:
    """The first paragraphs of XQuAD-``lang`` as Markdown files; returns (question, doc file)."""
    folder.mkdir(parents=True)
    docs = [json.loads(line) for line in (DATA / f"xquad-{lang}" / "corpus.jsonl").read_text("utf-8").splitlines()]
    name = {}
    for i, d in enumerate(docs[:PARAGRAPHS]):
        name[d["id"]] = f"p{i:03d}.md"
        (folder / name[d["id"]]).write_text(f"# {d['title']}\n\n{d['text']}\n", encoding="utf-8")
    gold = {}
    for line in (DATA / f"xquad-{lang}" / "qrels.tsv").read_text(encoding="utf-8").splitlines()[1:]:
        qid, doc, _ = line.split("\t")
        gold[qid] = doc
    questions = [json.loads(line)
                 for line in (DATA / f"xquad-{lang}" / "queries.jsonl").read_text("utf-8").splitlines()]
    return [(q["text"], name[gold[q["id"]]]) for q in questions if gold.get(q["id"]) in name]


def _ingest(services: Services, folder: Path, name: str = "xquad") -> None:
    services.state.add_source(SourceConfig(name=name, kind="folder", location=str(folder)))
    with services.write_lock():
        report = reindex(services, name, "full")
    assert report.failed == 0 and report.added == PARAGRAPHS


def _mrr(retriever: HybridRetriever, questions: list[tuple[str, str]]) -> float:
    total = 0.0
    for question, doc in questions:
        files = [h.chunk.url.rsplit("/", 1)[-1] for h in retriever.retrieve(question, k=10)]
        total += 1 / (files.index(doc) + 1) if doc in files else 0.0
    return total / len(questions)


@pytest.fixture(scope="module")
def chinese_on_minilm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Services, list]]:
    """Chinese paragraphs indexed with the packaged English MiniLM, chosen by hand."""
    base = tmp_path_factory.mktemp("zh-minilm")
    questions = _xquad("zh", base / "docs")
    services = open_services(make_settings(base / "data", embedder={"backend": "sentence-transformers",
                                                                "progress": False}))
    _ingest(services, base / "docs")
    yield services, questions
    services.close()


def test_detector_and_model_languages():
    assert detect_lang("What is 北京?") == "en" and detect_lang("北京是什么 city") == "zh"
    assert detect_lang("1234 !!") == "en" and detect_lang("1234", empty="und") == "und"
    assert model_languages("all-MiniLM-L6-v2") == frozenset({"en"})
    assert model_languages("paraphrase-multilingual-MiniLM-L12-v2") is None
    assert model_languages("embed-english-v3.0") == frozenset({"en"})
    assert model_languages("/srv/models/my-own-model") is None  # unknown: trusted with any language


def test_a_chinese_question_skips_an_english_only_vector_leg(chinese_on_minilm):
    services, questions = chinese_on_minilm
    assert services.embedder.languages == frozenset({"en"})
    question = questions[0][0]
    result = HybridRetriever.from_services(services, dedup_threshold=None).search(question, k=10)
    bm25_w, vector_w = result.fusion["weights"]
    assert result.fusion["lang"] == "zh" and 0 < vector_w <= UNCOVERED_SHARE * (bm25_w + vector_w)
    assert "does not rank" in result.fusion["why"] and "keeps 3% of its weight" in result.fusion["why"]
    ungated = HybridRetriever.from_services(services, language_aware=False).search(question, k=10)
    assert ungated.fusion["weights"][1] > 10 * vector_w
    hybrid = HybridRetriever(services, mode="hybrid", dedup_threshold=None).search(question, k=10)
    bm25 = HybridRetriever(services, mode="bm25", dedup_threshold=None).retrieve(question, k=10)
    assert [h.chunk_id for h in hybrid.hits] == [h.chunk_id for h in bm25]  # not reordered by cosine
    assert "embed_ms" not in hybrid.timings and hybrid.fusion["weights"] == (1.0, 0.0)


def test_the_gate_keeps_chinese_retrieval_at_bm25_quality(chinese_on_minilm):
    """The measured reason for the gate: fusing MiniLM's near-random Chinese ranking drags
    BM25 down; with the gate the default equals BM25 alone."""
    services, questions = chinese_on_minilm
    bm25 = _mrr(HybridRetriever(services, mode="bm25", dedup_threshold=None), questions)
    default = _mrr(HybridRetriever.from_services(services, dedup_threshold=None), questions)
    ungated = _mrr(HybridRetriever.from_services(services, dedup_threshold=None, language_aware=False),
                   questions)
    assert default >= bm25 - 0.01, (default, bm25)
    assert ungated < bm25 - 0.02, (ungated, bm25)


def test_search_explain_prints_the_weights_and_why(chinese_on_minilm):
    services, questions = chinese_on_minilm
    env = {"RAG_DATA_DIR": str(services.data_dir), "RAG_EMBEDDER__BACKEND": "sentence-transformers",
           "RAG_VECTOR__BACKEND": "numpy", "RAG_CONFIG": ""}
    res = CliRunner().invoke(cli, ["search", questions[0][0], "--explain", "-k", "2"], env=env,
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    first = res.stdout.splitlines()[0]
    assert first.startswith("language zh; weights bm25 ") and "the question is in Chinese" in first
    assert first.endswith("the vector leg keeps 3% of its weight (adaptive: rag.retrieval.adaptive)")
    res = CliRunner().invoke(cli, ["search", "Who won the game?", "--explain", "-k", "2", "--json"], env=env,
                             catch_exceptions=False)
    fusion = json.loads(res.stdout)["fusion"]  # an English question: MiniLM ranks it, fused adaptively
    assert fusion["lang"] == "en" and fusion["why"].startswith("adaptive:")
    assert sum(fusion["weights"]) == pytest.approx(1.0, abs=0.01) and fusion["weights"][1] > 0


def test_adaptive_weights_follow_the_legs():
    # A question BM25 answers: its top hit stands far above the rest, and few chunks match.
    peaked = Leg([f"d{i}" for i in range(12)], [30.0, 9.0] + [8.0 - 0.1 * i for i in range(10)])
    vague = Leg([f"v{i}" for i in range(100)], [0.52 - 0.0005 * i for i in range(100)])
    bm25_w, vector_w = adaptive_weights(peaked, vague, "Which team won Super Bowl 50?")
    assert bm25_w > vector_w
    # A question in another language than the documents: BM25 matches little and flatly,
    # the vector leg has a clear winner.
    flat = Leg(["a", "b", "c"], [2.1, 2.0, 2.0])
    sharp = Leg([f"v{i}" for i in range(100)], [0.83, 0.6] + [0.55 - 0.001 * i for i in range(98)])
    bm25_w, vector_w = adaptive_weights(flat, sharp, "超级碗50的冠军是哪支球队？")
    assert vector_w > bm25_w
    assert adaptive_weights(Leg([], []), sharp, "x") == (0.0, 1.0)  # nothing to fuse with


def test_eval_variants_name_auto_weights_and_the_gate():
    assert parse_variant("rrf").weights is None and parse_variant("rrf").name == "rrf"
    assert parse_variant("rrf", weights=(1, 1)).name == "rrf:weights=1,1"
    assert parse_variant("rrf:w=auto:lang=0").name == "rrf:lang=0"  # auto weights are the standard
    assert parse_variant("rrf:lang=off").language_aware is False
    with pytest.raises(ConfigError):
        parse_variant("bm25:lang=0")
    with pytest.raises(ConfigError):
        parse_variant("rrf:lang=maybe")


@pytest.mark.parametrize(("lang", "backend"), [("zh", "use"), ("en", "onnx-int8")])
def test_auto_embedder_is_chosen_by_the_first_ingest_and_kept(tmp_path, lang, backend):
    questions = _xquad(lang, tmp_path / "docs")
    settings = make_settings(tmp_path / "data", embedder={"backend": "auto", "progress": False})
    services = open_services(settings)
    assert services.embedder_undecided
    assert "not chosen yet" in services.backend_names()["embedder"]
    _ingest(services, tmp_path / "docs")
    choice = services.embedder_choice()
    assert choice is not None and choice["backend"] == backend
    assert services.embedder_settings.backend == backend and not services.embedder_undecided
    expected_name = services.embedder.name
    assert services.state.get_meta("embedder") == f"{expected_name}:{services.embedder.dim}"
    hits = HybridRetriever.from_services(services).retrieve(questions[0][0], k=5)
    assert questions[0][1] in [h.chunk.url.rsplit("/", 1)[-1] for h in hits]
    services.close()

    # Another process on the same data directory uses the recorded choice, and says why.
    again = open_services(settings)
    assert again.embedder.name == expected_name
    env = {"RAG_DATA_DIR": str(tmp_path / "data"), "RAG_VECTOR__BACKEND": "numpy", "RAG_CONFIG": ""}
    res = CliRunner().invoke(cli, ["status"], env=env, catch_exceptions=False)
    share = "100%" if lang == "zh" else "0%"
    assert f"embedder: auto: {backend}, chosen at the first ingest: {share} of its first" in res.stdout
    # A second ingest changes nothing about the choice.
    with again.write_lock():
        assert reindex(again, "xquad", "full").unchanged == PARAGRAPHS
    assert again.embedder_choice() == choice
    again.close()


def test_status_warns_about_documents_the_embedder_does_not_rank(chinese_on_minilm):
    services, _ = chinese_on_minilm
    env = {"RAG_DATA_DIR": str(services.data_dir), "RAG_EMBEDDER__BACKEND": "sentence-transformers",
           "RAG_VECTOR__BACKEND": "numpy", "RAG_CONFIG": ""}
    res = CliRunner().invoke(cli, ["status"], env=env, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert f"documents by language: zh {PARAGRAPHS}" in res.stdout
    assert (f"warning: {PARAGRAPHS} Chinese documents, which the embedder st:all-MiniLM-L6-v2 does not rank: "
            "Chinese questions use mostly keyword search.") in res.stdout
    res = CliRunner().invoke(cli, ["status"], env={**env, "RAG_EMBEDDER__BACKEND": "use"}, catch_exceptions=False)
    assert "warning" not in res.stdout  # a multilingual embedder ranks them


def test_searching_before_the_first_ingest_does_not_fix_the_vector_size(tmp_path):
    """A query (or a health probe) against an empty index must not create the vector collection
    at the provisional model's size: the first ingest may choose another model."""
    _xquad("zh", tmp_path / "docs")
    services = open_services(make_settings(tmp_path / "data", embedder={"backend": "auto", "progress": False},
                                      vector={"backend": "milvus"}))
    try:
        assert HybridRetriever.from_services(services).retrieve("黑豹队", k=3) == []
        assert services.vector.count() == 0
        _ingest(services, tmp_path / "docs")  # chooses USE (512 dimensions), not MiniLM's 384
        assert services.embedder_settings.backend == "use" and services.vector.count() > 0
        assert HybridRetriever.from_services(services).retrieve("黑豹队的防守", k=3)
    finally:
        services.close()
