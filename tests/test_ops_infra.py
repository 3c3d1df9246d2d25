"""The deployment files in infra/ checked by real tools, offline: promtool for the alert rules
and their unit tests. Whether ragqa really exports the metrics they name is checked against a
running server in ``test_ops_metrics.py``."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

INFRA = Path(__file__).resolve().parent.parent / "infra"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (scripts/test.sh installs "
                                    "Debian's prometheus package)")


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PROMTOOL or "promtool", *args], cwd=INFRA / "prometheus", capture_output=True,
                          text=True, timeout=60, check=False)


@needs_promtool
def test_alert_rules_are_valid_and_every_alert_fires_and_stays_quiet_in_its_unit_tests():
    check = promtool("check", "rules", "alerts.yml")
    assert check.returncode == 0, check.stdout + check.stderr
    run = promtool("test", "rules", "alerts_test.yml")
    assert run.returncode == 0 and "SUCCESS" in run.stdout, run.stdout + run.stderr
    import yaml

    alerts = {r["alert"] for g in yaml.safe_load((INFRA / "prometheus/alerts.yml").read_text())["groups"]
              for r in g["rules"]}
    tests = yaml.safe_load((INFRA / "prometheus/alerts_test.yml").read_text())["tests"]
    cases = [case for t in tests for case in t["alert_rule_test"]]
    fired = {c["alertname"] for c in cases if c.get("exp_alerts")}
    quiet = {c["alertname"] for c in cases if not c.get("exp_alerts")}
    assert fired == alerts, alerts - fired
    assert quiet >= alerts - {"RagqaDown"}, alerts - quiet  # RagqaDown's quiet case: the healthy target


@needs_promtool
def test_the_scrape_config_is_valid(tmp_path):
    # The rule file is named where the Prometheus container mounts it; point it at ours here.
    config = (INFRA / "prometheus/prometheus.yml").read_text()
    assert "/etc/prometheus/alerts.yml" in config
    (tmp_path / "prometheus.yml").write_text(config.replace("/etc/prometheus/alerts.yml",
                                                            str(INFRA / "prometheus/alerts.yml")))
    check = promtool("check", "config", str(tmp_path / "prometheus.yml"))
    assert check.returncode == 0 and "SUCCESS" in check.stdout, check.stdout + check.stderr
