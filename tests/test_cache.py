"""The answer cache, on the memory and the Redis backends through one suite, with the real
MiniLM embedder (the packaged all-MiniLM-L6-v2) for the index and the semantic lookups, and
the extractive generator behind a counter, so "served from the cache" means "not generated".

Then the HTTP service through real uvicorn servers: ``/v1/ask``'s ``cache`` field, the chat
route's ``X-Cache`` header and ``delta.cache``, ``no_cache``, the metrics, and two app
instances sharing one Redis cache.

The Redis tests need ``RAG_TEST_REDIS_URL`` (``scripts/test.sh`` starts a throwaway Redis).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
from click.testing import CliRunner

from ingest.pipeline import reindex
from ingest.services import open_services
from rag.answer import Answerer, AnswerEvent
from rag.cache import (
    CachedAnswer,
    MemoryAnswerCache,
    make_answer_cache,
    normalise_question,
)
from rag.config import CacheSettings, SourceConfig
from rag.services import Services
from rag.types import Filters
from ragqa.cli import cli
from serve.app import create_app
from tests.conftest import make_settings
from tests.fixtures.cache import NO_REDIS, REDIS_URL, Counting, ask, done, flush_redis
from tests.live import live

NOTES = {
    "docs": {
        "files.md": ("Reading files", ("To read a file in Python, open it with open(path) and call read() on "
                                       "the file object; a with block closes it for you.")),
        "writing.md": ("Writing files", ("To write a file in Python, open it with open(path, 'w') and call "
                                         "write() with the text.")),
        "py311.md": ("Python 3.11", ("Python 3.11 was released on 24 October 2022, with faster CPython and "
                                     "exception groups.")),
        "py312.md": ("Python 3.12", ("Python 3.12 was released on 2 October 2023, with a more flexible "
                                     "f-string syntax.")),
    },
    "acme": {"holidays.md": ("Acme holidays", "Acme employees get 30 days of paid holiday each year.")},
    "globex": {"holidays.md": ("Globex holidays", "Globex employees get 25 days of paid holiday each year.")},
    "news": {"status.md": ("Status", "The service status is green.")},
}
TENANTS = {"acme": "acme", "globex": "globex"}

READ = "How do I read a file in Python?"
READ_PARAPHRASE = "In Python, how can I read a file?"  # MiniLM: cosine 0.98-0.99 to READ
WRITE = "How do I write a file in Python?"  # 0.79 to READ


def write_notes(base: Path, source: str) -> None:
    folder = base / source
    folder.mkdir(parents=True, exist_ok=True)
    for name, (title, body) in NOTES[source].items():
        (folder / name).write_text(f"# {title}\n\n{body}\n", encoding="utf-8")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    """The notes indexed with MiniLM (the default embedder), in hybrid mode; the cache is off in
    these settings, each test builds its own."""
    base = tmp_path_factory.mktemp("cache")
    settings = make_settings(base / "data", embedder={"backend": "sentence-transformers", "progress": False,
                                                      "threads": 1},
                             generator={"backend": "extractive"}, retrieval={"mode": "hybrid", "top_k": 3},
                             serve={"max_body_bytes": 20_000, "auth": False, "rate_limit_per_minute": 0})
    svc = open_services(settings)
    for source in NOTES:
        write_notes(base / "src", source)
        svc.state.add_source(SourceConfig(name=source, kind="folder", location=str(base / "src" / source),
                                          lang="en", tenant=TENANTS.get(source)))
        with svc.write_lock():
            reindex(svc, source, "full")
    svc.src = base / "src"  # type: ignore[attr-defined]
    yield svc
    svc.close()


# -- the shared suite -----------------------------------------------------------------------------------
def test_the_same_question_is_an_exact_hit_replayed_as_the_same_events(corpus, new_cache):
    gen = Counting()
    answerer = Answerer(corpus, generator=gen, cache=new_cache())
    text, first = ask(answerer, READ)
    assert gen.calls == 1 and done(first).cache == "miss" and "read()" in text
    again, second = ask(answerer, "  how do I READ a file in python ")  # normalised: case, spaces, the "?"
    assert gen.calls == 1, "served from the cache, not generated"
    assert again == text and [e.kind for e in second] == ["sources", "delta", "done"]
    assert second[0].cache == "hit" and done(second).cache == "hit"
    assert second[0].citations == first[0].citations  # the packed sources
    assert done(second).citations == done(first).citations and done(second).citations[0].doc_id == "docs:files.md"
    assert done(second).finish_reason == "stop" and done(second).usage == done(first).usage
    assert "cache_ms" in done(second).timings and "generate_ms" not in done(second).timings
    assert asyncio.run(answerer.ask(READ)).cache == "hit"


def test_a_paraphrase_is_a_semantic_hit_and_a_different_question_a_miss(corpus, new_cache):
    gen = Counting()
    answerer = Answerer(corpus, generator=gen, cache=new_cache())
    text, _ = ask(answerer, READ)
    para, events = ask(answerer, READ_PARAPHRASE)
    assert gen.calls == 1 and done(events).cache == "semantic" and para == text
    other, events = ask(answerer, WRITE)
    assert gen.calls == 2 and done(events).cache == "miss"
    assert "write()" in other and done(events).citations[0].doc_id == "docs:writing.md"


def test_a_miss_embeds_the_question_once(corpus, new_cache, monkeypatch):
    """The semantic lookup's embedding is the one retrieval uses; it is not computed twice."""
    calls: list[str] = []
    embed = corpus.embedder.embed_query
    monkeypatch.setattr(corpus.embedder, "embed_query", lambda q: calls.append(q) or embed(q))
    answerer = Answerer(corpus, generator=Counting(), cache=new_cache())
    _, events = ask(answerer, WRITE)
    assert done(events).cache == "miss" and calls == [WRITE]
    assert done(events).citations[0].doc_id == "docs:writing.md"  # retrieval still found it


