"""The 60-second version of ``bench/soak.py``: a real ``ragqa serve`` under a mixed load
(cached, uncached, streams, dropped and resumed streams, a reindex half way) answers
everything, every streamed event fits the chunk schema, and its memory levels off.

The 10-minute run, whose figures ``docs/reliability.md`` reports, is
``python bench/soak.py``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_a_minute_of_mixed_load_with_a_reindex_in_the_middle(tmp_path: Path):
    out = tmp_path / "soak.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "soak.py"), "--duration", "60", "--window", "10",
                           "--docs", "60", "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    errors = {k: v for row in result["windows"] for k, v in row["errors"].items()}
    assert result["errors"] == 0, errors
    assert all(result["requests"].get(kind, 0) >= 10 for kind in ("cached", "uncached", "stream", "reconnect"))
    assert result["resumes"] == result["requests"]["reconnect"]
    assert result["reindex"]["status"] == 200 and result["reindex"]["changed"] == 10, result["reindex"]
    assert len(result["windows"]) == 6 and all(row["rss_mb"] for row in result["windows"])
    # A minute cannot show a slow leak (the 10-minute run is for that), only a fast one:
    # after the reindex the server's memory stays within 64 MB.
    assert result["rss_growth_second_half_mb"] < 64, result["windows"]
