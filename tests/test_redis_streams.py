"""The stream store contract, on the memory store and on the Redis store; and resume across
two app instances (two uvicorn servers) that share one Redis.

The Redis tests need a Redis server: ``scripts/test.sh`` starts a throwaway one and sets
``RAG_TEST_REDIS_URL``; without it they are skipped.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import openai
import pytest

from rag.answer import Answerer
from rag.metrics import REGISTRY
from rag.services import Services
from serve.app import create_app
from serve.conversations import RedisConversations
from serve.errors import NotFound
from serve.streams import MemoryStreamStore, StreamStore
from tests.corpus import question
from tests.live import Gated, comparable, live, sse_events, wait_for

REDIS_URL = os.environ.get("RAG_TEST_REDIS_URL")
needs_redis = pytest.mark.skipif(not REDIS_URL, reason="RAG_TEST_REDIS_URL is not set (scripts/test.sh starts "
                                 "a throwaway Redis and sets it)")



def _flush(prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture(params=["memory", pytest.param("redis", marks=needs_redis)])
def make_store(request: pytest.FixtureRequest) -> Iterator[Callable[..., StreamStore]]:
    """Builds stores of one kind; Redis ones share a prefix of their own, removed afterwards."""
    prefix = f"ragqa-test:{uuid.uuid4().hex[:8]}"

    def make(retention_s: float = 300.0) -> StreamStore:
        if request.param == "memory":
            return MemoryStreamStore(retention_s)
        from serve.redis_streams import RedisStreamStore

        return RedisStreamStore(REDIS_URL, retention_s, prefix=prefix)  # type: ignore[arg-type]

    make.kind = request.param  # type: ignore[attr-defined]
    yield make
    if request.param == "redis":
        _flush(prefix)


@pytest.fixture
def make_redis_store() -> Iterator[Callable[..., StreamStore]]:
    if not REDIS_URL:
        pytest.skip("RAG_TEST_REDIS_URL is not set (scripts/test.sh starts a throwaway Redis and sets it)")
    from serve.redis_streams import RedisStreamStore

    prefix = f"ragqa-test:{uuid.uuid4().hex[:8]}"
    yield lambda retention_s=300.0: RedisStreamStore(REDIS_URL, retention_s, prefix=prefix)
    _flush(prefix)


def run(coro_fn: Callable[[], object]) -> None:
    asyncio.run(coro_fn())  # type: ignore[arg-type]


# -- the contract -------------------------------------------------------------------------------
def test_events_get_dense_seqs_and_are_read_after_any_seq(make_store):
    async def go() -> None:
        store = make_store()
        assert isinstance(store, StreamStore)
        await store.create("s1", "chat", owner="key-1")
        await store.create("s2", "ask")
        datas = ['{"a": 1}', "line one\nline two", "中文 ✓", "[DONE]"]
        seqs = [await store.append("s1", d, "delta" if i % 2 else None) for i, d in enumerate(datas)]
        assert seqs == [1, 2, 3, 4]
        assert await store.append("s2", "other") == 1  # each stream counts alone
        events, done = await store.read_after("s1", 0, wait_s=0.1)
        assert [(e.seq, e.data, e.event) for e in events] == [
            (1, datas[0], None), (2, datas[1], "delta"), (3, datas[2], None), (4, datas[3], "delta")]
        assert not done
        events, _ = await store.read_after("s1", 2, wait_s=0.1)
        assert [e.seq for e in events] == [3, 4]
        info = await store.info("s1")
        assert (info.kind, info.owner, info.events, info.finished) == ("chat", "key-1", 4, False)
        assert (await store.info("s2")).owner is None
        await store.finish("s1")
        events, done = await store.read_after("s1", 4, wait_s=5)
        assert events == [] and done
        events, done = await store.read_after("s1", 1, wait_s=5)
        assert [e.seq for e in events] == [2, 3, 4] and done
        assert (await store.info("s1")).finished
        await _close(store)

    run(go)


def test_a_waiting_reader_wakes_on_append_and_on_finish(make_store):
    async def go() -> None:
        store = make_store()
        await store.create("w", "ask")
        await store.append("w", "e1")
        started = time.monotonic()
        waiting = asyncio.create_task(store.read_after("w", 1, wait_s=10))
        await asyncio.sleep(0.2)
        assert not waiting.done()  # a reader at the end waits for the next event
        await store.append("w", "e2", "done")
        events, done = await asyncio.wait_for(waiting, 5)
        assert [(e.seq, e.data, e.event) for e in events] == [(2, "e2", "done")] and not done
        waiting = asyncio.create_task(store.read_after("w", 2, wait_s=10))
        await asyncio.sleep(0.2)
        await store.finish("w")
        events, done = await asyncio.wait_for(waiting, 5)
        assert events == [] and done
        assert time.monotonic() - started < 8  # woken, not timed out
        await _close(store)

    run(go)


def test_a_reader_that_waits_in_vain_returns_after_wait_s_and_counts_as_present(make_store):
    async def go() -> None:
        store = make_store()
        await store.create("p", "chat")
        before = (await store.info("p")).last_seen
        await asyncio.sleep(0.05)
        started = time.monotonic()
        events, done = await store.read_after("p", 0, wait_s=0.3)
        assert events == [] and not done and 0.25 <= time.monotonic() - started < 5
        assert (await store.info("p")).last_seen > before
        await _close(store)

    run(go)


def test_unknown_streams_are_not_found(make_store):
    async def go() -> None:
        store = make_store()
        assert await store.info("nope") is None
        with pytest.raises(NotFound):
            await store.read_after("nope", 0, wait_s=0.1)
        await _close(store)

    run(go)


def test_a_finished_stream_is_kept_for_the_retention_period_then_dropped(make_store):
    async def go() -> None:
        store = make_store(retention_s=1.0)
        await store.create("r", "ask")
        for i in range(3):
            await store.append("r", f"e{i}")
        await store.finish("r")
        finished_at = time.monotonic()
        events, done = await store.read_after("r", 0, wait_s=0.1)
        if time.monotonic() - finished_at < 0.8:  # (a very busy machine could oversleep)
            assert [e.seq for e in events] == [1, 2, 3] and done
        await asyncio.sleep(2.2)
        assert await store.info("r") is None
        with pytest.raises(NotFound):
            await store.read_after("r", 0, wait_s=0)
        await _close(store)

    run(go)


def test_redis_a_reader_in_another_process_state_wakes_on_anothers_append(make_redis_store):
    """Two stores (two clients, as two workers have) over one Redis: B's blocked reader sees A's events."""

    async def go() -> None:
        a, b = make_redis_store(), make_redis_store()
        await a.create("x", "chat", owner=None)
        waiting = asyncio.create_task(b.read_after("x", 0, wait_s=10))
        await asyncio.sleep(0.2)
        assert not waiting.done()
        started = time.monotonic()
        await a.append("x", "hello")
        events, _ = await asyncio.wait_for(waiting, 5)
        assert [(e.seq, e.data) for e in events] == [(1, "hello")] and time.monotonic() - started < 2
        assert (await b.info("x")).events == 1
        await a.finish("x")
        assert (await b.read_after("x", 1, wait_s=5)) == ([], True)
        await _close(a)
        await _close(b)

    run(go)


def test_redis_an_unfinished_stream_whose_writer_died_expires(make_redis_store):
    async def go() -> None:
        store = make_redis_store(retention_s=1.0)
        await store.create("dead", "chat")
        await store.append("dead", "e1")
        await asyncio.sleep(2.2)  # no append, no reader: the writer is gone
        assert await store.info("dead") is None
        await _close(store)

    run(go)


async def _close(store: StreamStore) -> None:
    close = getattr(store, "aclose", None)
    if close is not None:
        await close()


# -- two app instances sharing one Redis ------------------------------------------------------------
def finished(state, stream_id: str) -> bool:  # state: an app's AppState; read with a client of our own
    import redis

    meta = state.streams.store.redis._keys(stream_id)[0]
    with redis.Redis.from_url(REDIS_URL, decode_responses=True) as client:
        return client.hget(meta, "finished") == "1"


@pytest.fixture(scope="module")
def pair(corpus: Services, gen: Gated) -> Iterator[tuple[str, str, object]]:
    """Servers A and B (two apps, two uvicorn servers, two event loops) on one Redis, with a
    disconnect grace of 1 s: A's generation lives on only while some client reads it."""
    if not REDIS_URL:
        pytest.skip("RAG_TEST_REDIS_URL is not set (scripts/test.sh starts a throwaway Redis and sets it)")
    settings = corpus.settings.model_copy(update={
        "serve": corpus.settings.serve.model_copy(update={"redis_url": REDIS_URL, "disconnect_grace_s": 1.0}),
        "cache": corpus.settings.cache.model_copy(update={"backend": "off"})})
    app_a = create_app(settings, services=corpus, answerer=Answerer(corpus, generator=gen))
    app_b = create_app(settings, services=corpus, answerer=Answerer(corpus, generator=gen))
    with live(app_a) as url_a, live(app_b) as url_b:
        yield url_a, url_b, app_a.state.ragqa