def test_a_question_the_embedder_cannot_rank_is_only_looked_up_exactly(corpus, new_cache):
    """MiniLM is English-only: to it, "how do I read a file" and "how do I delete a file" in
    Chinese are the same vector, so a Chinese question gets no semantic lookup."""
    read, delete = "如何在Python中读取文件？", "如何在Python中删除文件？"
    assert float(corpus.embedder.embed_query(read) @ corpus.embedder.embed_query(delete)) > 0.99
    gen = Counting()
    answerer = Answerer(corpus, generator=gen, cache=new_cache())
    ask(answerer, read)
    _, events = ask(answerer, delete)
    assert done(events).cache == "miss" and gen.calls == 2
    _, events = ask(answerer, read)
    assert done(events).cache == "hit" and gen.calls == 2  # the exact lookup still serves it


def test_the_semantic_threshold_and_the_numbers_guard(corpus, new_cache):
    gen = Counting()
    strict = Answerer(corpus, generator=gen, cache=new_cache(semantic_threshold=0.999))
    ask(strict, READ)
    _, events = ask(strict, READ_PARAPHRASE)
    assert done(events).cache == "miss" and gen.calls == 2  # below a 0.999 threshold
    # MiniLM puts these two at about 0.93: a lenient threshold would serve 3.11's answer for
    # 3.12, but the numbers differ, so it is a miss
    lenient = Answerer(corpus, generator=gen, cache=new_cache(semantic_threshold=0.8))
    text311, _ = ask(lenient, "When was Python 3.11 released?")
    text312, events = ask(lenient, "When was Python 3.12 released?")
    assert done(events).cache == "miss" and "2023" in text312 and "2022" in text311
    _, events = ask(lenient, "What was the release date of Python 3.11?")
    assert done(events).cache == "semantic"  # same numbers, close enough at 0.8


def test_filters_and_tenants_have_caches_of_their_own(corpus, new_cache):
    gen = Counting()
    answerer = Answerer(corpus, generator=gen, cache=new_cache())
    q = "How many days of paid holiday do employees get?"
    acme, events = ask(answerer, q, filters=Filters(tenant="acme"))
    assert "30 days" in acme and done(events).cache == "miss"
    globex, events = ask(answerer, q, filters=Filters(tenant="globex"))
    assert "25 days" in globex and done(events).cache == "miss" and gen.calls == 2
    assert all(c.doc_id.startswith("globex:") for c in done(events).citations)
    _, events = ask(answerer, q, filters=Filters(tenant="acme"))
    assert done(events).cache == "hit" and gen.calls == 2
    # a paraphrase in another tenant is not served the first tenant's answer either
    _, events = ask(answerer, "How many paid holiday days do employees get?", filters=Filters(tenant="globex"))
    assert done(events).cache in ("semantic", "miss") and "25 days" in _text(events)
    # other filters, top_k, the conversation so far: each its own scope
    _, events = ask(answerer, READ)
    _, events = ask(answerer, READ, filters=Filters(source=("docs",)))
    assert done(events).cache == "miss"
    _, events = ask(answerer, READ, top_k=1)
    assert done(events).cache == "miss"
    _, events = ask(answerer, READ, history=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}])
    assert done(events).cache == "miss"


