"""scripts/elasticsearch.sh as root: Elasticsearch runs as its own user from a folder that user
owns, and no folder of root's home is opened to it.

These run the real script on a real distribution (the integ-test zip that ``scripts/test.sh``
fetched into ``~/.m2``) with a private, closed home folder, so the machine's own
``~/.cache/ragqa`` is left alone.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(os.environ.get("ES_SCRIPT_UNDER_TEST", ROOT / "scripts" / "elasticsearch.sh"))
VERSION = os.environ.get("RAGQA_ES_VERSION", "9.3.2")
M2 = Path.home() / ".m2" / "repository"
ZIP = M2 / f"org/elasticsearch/distribution/integ-test-zip/elasticsearch/{VERSION}/elasticsearch-{VERSION}.zip"


def _jdk() -> bool:
    return any(p.joinpath("bin", "java").exists() for p in Path("/usr/lib/jvm").glob("*"))


pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="the root path of scripts/elasticsearch.sh (run as root)"),
    pytest.mark.skipif(not ZIP.exists(), reason=f"{ZIP} is not there (scripts/test.sh fetches it)"),
    pytest.mark.skipif(not _jdk(), reason="no JDK in /usr/lib/jvm"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def place() -> Iterator[tuple[Path, Path]]:
    """(base, home): an open folder for Elasticsearch's files, and a closed home (0700) as
    root's is on most systems. Both are ours, removed afterwards."""
    top = Path(tempfile.mkdtemp(prefix="ragqa-es-script-", dir="/var/tmp"))
    top.chmod(0o755)  # (mkdtemp makes it 0700; the base inside must be reachable)
    home = top / "home"
    home.mkdir(mode=0o700)
    base = top / "base"
    try:
        yield base, home
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _run(home: Path, port: int, command: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "HOME": str(home), "RAGQA_M2_REPO": str(M2), "RAGQA_ES_PORT": str(port),
            "RAGQA_ES_WAIT_S": "240", **env}
    if "RAGQA_ES_DATA" not in env:
        full.pop("RAGQA_ES_DATA", None)
    return subprocess.run(["bash", str(SCRIPT), command], env=full, text=True,
                          capture_output=True, timeout=300)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_data_folder_the_es_user_cannot_reach_is_an_error_not_a_chmod(place: tuple[Path, Path]) -> None:
    base, home = place
    data = home / "es-data"
    run = _run(home, _free_port(), "start", RAGQA_ES_BASE=str(base), RAGQA_ES_DATA=str(data))
    assert run.returncode != 0
    assert "cannot reach" in run.stderr and str(data) in run.stderr
    assert _mode(home) == 0o700  # the home folder stays closed


def test_start_runs_elasticsearch_from_its_own_folder_and_leaves_home_closed(place: tuple[Path, Path]) -> None:
    base, home = place
    port = _free_port()
    run = _run(home, port, "start", RAGQA_ES_BASE=str(base))
    try:
        assert run.returncode == 0, run.stderr[-2000:]
        health = httpx.get(f"http://127.0.0.1:{port}/_cluster/health", timeout=10).json()
        assert health["cluster_name"] == f"ragqa-{port}"  # ours, and answering
        assert _mode(home) == 0o700
        assert not (home / ".cache" / "ragqa" / f"es-{VERSION}").exists()
        pid = int((base / f"es-data-{port}" / "es.pid").read_text())
        assert Path(f"/proc/{pid}").stat().st_uid != 0  # not running as root
        assert (base / f"es-{VERSION}" / f"elasticsearch-{VERSION}" / "config").owner() == "ragqa-es"
    finally:
        stopped = _run(home, port, "stop", RAGQA_ES_BASE=str(base))
    assert stopped.returncode == 0, stopped.stderr
    assert _run(home, port, "status", RAGQA_ES_BASE=str(base)).returncode == 3
