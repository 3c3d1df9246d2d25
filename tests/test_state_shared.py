"""Instances that share a PostgreSQL state: what one instance's reindex writes, another
process sees, and ``ragqa status`` from either agrees on the sources, their counts and runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ingest.pipeline import reindex
from ingest.services import open_services
from ragqa.cli import cli
from tests.conftest import make_settings
from tests.corpus import OLD, index_notes
from tests.fixtures.postgres import NO_POSTGRES, POSTGRES_URL, fresh_schema

pytestmark = [pytest.mark.integration, pytest.mark.skipif(not POSTGRES_URL, reason=NO_POSTGRES)]

ENV = {"RAG_EMBEDDER__BACKEND": "hash", "RAG_EMBEDDER__DIM": "256", "RAG_VECTOR__BACKEND": "numpy",
       "RAG_CACHE__BACKEND": "off"}


def state_part(status: dict[str, Any]) -> list[dict[str, Any]]:
    """What the shared state says of each source (the next run times are the clock's)."""
    return [{k: v for k, v in s.items() if not k.startswith("next_")} for s in status["sources"]]


def test_another_process_sees_a_reindex_and_status_agrees(tmp_path: Path) -> None:
    with fresh_schema("shared_status") as url:
        services = open_services(make_settings(tmp_path / "ingester", state={"url": url}))
        try:
            index_notes(services, tmp_path, {"notes": (range(6), OLD)})
            (tmp_path / "notes" / "d00.md").write_text("# Changed\n\nA new first note about copper.\n")
            with services.write_lock():
                assert reindex(services, "notes", "incremental").changed == 1
        finally:
            services.close()

        env = {**os.environ, **ENV, "RAG_STATE__URL": url}
        here = CliRunner().invoke(cli, ["--data-dir", str(tmp_path / "ingester"), "status", "--json"], env=env)
        assert here.exit_code == 0, here.output
        other = subprocess.run([sys.executable, "-m", "ragqa.cli", "--data-dir", str(tmp_path / "other"), "status",
                                "--json"], env=env, capture_output=True, text=True, timeout=120)
        assert other.returncode == 0, other.stderr
    mine, theirs = json.loads(here.output), json.loads(other.stdout)
    assert state_part(theirs) == state_part(mine)
    assert theirs["data_dir"] != mine["data_dir"] and theirs["languages"] == mine["languages"] == {"en": 6}
    (notes,) = state_part(theirs)
    assert (notes["documents"], notes["last_run"]["mode"], notes["last_run"]["status"]) == (6, "incremental", "ok")


def test_two_instances_never_reindex_at_once(tmp_path: Path) -> None:
    from rag.errors import DataDirLocked

    with fresh_schema("shared_write_lock") as url:
        one = open_services(make_settings(tmp_path / "one", state={"url": url}))
        two = open_services(make_settings(tmp_path / "two", state={"url": url}))
        try:
            with one.write_lock():
                with pytest.raises(DataDirLocked, match="shared state is locked by another ragqa instance"):
                    with two.write_lock():
                        pass
            with two.write_lock():  # free again once the first lets go, and again after that
                pass
            with one.write_lock():
                pass
        finally:
            one.close()
            two.close()