def _text(events: list[AnswerEvent]) -> str:
    return "".join(e.text for e in events if e.kind == "delta")


def test_answers_expire_after_the_ttl(corpus, new_cache):
    gen = Counting()
    answerer = Answerer(corpus, generator=gen, cache=new_cache(ttl_s=1))
    ask(answerer, READ)
    _, events = ask(answerer, READ)
    stored_at = time.monotonic()
    assert done(events).cache == "hit"
    time.sleep(max(0.0, 1.3 - (time.monotonic() - stored_at)))
    _, events = ask(answerer, READ)
    assert done(events).cache == "miss" and gen.calls == 2
    _, events = ask(answerer, READ_PARAPHRASE)  # the answer stored again serves a paraphrase again
    assert done(events).cache == "semantic"


def test_a_reindex_invalidates_cached_answers(corpus, new_cache):
    gen = Counting()
    answerer = Answerer(corpus, generator=gen, cache=new_cache())
    q = "What is the service status?"
    before, _ = ask(answerer, q)
    _, events = ask(answerer, q)
    assert done(events).cache == "hit"
    marker = f"amber{uuid.uuid4().hex[:6]}"
    (corpus.src / "news" / "status.md").write_text(f"# Status\n\nThe service status is {marker}.\n", encoding="utf-8")
    with corpus.write_lock():
        reindex(corpus, "news", "full")
    after, events = ask(answerer, q)
    assert done(events).cache == "miss" and gen.calls == 2 and marker in after and after != before
    _, events = ask(answerer, "What's the service status?")
    assert done(events).cache in ("hit", "semantic")  # cached again, under the new index


def test_degraded_and_cut_short_answers_are_not_cached(corpus, new_cache):
    gen = Counting()
    answerer = Answerer(corpus, generator=gen, cache=new_cache())
    gen.down = True
    _, events = ask(answerer, READ)
    assert done(events).degraded and done(events).cache == "miss"
    _, events = ask(answerer, READ)
    assert done(events).degraded and done(events).cache == "miss"  # not stored: asked again
    gen.down = False
    _, events = ask(answerer, READ)
    assert not done(events).degraded and done(events).cache == "miss"
    _, events = ask(answerer, READ)
    assert done(events).cache == "hit"
    cut = {"max_tokens": 3}
    _, events = ask(answerer, WRITE, overrides=cut)
    assert done(events).finish_reason == "length" and done(events).cache == "miss"
    calls = gen.calls
    _, events = ask(answerer, WRITE, overrides=cut)
    assert done(events).cache == "miss" and gen.calls == calls + 1


def test_no_cache_skips_the_lookup_and_the_store(corpus, new_cache):
    gen = Counting()
    answerer = Answerer(corpus, generator=gen, cache=new_cache())
    _, events = ask(answerer, READ, no_cache=True)
    assert done(events).cache is None and gen.calls == 1
    _, events = ask(answerer, READ)
    assert done(events).cache == "miss" and gen.calls == 2  # the first was not stored
    _, events = ask(answerer, READ, no_cache=True)
    assert done(events).cache is None and gen.calls == 3  # nor read
    assert asyncio.run(answerer.ask(READ, no_cache=True)).cache == "miss"


def test_a_cache_that_is_down_is_a_miss_not_an_error(corpus):
    cfg = CacheSettings(backend="redis", redis_url="redis://127.0.0.1:9/0")  # nothing listens there
    gen = Counting()
    answerer = Answerer(corpus, generator=gen, cache=make_answer_cache(corpus, settings=cfg))
    text, events = ask(answerer, READ)
    assert "read()" in text and done(events).finish_reason == "stop" and done(events).cache is None


