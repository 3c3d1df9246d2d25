"""Resumable streams through a real uvicorn server: reconnect with ``Last-Event-ID`` while the
generation runs or after it finished (no gap, no repeat), abort after the disconnect grace,
errors after the stream started, and the degraded fallback.

The generator is the extractive one behind a gate the test controls, so "still running" and
"already finished" are facts, not timing luck.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from rag.answer import Answerer
from rag.services import Services
from serve.app import create_app
from tests.corpus import question
from tests.live import Gated, comparable, live, sse_events, wait_for


@pytest.fixture(scope="module")
def patient(corpus: Services, gen: Gated) -> Iterator[tuple[str, object]]:
    """A server that waits 30 s for a client to come back."""
    app = create_app(corpus.settings, services=corpus, answerer=Answerer(corpus, generator=gen))
    with live(app) as url:
        yield url, app.state.ragqa


@pytest.fixture(scope="module")
def impatient(corpus: Services, gen: Gated) -> Iterator[str]:
    """A server that aborts a generation nobody has read for half a second."""
    settings = corpus.settings.model_copy(update={"serve": corpus.settings.serve.model_copy(
        update={"disconnect_grace_s": 0.5})})
    app = create_app(settings, services=corpus, answerer=Answerer(corpus, generator=gen))
    with live(app) as url:
        yield url


def chat(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def same_run(event: dict[str, str]) -> tuple[str, dict]:
    """An ask event without what differs between two runs of the same question."""
    data = json.loads(event["data"])
    for key in ("conversation_id", "timings", "answer_id"):
        data.pop(key, None)
    return event["event"], data


def finished(state, stream_id: str) -> bool:  # state: the app's AppState
    info = asyncio.run(state.streams.store.info(stream_id))
    return info is not None and info.finished


def test_openai_client_resumes_a_running_stream_with_last_event_id(patient, knobs):
    url, state = patient
    msgs = [{"role": "user", "content": question(3)}]
    with chat(url) as client:
        with client.chat.completions.create(model="ragqa", messages=msgs, stream=True) as stream:
            reference = [comparable(c) for c in stream]
        knobs.hold_at = 3
        stream = client.chat.completions.create(model="ragqa", messages=msgs, stream=True)
        first = [next(stream), next(stream)]
        stream.close()  # the connection drops after two events
        stream_id = first[0].id.removeprefix("chatcmpl-")
        assert not finished(state, stream_id)
        with client.chat.completions.create(model="ragqa", messages=msgs, stream=True,
                                            extra_headers={"Last-Event-ID": f"{stream_id}:2"}) as resumed:
            rest = [next(resumed), next(resumed)]  # stored while the client was away
            assert not finished(state, stream_id)  # the generation is still waiting at the gate
            knobs.gate.set()
            rest += list(resumed)
    assert all(c.id == first[0].id for c in rest)
    assert [comparable(c) for c in first + rest] == reference
    assert not knobs.closed_early


def test_resume_after_the_generation_finished_by_get_or_re_post(patient, knobs, http):
    url, state = patient
    body = {"question": question(8), "stream": True}
    with http.stream("POST", f"{url}/v1/ask", json=body) as r:
        reference = list(sse_events(r.iter_lines()))
    knobs.hold_at = 2
    with http.stream("POST", f"{url}/v1/ask", json=body) as r:
        events = sse_events(r.iter_lines())
        head = [next(events), next(events), next(events)]
    stream_id = r.headers["x-stream-id"]
    knobs.gate.set()
    wait_for(lambda: finished(state, stream_id))
    with http.stream("GET", f"{url}/v1/streams/{stream_id}", headers={"Last-Event-ID": f"{stream_id}:3"}) as r:
        tail = list(sse_events(r.iter_lines()))
    union = head + tail
    assert [e["id"] for e in union] == [f"{stream_id}:{i}" for i in range(1, len(reference) + 1)]
    assert [same_run(e) for e in union] == [same_run(e) for e in reference]
    # the same by re-sending the request, and from any point
    with http.stream("POST", f"{url}/v1/ask", json=body, headers={"Last-Event-ID": f"{stream_id}:1"}) as r:
        assert [e["id"] for e in sse_events(r.iter_lines())] == [e["id"] for e in union[1:]]
    with http.stream("GET", f"{url}/v1/streams/{stream_id}?after=0") as r:
        assert [e["data"] for e in sse_events(r.iter_lines())] == [e["data"] for e in union]


def test_resume_errors(patient, http):
    url, _ = patient
    r = http.get(f"{url}/v1/streams/nosuchstream", headers={"Last-Event-ID": "nosuchstream:4"})
    assert r.status_code == 404 and r.json()["error"]["param"] == "Last-Event-ID"
    r = http.post(f"{url}/v1/ask", json={"question": "q", "stream": True}, headers={"Last-Event-ID": "x:y"})
    assert r.status_code == 422 and "<stream_id>:<seq>" in r.json()["error"]["message"]
    with http.stream("POST", f"{url}/v1/ask", json={"question": question(2), "stream": True}) as r:
        ask_events = list(sse_events(r.iter_lines()))
    stream_id = r.headers["x-stream-id"]
    msgs = [{"role": "user", "content": "q"}]
    r = http.post(f"{url}/v1/chat/completions", json={"messages": msgs, "stream": True},
                   headers={"Last-Event-ID": f"{stream_id}:1"})
    assert r.status_code == 422 and "ask route" in r.json()["error"]["message"]
    r = http.get(f"{url}/v1/streams/{stream_id}", headers={"Last-Event-ID": f"{stream_id}:{len(ask_events) + 5}"})
    assert r.status_code == 422


def test_a_client_that_never_comes_back_has_its_generation_aborted(impatient, knobs, http):
    knobs.hold_at = 2
    msgs = [{"role": "user", "content": question(5)}]
    with http.stream("POST", f"{impatient}/v1/chat/completions", json={"messages": msgs, "stream": True}) as r:
        events = sse_events(r.iter_lines())
        head = [next(events), next(events)]
    stream_id = r.headers["x-stream-id"]
    wait_for(lambda: knobs.closed_early)  # cancelled at the gate, within the grace period plus a poll
    with http.stream("GET", f"{impatient}/v1/streams/{stream_id}?after=2") as r:
        tail = list(sse_events(r.iter_lines()))
    assert [e["id"] for e in head + tail] == [f"{stream_id}:{i}" for i in range(1, len(tail) + 3)]
    assert json.loads(tail[-2]["data"])["error"]["code"] == "aborted" and tail[-1]["data"] == "[DONE]"
    assert "no client has read the stream" in json.loads(tail[-2]["data"])["error"]["message"]


def test_a_slow_generation_with_its_client_still_there_is_not_aborted(impatient, knobs):
    knobs.hold_at = 2
    threading.Timer(1.5, knobs.gate.set).start()  # three grace periods without a new event
    with chat(impatient) as client:
        stream = client.chat.completions.create(model="ragqa", stream=True,
                                                messages=[{"role": "user", "content": question(6)}])
        chunks = list(stream)
    assert chunks[-1].choices[0].finish_reason == "stop" and not knobs.closed_early
    assert question(6) in "".join(c.choices[0].delta.content or "" for c in chunks)


def test_an_error_after_the_stream_started_is_an_error_event_then_done(patient, knobs, http):
    url, _ = patient
    knobs.fail_after = 2
    msgs = [{"role": "user", "content": question(4)}]
    with http.stream("POST", f"{url}/v1/chat/completions", json={"messages": msgs, "stream": True}) as r:
        assert r.status_code == 200
        events = list(sse_events(r.iter_lines()))
    assert [e["data"] for e in events][-1] == "[DONE]"
    error = json.loads(events[-2]["data"])["error"]
    assert error["code"] == "generator_error" and "closed the stream" in error["message"]
    assert len(events) == 5 and all("id" in e for e in events)  # role, two deltas, error, [DONE]
    with chat(url) as client:
        stream = client.chat.completions.create(model="ragqa", messages=msgs, stream=True)
        with pytest.raises(openai.APIError, match="closed the stream"):
            list(stream)
    with http.stream("POST", f"{url}/v1/ask", json={"question": question(4), "stream": True}) as r:
        kinds = [e["event"] for e in sse_events(r.iter_lines())]
    assert kinds == ["sources", "delta", "delta", "error"]
    r = http.post(f"{url}/v1/ask", json={"question": question(4)})
    assert r.status_code == 503 and r.json()["error"]["code"] == "generator_error"


def test_a_generator_that_is_down_gives_degraded_answers_and_ready_says_so(patient, knobs, http):
    url, _ = patient
    before = _degraded(http, url)
    knobs.down = True
    r = http.post(f"{url}/v1/ask", json={"question": question(9)}).json()
    assert r["degraded"] is True and question(9) in r["answer"]
    assert _degraded(http, url) == before + 1
    ready = http.get(f"{url}/ready").json()
    assert ready["status"] == "degraded" and ready["backends"]["generator"]["state"] == "down"
    knobs.down = False
    assert http.post(f"{url}/v1/ask", json={"question": question(9)}).json()["degraded"] is False
    assert http.get(f"{url}/ready").json()["status"] == "ready"


def _degraded(http: httpx.Client, url: str) -> float:
    for line in http.get(f"{url}/metrics").text.splitlines():
        if line.startswith("answers_degraded_total "):
            return float(line.split()[1])
    raise AssertionError("answers_degraded_total is missing")


def test_a_plain_request_whose_client_left_is_cancelled(patient, knobs, http):
    url, _ = patient
    knobs.hold_at = 1
    with pytest.raises(httpx.ReadTimeout):
        http.post(f"{url}/v1/ask", json={"question": question(10)}, timeout=0.5)
    wait_for(lambda: knobs.closed_early)
    assert 'http_requests_total{method="POST",route="/v1/ask",status="499"}' in http.get(f"{url}/metrics").text


def test_the_memory_store_keeps_a_finished_stream_for_the_retention_period():
    from serve.errors import NotFound
    from serve.streams import MemoryStreamStore, StreamStore

    async def run() -> None:
        store = MemoryStreamStore(retention_s=1.0)
        assert isinstance(store, StreamStore)
        await store.create("s1", "ask")
        assert [await store.append("s1", f"e{i}") for i in range(3)] == [1, 2, 3]
        waiting = asyncio.create_task(store.read_after("s1", 3, wait_s=5))
        await asyncio.sleep(0.05)
        assert not waiting.done()  # a reader at the end waits for the next event
        await store.append("s1", "e3", "done")
        events, finished = await waiting
        assert [(e.seq, e.data, e.event) for e in events] == [(4, "e3", "done")] and not finished
        await store.finish("s1")
        events, finished = await store.read_after("s1", 1, wait_s=5)
        assert [e.seq for e in events] == [2, 3, 4] and finished
        finished_at = time.time()
        await asyncio.sleep(0.1)
        if time.time() - finished_at < 0.9:  # (a very busy machine could oversleep)
            assert (await store.info("s1")).events == 4  # still within the retention
        await asyncio.sleep(1.0)
        assert await store.info("s1") is None
        with pytest.raises(NotFound):
            await store.read_after("s1", 0, wait_s=0)

    asyncio.run(run())
