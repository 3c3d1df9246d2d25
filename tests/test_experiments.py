"""Online A/B experiments: stable assignment by weight, pinning an arm (admin only), feedback
on an answer, the cache kept per arm, and rollback across two real servers sharing one Redis.

The rollback test starts two ``ragqa serve --workers 2`` on loopback over one index and one
Redis; an experiment set through one server splits both, and a stop through the other sends
the next request of every worker (seen by the QA log file each worker writes) to the control.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from click.testing import CliRunner

from ingest.services import open_services
from rag.config import Settings
from rag.errors import ConfigError
from rag.experiments import Arm, Experiment, FileExperimentStore, parse_arm, unit_hash
from rag.feedback import summarise
from ragqa.cli import cli
from serve.app import create_app
from tests.conftest import NOTES, make_settings
from tests.corpus import index_notes, question
from tests.fixtures.cache import NO_REDIS, REDIS_URL, flush_redis
from tests.fixtures.keys import bearer, key_entries
from tests.live import live, sse_events

SPLIT = [{"name": "control", "profile": "default", "weight": 50}, {"name": "alt", "profile": "alt", "weight": 50}]
PORTS = (8751, 8752)


# -- assignment ----------------------------------------------------------------------------------

def test_assignment_is_stable_and_follows_the_weights():
    exp = Experiment.create("small-vs-default", [Arm("control", "default", 90), Arm("small", "small", 10)])
    units = [f"key:app-{i}" for i in range(10_000)]
    arms = [exp.assign(u).name for u in units]
    assert arms == [exp.assign(u).name for u in units]  # the same caller, the same arm
    assert abs(arms.count("small") / len(arms) - 0.10) <= 0.02
    # the same in another process with another hash seed: not Python's salted hash()
    code = ("from rag.experiments import unit_hash; "
            "print([round(unit_hash('small-vs-default', f'key:app-{i}'), 12) for i in range(50)])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONHASHSEED": "12345"}).stdout
    assert json.loads(out) == [round(unit_hash("small-vs-default", f"key:app-{i}"), 12) for i in range(50)]
    # moving weight to an arm moves callers into it, none out of it
    wider = Experiment.create("small-vs-default", [Arm("control", "default", 80), Arm("small", "small", 20)])
    after = [wider.assign(u).name for u in units]
    assert all(b == "small" for a, b in zip(arms, after, strict=True) if a == "small")
    assert abs(after.count("small") / len(after) - 0.20) <= 0.02
    # another experiment shuffles callers afresh
    other = Experiment.create("other", [Arm("control", "default", 90), Arm("small", "small", 10)])
    assert [other.assign(u).name for u in units] != arms
    assert {exp.stop().assign(u).name for u in units} == {"control"}


def test_bad_experiments_are_clear_errors(tmp_path):
    assert parse_arm("control=default:90") == Arm("control", "default", 90.0)
    for text in ("control=default", "control:90", "=default:9", "control=default:-1"):
        with pytest.raises(ConfigError, match="NAME=PROFILE:WEIGHT"):
            parse_arm(text)
    with pytest.raises(ConfigError, match="twice"):
        Experiment.create("x", [Arm("a", "default", 1), Arm("a", "default", 1)])
    with pytest.raises(ConfigError, match="add up to 0"):
        Experiment.create("x", [Arm("a", "default", 0)])
    with pytest.raises(ConfigError, match="no arms"):
        Experiment.create("x", [])
    with pytest.raises(ConfigError, match="experiment.arms is empty"):
        Settings.load(None, data_dir=tmp_path, experiment={"name": "x"})
    settings = Settings.load(None, data_dir=tmp_path, experiment={"name": "x", "arms": SPLIT})
    with pytest.raises(ConfigError, match="no generator profile 'alt'"):
        Experiment.from_settings(settings)


def test_the_file_store_is_followed_at_the_next_read(tmp_path):
    writer, reader = FileExperimentStore(tmp_path / "experiment.json"), FileExperimentStore(tmp_path / "experiment.json")
    assert asyncio.run(reader.current()) is None
    exp = Experiment.create("x", [Arm("control", "default", 1), Arm("alt", "alt", 1)])
    for version in (exp, exp.stop(), Experiment.create("x", [Arm("control", "default", 1), Arm("alt", "alt", 3)])):
        writer.save(version)
        assert asyncio.run(reader.current()) == version  # at once, not after refresh_s
    assert [p.name for p in tmp_path.iterdir()] == ["experiment.json"]  # no temporary file left


def test_ragqa_experiment_set_status_stop_on_the_data_dir(tmp_path):
    env = {"RAG_DATA_DIR": str(tmp_path), "RAG_PROFILES__ALT__BACKEND": "extractive", "RAG_CONFIG": "",
           "RAG_SERVE__REDIS_URL": ""}
    run = CliRunner().invoke
    res = run(cli, ["experiment", "set", "split", "--arm", "control=default:90", "--arm", "alt=alt:10", "--json"],
              env=env)
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["experiment"]["shares"] == {"control": 0.9, "alt": 0.1}
    res = run(cli, ["experiment", "set", "split", "--arm", "control=default:90", "--arm", "alt=big:10"], env=env)
    assert res.exit_code == 1 and "no generator profile 'big'" in res.output
    res = run(cli, ["experiment", "stop"], env=env)
    assert res.exit_code == 0 and "stopped: everyone on control" in res.output, res.output
    status = json.loads(run(cli, ["experiment", "status", "--json"], env=env).output)
    assert status["experiment"]["stopped"] and status["store"] == str(tmp_path / "experiment.json")
    assert run(cli, ["experiment", "report"], env=env).output.strip() == "no recorded answers"


def test_an_arm_whose_profile_this_server_lacks_answers_as_control(tmp_path):
    from starlette.requests import Request

    from serve.deps import Caller
    from serve.routes_experiments import Experiments

    settings = Settings.load(None, data_dir=tmp_path, profiles={"alt": {"backend": "extractive"}})
    ab = Experiments(settings)  # another instance set an arm on a profile this one does not define
    ab.store.save(Experiment.create("x", [Arm("control", "default", 0.001), Arm("new", "gone", 1000)]))
    request = Request({"type": "http", "headers": []})
    got = {asyncio.run(ab.assign(request, Caller(), f"c{i}")) for i in range(20)}
    assert {(a.experiment, a.arm, a.profile) for a in got} == {("x", "control", "default")}


def test_the_report_compares_arms_from_the_records():
    answers = [{"experiment": "x", "arm": "a", "versions": {"profile": "default"}, "cache": "miss", "total_ms": t,
                "ttft_ms": t / 2, "tokens_per_s": 10.0, "abstained": t > 300, "cited": t <= 300}
               for t in (100, 200, 300, 400)]
    answers += [{"experiment": "x", "arm": "b", "versions": {"profile": "small"}, "cache": "hit", "total_ms": 5,
                 "abstained": False, "cited": True}, {"experiment": None, "arm": None, "cache": "miss"}]
    feedback = [{"experiment": "x", "arm": "a", "rating": r} for r in ("up", "up", "down")]
    rows = {r["arm"]: r for r in summarise(answers, feedback, "x")}
    assert set(rows) == {"a", "b"}
    a, b = rows["a"], rows["b"]
    assert (a["answers"], a["latency_p50_ms"], a["ttft_p50_ms"], a["abstention"], a["citation_compliance"]) == (
        4, 250.0, 125.0, 0.25, 0.75)
    assert (a["feedback_up"], a["feedback_down"], a["feedback_up_share"]) == (2, 1, 0.6667)
    assert (b["answers"], b["cached"], b["latency_p50_ms"], b["profiles"]) == (1, 1, None, ["small"])


# -- one server with API keys: pinning, staying in an arm, feedback, the cache ---------------------

@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    base = tmp_path_factory.mktemp("experiments")
    settings = make_settings(
        base / "data", generator={"backend": "extractive"}, profiles={"alt": {"backend": "extractive"}},
        retrieval={"mode": "hybrid"}, cache={"backend": "memory"},
        serve={"api_keys": key_entries(), "rate_limit_per_minute": 0},
        experiment={"name": "split", "arms": SPLIT})
    svc = index_notes(open_services(settings), base, NOTES)
    try:
        with live(create_app(settings, services=svc)) as url:
            yield SimpleNamespace(url=url, services=svc)
    finally:
        svc.close()


def ask(http: httpx.Client, url: str, key: str, headers: dict[str, str] | None = None,
        **body: object) -> httpx.Response:
    return http.post(f"{url}/v1/ask", headers={**bearer(key), **(headers or {})}, json=body)


def test_pinning_an_arm_needs_an_admin_key(keyed, http):
    res = ask(http, keyed.url, "acme", {"X-Ragqa-Arm": "alt"}, question=question(3))
    assert res.status_code == 403 and res.json()["error"]["code"] == "arm_pin_forbidden", res.text
    res = ask(http, keyed.url, "admin", {"X-Ragqa-Arm": "nope"}, question=question(3))
    assert res.status_code == 422 and "has no arm 'nope'" in res.json()["error"]["message"]
    for arm, profile in (("alt", "alt"), ("control", "default")):
        res = ask(http, keyed.url, "admin", {"X-Ragqa-Arm": arm}, question=question(3), no_cache=True)
        assert res.status_code == 200, res.text
        assert res.json()["versions"]["arm"] == arm and res.json()["versions"]["profile"] == profile


def test_a_key_stays_in_its_arm(keyed, http):
    expected = Experiment.create("split", [Arm(a["name"], a["profile"], a["weight"]) for a in SPLIT])
    for key, key_id in (("acme", "acme-app"), ("globex", "globex-app")):
        arms = {ask(http, keyed.url, key, question=question(i), no_cache=True).json()["versions"]["arm"]
                for i in range(4)}
        assert arms == {expected.assign(f"key:{key_id}").name}


def test_feedback_is_stored_with_the_answers_versions(keyed, http):
    res = ask(http, keyed.url, "admin", {"X-Ragqa-Arm": "alt"}, question=question(5), no_cache=True)
    answer_id = res.json()["answer_id"]
    rating = {"answer_id": answer_id, "rating": "down", "comment": "cites the wrong note"}
    other = http.post(f"{keyed.url}/v1/feedback", headers=bearer("acme"), json=rating)
    assert other.status_code == 404, other.text  # another key's answer is not this key's to rate
    own = ask(http, keyed.url, "acme", question=question(5), no_cache=True).json()["answer_id"]
    res_own = http.post(f"{keyed.url}/v1/feedback", headers=bearer("acme"), json={"answer_id": own, "rating": "up"})
    assert res_own.status_code == 200, res_own.text
    up = http.post(f"{keyed.url}/v1/feedback", headers=bearer("admin"), json=rating)
    assert up.status_code == 200, up.text
    assert up.json()["arm"] == "alt" and up.json()["versions"] == res.json()["versions"]
    for body, status in (({"answer_id": "ans-unknown", "rating": "up"}, 404),
                         ({"answer_id": answer_id, "rating": "meh"}, 422),
                         ({"answer_id": answer_id, "rating": "up", "comment": "x" * 2001}, 422),
                         ({"rating": "up"}, 422)):
        res = http.post(f"{keyed.url}/v1/feedback", headers=bearer("admin"), json=body)
        assert res.status_code == status, (body, res.text)
    assert http.get(f"{keyed.url}/v1/admin/experiment/report", headers=bearer("acme")).status_code == 403
    rows = http.get(f"{keyed.url}/v1/admin/experiment/report", headers=bearer("admin")).json()
    alt = next(r for r in rows if r["arm"] == "alt")
    assert alt["feedback_down"] >= 1 and alt["profiles"] == ["alt"] and alt["answers"] >= 1
    metrics = http.get(f"{keyed.url}/metrics").text
    assert 'experiment_feedback_total{arm="alt",experiment="split",rating="down"}' in metrics
    assert 'experiment_answers_total{arm="alt",cache="miss",experiment="split"}' in metrics


def test_chat_completions_carry_the_arm_and_their_answer_id_takes_feedback(keyed, http):
    headers = {**bearer("admin"), "X-Ragqa-Arm": "alt"}
    body = {"model": "ragqa", "messages": [{"role": "user", "content": question(9)}], "rag": {"no_cache": True}}
    res = http.post(f"{keyed.url}/v1/chat/completions", headers=headers, json=body)
    assert res.status_code == 200, res.text
    ext = res.json()["ragqa"]
    assert ext["arm"] == "alt" and ext["profile"] == "alt"
    with http.stream("POST", f"{keyed.url}/v1/chat/completions", headers=headers, json={**body, "stream": True}) as r:
        chunks = [json.loads(e["data"]) for e in sse_events(r.iter_lines()) if e.get("data") not in (None, "[DONE]")]
    streamed = next(c["ragqa"] for c in chunks if c.get("ragqa"))
    assert streamed["arm"] == "alt" and streamed["answer_id"] != ext["answer_id"]
    for answer_id in (ext["answer_id"], streamed["answer_id"]):
        fb = http.post(f"{keyed.url}/v1/feedback", headers=bearer("admin"), json={"answer_id": answer_id, "rating": "up"})
        assert fb.status_code == 200 and fb.json()["arm"] == "alt" and fb.json()["experiment"] == "split", fb.text


def test_the_cache_never_serves_one_arms_answer_to_another(keyed, http):
    q = question(7)
    first = ask(http, keyed.url, "admin", {"X-Ragqa-Arm": "alt"}, question=q).json()
    again = ask(http, keyed.url, "admin", {"X-Ragqa-Arm": "alt"}, question=q).json()
    other = ask(http, keyed.url, "admin", {"X-Ragqa-Arm": "control"}, question=q).json()
    assert (first["cache"], again["cache"], other["cache"]) == ("miss", "hit", "miss")
    assert again["versions"]["arm"] == "alt" and again["versions"]["profile"] == "alt"
    assert other["versions"]["arm"] == "control" and other["versions"]["profile"] == "default"
    assert ask(http, keyed.url, "admin", {"X-Ragqa-Arm": "control"}, question=q).json()["versions"]["arm"] == "control"


# -- two servers, two workers each, one Redis: rollback ----------------------------------------------

def _start(env: dict[str, str], port: int) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "ragqa.cli", "serve", "--no-auth", "--workers", "2",
                             "--port", str(port)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _ready(url: str, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else "exited"
        try:
            if httpx.get(f"{url}/ready", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} did not get ready")


@pytest.fixture(scope="module")
def pair(corpus, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    if not REDIS_URL:
        pytest.skip(NO_REDIS)
    tag = uuid.uuid4().hex[:8]
    logs = tmp_path_factory.mktemp("ab-logs")
    env = {**os.environ, "RAG_DATA_DIR": str(corpus.data_dir), "RAG_EMBEDDER__BACKEND": "hash",
           "RAG_EMBEDDER__DIM": "256", "RAG_VECTOR__BACKEND": "numpy", "RAG_GENERATOR__BACKEND": "extractive",
           "RAG_PROFILES__ALT__BACKEND": "extractive", "RAG_RETRIEVAL__MODE": "hybrid",
           "RAG_RETRIEVAL__WEIGHTS": "[1, 1]", "RAG_SERVE__RATE_LIMIT_PER_MINUTE": "0", "RAG_CONFIG": "",
           "RAG_SERVE__REDIS_URL": REDIS_URL, "RAG_CACHE__BACKEND": "redis",
           "RAG_CACHE__PREFIX": f"ragqa-test-ab-cache:{tag}", "RAG_EXPERIMENT__REDIS_PREFIX": f"ragqa-test-ab:{tag}"}
    procs, urls = [], []
    try:
        for i, port in enumerate(PORTS):
            (logs / str(i)).mkdir()
            procs.append(_start({**env, "RAG_SERVE__QA_LOG_PATH": str(logs / str(i) / "qa-{pid}.jsonl")}, port))
            urls.append(f"http://127.0.0.1:{port}")
        for url, proc in zip(urls, procs, strict=True):
            _ready(url, proc)
        yield SimpleNamespace(urls=urls, logs=[logs / str(i) for i in range(len(PORTS))], env=env)
    finally:
        errors = []
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            _, err = proc.communicate(timeout=60)
            errors.append(err)
        flush_redis(f"ragqa-test-ab:{tag}")
        flush_redis(f"ragqa-test-ab-cache:{tag}")
    assert not any("Traceback" in e for e in errors), errors


def _fresh_asks(urls: list[str], questions: list[str]) -> list[dict]:
    """Each question on a new connection from 4 threads, so every worker of a server takes some."""
    def one(job: tuple[str, str]) -> dict:
        res = httpx.post(f"{job[0]}/v1/ask", json={"question": job[1], "no_cache": True}, timeout=60)
        assert res.status_code == 200, res.text
        return {**res.json(), "server": job[0]}

    jobs = [(url, q) for q in questions for url in urls]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        return list(pool.map(one, jobs))


def _answered_by(log_dir: Path, marker: str) -> dict[str, set[str]]:
    """Per worker (its QA log file), the arms of the answers whose question holds ``marker``."""
    found: dict[str, set[str]] = {}
    for path in log_dir.glob("qa-*.jsonl"):
        for line in path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            if marker in row["question"]:
                found.setdefault(path.name, set()).add((row.get("versions") or {}).get("arm"))
    return found


def test_stopping_sends_the_next_request_of_every_worker_of_both_servers_to_control(pair, http):
    a, b = pair.urls
    res = http.put(f"{a}/v1/admin/experiment", json={"name": "rollout", "arms": SPLIT})
    assert res.status_code == 200, res.text
    before = _fresh_asks([a, b], [f"{question(i)} before" for i in range(8)])
    assert {r["versions"]["arm"] for r in before} == {"control", "alt"}  # both servers follow the split
    assert {r["versions"]["profile"] for r in before if r["versions"]["arm"] == "alt"} == {"alt"}

    res = http.delete(f"{b}/v1/admin/experiment")  # the rollback, through the other server
    assert res.status_code == 200 and res.json()["experiment"]["stopped"], res.text
    after: list[dict] = []
    for round_ in range(8):  # until each of the four workers has answered since the stop
        after += _fresh_asks([a, b], [f"{question(i)} after {round_}" for i in range(4)])
        seen = [_answered_by(d, " after ") for d in pair.logs]
        if all(len(s) == 2 for s in seen):
            break
    assert all(len(s) == 2 for s in seen), seen
    assert {r["versions"]["arm"] for r in after} == {"control"}
    assert {r["versions"]["profile"] for r in after} == {"default"}
    assert all(arms == {"control"} for s in seen for arms in s.values()), seen

    # the command line reaches the same Redis: status, then a new split that every server follows
    run = CliRunner().invoke
    status = run(cli, ["experiment", "status", "--json"], env=pair.env)
    assert json.loads(status.output)["experiment"]["stopped"], status.output
    res = run(cli, ["experiment", "set", "rollout", "--arm", "control=default:0", "--arm", "alt=alt:1"], env=pair.env)
    assert res.exit_code == 0, res.output
    last = _fresh_asks([a, b], [question(1), question(2)])
    assert {r["versions"]["arm"] for r in last} == {"alt"}

    # each server's /metrics sums its two workers' per-arm counts
    for url in (a, b):
        mine = [r for r in before + after + last if r["server"] == url]
        text = http.get(f"{url}/metrics").text
        counted = {arm: _sample(text, "experiment_answers_total", experiment="rollout", arm=arm)
                   for arm in ("control", "alt")}
        assert counted == {arm: sum(r["versions"]["arm"] == arm for r in mine) for arm in counted}, counted
    # and the records in Redis hold every answer of both servers, for the report
    report = run(cli, ["experiment", "report", "--experiment", "rollout", "--json"], env=pair.env)
    rows = {r["arm"]: r for r in json.loads(report.output)}
    everything = before + after + last
    assert {arm: r["answers"] for arm, r in rows.items()} == {
        arm: sum(r["versions"]["arm"] == arm for r in everything) for arm in ("control", "alt")}, report.output


def _sample(text: str, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))
