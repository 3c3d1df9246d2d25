"""``embedder.backend: auto`` on English documents: the int8 MiniLM for a new index, the model an
existing index was built with for that index, and fp32 with one log line when onnxruntime is
missing. With the packaged models (the int8 one is built once per machine, about 6 s)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ingest.pipeline import reindex
from ingest.services import open_services
from rag.config import SourceConfig
from rag.retrieval import HybridRetriever
from rag.services import AUTO_META, Services
from tests.conftest import make_settings

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "xquad-en"
PARAGRAPHS = 8


def _docs(folder: Path) -> str:
    """The first XQuAD-en paragraphs as Markdown files; returns the first one's first sentence."""
    folder.mkdir(parents=True)
    docs = [json.loads(line) for line in (DATA / "corpus.jsonl").read_text("utf-8").splitlines()[:PARAGRAPHS]]
    for i, d in enumerate(docs):
        (folder / f"p{i}.md").write_text(f"# {d['title']}\n\n{d['text']}\n", encoding="utf-8")
    return str(docs[0]["text"]).split(". ")[0]


def _ingest(services: Services, folder: Path) -> None:
    services.state.add_source(SourceConfig(name="docs", kind="folder", location=str(folder)))
    with services.write_lock():
        report = reindex(services, "docs", "full")
    assert report.failed == 0 and report.added == PARAGRAPHS


def test_a_new_english_index_gets_the_int8_minilm(tmp_path):
    sentence = _docs(tmp_path / "docs")
    services = open_services(make_settings(tmp_path / "data", embedder={"backend": "auto", "progress": False}))
    _ingest(services, tmp_path / "docs")
    assert services.embedder_choice()["backend"] == "onnx-int8"
    assert services.state.get_meta("embedder") == "onnx-int8:all-MiniLM-L6-v2:384"
    hits = HybridRetriever.from_services(services).retrieve(sentence, k=3)
    assert hits and hits[0].chunk.url.endswith("/p0.md")
    services.close()


def test_an_index_recorded_with_the_fp32_minilm_keeps_it(tmp_path):
    _docs(tmp_path / "docs")
    settings = make_settings(tmp_path / "data", embedder={"backend": "auto", "progress": False})
    services = open_services(settings)
    recorded = {"backend": "sentence-transformers", "reason": "chosen at the first ingest: 0% of its first 8 "
                "documents are Chinese (under 10%)"}
    services.state.set_meta(AUTO_META, json.dumps(recorded))
    services.close()

    services = open_services(settings)
    assert services.embedder_settings.backend == "sentence-transformers"
    _ingest(services, tmp_path / "docs")
    assert services.embedder_choice() == recorded
    assert services.state.get_meta("embedder") == "st:all-MiniLM-L6-v2:384"
    services.close()


def test_an_index_built_before_auto_recorded_choices_keeps_its_model(tmp_path):
    """An index with vectors of the fp32 MiniLM and no recorded choice (built when that was the
    default) is not re-chosen: its next ingest would refuse the int8 model's vectors."""
    _docs(tmp_path / "docs")
    built = make_settings(tmp_path / "data", embedder={"backend": "sentence-transformers", "progress": False})
    services = open_services(built)
    _ingest(services, tmp_path / "docs")
    assert services.state.get_meta(AUTO_META) is None
    services.close()

    services = open_services(make_settings(tmp_path / "data", embedder={"backend": "auto", "progress": False}))
    assert not services.embedder_undecided
    assert services.embedder_choice() == {"backend": "sentence-transformers",
                                          "reason": "the index was built with st:all-MiniLM-L6-v2"}
    with services.write_lock():
        assert reindex(services, "docs", "full").unchanged == PARAGRAPHS
    assert services.embedder.name == "st:all-MiniLM-L6-v2"
    services.close()


def test_without_onnxruntime_auto_chooses_the_fp32_minilm_and_says_how_to_get_int8(tmp_path):
    code = f"""
import logging, sys
sys.modules["onnxruntime"] = None
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", stream=sys.stdout)
from ingest.services import open_services
from tests.conftest import make_settings
services = open_services(make_settings({str(tmp_path / "data")!r}, embedder={{"backend": "auto"}}))
print("before:", services.embedder_settings.backend)
print("chosen:", services.choose_embedder(["en"] * 5)["backend"])
print("again:", services.choose_embedder(["en"] * 5)["backend"])
services.close()
"""
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, text=True, capture_output=True, timeout=120)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert "before: sentence-transformers" in lines
    assert "chosen: sentence-transformers" in lines and "again: sentence-transformers" in lines
    warnings = [line for line in lines if line.startswith("WARNING")]
    assert warnings == ["WARNING onnxruntime not installed: the English embedder is MiniLM fp32 "
                        "(sentence-transformers); pip install onnxruntime onnx before the first ingest "
                        "for the int8 one (onnx-int8), 3-5x faster on CPU"]