def test_a_stream_started_on_a_resumes_on_b_with_no_gap_and_no_repeat(pair, knobs):
    url_a, url_b, state_a = pair
    msgs = [{"role": "user", "content": question(3)}]
    with openai.OpenAI(base_url=f"{url_a}/v1", api_key="unused", max_retries=0) as a, \
            openai.OpenAI(base_url=f"{url_b}/v1", api_key="unused", max_retries=0) as b:
        with a.chat.completions.create(model="ragqa", messages=msgs, stream=True) as stream:
            reference = [comparable(c) for c in stream]
        knobs.hold_at = 3
        stream = a.chat.completions.create(model="ragqa", messages=msgs, stream=True)
        first = [next(stream), next(stream)]
        stream.close()  # the connection to A drops after two events
        stream_id = first[0].id.removeprefix("chatcmpl-")
        assert not finished(state_a, stream_id)
        with b.chat.completions.create(model="ragqa", messages=msgs, stream=True,
                                       extra_headers={"Last-Event-ID": f"{stream_id}:2"}) as resumed:
            rest = [next(resumed), next(resumed)]  # stored by A while the client was away
            # B's reader keeps A's generation alive past A's 1 s grace: it heartbeats in Redis
            time.sleep(2.5)
            assert not knobs.closed_early and not finished(state_a, stream_id)
            knobs.gate.set()
            rest += list(resumed)  # generated on A, read on B as A appends
    assert all(c.id == first[0].id for c in rest)
    assert [comparable(c) for c in first + rest] == reference
    assert not knobs.closed_early