# -- units -------------------------------------------------------------------------------------------------
def test_normalise_question():
    assert normalise_question("  How do I   READ a file？ ") == "how do i read a file"
    assert normalise_question("什么是 GIL？") == normalise_question("什么是 GIL")
    assert normalise_question("Python 3.11?") != normalise_question("Python 3.12?")


def test_memory_store_lru_and_scopes():
    now = [1000.0]
    store = MemoryAnswerCache(max_entries=2, ttl_s=10, clock=lambda: now[0])
    v = np.array([1.0, 0.0], dtype=np.float32)
    store.put("a", {"x": 1}, scope="s", vector=v)
    store.put("b", {"x": 2}, scope="s", vector=np.array([0.0, 1.0], dtype=np.float32))
    assert store.get("a")[0] == {"x": 1}  # a is now the most recently used
    store.put("c", {"x": 3}, scope="t", vector=v)
    assert store.get("b")[0] is None and len(store) == 2  # b went
    assert [s for _, s in store.nearest("s", v, 0.9)] == [1.0]
    assert store.nearest("other", v, 0.0) == []
    now[0] += 11
    assert store.get("a")[0] is None and store.nearest("t", v, 0.5) == []


def test_cached_answer_round_trips_through_json():
    import json
    from datetime import UTC, datetime

    from rag.types import Citation

    c = Citation(1, "c1", "d1", "T", "file:///x", datetime(2024, 1, 2, tzinfo=UTC), "snip")
    a = CachedAnswer("text [1]", (c,), (c,), "stop", {"completion_tokens": 3}, "q", 5.0)
    assert CachedAnswer.from_dict(json.loads(json.dumps(a.to_dict()))) == a


# -- through HTTP ---------------------------------------------------------------------------------------------
def _cache_count(http: httpx.Client, url: str, result: str) -> float:
    for line in http.get(f"{url}/metrics").text.splitlines():
        if line.startswith(f'answer_cache_lookups_total{{result="{result}"}}'):
            return float(line.split()[-1])
    return 0.0


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=60) as c:
        yield c


@pytest.mark.skipif(not REDIS_URL, reason=NO_REDIS)
def test_ragqa_ask_json_says_when_the_shared_cache_answered(corpus):
    """``ragqa ask --json`` used to print ``cache: "miss"`` whatever the cache did."""
    prefix = f"ragqa-test-cache:{uuid.uuid4().hex[:8]}"
    env = {"RAG_DATA_DIR": str(corpus.data_dir), "RAG_EMBEDDER__BACKEND": "sentence-transformers",
           "RAG_VECTOR__BACKEND": "numpy", "RAG_GENERATOR__BACKEND": "extractive", "RAG_RETRIEVAL__MODE": "hybrid",
           "RAG_CACHE__BACKEND": "redis", "RAG_CACHE__REDIS_URL": str(REDIS_URL), "RAG_CACHE__PREFIX": prefix,
           "RAG_CONFIG": ""}
    try:
        runs = [CliRunner().invoke(cli, ["ask", READ, *extra], env=env, catch_exceptions=False)
                for extra in (["--json"], ["--json"], ["--json", "--stream"])]
    finally:
        flush_redis(prefix)
    first, second = (json.loads(r.stdout) for r in runs[:2])
    assert first["cache"] == "miss" and second["cache"] == "hit" and second["answer"] == first["answer"]
    assert json.loads(runs[2].stdout.splitlines()[-1])["cache"] == "hit"  # the streamed done event


def _app(corpus: Services, gen: Counting, **cache: object):
    """An app over ``corpus`` with these cache settings (the corpus' own have the cache off)."""
    settings = corpus.settings.model_copy(update={"cache": CacheSettings(**cache)})
    answerer = Answerer(corpus, generator=gen, cache=make_answer_cache(corpus, settings=settings.cache, salt=gen.name))
    return create_app(settings, services=corpus, answerer=answerer)


