"""The HTTP service through a real uvicorn server on 127.0.0.1, with a small real index.

OpenAI's client (sync, async, streaming) and LangChain's ``ChatOpenAI`` talk to it
unchanged; ``/v1/ask`` answers with citations and timings; errors have OpenAI's shape;
``/health``, ``/ready`` and ``/metrics`` say what they should; ``ragqa ask`` and ``ragqa serve``
run the same pipeline. Resuming streams is in ``test_serve_streams.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator

import openai
import pytest
from click.testing import CliRunner
from filelock import FileLock

from rag.services import Services
from ragqa.cli import cli
from serve.app import create_app
from tests.corpus import doc_text, question
from tests.live import MAX_BODY, live, sse_events


@pytest.fixture(scope="module")
def base_url(corpus: Services) -> Iterator[str]:
    with live(create_app(corpus.settings, services=corpus)) as url:
        yield url


@pytest.fixture(scope="module")
def client(base_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0) as c:
        yield c


# -- the OpenAI route -------------------------------------------------------------------
def test_openai_client_gets_a_completion_with_citations(client):
    res = client.chat.completions.create(model="ragqa", messages=[
        {"role": "system", "content": "You are helpful."}, {"role": "user", "content": question(3)}])
    assert res.object == "chat.completion" and res.model == "ragqa" and res.id.startswith("chatcmpl-")
    choice = res.choices[0]
    assert choice.finish_reason == "stop" and choice.message.role == "assistant"
    assert question(3) in choice.message.content and "[1]" in choice.message.content
    citations = choice.message.citations  # the extension field
    assert citations[0]["label"] == 1 and citations[0]["doc_id"] == "alpha:d03.md"
    assert citations[0]["url"].endswith("d03.md") and citations[0]["title"] == doc_text(3)[0]
    assert citations[0]["inferred"] is False  # the extractive answer labels every sentence itself
    assert res.usage.completion_tokens > 0
    assert res.usage.total_tokens == res.usage.prompt_tokens + res.usage.completion_tokens


def test_openai_client_streams_chunks_with_citations_and_usage(client):
    whole = client.chat.completions.create(model="ragqa", messages=[{"role": "user", "content": question(5)}])
    with client.chat.completions.create(model="ragqa", messages=[{"role": "user", "content": question(5)}],
                                        stream=True, stream_options={"include_usage": True}) as stream:
        chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip() == whole.choices[0].message.content
    final = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(final) == 1 and final[0].choices[0].finish_reason == "stop"
    assert final[0].choices[0].delta.citations == whole.choices[0].message.citations
    assert final[0].choices[0].delta.citations[0]["doc_id"] == "alpha:d05.md"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_async_openai_client_plain_and_streaming(base_url):
    async def run() -> tuple[str, str]:
        async with openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0) as aclient:
            msgs = [{"role": "user", "content": question(7)}]
            res = await aclient.chat.completions.create(model="ragqa", messages=msgs)
            stream = await aclient.chat.completions.create(model="ragqa", messages=msgs, stream=True)
            parts = [c.choices[0].delta.content or "" async for c in stream if c.choices]
            return res.choices[0].message.content, "".join(parts)

    plain, streamed = asyncio.run(run())
    assert question(7) in plain and streamed.strip() == plain


def test_langchain_chat_openai_with_base_url(base_url):
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model="ragqa", base_url=f"{base_url}/v1", api_key="unused", max_retries=0, temperature=0.2)
    message = llm.invoke(question(9))
    assert question(9) in message.content and "[1]" in message.content
    streamed = "".join(chunk.content for chunk in llm.stream(question(9)))
    assert streamed.strip() == message.content
    assert message.usage_metadata["output_tokens"] > 0


def test_filters_and_top_k_in_the_rag_extension(client):
    res = client.chat.completions.create(model="ragqa", messages=[{"role": "user", "content": question(3)}],
                                         extra_body={"rag": {"filters": {"source": "beta"}, "top_k": 3}})
    assert all(c["doc_id"].startswith("beta:") for c in res.choices[0].message.citations)
    assert question(3) not in res.choices[0].message.content


def test_conversation_history_and_models(client):
    res = client.chat.completions.create(model="any-name", messages=[
        {"role": "user", "content": "hello"}, {"role": "assistant", "content": "Hi."},
        {"role": "user", "content": question(4)}])
    assert res.model == "any-name" and question(4) in res.choices[0].message.content
    assert [m.id for m in client.models.list()] == ["ragqa"]


# -- errors before the stream -------------------------------------------------------------
def test_an_unknown_filter_is_a_422_naming_the_field(client, base_url, http):
    with pytest.raises(openai.UnprocessableEntityError) as info:
        client.chat.completions.create(model="ragqa", messages=[{"role": "user", "content": "x y"}],
                                       extra_body={"rag": {"filters": {"colour": "red"}}})
    error = info.value.body
    assert error["param"] == "rag.filters.colour" and error["type"] == "invalid_request_error"
    assert error["code"] == "unknown_field" and "source" in error["message"]
    for stream in (False, True):  # a stream that cannot start is a JSON error, not a stream
        r = http.post(f"{base_url}/v1/ask", json={"question": "q", "stream": stream, "filters": {"colour": 1}})
        assert r.status_code == 422 and r.headers["content-type"] == "application/json"
        assert r.json()["error"]["param"] == "filters.colour"


def test_bad_values_name_their_field(base_url, http):
    def error(path: str, body: dict) -> dict:
        r = http.post(f"{base_url}{path}", json=body)
        assert r.status_code == 422, r.text
        return r.json()["error"]

    msgs = [{"role": "user", "content": question(1)}]
    assert error("/v1/chat/completions", {"messages": msgs, "rag": {"filters": {"modified_from": "soon"}}})[
        "param"] == "rag.filters.modified_from"
    assert error("/v1/chat/completions", {"messages": msgs, "temperature": 7})["param"] == "temperature"
    assert error("/v1/chat/completions", {"messages": msgs, "rag": {"top_k": 0}})["param"] == "rag.top_k"
    assert error("/v1/chat/completions", {"messages": msgs, "rag": {"cache": True}})["param"] == "rag.cache"
    assert error("/v1/chat/completions", {"messages": [*msgs, {"role": "assistant", "content": "x"}]})[
        "param"] == "messages.1.role"
    assert error("/v1/chat/completions", {"messages": []})["param"] == "messages"
    assert error("/v1/ask", {"question": "q", "top_k": 500})["param"] == "top_k"


def test_limits_on_body_size_message_count_and_question_length(client, base_url, http):
    many = [{"role": "user", "content": "hi"}] * 9
    with pytest.raises(openai.UnprocessableEntityError) as info:
        client.chat.completions.create(model="ragqa", messages=many)
    assert info.value.body["param"] == "messages" and "at most 8 messages" in info.value.body["message"]
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(model="ragqa", messages=[{"role": "user", "content": "x" * MAX_BODY}])
    assert info.value.status_code == 413 and info.value.body["code"] == "too_large"
    assert f"at most {MAX_BODY} bytes" in info.value.body["message"]
    chunked = http.post(f"{base_url}/v1/ask", content=(b"x" * 4096 for _ in range(10)),  # no Content-Length
                         headers={"content-type": "application/json"})
    assert chunked.status_code == 413 and chunked.json()["error"]["code"] == "too_large"
    long = http.post(f"{base_url}/v1/ask", json={"question": "why " * 200})
    assert long.status_code == 422 and long.json()["error"]["param"] == "question"
    assert "at most 500" in long.json()["error"]["message"]


def test_openapi_documents_the_error_shape_on_every_route(base_url, http):
    spec = http.get(f"{base_url}/openapi.json").json()
    assert set(spec["components"]["schemas"]["ErrorDetail"]["properties"]) == {"message", "type", "param", "code"}
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            errors = [code for code, r in op["responses"].items() if code[0] in "45"
                      and "ErrorResponse" in json.dumps(r)]
            assert errors, f"{method.upper()} {path} documents no error"
    chat = spec["paths"]["/v1/chat/completions"]["post"]["responses"]
    assert {"413", "422", "503"} <= set(chat)
    assert "ChatCompletionChunk" in json.dumps(chat["200"]) and "ChatCompletionChunk" in spec["components"]["schemas"]


# -- the native route ---------------------------------------------------------------------
def test_ask_returns_answer_citations_timings_cache_and_degraded(base_url, http):
    r = http.post(f"{base_url}/v1/ask", json={"question": question(11), "top_k": 4})
    assert r.status_code == 200, r.text
    body = r.json()
    assert question(11) in body["answer"] and body["citations"][0]["doc_id"] == "alpha:d11.md"
    assert body["cache"] == "miss" and body["degraded"] is False and body["finish_reason"] == "stop"
    assert {"embed_ms", "retrieve_ms", "rerank_ms", "generate_ms", "total_ms"} <= set(body["timings"])
    again = http.post(f"{base_url}/v1/ask", json={"question": question(12),
                                                   "conversation_id": body["conversation_id"]}).json()
    assert again["conversation_id"] == body["conversation_id"] and question(12) in again["answer"]


def test_ask_streams_named_events_with_ids(base_url, http):
    with http.stream("POST", f"{base_url}/v1/ask", json={"question": question(13), "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = list(sse_events(r.iter_lines()))
    sid = r.headers["x-stream-id"]
    assert [e["id"] for e in events] == [f"{sid}:{i}" for i in range(1, len(events) + 1)]
    kinds = [e["event"] for e in events]
    assert kinds[0] == "sources" and kinds[-1] == "done" and set(kinds[1:-1]) == {"delta"}
    text = "".join(json.loads(e["data"])["text"] for e in events if e["event"] == "delta")
    done = json.loads(events[-1]["data"])
    assert done["answer"] == text.strip() and question(13) in text
    assert done["citations"][0]["doc_id"] == "alpha:d13.md" and "total_ms" in done["timings"]
    assert json.loads(events[0]["data"])["citations"][0]["doc_id"] == "alpha:d13.md"


# -- operations ---------------------------------------------------------------------------
def test_health_and_ready(base_url, http):
    assert http.get(f"{base_url}/health").json() == {"status": "ok"}
    ready = http.get(f"{base_url}/ready")
    assert ready.status_code == 200
    body = ready.json()
    assert body["status"] == "ready"
    assert body["backends"]["lexical"] == {"state": "ready", "backend": body["backends"]["lexical"]["backend"],
                                           "detail": "30 chunks"}
    assert body["backends"]["vector"]["state"] == "ready"
    assert body["backends"]["generator"] == {"state": "ready", "backend": "extractive", "detail": None}


def test_metrics_count_requests_and_time_each_stage(client, base_url, http):
    client.chat.completions.create(model="ragqa", messages=[{"role": "user", "content": question(2)}])
    with contextlib.suppress(openai.APIStatusError):
        client.chat.completions.create(model="ragqa", messages=[{"role": "user", "content": "x" * MAX_BODY}])
    r = http.get(f"{base_url}/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    assert 'http_requests_total{method="POST",route="/v1/chat/completions",status="200"}' in text
    assert 'http_requests_total{method="POST",route="/v1/chat/completions",status="413"}' in text
    assert 'http_request_seconds_bucket{le="0.5",route="/v1/chat/completions"}' in text
    for stage in ("embed", "retrieve", "rerank", "generate", "total"):
        assert f'answer_stage_seconds_count{{stage="{stage}"}}' in text, stage
    assert "answer_ttft_seconds_count" in text and "answer_tokens_per_second_count" in text
    assert 'answers_total{outcome="ok",route="chat"}' in text and "answers_degraded_total" in text
    assert 'index_last_success_timestamp{source="alpha"}' in text  # the ingest gauges, same registry


# -- admin --------------------------------------------------------------------------------
def test_sources_documents_and_reindex(base_url, corpus, http):
    sources = http.get(f"{base_url}/v1/sources").json()
    assert [(s["name"], s["documents"]) for s in sources] == [("alpha", 20), ("beta", 10)]
    doc = http.get(f"{base_url}/v1/documents/alpha:d03.md").json()
    assert doc["source"] == "alpha" and question(3) in doc["chunks"][0]["text"]
    missing = http.get(f"{base_url}/v1/documents/alpha:nope.md")
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "doc_id"
    report = http.post(f"{base_url}/v1/sources/alpha/reindex", timeout=60)
    assert report.status_code == 200 and report.json()["unchanged"] == 20 and report.json()["mode"] == "incremental"
    assert http.post(f"{base_url}/v1/sources/gamma/reindex").status_code == 404
    held = FileLock(str(corpus.data_dir / "write.lock"))  # another process's reindex, as far as flock sees
    with held.acquire(timeout=5):
        locked = http.post(f"{base_url}/v1/sources/alpha/reindex?mode=full")
    assert locked.status_code == 409 and locked.json()["error"]["code"] == "data_dir_locked"


# -- the commands -------------------------------------------------------------------------
def cli_env(corpus: Services) -> dict[str, str]:
    return {"RAG_DATA_DIR": str(corpus.data_dir), "RAG_EMBEDDER__BACKEND": "hash", "RAG_EMBEDDER__DIM": "256",
            "RAG_VECTOR__BACKEND": "numpy", "RAG_GENERATOR__BACKEND": "extractive", "RAG_CONFIG": ""}


def test_ragqa_ask_json_and_stream(corpus):
    res = CliRunner().invoke(cli, ["ask", question(6), "--json"], env=cli_env(corpus), catch_exceptions=False)
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert question(6) in data["answer"] and data["citations"][0]["doc_id"] == "alpha:d06.md"
    assert data["cache"] == "miss" and data["degraded"] is False and "total_ms" in data["timings"]
    res = CliRunner().invoke(cli, ["ask", question(6), "--stream"], env=cli_env(corpus), catch_exceptions=False)
    assert res.exit_code == 0 and res.stdout.startswith(data["answer"]) and "\n[1] Note zorgaith" in res.stdout
    res = CliRunner().invoke(cli, ["ask", question(6), "--stream", "--json"], env=cli_env(corpus))
    kinds = [json.loads(line)["event"] for line in res.stdout.splitlines()]
    assert kinds[0] == "sources" and kinds[-1] == "done"


def test_ragqa_serve_says_where_to_point_a_browser_and_runs_the_schedule(corpus, http):
    env = {**os.environ, **cli_env(corpus)}
    proc = subprocess.Popen([sys.executable, "-m", "ragqa.cli", "serve", "--port", "0", "--with-scheduler"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert "point a browser at http://127.0.0.1:" in line, line + proc.stderr.read()
        url = line.split("point a browser at ")[1].split()[0].rstrip("/")
        assert http.get(f"{url}/health").json() == {"status": "ok"}
        assert http.get(f"{url}/docs").status_code == 200
        assert "<textarea" in http.get(f"{url}/").text  # the chat page
        with contextlib.closing(sqlite3.connect(corpus.data_dir / "jobs.db")) as db:
            jobs = sorted(row[0] for row in db.execute("SELECT id FROM apscheduler_jobs"))
        assert jobs == ["alpha:full", "alpha:incremental", "beta:full", "beta:incremental"]
    finally:
        proc.terminate()  # uvicorn shuts down gracefully, then re-raises SIGTERM
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGTERM and "Traceback" not in err, err


def test_create_app_without_arguments_reads_the_settings_like_every_worker(corpus, monkeypatch):
    for key, value in cli_env(corpus).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("RAG_SERVE__MAX_MESSAGES", "3")
    state = create_app().state.ragqa
    assert state.settings.data_dir == corpus.data_dir and state.settings.serve.max_messages == 3
    assert state.answerer.generator.name == "extractive"
