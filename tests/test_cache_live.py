"""The answer cache end to end: a site served over HTTP on loopback, crawled by the real
crawler, answered by real uvicorn servers, reindexed through the admin API, with the cache in
memory and in a real Redis; two servers with their own data directories sharing one Redis;
and a Redis that stops and comes back while the server answers.

The Redis tests need ``RAG_TEST_REDIS_URL`` (``scripts/test.sh`` starts a throwaway Redis)
and Debian's ``redis-server`` for the one that is stopped.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ingest.pipeline import reindex
from ingest.services import open_services
from rag.answer import Answerer
from rag.config import CacheSettings, SourceConfig
from rag.metrics import REGISTRY
from rag.services import Services
from serve.app import create_app
from tests.conftest import make_settings
from tests.fixtures.cache import NO_REDIS, REDIS_URL, Counting, flush_redis
from tests.httpserver import LocalServer, serve_dir
from tests.live import live, wait_for

STATUS = "What is the service status?"
PAGES = {
    "status.html": ("Status", "The service status is green."),
    "garden.html": ("Tomatoes", "Tomatoes need six hours of sun and deep watering twice a week."),
    "files.html": ("Reading files", "To read a file in Python, open it with open(path) and call read()."),
}


def write_page(site: Path, name: str, title: str, body: str) -> None:
    (site / name).write_text(f"<html><head><title>{title}</title></head><body><h1>{title}</h1>"
                             f"<p>{body}</p></body></html>", encoding="utf-8")


def write_index(site: Path, server: LocalServer | None = None) -> None:
    """The sitemap: every page (it is not a document itself, so editing it changes no answer)."""
    base = f"http://127.0.0.1:{server.port}" if server else "http://127.0.0.1:PORT"
    urls = "".join(f"<url><loc>{base}/{p.name}</loc></url>" for p in sorted(site.glob("*.html")))
    (site / "sitemap.xml").write_text('<?xml version="1.0" encoding="UTF-8"?><urlset xmlns='
                                      f'"http://www.sitemaps.org/schemas/sitemap/0.9">{urls}</urlset>', encoding="utf-8")


@pytest.fixture
def site(tmp_path: Path) -> Iterator[tuple[Path, LocalServer]]:
    root = tmp_path / "site"
    root.mkdir()
    for name, (title, body) in PAGES.items():
        write_page(root, name, title, body)
    with serve_dir(root) as server:
        write_index(root, server)
        yield root, server


def instance(data_dir: Path, server: LocalServer, gen: Counting, serve: dict | None = None,
             **cache: object) -> tuple[Services, object]:
    """A server's services (the site indexed) and app, with these cache (and serve) settings."""
    settings = make_settings(data_dir, embedder={"backend": "sentence-transformers", "progress": False, "threads": 1},
                             generator={"backend": "extractive"}, retrieval={"mode": "hybrid", "top_k": 2},
                             cache=CacheSettings(**cache).model_dump(),
                             serve={"auth": False, "rate_limit_per_minute": 0, **(serve or {})})
    services = open_services(settings)
    services.state.add_source(SourceConfig(name="site", kind="sitemap", location=server.url("/sitemap.xml")))
    with services.write_lock():
        reindex(services, "site", "full")
    return services, create_app(settings, services=services, answerer=Answerer(services, generator=gen))


def ask(http: httpx.Client, url: str, question: str = STATUS) -> dict:
    response = http.post(f"{url}/v1/ask", json={"question": question})
    assert response.status_code == 200, response.text
    return response.json()


def reindex_via_api(http: httpx.Client, url: str) -> dict:
    response = http.post(f"{url}/v1/sources/site/reindex", params={"mode": "incremental"})
    assert response.status_code == 200, response.text
    return response.json()


def pages(answer: dict) -> set[str]:
    return {c["url"].rsplit("/", 1)[-1] for c in answer["citations"]}


@pytest.mark.parametrize("backend", ["memory", pytest.param("redis", marks=pytest.mark.skipif(
    not REDIS_URL, reason=NO_REDIS))])
