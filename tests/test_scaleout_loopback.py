"""Scale-out on loopback: two ``ragqa serve --workers 2`` instances, each with a data directory
of its own, on one Elasticsearch, one Milvus server, one PostgreSQL (the ingestion state) and
one Redis, with the ingest run by a third process. A client spreads its requests over both:

- every answer cites the same sources whichever instance (and worker) answers it;
- a ``/v1/ask`` conversation started on one instance continues on the other;
- a stream started on one resumes on the other with ``Last-Event-ID``;
- a key's rate limit is counted across both;
- a reindex through one drops the changed answers from the shared cache for both, and keeps
  the others;
- stopping one instance loses no conversation and no finished stream; a stream it was still
  generating ends with an ``aborted`` error event, served by the other.

The services come from ``scripts/test.sh`` (``RAG_TEST_ES_URL``, ``RAG_TEST_MILVUS_URI``,
``RAG_TEST_POSTGRES_URL``, ``RAG_TEST_REDIS_URL``); without one the tests skip with the reason.
The state lives in a fresh PostgreSQL schema, the indexes in an Elasticsearch index and a
Milvus collection named for the run, the Redis keys under the run's prefixes; all are dropped
at the end.

The generator is an OpenAI-compatible server in this process, on loopback, in place of the
shared vLLM server of a real deployment (a real model answers in seconds per question on two
cores; vLLM's own server is tested in tests/test_vllm_generators.py). It answers by quoting
the first sentence of passage [1], so an answer changes when its passage does, and it records
every request, so a test sees the history an instance sent with a question. It can hold a
stream after some tokens, so a stream is still running when its client moves.

The instances start once for the module (about 15 s on two idle cores, up to a minute with
other test runs on them); the last test stops one.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import yaml

from ingest.services import open_services
from rag.config import Settings
from serve.auth import hash_key, new_key
from tests.corpus import OLD, doc_text, question, write_folder
from tests.fixtures.cache import flush_redis
from tests.fixtures.elasticsearch import drop_everything
from tests.fixtures.openai_wire import OpenAIHandler, chat_chunk, sse
from tests.fixtures.postgres import POSTGRES_URL, fresh_schema
from tests.live import sse_events

ES_URL = os.environ.get("RAG_TEST_ES_URL")
MILVUS_URI = os.environ.get("RAG_TEST_MILVUS_URI")
REDIS_URL = os.environ.get("RAG_TEST_REDIS_URL")
_MISSING = [name for name, value in (("RAG_TEST_ES_URL", ES_URL), ("RAG_TEST_MILVUS_URI", MILVUS_URI),
                                     ("RAG_TEST_POSTGRES_URL", POSTGRES_URL), ("RAG_TEST_REDIS_URL", REDIS_URL))
            if not value]
pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(bool(_MISSING), reason=f"{', '.join(_MISSING)} not set (scripts/test.sh starts "
                                 "Elasticsearch, Milvus, PostgreSQL and Redis and sets them)")]

PORTS = (8731, 8732)
NOTES = range(12)
LIMIT = 4
"""The metered key's requests per minute."""
SOURCE = "handbook"


# -- the model server ------------------------------------------------------------------------
_PASSAGE_1 = re.compile(r"^\[1\] [^\n]*\n(.*?[.!?])(?:\s|$)", re.S | re.M)


@dataclass
class ChatModel:
    """What the loopback model server answers and saw. ``hold_after``: stop after this many
    tokens of the next answers until ``release`` is set."""

    requests: list[list[dict[str, str]]] = field(default_factory=list)
    hold_after: int | None = None
    release: threading.Event = field(default_factory=threading.Event)

    @staticmethod
    def answer(messages: list[dict[str, str]]) -> str:
        found = _PASSAGE_1.search(messages[-1]["content"])
        return f"{found.group(1).strip()} [1]" if found else "I don't know: the documents do not say."

    def asked(self, question_text: str) -> list[dict[str, str]]:
        """The messages of the last request whose question is ``question_text``."""
        for messages in reversed(self.requests):
            if f"<question>\n{question_text}\n</question>" in messages[-1]["content"]:
                return messages
        raise AssertionError(f"the model was never asked {question_text!r}")


