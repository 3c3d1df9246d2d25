"""The admin CLI contract, through click's runner and a real folder source."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ragqa.cli import cli

REPORT_KEYS = {"source", "mode", "fetched", "unchanged", "changed", "added", "deleted", "failed",
               "chunks_embedded", "seconds"}


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {
        "RAG_DATA_DIR": str(tmp_path / "data"),
        "RAG_EMBEDDER__BACKEND": "hash",
        "RAG_VECTOR__BACKEND": "numpy",
        "RAG_CONFIG": "",
    }


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    root = tmp_path / "notes"
    root.mkdir()
    (root / "tls.md").write_text("# TLS\n\nCertificates are verified against the system store.\n")
    (root / "cache.md").write_text("# Caching\n\nAnswers are cached for ten minutes.\n")
    (root / "zh.txt").write_text("黑豹队的防守只丢了三百零八分，在联赛中排名第六。\n")
    return root


def invoke(env: dict[str, str], *args: str):
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


def test_ingest_reindex_status_search(env, folder):
    res = invoke(env, "ingest", str(folder), "--name", "notes", "--trust", "high", "--json")
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert REPORT_KEYS <= set(report) and report["added"] == 3 and report["chunks_embedded"] >= 3

    (folder / "cache.md").write_text("# Caching\n\nAnswers are cached for one hour.\n")
    (folder / "zh.txt").unlink()
    res = invoke(env, "reindex", "--json")
    assert res.exit_code == 0, res.output
    lines = [json.loads(line) for line in res.stdout.splitlines()]
    assert len(lines) == 1 and REPORT_KEYS <= set(lines[0])
    assert (lines[0]["changed"], lines[0]["deleted"], lines[0]["unchanged"]) == (1, 1, 1)

    res = invoke(env, "status", "--json")
    status = json.loads(res.stdout)
    src = status["sources"][0]
    assert (src["name"], src["trust"], src["documents"]) == ("notes", "high", 2)
    assert src["last_run"]["status"] == "ok" and src["next_incremental"]
    assert set(status["backends"]) >= {"lexical", "vector", "embedder"}

    res = invoke(env, "search", "how long are answers cached", "--json", "--k", "1")
    hit = json.loads(res.stdout)["hits"][0]
    assert "one hour" in hit["text"] and hit["doc_id"] == "notes:cache.md"
    res = invoke(env, "search", "cached", "--since", "2999-01-01", "--json")
    assert json.loads(res.stdout)["hits"] == []

    res = invoke(env, "search", "certificates")
    assert res.exit_code == 0 and "TLS" in res.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("reindex", "--source", "nope"), "unknown source 'nope'"),
        (("ingest", "/does/not/exist"), "folder not found"),
        (("ingest", "ftp://example.org/x"), "unsupported source"),
        (("search", "x", "--since", "yesterday"), "not an ISO 8601 date"),
        (("reindex",), "no sources registered"),
    ],
)
def test_errors_are_one_line_without_traceback(env, args, message):
    res = CliRunner().invoke(cli, list(args), env=env)
    assert res.exit_code == 1
    assert message in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.output


def test_unreachable_url_is_one_clear_error(env):
    res = CliRunner().invoke(cli, ["ingest", "http://127.0.0.1:9/docs/"], env=env)
    assert res.exit_code == 1
    assert res.stderr.startswith("error: cannot crawl http://127.0.0.1:9/docs/")
    assert len(res.stderr.strip().splitlines()) == 1
    assert json.loads(invoke(env, "sources", "--json").stdout) == []


def test_bad_config_is_one_line(env, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("chunking:\n  size_tokens: -1\n")
    res = CliRunner().invoke(cli, ["--config", str(bad), "status"], env=env)
    assert res.exit_code == 1
    assert "chunking.size_tokens" in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_locked_data_dir_is_one_clear_error(env, folder):
    from filelock import FileLock

    data = Path(env["RAG_DATA_DIR"])
    data.mkdir(parents=True)
    with FileLock(str(data / "write.lock")):  # as another ragqa process would hold it
        res = CliRunner().invoke(cli, ["ingest", str(folder)], env=env)
    assert res.exit_code == 1 and "is locked by another ragqa process" in res.stderr


def test_help_explains_every_command(env):
    res = invoke(env, "--help")
    for command in ("ingest", "reindex", "status", "schedule", "search"):
        assert command in res.stdout
    res = invoke(env, "reindex", "--help")
    assert "--mode" in res.stdout and "incremental" in res.stdout


def test_a_usage_error_is_clicks_own_message_and_exit_code(tmp_path):
    res = CliRunner().invoke(cli, ["ask", "   "], env={"RAG_DATA_DIR": str(tmp_path / "data"), "RAG_CONFIG": ""})
    assert res.exit_code == 2
    assert "Error: the question is empty" in res.output and "unexpected" not in res.output


def test_docs_cli_md_is_the_commands_own_help():
    """docs/cli.md is written by ``python -m ragqa.cli.docs``; a command or option added without
    rewriting it fails here."""
    from ragqa.cli.docs import render

    committed = (Path(__file__).parent.parent / "docs" / "cli.md").read_text(encoding="utf-8")
    assert committed == render(), "docs/cli.md is stale: python -m ragqa.cli.docs > docs/cli.md"
    for command in ("ask", "eval retrieval", "keys create", "rebuild", "serve", "status", "verify"):
        assert f"## `ragqa {command}`" in committed