def test_ask_and_chat_routes_say_hit_semantic_or_miss_and_metrics_count_them(corpus, http):
    gen = Counting()
    app = _app(corpus, gen, backend="memory")
    with live(app) as url:
        before = {r: _cache_count(http, url, r) for r in ("hit", "semantic", "miss")}
        first = http.post(f"{url}/v1/ask", json={"question": READ}).json()
        assert first["cache"] == "miss" and "read()" in first["answer"]
        hit = http.post(f"{url}/v1/ask", json={"question": READ}).json()
        assert hit["cache"] == "hit" and hit["answer"] == first["answer"] and hit["citations"] == first["citations"]
        semantic = http.post(f"{url}/v1/ask", json={"question": READ_PARAPHRASE}).json()
        assert semantic["cache"] == "semantic" and semantic["answer"] == first["answer"]
        fresh = http.post(f"{url}/v1/ask", json={"question": READ, "no_cache": True}).json()
        assert fresh["cache"] == "miss" and gen.calls == 2
        # streamed: the done event carries the status
        with http.stream("POST", f"{url}/v1/ask", json={"question": READ, "stream": True}) as r:
            body = r.read().decode()
        assert '"cache":"hit"' in body.split("event: done")[-1]
        # the OpenAI route: X-Cache, and delta.cache on the last chunk
        with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as client:
            raw = client.chat.completions.with_raw_response.create(
                model="ragqa", messages=[{"role": "user", "content": READ}])
            assert raw.headers["x-cache"] == "hit" and raw.parse().choices[0].message.content == first["answer"]
            raw = client.chat.completions.with_raw_response.create(
                model="ragqa", messages=[{"role": "user", "content": READ}], extra_body={"rag": {"no_cache": True}})
            assert raw.headers["x-cache"] == "miss"
            with client.chat.completions.create(model="ragqa", stream=True,
                                                messages=[{"role": "user", "content": READ_PARAPHRASE}]) as stream:
                chunks = list(stream)
            assert chunks[-1].choices[0].delta.cache == "semantic"  # an extension field
            assert "".join(c.choices[0].delta.content or "" for c in chunks).strip() == first["answer"]
        after = {r: _cache_count(http, url, r) for r in ("hit", "semantic", "miss")}
    # ask: miss, hit, semantic, (no_cache: not counted), stream hit; chat: hit, (no_cache), semantic
    assert after["hit"] - before["hit"] == 3
    assert after["semantic"] - before["semantic"] == 2
    assert after["miss"] - before["miss"] == 1
    assert gen.calls == 3  # the first ask, and the two no_cache requests


def test_two_app_instances_share_one_redis_cache(corpus, http):
    if REDIS_URL is None:
        pytest.skip(NO_REDIS)
    prefix = f"ragqa-test-cache:{uuid.uuid4().hex[:8]}"
    gen_a, gen_b = Counting(), Counting()
    app_a = _app(corpus, gen_a, backend="redis", redis_url=REDIS_URL, prefix=prefix)
    app_b = _app(corpus, gen_b, backend="redis", redis_url=REDIS_URL, prefix=prefix)
    try:
        with live(app_a) as url_a, live(app_b) as url_b:
            first = http.post(f"{url_a}/v1/ask", json={"question": WRITE}).json()
            on_b = http.post(f"{url_b}/v1/ask", json={"question": WRITE}).json()
            para = http.post(f"{url_b}/v1/ask", json={"question": "In Python, how can I write a file?"}).json()
        assert first["cache"] == "miss" and on_b["cache"] == "hit" and para["cache"] == "semantic"
        assert on_b["answer"] == first["answer"] == para["answer"] and gen_a.calls == 1 and gen_b.calls == 0
    finally:
        flush_redis(prefix)


def test_a_change_seen_through_the_store_makes_the_next_retrieval_read_fresh() -> None:
    """When the store's generation moves (an index changed, here or in another process), the
    layer asks the indexes to read at once (a Milvus server's Bounded reads can lag a write by
    a fraction of a second, and the answer built then would be cached); a put does not."""
    from rag.cache import AnswerCacheLayer
    from rag.types import IndexChange

    store = MemoryAnswerCache(max_entries=10, ttl_s=60)
    fresh: list[int] = []
    layer = AnswerCacheLayer(store, on_change=lambda: fresh.append(1))
    first = layer.lookup_exact("what is copper?")
    assert fresh == []  # the first lookup only learns the generation
    assert store.put(first.key, {"text": "a metal"}, generation=first.generation, sources=("notes",),
                     deps=("c1",))
    assert layer.lookup_exact("what is copper?").kind == "hit" and fresh == []
    store.apply([IndexChange(seq=1, source="notes", removed=("c1",))])
    assert layer.lookup_exact("what is copper?").kind == "miss" and fresh == [1]
    layer.lookup_exact("what is copper?")
    assert fresh == [1]  # once per change