def _chunk(delta: dict[str, Any], finish: str | None = None, usage: dict[str, int] | None = None) -> bytes:
    """One SSE event of a streamed chat completion; with ``usage``, the last one (no choices)."""
    body = chat_chunk(delta, finish, model="tiny")
    if usage is not None:
        body.update(choices=[], usage=usage)
    return sse(body)


def _model_handler(model: ChatModel) -> type[BaseHTTPRequestHandler]:
    class Handler(OpenAIHandler):
        model_id = "tiny"
        max_model_len = 4096

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path != "/v1/chat/completions":  # /tokenize: ragqa then estimates tokens
                return self._error(404, "not found")
            model.requests.append(body["messages"])
            try:
                self._stream(model.answer(body["messages"]).split(" "))
            except (BrokenPipeError, ConnectionResetError):
                pass  # the instance stopped or aborted the answer

        def _stream(self, words: list[str]) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(_chunk({"role": "assistant", "content": ""}))
            for i, word in enumerate(words):
                if i == model.hold_after:
                    self.wfile.flush()
                    model.release.wait(60)
                self.wfile.write(_chunk({"content": word if i == 0 else " " + word}))
            self.wfile.write(_chunk({}, "stop"))
            usage = {"prompt_tokens": 50, "completion_tokens": len(words), "total_tokens": 50 + len(words)}
            self.wfile.write(_chunk({}, usage=usage))
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()

    return Handler


# -- the deployment --------------------------------------------------------------------------
KEYS = {name: new_key() for name in ("admin", "app", "other", "metered")}


def _config(run: str, state_url: str, model_url: str, notes: Path) -> dict[str, Any]:
    """The one settings file of the three processes (each has its own RAG_DATA_DIR)."""
    return {
        "state": {"url": state_url},
        "embedder": {"backend": "hash", "dim": 256, "progress": False},
        "lexical": {"backend": "elasticsearch", "url": ES_URL, "index": f"ragqa-scaleout-{run}"},
        "vector": {"backend": "milvus", "uri": MILVUS_URI, "collection": f"ragqa_scaleout_{run}", "cache": False},
        # Fixed weights: the hash embedder's cosines are not a model's. One passage per answer,
        # so an answer depends on one note only (an uncited passage in the context would tie it
        # to another, and a change there would drop it too).
        "retrieval": {"mode": "rrf", "weights": [1.0, 1.0], "max_context_chunks": 1},
        "generator": {"backend": "openai", "base_url": model_url, "model": "tiny", "fallback": False},
        "cache": {"backend": "redis", "prefix": f"ragqa-test-scaleout:{run}", "semantic": False},
        "serve": {"redis_url": REDIS_URL, "rate_limit_per_minute": 0, "conversation_ttl_s": 600,
                  "stream_retention_s": 120, "api_keys": [
                      {"id": f"ops-{run}", "hash": hash_key(KEYS["admin"]), "scopes": ["admin"]},
                      {"id": f"app-{run}", "hash": hash_key(KEYS["app"])},
                      {"id": f"other-{run}", "hash": hash_key(KEYS["other"])},
                      {"id": f"metered-{run}", "hash": hash_key(KEYS["metered"]), "rate_limit_per_minute": LIMIT}]},
        "sources": [{"name": SOURCE, "kind": "folder", "location": str(notes), "lang": "en"}],
    }


def _data_dir(base: Path, name: str) -> Path:
    """A data directory of its own: nothing is shared through it."""
    data = base / name
    data.mkdir()
    return data


