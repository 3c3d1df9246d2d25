"""A real ``ragqa serve --workers 2`` on loopback: /metrics sums both workers, and every ragqa
metric that the alert rules (infra/prometheus/alerts.yml) and the Grafana dashboard
(infra/grafana/ragqa.json) name is in it after a few real questions.

One server for the module: starting two workers costs a few seconds on two cores.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from click.testing import CliRunner
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from rag.services import Services
from ragqa.cli import cli
from tests.corpus import question

INFRA = Path(__file__).resolve().parent.parent / "infra"
PORT = 8711
HEALTH_CHECKS = 60
QUESTIONS = [question(3), question(4), question(3), question(22)]  # one asked twice: the cache answers it

# Metrics named in infra/ that ragqa does not export, with where they come from.
NOT_RAGQA = {
    "up": "Prometheus, per scrape target",
    "gpu_memory_used_bytes": "ragqa, only on a machine with a GPU (rag.metrics.GpuMemoryCollector)",
    "gpu_memory_total_bytes": "ragqa, only on a machine with a GPU (rag.metrics.GpuMemoryCollector)",
    "DCGM_FI_DEV_FB_USED": "NVIDIA's dcgm-exporter",
    "DCGM_FI_DEV_FB_FREE": "NVIDIA's dcgm-exporter",
    "vllm:num_requests_running": "vLLM",
    "vllm:num_requests_waiting": "vLLM",
    "vllm:kv_cache_usage_perc": "vLLM 0.10 and later",
    "vllm:gpu_cache_usage_perc": "vLLM before 0.10",
    "vllm:request_queue_time_seconds_bucket": "vLLM",
    "vllm:time_to_first_token_seconds_bucket": "vLLM",
    "vllm:generation_tokens_total": "vLLM",
    "vllm:prompt_tokens_total": "vLLM",
}
# ragqa's metrics whose label values exist only once something happened (in multiprocess mode a
# family without samples is not exported at all): these must at least be declared.
EVENT_ONLY = {"answer_cache_errors_total": "labelled by the Redis operation that failed"}
_FUNCTIONS_AND_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "and", "or",
                           "unless", "bool", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """The metric names in a PromQL expression (label matchers, groupings and ranges removed)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)  # strings
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges
    expr = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", expr)  # groupings
    names = set()
    for m in re.finditer(r"(?<![\w:.])([A-Za-z_:][\w:]*)(\s*\()?", expr):
        if not m.group(2) and m.group(1).lower() not in _FUNCTIONS_AND_KEYWORDS:
            names.add(m.group(1))
    return names


def alert_exprs() -> list[str]:
    groups = yaml.safe_load((INFRA / "prometheus/alerts.yml").read_text())["groups"]
    return [rule["expr"] for group in groups for rule in group["rules"]]


def dashboard() -> dict:
    return json.loads((INFRA / "grafana/ragqa.json").read_text())


def dashboard_exprs() -> list[str]:
    return [t["expr"] for p in dashboard()["panels"] for t in p.get("targets", [])]


