"""``ragqa eval export-distill``: a teacher's answers as a chat-format training set, from a real
run of the packaged Qwen2.5-Coder-1.5B (``evals/baselines/xquad-en-qwen-small``), from a real
extractive run with its index, and from the server's QA log."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from evals.answers import run_answer_eval
from evals.distill import export_distill
from ingest.services import open_services
from rag.answer import Answerer
from rag.config import Settings
from rag.prompts import PROMPT_VERSION
from rag.support import labels_of
from ragqa.cli import cli
from serve.qa_log import QALog, entry
from tests.fixtures.xquad import xquad_subset

ROOT = Path(__file__).resolve().parents[1]
TEACHER = ROOT / "evals" / "baselines" / "xquad-en-qwen-small"
CORPUS = {json.loads(line)["id"]: json.loads(line) for line in
          (ROOT / "tests" / "data" / "xquad-en" / "corpus.jsonl").read_text(encoding="utf-8").splitlines()}


def _overrides(data_dir: Path, **more: Any) -> dict[str, Any]:
    return {"data_dir": data_dir, "embedder": {"backend": "hash", "dim": 256, "progress": False},
            "vector": {"backend": "numpy"}, "generator": {"backend": "extractive"}, "cache": {"backend": "off"},
            "eval": {"tracking": False}, **more}


def _read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _teacher_rows() -> list[dict[str, Any]]:
    return _read(TEACHER / "rows.jsonl")


def test_a_teacher_run_becomes_chat_rows_with_provenance(tmp_path: Path) -> None:
    out = tmp_path / "train.jsonl"
    result = CliRunner().invoke(cli, ["--data-dir", str(tmp_path / "data"), "eval", "export-distill", str(TEACHER),
                                      "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    source = _teacher_rows()
    cited = [r for r in source if r["citations"]]
    assert report["read"] == 8 and report["kept"] == len(cited) == 6 and report["dropped"] == {"uncited": 2}
    rows = _read(out)
    assert len(rows) == 6
    for row, teacher in zip(rows, cited, strict=True):
        system, user, assistant = row["messages"]
        assert [m["role"] for m in row["messages"]] == ["system", "user", "assistant"]
        assert "cite the passages" in system["content"]
        assert user["content"].startswith("<context>\n[1] ") and f"<question>\n{teacher['question']}\n" in user["content"]
        assert assistant["content"] == teacher["answer"]
        # the packed passages, in label order, from the dataset's documents (an XQuAD paragraph is one chunk)
        doc_of = dict(map(tuple, teacher["retrieved"]))
        positions = [user["content"].index(CORPUS[doc_of[c]]["text"]) for c in teacher["packed"]]
        assert positions == sorted(positions) and len(teacher["packed"]) == 2
        for label in labels_of(assistant["content"]):
            assert f"[{label}] " in user["content"]
        p = row["provenance"]
        assert p["source"] == "eval-run" and p["run"] == "xquad-en-qwen-small" and p["qid"] == teacher["qid"]
        assert p["model"] == "qwen2.5-coder-1.5b-instruct" and p["quantization"] == "Q4_K_M"
        assert p["dataset"] == "xquad-en" and p["context"] == "corpus" and p["prompt_version"] == PROMPT_VERSION
        assert p["row"] == source.index(teacher) + 1 and p["f1"] == teacher["metrics"]["f1"]


def test_filters_count_what_they_drop(tmp_path: Path) -> None:
    rows = _teacher_rows()
    everything = export_distill([TEACHER], tmp_path / "all.jsonl", keep_uncited=True)
    assert everything["kept"] == 8 and everything["dropped"] == {}
    strict = export_distill([TEACHER], tmp_path / "f1.jsonl", min_f1=0.3)
    low = [r for r in rows if r["citations"] and r["metrics"]["f1"] < 0.3]
    assert low and strict["dropped"] == {"uncited": 2, "f1 below": len(low)}
    assert strict["kept"] == 6 - len(low)
    assert all(r["provenance"]["f1"] >= 0.3 for r in _read(tmp_path / "f1.jsonl"))
    assert export_distill([TEACHER], tmp_path / "p.jsonl", profile="large")["dropped"] == {"other profile": 8}


def test_duplicates_and_near_duplicates_are_kept_once(tmp_path: Path) -> None:
    copy = tmp_path / "again"
    shutil.copytree(TEACHER, copy)
    rows = _teacher_rows()
    # the same question asked again, differently spaced and cased; and a rephrasing on the same context
    again = [dict(rows[0], question="  where is POLONIA's home venue   located ?"),
             dict(rows[0], question="Where is the home venue of Polonia located?")]
    (copy / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in again), encoding="utf-8")
    report = export_distill([TEACHER, TEACHER, copy], tmp_path / "d.jsonl")
    assert report["kept"] == 7 and report["dropped"] == {"uncited": 4, "duplicate": 7}
    assert report["sources"] == {str(TEACHER): 6, str(copy): 1}  # a source given twice counts once
    near = export_distill([TEACHER, copy], tmp_path / "n.jsonl", near_dup=0.6)
    assert near["kept"] == 6 and near["dropped"] == {"uncited": 2, "duplicate": 1, "near duplicate": 1}


def test_bad_input_is_a_clear_error(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(cli, ["eval", "export-distill", str(tmp_path), "--out", str(tmp_path / "x.jsonl")])
    assert result.exit_code == 1 and "no rows.jsonl" in result.output
    result = runner.invoke(cli, ["eval", "export-distill", str(TEACHER), "--out", "x", "--min-f1", "2"])
    assert result.exit_code == 2 and "--min-f1" in result.output


@pytest.fixture(scope="module")
def extractive_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A real eval run (hash embedder, extractive answerer) on 30 XQuAD paragraphs, and its data dir."""
    base = tmp_path_factory.mktemp("distill")
    dataset = xquad_subset(base / "xquad-en-30")
    run_answer_eval(dataset, overrides=_overrides(base / "data"), limit=8, seed=1, abstain_limit=4,
                    out=base / "run", progress=False, tracking=False)
    return base / "run", base / "data"