def _env(config: Path, data: Path, metrics: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAG_") or k.startswith("RAG_TEST_")}
    return {**env, "RAG_CONFIG": str(config), "RAG_DATA_DIR": str(data), "PROMETHEUS_MULTIPROC_DIR": str(metrics)}


@dataclass
class Instance:
    url: str
    proc: subprocess.Popen[str]
    data: Path
    reader: threading.Thread | None = None

    def drain(self) -> None:
        """Read what the server prints after its announcement, on a thread (a full pipe would
        block the server)."""
        def read() -> None:
            for _ in self.proc.stdout:  # type: ignore[union-attr]
                pass

        self.reader = threading.Thread(target=read, daemon=True)
        self.reader.start()

    def stop(self) -> str:
        """SIGTERM, as an orchestrator stops a pod; returns its log (stderr)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)
        if self.reader is not None:
            self.reader.join(10)
        self.proc.stdout.close()  # type: ignore[union-attr]
        return (self.data / "serve.log").read_text(errors="replace")


def _start(port: int, env: dict[str, str]) -> Instance:
    data = Path(env["RAG_DATA_DIR"])
    with open(data / "serve.log", "wb") as log:  # a file: a pipe nobody reads would block the server
        proc = subprocess.Popen([sys.executable, "-m", "ragqa.cli", "serve", "--workers", "2", "--port", str(port)],
                                env=env, stdout=subprocess.PIPE, stderr=log, text=True)
    return Instance(f"http://127.0.0.1:{port}", proc, data)


def _wait_ready(instance: Instance) -> None:
    line = instance.proc.stdout.readline()  # type: ignore[union-attr]
    assert instance.url in line, line + instance.stop()
    instance.drain()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # the workers load their apps after the announcement
        try:
            if httpx.get(f"{instance.url}/ready", timeout=10).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert instance.proc.poll() is None, instance.stop()
        time.sleep(0.1)
    raise AssertionError(f"{instance.url} not ready in 120 s: {httpx.get(f'{instance.url}/ready').text}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    base = tmp_path_factory.mktemp("scaleout")
    run = uuid.uuid4().hex[:8]
    model = ChatModel()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _model_handler(model))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    notes = base / "notes"
    write_folder(notes, NOTES, OLD)
    state = contextlib.ExitStack()
    config = base / "ragqa.yaml"
    config.write_text(yaml.safe_dump(_config(run, state.enter_context(fresh_schema("scaleout")),
                                             f"http://127.0.0.1:{httpd.server_address[1]}/v1", notes)))
    (base / "metrics").mkdir()
    timings: dict[str, float] = {}
    instances: list[Instance] = []
    try:
        began = time.monotonic()
        ingest = subprocess.run([sys.executable, "-m", "ragqa.cli", "reindex", "--mode", "full", "--json"],
                                env=_env(config, _data_dir(base, "ingest"), base / "metrics"),
                                capture_output=True, text=True, timeout=300)
        assert ingest.returncode == 0, ingest.stdout + ingest.stderr
        assert json.loads(ingest.stdout.splitlines()[-1])["added"] == len(NOTES), ingest.stdout
        timings["ingest_s"] = time.monotonic() - began
        began = time.monotonic()
        instances = [_start(port, _env(config, _data_dir(base, f"api-{i}"), base / "metrics"))
                     for i, port in enumerate(PORTS)]
        for instance in instances:
            _wait_ready(instance)
        timings["start_s"] = time.monotonic() - began
        yield SimpleNamespace(a=instances[0], b=instances[1], model=model, notes=notes, config=config, base=base,
                              run=run, timings=timings)
    finally:
        errors = [instance.stop() for instance in instances]
        httpd.shutdown()
        httpd.server_close()
        with state:  # the schema goes last: dropping the indexes opens the settings' state
            _drop(config, base, run)
        print(f"\nscale-out loopback timings: {json.dumps({k: round(v, 1) for k, v in timings.items()})}")
    for err in errors:
        assert "Traceback" not in err, err


def _drop(config: Path, base: Path, run: str) -> None:
    """Drop the module's Elasticsearch index, Milvus collection and Redis keys."""
    from elasticsearch import Elasticsearch

    settings = Settings.load(config, data_dir=base / "cleanup")
    services = open_services(settings)
    try:
        services.vector.drop()  # type: ignore[attr-defined]
        with Elasticsearch(ES_URL) as raw:
            drop_everything(raw, settings.lexical.index)
    finally:
        services.close()
    for prefix in (settings.cache.prefix, f"ragqa:conv:app-{run}", f"ragqa:conv:other-{run}"):
        flush_redis(prefix)


# -- the client ------------------------------------------------------------------------------
def auth(name: str = "app") -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[name]}"}


