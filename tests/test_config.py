from __future__ import annotations

from pathlib import Path

import pytest

from rag.config import Settings
from rag.errors import ConfigError
from rag.types import Trust


def test_defaults_keep_everything_under_the_data_dir(monkeypatch):
    monkeypatch.delenv("RAG_DATA_DIR", raising=False)
    s = Settings.load()
    assert s.data_dir == Path(".ragqa")
    assert s.milvus_uri == str(Path(".ragqa") / "milvus.db")
    assert s.lexical_path == Path(".ragqa") / "lexical"


def test_env_prefix_and_nested_sections(monkeypatch, tmp_path):
    monkeypatch.setenv("RAG_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("RAG_CHUNKING__SIZE_TOKENS", "128")
    monkeypatch.setenv("RAG_VECTOR__BACKEND", "numpy")
    s = Settings.load()
    assert s.data_dir == tmp_path and s.chunking.size_tokens == 128 and s.vector.backend == "numpy"


def test_yaml_file_and_precedence(monkeypatch, tmp_path):
    cfg = tmp_path / "ragqa.yaml"
    cfg.write_text(
        "data_dir: /srv/rq\nchunking:\n  size_tokens: 300\n  overlap_tokens: 20\n"
        "sources:\n  - {name: docs, kind: folder, location: /srv/docs, trust: high}\n"
    )
    s = Settings.load(cfg)
    assert s.data_dir == Path("/srv/rq") and s.chunking.size_tokens == 300
    assert s.sources[0].trust is Trust.high
    monkeypatch.setenv("RAG_CHUNKING__SIZE_TOKENS", "100")
    monkeypatch.setenv("RAG_CONFIG", str(cfg))
    assert Settings.load().chunking.size_tokens == 100  # env beats the file
    assert Settings.load(None, data_dir="/x").data_dir == Path("/x")  # arguments beat both


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("chunking:\n  size_tokens: 4\n", "chunking.size_tokens"),
        ("chunking:\n  size_tokens: 64\n  overlap_tokens: 64\n", "overlap_tokens must be smaller"),
        ("bogus_section: 1\n", "bogus_section"),
        ("chunking: [unclosed\n", "cannot read config"),
    ],
)
def test_bad_config_is_one_clear_error(tmp_path, content, message):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(content)
    with pytest.raises(ConfigError, match=message) as info:
        Settings.load(cfg)
    assert "\n" not in str(info.value)


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        Settings.load(tmp_path / "nope.yaml")