def test_an_ask_stream_finished_on_a_is_read_on_b_by_get_and_re_post(pair, knobs, http):
    url_a, url_b, state_a = pair
    body = {"question": question(8), "stream": True}
    knobs.hold_at = 2
    with http.stream("POST", f"{url_a}/v1/ask", json=body) as r:
        events = sse_events(r.iter_lines())
        head = [next(events), next(events), next(events)]
        stream_id = r.headers["x-stream-id"]
    # B follows it while it is still held, from where the client was
    got: list[dict[str, str]] = []

    def follow_on_b() -> None:
        with http.stream("GET", f"{url_b}/v1/streams/{stream_id}",
                         headers={"Last-Event-ID": f"{stream_id}:3"}) as r2:
            got.extend(sse_events(r2.iter_lines()))

    reader = threading.Thread(target=follow_on_b)
    reader.start()
    time.sleep(0.5)
    knobs.gate.set()
    reader.join(60)
    assert not reader.is_alive()
    wait_for(lambda: finished(state_a, stream_id))
    union = head + got
    assert [e["id"] for e in union] == [f"{stream_id}:{i}" for i in range(1, len(union) + 1)]
    assert union[-1]["event"] == "done" and question(8) in json.loads(union[-1]["data"])["answer"]
    # after the end: the same events from B by re-sending the POST, and from any point
    with http.stream("POST", f"{url_b}/v1/ask", json=body, headers={"Last-Event-ID": f"{stream_id}:1"}) as r:
        assert [e["data"] for e in sse_events(r.iter_lines())] == [e["data"] for e in union[1:]]
    with http.stream("GET", f"{url_b}/v1/streams/{stream_id}?after=0") as r:
        assert [e["id"] for e in sse_events(r.iter_lines())] == [e["id"] for e in union]


