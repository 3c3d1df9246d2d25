"""The int8 ONNX MiniLM (``embedder.backend: onnx-int8``): close to fp32, its own embedder, built once.

The model is exported and quantized once per machine into ~/.cache/ragqa/models (about 10 s
on two cores the first time), then reused by every test and every run.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from ingest.pipeline import reindex
from ingest.services import open_services
from rag.config import EmbedderSettings, SourceConfig
from rag.embedders import make_embedder, onnx_export
from rag.errors import ConfigError, EmbedderError
from tests.conftest import make_settings
from tests.embedder_suite import EmbedderSuite

ROOT = Path(__file__).resolve().parents[1]
XQUAD = ROOT / "tests" / "data" / "xquad-en"
# Measured over 766 real passages (bench/RESULTS-onnx.md): min 0.9826, p1 0.9888.
MIN_COSINE = 0.975


def needs_onnx() -> None:
    """The onnx extra, which the tests install: a broken install fails here instead of skipping."""
    import onnx  # noqa: F401
    import onnxruntime  # noqa: F401


@pytest.fixture(scope="module")
def int8():
    needs_onnx()
    return make_embedder(EmbedderSettings(backend="onnx-int8", progress=False))


def passages(n: int) -> list[str]:
    with (XQUAD / "corpus.jsonl").open(encoding="utf-8") as fh:
        return [json.loads(line)["text"] for line in fh][:n]


class TestOnnxInt8Contract(EmbedderSuite):
    @pytest.fixture
    def embedder(self, int8):
        return int8


def test_int8_vectors_stay_close_to_fp32_on_real_passages(int8) -> None:
    texts = passages(50)
    fp32 = make_embedder(EmbedderSettings(backend="sentence-transformers", progress=False))
    ours, theirs = int8.embed_documents(texts), fp32.embed_documents(texts)
    assert ours.shape == theirs.shape == (50, 384) and ours.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    cosines = (ours * theirs).sum(axis=1)
    assert cosines.min() > MIN_COSINE, f"least cosine to fp32 {cosines.min():.4f}"
    # A passage ranks its own question's fp32 neighbours the same way: each passage's int8
    # vector is nearest to its own fp32 vector.
    assert (np.argmax(ours @ theirs.T, axis=1) == np.arange(50)).all()


def test_a_text_gets_the_same_vector_alone_or_among_others(int8) -> None:
    texts = passages(12)
    together = int8.embed_documents(texts)
    alone = int8.embed_query(texts[7])
    np.testing.assert_allclose(together[7], alone, atol=1e-6)
    np.testing.assert_allclose(int8.embed_documents(texts[::-1])[::-1], together, atol=1e-6)


def test_texts_embedded_side_by_side_get_the_vectors_they_get_one_by_one(int8) -> None:
    """Texts run on parallel threads; a text's vector must not depend on the thread count."""
    texts = passages(24)
    parallel = make_embedder(EmbedderSettings(backend="onnx-int8", threads=3, progress=False)).embed_documents(texts)
    serial = make_embedder(EmbedderSettings(backend="onnx-int8", threads=1, progress=False))
    np.testing.assert_array_equal(serial.embed_documents(texts), parallel)


def test_a_forked_child_embeds_with_threads_of_its_own(int8) -> None:
    """The parent's worker threads do not exist in a fork; the child must not wait on them."""
    import multiprocessing

    texts = passages(6)
    expected = int8.embed_documents(texts)  # the parent's pool now exists
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    child = ctx.Process(target=lambda: results.put(int8.embed_documents(texts)))  # forked: nothing pickled
    child.start()
    try:
        got = results.get(timeout=120)
    finally:
        child.join(timeout=10)
        if child.is_alive():
            child.kill()
    np.testing.assert_array_equal(got, expected)