def ask(url: str, text: str, key: str = "app", **body: Any) -> dict[str, Any]:
    """One question on a new connection (so the instance's two workers both get some)."""
    response = httpx.post(f"{url}/v1/ask", json={"question": text, **body}, headers=auth(key), timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def cited(answer: dict[str, Any]) -> list[tuple[str, str]]:
    return [(c["doc_id"], c["chunk_id"]) for c in answer["citations"]]


def note_of(answer: dict[str, Any]) -> str:
    """The file name of the first cited document."""
    return Path(answer["citations"][0]["url"]).name


# -- the tests ---------------------------------------------------------------------------------
def test_both_instances_serve_the_ingest_of_a_third_process(cluster):
    a, b = (httpx.get(f"{i.url}/v1/sources", headers=auth(), timeout=30).json() for i in (cluster.a, cluster.b))
    assert a == b
    assert [(s["name"], s["documents"], s["last_run"]["status"]) for s in a] == [(SOURCE, len(NOTES), "ok")]
    for instance in (cluster.a, cluster.b):  # nothing an answer reads is in a data directory
        assert not {"state.db", "vectors.db", "milvus.db", "lexical"} & {p.name for p in instance.data.iterdir()}


def test_every_answer_cites_the_same_sources_on_either_instance(cluster):
    jobs = [(instance, i) for i in NOTES for instance in (cluster.a, cluster.b)]
    began = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda job: ask(job[0].url, question(job[1]), no_cache=True), jobs))
    cluster.timings["spread_questions_s"] = time.monotonic() - began
    for i in NOTES:
        on_a, on_b = answers[2 * i], answers[2 * i + 1]
        assert cited(on_a) == cited(on_b) and on_a["answer"] == on_b["answer"], (question(i), on_a, on_b)
        assert note_of(on_a) == f"d{i:02d}.md" and not on_a["degraded"], on_a


def test_a_conversation_continues_on_the_other_instance(cluster):
    first = ask(cluster.a.url, question(1))
    cid = first["conversation_id"]
    follow_up = ask(cluster.b.url, "And what else does that note say?", conversation_id=cid)
    assert follow_up["conversation_id"] == cid
    sent = cluster.model.asked("And what else does that note say?")
    assert [(m["role"], m["content"]) for m in sent[1:-1]] == [("user", question(1)), ("assistant", first["answer"])]
    ask(cluster.a.url, "Which note was it?", conversation_id=cid)  # and back: both earlier turns
    assert [m["role"] for m in cluster.model.asked("Which note was it?")[1:-1]] == ["user", "assistant"] * 2


def test_another_key_cannot_continue_a_conversation_on_either_instance(cluster):
    cid = ask(cluster.a.url, question(2))["conversation_id"]
    ask(cluster.b.url, "Is there more?", key="other", conversation_id=cid)
    assert len(cluster.model.asked("Is there more?")) == 2  # system and question: no history


def _events(response: httpx.Response, stop_after_delta: bool = False) -> list[dict[str, str]]:
    events = []
    for event in sse_events(response.iter_lines()):
        events.append(event)
        if event.get("event") in ("done", "error") or (stop_after_delta and event.get("event") == "delta"):
            break
    return events


def test_a_stream_started_on_one_instance_resumes_on_the_other(cluster):
    model = cluster.model
    model.release.clear()
    model.hold_after = 2
    try:
        with httpx.Client(timeout=60) as http:
            with http.stream("POST", f"{cluster.a.url}/v1/ask", headers=auth(),
                             json={"question": question(5), "stream": True, "no_cache": True}) as response:
                assert response.status_code == 200 and response.headers["X-Stream-Store"] == "redis"
                before = _events(response, stop_after_delta=True)  # then the connection drops
        last_id = before[-1]["id"]
        stream_id = last_id.split(":")[0]
        threading.Timer(0.5, model.release.set).start()  # the answer goes on while B follows it
        with httpx.Client(timeout=60) as http:
            with http.stream("GET", f"{cluster.b.url}/v1/streams/{stream_id}",
                             headers={**auth(), "Last-Event-ID": last_id}) as response:
                assert response.status_code == 200, response.read()
                after = _events(response)
    finally:
        model.hold_after = None
        model.release.set()
    events = before + after
    assert [int(e["id"].split(":")[1]) for e in events] == list(range(1, len(events) + 1))  # no gap, no repeat
    assert events[-1]["event"] == "done"
    done = json.loads(events[-1]["data"])
    text = "".join(json.loads(e["data"])["text"] for e in events if e["event"] == "delta")
    assert text.strip() == done["answer"] and note_of(done) == "d05.md"
    assert len([e for e in after if e["event"] == "delta"]) >= 2  # generated after the move