def test_a_client_gone_from_both_servers_has_its_generation_aborted(pair, knobs, http):
    url_a, url_b, _ = pair
    knobs.hold_at = 2
    msgs = [{"role": "user", "content": question(5)}]
    with http.stream("POST", f"{url_a}/v1/chat/completions", json={"messages": msgs, "stream": True}) as r:
        events = sse_events(r.iter_lines())
        head = [next(events), next(events)]
        stream_id = r.headers["x-stream-id"]
    wait_for(lambda: knobs.closed_early)  # cancelled at the gate after the grace
    with http.stream("GET", f"{url_b}/v1/streams/{stream_id}?after=2") as r:
        tail = list(sse_events(r.iter_lines()))
    assert [e["id"] for e in head + tail] == [f"{stream_id}:{i}" for i in range(1, len(tail) + 3)]
    assert json.loads(tail[-2]["data"])["error"]["code"] == "aborted" and tail[-1]["data"] == "[DONE]"


def test_a_conversation_goes_on_across_instances_and_is_kept_per_key(pair, http):
    """``/v1/ask`` conversations live in Redis: the second turn, asked on B, continues the one
    started on A, and B's third turn sees both."""
    url_a, url_b, state_a = pair
    first = http.post(f"{url_a}/v1/ask", json={"question": question(11)}).json()
    cid = first["conversation_id"]
    second = http.post(f"{url_b}/v1/ask", json={"question": question(12), "conversation_id": cid})
    assert second.status_code == 200 and second.json()["conversation_id"] == cid

    async def read(owner: str | None) -> list[dict[str, str]]:  # as any instance reads it
        store = RedisConversations(REDIS_URL)
        try:
            return await store.history(cid, owner)
        finally:
            await store.aclose()

    turns = asyncio.run(read(None))
    assert [t["content"] for t in turns] == [question(11), first["answer"], question(12), second.json()["answer"]]
    assert asyncio.run(read("another-key")) == []


def test_with_redis_down_a_conversation_goes_on_from_the_workers_copy():
    async def scenario() -> None:
        store = RedisConversations("redis://127.0.0.1:9/0")
        before = REGISTRY.get_sample_value("conversation_store_fallbacks_total", {"op": "write"}) or 0.0
        await store.add("conv-x", "first question", "first answer", "key-a")
        assert [t["content"] for t in await store.history("conv-x", "key-a")] == ["first question", "first answer"]
        assert await store.history("conv-x", "key-b") == []
        assert REGISTRY.get_sample_value("conversation_store_fallbacks_total", {"op": "write"}) == before + 1
        await store.aclose()

    asyncio.run(scenario())


def test_an_unknown_stream_is_404_on_either_server(pair, http):
    for url in pair[:2]:
        r = http.get(f"{url}/v1/streams/nosuchstream", headers={"Last-Event-ID": "nosuchstream:4"})
        assert r.status_code == 404 and r.json()["error"]["param"] == "Last-Event-ID"



def fallbacks(when: str) -> float:
    return REGISTRY.get_sample_value("stream_store_fallbacks_total", {"when": when}) or 0.0


