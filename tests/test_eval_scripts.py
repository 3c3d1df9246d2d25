"""The evaluation scripts take their datasets from the caller (no folder of one machine), and
evals/README.md says where every dataset they read comes from and under which license."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EVALS = ROOT / "evals"


def run(script: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k != "DATA"} | env
    return subprocess.run(["bash", str(EVALS / script), *args], env=full, text=True, capture_output=True,
                          timeout=60, cwd=ROOT)


def test_the_retrieval_sweep_asks_for_the_datasets_folder() -> None:
    result = run("sweep_retrieval.sh")
    assert result.returncode != 0 and "usage: evals/sweep_retrieval.sh DATA" in result.stderr


def test_the_answer_runs_on_rgb_ask_for_the_datasets_folder(tmp_path: Path) -> None:
    result = run("run_answers.sh", str(tmp_path / "out"), "rgb-zh-extractive")
    assert result.returncode == 2
    assert "rgb-zh-extractive needs DATA=<folder holding rgb-zh-dev>" in result.stderr
    result = run("run_answers.sh", str(tmp_path / "out"), "no-such-run")
    assert result.returncode == 2 and "unknown run no-such-run" in result.stderr


def test_every_dataset_the_scripts_read_has_a_source_and_a_license() -> None:
    used = {m for script in ("sweep_retrieval.sh", "run_answers.sh")
            for m in re.findall(r"\$DATA/([a-z0-9-]+)", (EVALS / script).read_text())}
    rows = {cells[0].strip("` "): cells for line in (EVALS / "README.md").read_text().splitlines()
            if line.startswith("| `") and len(cells := [c.strip() for c in line.strip("|").split("|")]) == 4}
    assert used == {"cranfield-dev", "rgb-zh-dev", "xquad-en", "xquad-zh"}
    for name in used:
        folder, what, source, license_ = rows[name]
        assert what and source and license_, rows[name]