def test_an_eval_run_takes_its_passages_from_the_index_it_answered_from(extractive_run, tmp_path: Path) -> None:
    run, data = extractive_run
    rows = _read(run / "rows.jsonl")
    report = export_distill([run], tmp_path / "t.jsonl", data_dir=data)
    answered = [r for r in rows if r["pass"] == "answer"]
    assert report["read"] == len(rows) == 12 and report["dropped"]["abstention pass"] == 4
    assert report["kept"] == sum(1 for r in answered if r["citations"] and not r["metrics"]["abstained"])
    out = _read(tmp_path / "t.jsonl")
    assert out and all(r["provenance"]["context"] == "index" for r in out)
    for r in out:  # the extractive answer's sentences are the passages' own
        answer = r["messages"][2]["content"]
        first = answer.split(" [")[0]
        assert first in r["messages"][1]["content"]
    kept_unknown = export_distill([run], tmp_path / "u.jsonl", data_dir=data, keep_abstentions=True)
    said = sum(1 for r in rows if r["pass"] == "abstain" and r["metrics"]["abstention"] == 1.0)
    assert kept_unknown["dropped"].get("abstention pass", 0) == 4 - said


def test_the_qa_log_gives_the_cited_passages_relabelled(extractive_run, tmp_path: Path) -> None:
    _, data = extractive_run
    index = next((data / "evals" / "index").glob("*/data"))
    settings = Settings.load(None, **{**_overrides(index), "serve": {"qa_log_path": tmp_path / "qa.jsonl"}})
    services = open_services(settings)
    log = QALog.from_settings(settings)
    assert log is not None

    async def ask(question: str) -> None:  # as the server does: the streamed text and its done event
        answerer = Answerer(services)
        parts: list[str] = []
        done = None
        try:
            async for event in answerer.stream(question):
                if event.kind == "delta":
                    parts.append(event.text)
                elif event.kind in ("done", "error"):
                    done = event
        finally:
            await answerer.close()
        log.write(entry("ask", question, "".join(parts), done))

    questions = [r["question"] for r in _read(extractive_run[0] / "rows.jsonl") if r["pass"] == "answer"][:3]
    try:
        for q in questions:
            asyncio.run(ask(q))
    finally:
        log.close()
        services.close()
    report = export_distill([tmp_path / "qa.jsonl"], tmp_path / "t.jsonl", data_dir=index)
    logged = _read(tmp_path / "qa.jsonl")
    assert report["read"] == 3 and report["kept"] == sum(1 for r in logged if r["citations"])
    for row in _read(tmp_path / "t.jsonl"):
        user, assistant = row["messages"][1]["content"], row["messages"][2]["content"]
        labels = labels_of(assistant)
        assert labels and sorted(set(labels)) == list(range(1, max(labels) + 1))  # renumbered 1..n
        assert f"[{max(labels) + 1}] " not in user
        assert row["provenance"]["source"] == "qa-log" and row["provenance"]["context"] == "cited"
        assert row["provenance"]["line"] >= 1

