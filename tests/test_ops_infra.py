"""The deployment files in infra/ checked by real tools, offline: promtool for the alert rules
and their unit tests, the compose specification's JSON schema and ragqa's Settings for
infra/compose.yaml. Whether ragqa really exports the metrics they name is checked against a
running server in ``test_ops_metrics.py``."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.fixtures.settings_env import setting_path_exists

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


# -- infra/compose.yaml ------------------------------------------------------------------------
TEST_VALUES = {"RAGQA_IMAGE": "ragqa:test", "ELASTIC_PASSWORD": "es-secret", "MINIO_SECRET_KEY": "minio-secret",
               "GRAFANA_ADMIN_PASSWORD": "grafana-secret", "POSTGRES_PASSWORD": "pg-secret",
               "RAGQA_API_KEYS": '[{"id": "ops", "hash": "sha256:' + "0" * 64 + '", "scopes": ["admin"]}]'}
_VAR = re.compile(r"\$\$|\$\{(\w+)(?:(:?[-?])([^}]*))?\}|\$(\w+)")


def interpolate(value: object, env: dict[str, str]) -> object:
    """Compose's variable interpolation (${VAR}, ${VAR:-default}, ${VAR:?error}, $$), over a loaded file."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name, op, arg = m.group(1) or m.group(4), m.group(2), m.group(3)
        if name in env and (env[name] or op not in (":-", ":?")):
            return env[name]
        if op and op.endswith("?"):
            raise AssertionError(f"${{{name}}} is required: {arg}")
        return arg if op else ""

    return _VAR.sub(sub, value)


def compose(env: dict[str, str] | None = None) -> dict:
    import yaml

    return interpolate(yaml.safe_load((INFRA / "compose.yaml").read_text()), TEST_VALUES if env is None else env)


def test_compose_file_follows_the_compose_specification():
    import jsonschema

    schema = json.loads((INFRA / "schemas/compose-spec.json").read_text())
    doc = compose()
    jsonschema.validate(doc, schema)  # raises with the path of the first violation
    services = doc["services"]
    assert {"elasticsearch", "etcd", "minio", "milvus", "postgres", "redis", "vllm", "ragqa-api", "ragqa-scheduler",
            "prometheus", "grafana"} <= set(services)
    assert all("healthcheck" in s for name, s in services.items() if name != "dcgm-exporter")
    assert "allkeys-lfu" in services["redis"]["command"]
    vllm = services["vllm"]
    assert "--enable-prefix-caching" in vllm["command"] and any("awq" in a for a in vllm["command"])
    assert vllm["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    assert services["ragqa-scheduler"]["command"] == ["ragqa", "schedule"]
    assert services["ragqa-scheduler"]["deploy"]["replicas"] == 1
    # a bad file is refused: the schema is really applied
    broken = compose()
    broken["services"]["redis"]["healthcheck"]["interval"] = {"seconds": 5}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema)


def test_compose_refuses_to_start_without_its_secrets():
    for secret in ("ELASTIC_PASSWORD", "POSTGRES_PASSWORD"):
        with pytest.raises(AssertionError, match=secret):
            compose({k: v for k, v in TEST_VALUES.items() if k != secret})


def test_ragqa_shares_its_state_through_the_postgresql_of_the_compose_file_and_no_volume():
    from sqlalchemy import make_url

    services = compose()["services"]
    pg = services["postgres"]
    assert re.fullmatch(r"postgres:\d+\.\d+", pg["image"]) and pg["healthcheck"]["test"][1] == "pg_isready"
    volumes = {}
    for name in ("ragqa-api", "ragqa-scheduler"):
        service = services[name]
        url = make_url(service["environment"]["RAG_STATE__URL"])
        assert (url.drivername, url.host, url.port) == ("postgresql+psycopg", "postgres", 5432)
        assert (url.username, url.database) == (pg["environment"]["POSTGRES_USER"], pg["environment"]["POSTGRES_DB"])
        assert url.password is None and service["environment"]["PGPASSWORD"] == pg["environment"]["POSTGRES_PASSWORD"]
        assert service["depends_on"]["postgres"] == {"condition": "service_healthy"}
        volumes[name] = {v.split(":")[0] for v in service.get("volumes", [])}
    assert not volumes["ragqa-api"] & volumes["ragqa-scheduler"], volumes
    api = services["ragqa-api"]
    assert api["environment"]["PROMETHEUS_MULTIPROC_DIR"] in api["tmpfs"]


@pytest.mark.parametrize("service", ["ragqa-api", "ragqa-scheduler"])
def test_every_rag_variable_of_a_ragqa_service_is_a_setting_and_validates(service, monkeypatch):
    from rag.config import Settings

    env = compose()["services"][service]["environment"]
    names = [k for k in env if k.startswith("RAG_")]
    assert names and all(setting_path_exists(k) for k in names), [k for k in names if not setting_path_exists(k)]
    assert not setting_path_exists("RAG_SERVE__WORKRES") and not setting_path_exists("RAG_LEXICAL__URL__X")
    for key in [k for k in os.environ if k.startswith("RAG_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, str(value))
    settings = Settings.load(None)
    assert settings.lexical.backend == "elasticsearch" and settings.vector.uri == "http://milvus:19530"
    assert settings.generator.backend == "openai" and settings.cache.backend == "redis"
    assert settings.lexical.password is not None and settings.lexical.password.get_secret_value() == "es-secret"
    if service == "ragqa-api":
        assert [k.id for k in settings.serve.api_keys] == ["ops"]