def test_the_int8_embedder_is_another_embedder_for_the_index_guard(tmp_path: Path) -> None:
    needs_onnx()
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# Tea\n\nGreen tea is steamed or pan-fired soon after picking.\n")
    source = SourceConfig(name="docs", kind="folder", location=str(tmp_path / "docs"), lang="en")

    def ingest(backend: str):
        svc = open_services(make_settings(tmp_path / "data", embedder={"backend": backend, "progress": False}))
        try:
            if not svc.state.sources():
                svc.state.add_source(source)
            with svc.write_lock():
                return reindex(svc, "docs", "full")
        finally:
            svc.close()

    assert ingest("sentence-transformers").chunks_embedded == 1
    with pytest.raises(ConfigError, match="built with embedder st:all-MiniLM-L6-v2:384, but the settings "
                                          "select onnx-int8:all-MiniLM-L6-v2:384"):
        ingest("onnx-int8")


def test_without_onnxruntime_the_error_names_the_extra() -> None:
    script = """import sys; sys.modules["onnxruntime"] = None
from rag.config import EmbedderSettings
from rag.embedders import make_embedder
from rag.errors import EmbedderError
embedder = make_embedder(EmbedderSettings(backend="onnx-int8"))  # builds nothing yet
try:
    embedder.embed_query("hello")
except EmbedderError as exc:
    print(exc)
"""
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, text=True, capture_output=True, timeout=120,
                         check=False)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "the onnx-int8 embedder needs onnxruntime: pip install 'ragqa[onnx]'"


def test_a_model_without_mean_pooling_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "cls-model"
    (folder / "1_Pooling").mkdir(parents=True)
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 384, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}))
    embedder = make_embedder(EmbedderSettings(backend="onnx-int8", model=str(folder)))
    with pytest.raises(EmbedderError, match="Transformer \\+ mean Pooling models only"):
        embedder.dim  # noqa: B018


# -- the cache: built once, rebuilt when its source or recipe changes, never seen half-written ----

@pytest.fixture()
def counted_builds(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[int]:
    """The export and quantization replaced by file writes, counted; a slow export lets threads race."""
    builds: list[int] = []
    started = threading.Event()

    def export(folder: Path, out: Path) -> None:
        builds.append(1)
        started.set()
        threading.Event().wait(0.3)
        out.write_bytes(b"fp32")

    monkeypatch.setattr(onnx_export, "export_fp32", export)
    monkeypatch.setattr(onnx_export, "quantize_int8", lambda fp32, out: out.write_bytes(b"int8"))
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "model.safetensors").write_bytes(b"weights v1")
    return builds


def test_two_first_runs_at_once_build_the_model_once(tmp_path: Path, counted_builds: list[int]) -> None:
    cache = tmp_path / "cache"
    paths: list[Path] = []
    threads = [threading.Thread(target=lambda: paths.append(onnx_export.int8_model(tmp_path / "model", "m", cache)))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(counted_builds) == 1
    assert paths == [cache / "m-onnx-int8" / "model.onnx"] * 3 and paths[0].read_bytes() == b"int8"
    assert sorted(p.name for p in cache.iterdir()) == ["m-onnx-int8", "m-onnx-int8.lock"]  # no temp folder left


def test_changed_weights_or_a_damaged_checksum_rebuild_the_model(tmp_path: Path, counted_builds: list[int]) -> None:
    cache, weights = tmp_path / "cache", tmp_path / "model" / "model.safetensors"
    onnx_export.int8_model(tmp_path / "model", "m", cache)
    onnx_export.int8_model(tmp_path / "model", "m", cache)
    assert len(counted_builds) == 1
    weights.write_bytes(b"weights, version 2")
    onnx_export.int8_model(tmp_path / "model", "m", cache)
    record = json.loads((cache / "m-onnx-int8" / "checksum.json").read_text())
    assert len(counted_builds) == 2 and record["recipe"] == onnx_export.RECIPE
    assert record["source_sha256"] == hashlib.sha256(b"weights, version 2").hexdigest()
    (cache / "m-onnx-int8" / "checksum.json").write_text("{not json")
    onnx_export.int8_model(tmp_path / "model", "m", cache)
    assert len(counted_builds) == 3