def test_edits_deletions_and_new_pages_through_the_crawler_and_the_server(tmp_path, site, http, backend):
    root, server = site
    prefix = f"ragqa-test-live:{uuid.uuid4().hex[:8]}"
    gen = Counting()
    services, app = instance(tmp_path / "data", server, gen, backend=backend, redis_url=REDIS_URL, prefix=prefix)
    try:
        with live(app) as url:
            first = ask(http, url)
            assert first["cache"] == "miss" and "status.html" in pages(first)
            assert ask(http, url)["cache"] == "hit"

            write_page(root, "garden.html", "Tomatoes", "Tomatoes need eight hours of sun.")  # unrelated
            report = reindex_via_api(http, url)
            assert report["changed"] == 1
            assert ask(http, url)["cache"] == "hit" and gen.calls == 1

            write_page(root, "status.html", "Status", "The service status is amber after the outage.")  # cited
            reindex_via_api(http, url)
            fresh = ask(http, url)
            assert fresh["cache"] == "miss" and "amber" in fresh["answer"] and gen.calls == 2

            write_page(root, "incident.html", "Service status update",
                       "The service status is red: the service status page reports an outage of the service.")
            write_index(root, server)
            reindex_via_api(http, url)
            better = ask(http, url)
            assert better["cache"] == "miss" and "incident.html" in pages(better) and gen.calls == 3

            (root / "incident.html").unlink()
            (root / "status.html").unlink()
            write_index(root, server)
            assert reindex_via_api(http, url)["deleted"] == 2
            after = ask(http, url)
            assert after["cache"] == "miss" and not pages(after) & {"incident.html", "status.html"}
            stats = http.get(f"{url}/v1/cache").json()
            assert stats["backend"] == backend and stats["dropped"] == 2 and stats["rechecks"]["stale"] == 1
    finally:
        services.close()
        if backend == "redis":
            flush_redis(prefix)


@pytest.mark.skipif(not REDIS_URL, reason=NO_REDIS)
def test_servers_sharing_a_redis_cache_but_not_a_data_directory_see_each_others_invalidations(tmp_path, site, http):
    root, server = site
    prefix = f"ragqa-test-live:{uuid.uuid4().hex[:8]}"
    gen_a, gen_b = Counting(), Counting()
    a, app_a = instance(tmp_path / "a", server, gen_a, backend="redis", redis_url=REDIS_URL, prefix=prefix)
    b, app_b = instance(tmp_path / "b", server, gen_b, backend="redis", redis_url=REDIS_URL, prefix=prefix)
    try:
        with live(app_a) as url_a, live(app_b) as url_b:
            assert ask(http, url_a)["cache"] == "miss"
            assert ask(http, url_b)["cache"] == "hit" and gen_b.calls == 0  # shared
            write_page(root, "status.html", "Status", "The service status is amber.")
            assert reindex_via_api(http, url_a)["answers_dropped"] == 1  # a's run dropped it from Redis
            assert ask(http, url_b)["cache"] == "miss" and gen_b.calls == 1  # b never saw a's reindex itself
            purge = http.post(f"{url_b}/v1/cache/purge", json={"all": True})
            assert purge.status_code == 200 and purge.json()["dropped"] >= 1
            assert ask(http, url_a)["cache"] == "miss"
            bad = http.post(f"{url_a}/v1/cache/purge", json={"source": "nope"})
            assert bad.status_code == 404 and bad.json()["error"]["param"] == "source"
            assert http.post(f"{url_a}/v1/cache/purge", json={}).status_code == 422
    finally:
        a.close()
        b.close()
        flush_redis(prefix)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _redis(port: int) -> subprocess.Popen:
    proc = subprocess.Popen(["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "",
                             "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def up() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return True
        except OSError:
            return False

    wait_for(up, 20)
    return proc


def _errors() -> float:
    return sum(s.value for m in REGISTRY.collect() if m.name == "answer_cache_errors" for s in m.samples
               if s.name.endswith("_total"))


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")
def test_a_redis_that_stops_is_skipped_and_reconnected_by_itself(tmp_path, site, http):
    """The answer cache and the rate limiter share the Redis that stops: answers go on uncached
    and still limited (in process), and both use Redis again once it is back."""
    _, server = site
    port = _free_port()
    proc = _redis(port)
    gen = Counting()
    redis_url = f"redis://127.0.0.1:{port}/0"
    services, app = instance(tmp_path / "data", server, gen, backend="redis", redis_url=redis_url,
                             serve={"rate_limit_per_minute": 1000, "rate_limit_storage": redis_url})
    try:
        with live(app) as url:
            assert ask(http, url)["cache"] == "miss"
            assert ask(http, url)["cache"] == "hit"
            proc.terminate()
            proc.wait(10)
            errors = _errors()
            for _ in range(3):
                down = ask(http, url)
                assert "green" in down["answer"] and down["cache"] == "miss"
            assert _errors() >= errors + 3 and gen.calls == 4
            assert REGISTRY.get_sample_value("rate_limit_fallbacks_total") >= 3  # limited in process meanwhile
            proc = _redis(port)  # back, empty
            wait_for(lambda: ask(http, url)["cache"] == "hit", 20)  # reconnected: stored again, then hit
            import redis

            with redis.Redis(port=port) as client:  # the rate limiter counts in Redis again
                assert any(not k.startswith(b"ragqa:cache") for k in client.scan_iter("*"))
    finally:
        services.close()
        proc.terminate()
        proc.wait(10)