def test_a_keys_rate_limit_is_counted_across_both_instances(cluster):
    def status(url: str) -> int:
        return httpx.get(f"{url}/v1/sources", headers=auth("metered"), timeout=30).status_code

    allowed = [status(url) for url in (cluster.a.url, cluster.b.url) * (LIMIT // 2)]
    assert allowed == [200] * LIMIT
    refused = [httpx.get(f"{url}/v1/sources", headers=auth("metered"), timeout=30)
               for url in (cluster.a.url, cluster.b.url)]
    assert [r.status_code for r in refused] == [429, 429], [r.text for r in refused]
    assert all(int(r.headers["Retry-After"]) >= 1 for r in refused)
    assert status(cluster.a.url) == 429  # another worker of the same instance counts the same


def test_a_reindex_through_one_instance_drops_the_changed_answers_for_both(cluster):
    changed, kept = 7, 8
    for i in (changed, kept):
        first = ask(cluster.a.url, question(i))
        assert ask(cluster.b.url, question(i))["cache"] == "hit", "B serves the answer A cached"
        assert first["answer"] == ask(cluster.a.url, question(i))["answer"]
    path = cluster.notes / f"d{changed:02d}.md"
    title, body = doc_text(changed)
    edited = body.replace(question(changed), question(changed) + " now rebuilt in granite", 1)
    path.write_text(f"# {title}\n\n{edited}\n", encoding="utf-8")
    began = time.monotonic()
    report = httpx.post(f"{cluster.a.url}/v1/sources/{SOURCE}/reindex", headers=auth("admin"), timeout=120)
    cluster.timings["reindex_s"] = time.monotonic() - began
    assert report.status_code == 200, report.text
    assert report.json()["changed"] == 1 and report.json()["added"] == 0, report.json()
    for instance in (cluster.b, cluster.a):
        fresh = ask(instance.url, question(changed))
        assert fresh["cache"] == "miss" or instance is cluster.a, fresh  # B answers afresh, A then from the cache
        assert "granite" in fresh["answer"] and note_of(fresh) == f"d{changed:02d}.md", fresh
        assert ask(instance.url, question(kept))["cache"] == "hit"


def test_stopping_one_instance_loses_no_conversation(cluster):
    """B stops (SIGTERM, as an orchestrator stops a pod) with a conversation, a finished stream
    and a stream still generating: the conversation goes on on A, the finished stream replays
    there, and the one B was generating ends with an error event that A serves (its
    generation died with B: the client asks again), rather than hanging."""
    model = cluster.model
    first = ask(cluster.b.url, question(9))
    cid = first["conversation_id"]
    ask(cluster.b.url, "Tell me more about it.", conversation_id=cid)
    with httpx.Client(timeout=60) as http, http.stream(
            "POST", f"{cluster.b.url}/v1/ask", headers=auth(),
            json={"question": question(10), "stream": True, "no_cache": True}) as response:
        finished = _events(response)
    model.release.clear()
    model.hold_after = 2
    try:
        with httpx.Client(timeout=60) as http, http.stream(
                "POST", f"{cluster.b.url}/v1/ask", headers=auth(),
                json={"question": question(11), "stream": True, "no_cache": True}) as response:
            running = _events(response, stop_after_delta=True)
        began = time.monotonic()
        err = cluster.b.stop()
        cluster.timings["stop_s"] = time.monotonic() - began
    finally:
        model.hold_after = None
        model.release.set()
    assert cluster.b.proc.returncode == 0 and "Traceback" not in err, err

    ask(cluster.a.url, "Anything else?", conversation_id=cid)
    sent = model.asked("Anything else?")
    assert [m["content"] for m in sent[1:-1] if m["role"] == "user"] == [question(9), "Tell me more about it."]

    def resumed(events: list[dict[str, str]], after: int) -> list[dict[str, str]]:
        response = httpx.get(f"{cluster.a.url}/v1/streams/{events[0]['id'].split(':')[0]}",
                             headers={**auth(), "Last-Event-ID": events[after]["id"]}, timeout=60)
        assert response.status_code == 200, response.text
        return list(sse_events(iter(response.text.splitlines())))

    assert [e["id"] for e in resumed(finished, 1)] == [e["id"] for e in finished[2:]]
    rest = resumed(running, len(running) - 1)
    assert [e["event"] for e in rest][-1:] == ["error"], rest
    assert json.loads(rest[-1]["data"])["error"]["code"] == "aborted", rest