@pytest.fixture(scope="module")
def server(corpus: Services, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """``ragqa serve --workers 2`` over the ``corpus`` fixture's index, after a ``ragqa verify``."""
    env = {**os.environ, "RAG_DATA_DIR": str(corpus.data_dir), "RAG_EMBEDDER__BACKEND": "hash",
           "RAG_EMBEDDER__DIM": "256", "RAG_VECTOR__BACKEND": "numpy", "RAG_GENERATOR__BACKEND": "extractive",
           "RAG_CACHE__BACKEND": "memory", "RAG_SERVE__RATE_LIMIT_PER_MINUTE": "0", "RAG_CONFIG": ""}
    res = CliRunner().invoke(cli, ["verify", "--json"], env=env, catch_exceptions=False)
    assert res.exit_code == 0, res.output  # records drift (0) in the state, which /metrics reads
    parent = tmp_path_factory.mktemp("metrics")
    env["PROMETHEUS_MULTIPROC_DIR"] = str(parent)  # the server makes a fresh directory inside
    proc = subprocess.Popen([sys.executable, "-m", "ragqa.cli", "serve", "--no-auth", "--workers", "2",
                             "--port", str(PORT)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert f"http://127.0.0.1:{PORT}" in line, line + proc.stderr.read()
        url = f"http://127.0.0.1:{PORT}"
        with httpx.Client(timeout=60) as http:
            for _ in range(600):  # the workers load their apps after the announcement
                try:
                    if http.get(f"{url}/ready").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.1)
        yield {"url": url, "dir": parent, "proc": proc}
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert "Traceback" not in err, err
    assert not list(parent.iterdir()), "the metrics directory outlived the server"


@pytest.fixture(scope="module")
def scraped(server: dict) -> dict:
    """The server after HEALTH_CHECKS health checks from 8 threads and the QUESTIONS."""
    url = server["url"]
    with httpx.Client(timeout=60) as http:
        for q in QUESTIONS:
            res = http.post(f"{url}/v1/ask", json={"question": q})
            assert res.status_code == 200, res.text
        res = http.post(f"{url}/v1/sources/beta/reindex", json={"mode": "incremental"})
        assert res.status_code == 200, res.text
        with concurrent.futures.ThreadPoolExecutor(8) as pool:  # separate connections: both workers take some
            codes = list(pool.map(lambda _: httpx.get(f"{url}/health").status_code, range(HEALTH_CHECKS)))
        assert codes == [200] * HEALTH_CHECKS
        texts = [http.get(f"{url}/metrics").text for _ in range(6)]
    return {"texts": texts, "families": list(text_string_to_metric_families(texts[-1]))}


def samples(text: str, name: str, **labels: str) -> float:
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def test_every_scrape_counts_the_requests_of_both_workers(server, scraped):
    for text in scraped["texts"]:  # whichever worker answers the scrape
        assert samples(text, "http_requests_total", route="/health") == HEALTH_CHECKS
        assert samples(text, "answers_total", outcome="ok") == len(QUESTIONS)
        assert samples(text, "answer_stage_seconds_count", stage="total") == len(QUESTIONS)
        assert samples(text, "answer_cache_lookups_total") == len(QUESTIONS)  # hit, semantic or miss
        assert samples(text, "answers_in_flight") == 0
    (metrics_dir,) = list(server["dir"].iterdir())  # one fresh directory for this server
    per_worker = {}
    for path in metrics_dir.glob("counter_*.db"):
        for family in MultiProcessCollector.merge([str(path)], accumulate=False):
            if family.name == "http_requests":
                per_worker[path.name] = sum(s.value for s in family.samples
                                            if s.name == "http_requests_total" and s.labels["route"] == "/health")
    served = [n for n in per_worker.values() if n]
    assert len(served) == 2 and sum(served) == HEALTH_CHECKS, per_worker


def test_each_worker_writes_a_qa_log_of_its_own(server, scraped, corpus):
    """Two workers rotating one qa.jsonl each on its own would overwrite each other's backups:
    the serve command tells its workers how many they are, so each logs to qa-<its pid>.jsonl."""
    logs = corpus.data_dir / "logs"
    before = {p.name: len(p.read_text().splitlines()) for p in logs.glob("qa*.jsonl")}
    asked = [question(i) for i in range(5, 21)]
    # Separate connections, so both workers answer some; four at once, which even one worker takes
    # without an overload 503 (two answering and two queued on two cores).
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        codes = list(pool.map(lambda q: httpx.post(f"{server['url']}/v1/ask", json={"question": q},
                                                   timeout=60).status_code, asked))
    assert codes == [200] * len(asked)
    grown = {p.name: len(p.read_text().splitlines()) - before.get(p.name, 0) for p in logs.glob("qa*.jsonl")}
    grown = {name: n for name, n in grown.items() if n}
    assert "qa.jsonl" not in before and "qa.jsonl" not in grown, sorted(logs.iterdir())
    (metrics_dir,) = list(server["dir"].iterdir())
    workers = {p.stem.rsplit("_", 1)[1] for p in metrics_dir.glob("counter_*.db")}
    assert len(grown) == 2 and {n.removeprefix("qa-").removesuffix(".jsonl") for n in grown} <= workers, \
        (grown, workers)
    assert sum(grown.values()) == len(asked)
    logged = {json.loads(line)["question"] for name in grown for line in (logs / name).read_text().splitlines()}
    assert set(asked) <= logged


def test_freshness_and_drift_come_from_the_state(scraped):
    text = scraped["texts"][-1]
    lags = {s.labels["source"]: s.value for f in scraped["families"] for s in f.samples
            if s.name == "freshness_lag_seconds"}
    assert set(lags) == {"alpha", "beta"} and all(0 <= v < 600 for v in lags.values()), lags
    assert samples(text, "index_drift_chunks", index="lexical") == 0  # what `ragqa verify` found
    assert text.count("# TYPE index_drift_chunks gauge") == 1


def test_every_ragqa_metric_in_the_alerts_and_the_dashboard_is_exported(scraped):
    exported = {s.name for f in scraped["families"] for s in f.samples}
    named = set().union(*map(metric_names, alert_exprs() + dashboard_exprs()))
    assert "answer_stage_seconds_bucket" in named and "vllm:num_requests_waiting" in named  # the parser works
    assert not set(NOT_RAGQA) - named, "listed as external but no longer used"
    assert sorted(named - set(NOT_RAGQA) - set(EVENT_ONLY) - exported) == []
    from prometheus_client import generate_latest

    from rag.metrics import REGISTRY

    declared = generate_latest(REGISTRY).decode()
    for name in EVENT_ONLY:
        assert name in named and re.search(rf"# TYPE {name.removesuffix('_total')}(_total)? counter", declared), name


def test_the_dashboard_is_well_formed():
    dash = dashboard()
    assert dash["uid"] == "ragqa" and dash["templating"]["list"][0]["type"] == "datasource"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    titles = " ".join(p["title"] for p in dash["panels"]).lower()
    for topic in ("requests per second", "p50", "p99", "first token", "tokens/s", "cache lookups", "degraded",
                  "drift", "freshness", "gpu memory", "vllm"):
        assert topic in titles, topic
    for panel in dash["panels"]:
        assert set(panel["gridPos"]) == {"h", "w", "x", "y"} and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        if panel["type"] == "row":
            continue
        assert panel["type"] == "timeseries" and panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}" and metric_names(target["expr"]), target
    provisioning = yaml.safe_load((INFRA / "grafana/provisioning/datasources/prometheus.yml").read_text())
    assert provisioning["datasources"][0]["type"] == "prometheus"
