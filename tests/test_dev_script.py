"""scripts/dev.sh stops, without serving, when ingesting or updating the docs fails.

The script runs for real against a stand-in environment: a virtualenv folder whose ``pip``
installs nothing and whose ``ragqa`` records its calls and fails where told, so no model is
installed and no server starts.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TORCH = next(line.split('"')[1] for line in (ROOT / "scripts" / "env.sh").read_text().splitlines()
             if line.startswith("TORCH_VERSION="))
LLAMA = next(line.split('"')[1] for line in (ROOT / "scripts" / "env.sh").read_text().splitlines()
             if line.startswith("LLAMA_CPP_VERSION="))

RAGQA = """#!/usr/bin/env bash
echo "$*" >> "$CALLS"
case "$1" in
  sources) [[ -n "${KNOWN:-}" ]] && echo '[{"name": "docs"}]' || echo '[]' ;;
  ingest|reindex) [[ "$1" == "${FAIL:-}" ]] && { echo "error: $1 failed" >&2; exit 1; } ;;
esac
exit 0
"""


@pytest.fixture
def venv(tmp_path: Path) -> Path:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    (venv / f".torch-{TORCH}-complete").touch()
    for name, text in {"pip": "#!/usr/bin/env bash\nexit 0\n", "ragqa": RAGQA}.items():
        (venv / "bin" / name).write_text(text)
        (venv / "bin" / name).chmod(0o755)
    (venv / "bin" / "activate").write_text(f'export PATH="{venv}/bin:$PATH"\n')
    wheels = tmp_path / "wheels" / "avx2"
    wheels.mkdir(parents=True)
    (wheels / f"llama_cpp_python-{LLAMA}-cp311-cp311-linux_x86_64.whl").touch()  # no build
    return venv


def dev(venv: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    calls = venv.parent / "calls.txt"
    full = {**os.environ, "RAGQA_VENV": str(venv), "RAGQA_WHEELS": str(venv.parent / "wheels"),
            "PYTHON": sys.executable, "RAG_DATA_DIR": str(venv.parent / "data"), "CALLS": str(calls), **env}
    run = subprocess.run(["bash", str(ROOT / "scripts" / "dev.sh")], env=full, text=True,
                         capture_output=True, timeout=60)
    return run, calls.read_text().splitlines() if calls.exists() else []


def test_a_failed_first_ingest_stops_before_serving(venv: Path) -> None:
    run, calls = dev(venv, FAIL="ingest")
    assert run.returncode != 0
    assert [c.split()[0] for c in calls] == ["sources", "ingest"]


def test_a_failed_update_of_the_docs_stops_before_serving(venv: Path) -> None:
    run, calls = dev(venv, KNOWN="1", FAIL="reindex")
    assert run.returncode != 0
    assert "not serving a stale index" in run.stderr
    assert [c.split()[0] for c in calls] == ["sources", "reindex"]


def test_after_a_good_ingest_it_serves(venv: Path) -> None:
    run, calls = dev(venv)
    assert run.returncode == 0, run.stderr
    assert [c.split()[0] for c in calls] == ["sources", "ingest", "status", "search", "serve"]
    assert "--host 127.0.0.1" in calls[-1] and "--no-auth" in calls[-1]