def test_with_redis_down_a_stream_runs_in_this_workers_memory_and_says_so(corpus, http):
    """Redis unreachable: streamed answers still stream, whole, from this worker's memory, with
    ``X-Stream-Store: local`` (resumable here only); what Redis held is a clear 503."""
    settings = corpus.settings.model_copy(update={
        "serve": corpus.settings.serve.model_copy(update={"redis_url": "redis://:secret@127.0.0.1:9/0"}),
        "cache": corpus.settings.cache.model_copy(update={"backend": "off"})})
    before = fallbacks("start")
    with live(create_app(settings, services=corpus)) as url:
        with http.stream("POST", f"{url}/v1/ask", json={"question": question(2), "stream": True}) as r:
            assert r.status_code == 200 and r.headers["x-stream-store"] == "local"
            events = list(sse_events(r.iter_lines()))
            stream_id = r.headers["x-stream-id"]
        assert events[-1]["event"] == "done" and question(2) in json.loads(events[-1]["data"])["answer"]
        with http.stream("GET", f"{url}/v1/streams/{stream_id}", headers={"Last-Event-ID": f"{stream_id}:2"}) as r:
            assert r.status_code == 200 and [e["id"] for e in sse_events(r.iter_lines())] == [
                e["id"] for e in events[2:]]
        with http.stream("POST", f"{url}/v1/chat/completions", json={
                "messages": [{"role": "user", "content": question(4)}], "stream": True}) as r:
            assert r.status_code == 200 and list(sse_events(r.iter_lines()))[-1]["data"] == "[DONE]"
        r = http.get(f"{url}/v1/streams/abc", headers={"Last-Event-ID": "abc:1"})  # might be in Redis
        assert r.status_code == 503 and r.json()["error"]["code"] == "backend_unavailable"
        assert "stream store" in r.json()["error"]["message"] and "secret" not in r.json()["error"]["message"]
    assert fallbacks("start") >= before + 2


def test_redis_lost_mid_stream_the_stream_ends_whole_on_this_worker(corpus, gen, knobs, http):
    """Redis goes away (a proxy in front of a real one starts refusing) after two events: the
    reader here gets the rest, numbered on with no gap; another instance says where they are."""
    if not REDIS_URL:
        pytest.skip("RAG_TEST_REDIS_URL is not set (scripts/test.sh starts a throwaway Redis and sets it)")
    from urllib.parse import urlsplit

    from tests.faultproxy import FaultProxy

    target = urlsplit(REDIS_URL)
    with FaultProxy(target.hostname or "127.0.0.1", target.port or 6379) as proxy:
        settings = corpus.settings.model_copy(update={
            "serve": corpus.settings.serve.model_copy(update={"redis_url": f"redis://127.0.0.1:{proxy.port}/0"}),
            "cache": corpus.settings.cache.model_copy(update={"backend": "off"})})
        before = fallbacks("mid-stream")
        with live(create_app(settings, services=corpus, answerer=Answerer(corpus, generator=gen))) as url_a, \
                live(create_app(settings, services=corpus, answerer=Answerer(corpus, generator=gen))) as url_b:
            knobs.hold_at = 2
            with http.stream("POST", f"{url_a}/v1/ask", json={"question": question(6), "stream": True}) as r:
                assert r.headers["x-stream-store"] == "redis"
                stream_id = r.headers["x-stream-id"]
                lines = r.iter_lines()
                events = sse_events(lines)
                head = [next(events), next(events)]
                proxy.set("refuse")
                knobs.gate.set()
                rest = list(events)
            union = head + rest
            assert [e["id"] for e in union] == [f"{stream_id}:{i}" for i in range(1, len(union) + 1)]
            assert union[-1]["event"] == "done" and question(6) in json.loads(union[-1]["data"])["answer"]
            assert fallbacks("mid-stream") == before + 1
            r = http.get(f"{url_b}/v1/streams/{stream_id}", headers={"Last-Event-ID": f"{stream_id}:1"})
            assert r.status_code == 503 and "stream store" in r.json()["error"]["message"]
            proxy.set("pass")
