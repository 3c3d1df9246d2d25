"""The web chat page in headless Chromium (Debian's ``chromium`` and ``chromium-driver``, through
Selenium), against a real uvicorn server on 127.0.0.1 with the small index of ``tests/conftest.py``'s ``corpus``.

The generator is the extractive one, paced (a pause before each piece of text) so that tokens
visibly arrive one after another, and optionally held before a given piece until the test
lets it go, so that "mid-answer" is a fact and not timing luck. For the dropped connection,
the browser reaches the server through a TCP relay the test can cut and take offline, which
is what a real network drop does to the page; the final text must equal an uninterrupted
answer to the same question, character for character.

Without ``/usr/bin/chromium``, ``/usr/bin/chromedriver`` or the ``selenium`` package the
browser tests are skipped (``scripts/env.sh``'s ``ensure_chromium`` installs the browser).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import re
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import pytest

from rag.answer import Answerer
from rag.config import ApiKeySettings
from rag.generators.extractive import ExtractiveGenerator
from rag.services import Services
from rag.types import GenerationDelta, GenerationParams, Prompt
from serve.app import create_app
from tests.corpus import doc_text, question
from tests.live import live, sse_events

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
KEY = "rqa_" + "k" * 43  # the keyed server's API key
WAIT_S = 60.0  # patient: a busy 2-core machine runs Chromium and the server side by side


def browser_missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not os.access(path, os.X_OK):
            return (f"{path} is missing: install Debian's {package} package "
                    "(apt-get install chromium chromium-driver; scripts/env.sh ensure_chromium)")
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "the selenium package is missing (it is in the dev extra: pip install -e '.[dev]')"
    return None


# -- the server side -------------------------------------------------------------------------
class Paced(ExtractiveGenerator):
    """The extractive generator, ``delay_s`` before each piece of text, and held before piece
    ``hold_at`` until ``gate`` is set (``waiting`` says it is held there). ``closed_early`` says a
    generation was cancelled or closed before it finished."""

    name = "paced-extractive"

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.reset()

    def reset(self) -> None:
        self.delay_s = 0.0
        self.hold_at: int | None = None
        self.gate.clear()
        self.waiting = False
        self.closed_early = False
        self.closed_at = 0.0

    async def stream(self, prompt: Prompt, params: GenerationParams) -> AsyncIterator[GenerationDelta]:
        sent = 0
        try:
            async for delta in super().stream(prompt, params):
                if delta.text:
                    if sent == self.hold_at:
                        self.waiting = True
                        while not self.gate.is_set() and self.hold_at is not None:
                            await asyncio.sleep(0.01)
                        self.waiting = False
                    if self.delay_s:
                        await asyncio.sleep(self.delay_s)
                    sent += 1
                yield delta
        except (GeneratorExit, asyncio.CancelledError):
            self.closed_early, self.closed_at = True, time.monotonic()
            raise


class Link:
    """A TCP relay from the browser to the server. ``cut()`` closes every connection through
    it, as a dropped network does; while ``offline`` it closes new connections at once."""

    def __init__(self, upstream: str) -> None:
        self.upstream = ("127.0.0.1", int(upstream.rsplit(":", 1)[1]))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.offline = False
        self.refused = 0  # connections closed at once while offline
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.offline:
                self.refused += 1
                _drop(client)
                continue
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                _drop(client)
                continue
            with self._lock:
                self._open |= {client, server}
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                _drop(s)
                with self._lock:
                    self._open.discard(s)

    def cut(self) -> None:
        with self._lock:
            for s in list(self._open):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)  # wakes the pumps, which close both ends

    def close(self) -> None:
        self.listener.close()
        self.cut()


def _drop(s: socket.socket) -> None:
    with contextlib.suppress(OSError):
        s.shutdown(socket.SHUT_RDWR)
    s.close()


@pytest.fixture(scope="module")
def paced() -> Paced:
    return Paced()


@pytest.fixture
def gen(paced: Paced) -> Iterator[Paced]:
    paced.reset()
    yield paced
    paced.hold_at = None  # never leave a generation waiting
    paced.gate.set()


def _app(corpus: Services, paced: Paced, **serve: Any):
    settings = corpus.settings.model_copy(update={"serve": corpus.settings.serve.model_copy(update=serve)})
    return create_app(settings, services=corpus, answerer=Answerer(corpus, generator=paced))


@pytest.fixture(scope="module")
def site(corpus: Services, paced: Paced) -> Iterator[tuple[str, Link, Any]]:
    """The server (30 s disconnect grace), the link the browser reaches it through, its state."""
    app = _app(corpus, paced)
    with live(app) as url:
        link = Link(url)
        try:
            yield url, link, app.state.ragqa
        finally:
            link.close()


@pytest.fixture(scope="module")
def impatient(corpus: Services, paced: Paced) -> Iterator[str]:
    """A server that aborts a generation nobody has read for one second."""
    with live(_app(corpus, paced, disconnect_grace_s=1.0)) as url:
        yield url


@pytest.fixture(scope="module")
def keyed(corpus: Services, paced: Paced) -> Iterator[str]:
    """A server that wants an API key (``KEY``, query scope)."""
    from serve.auth import hash_key

    with live(_app(corpus, paced, auth=True, api_keys=[ApiKeySettings(id="web", hash=hash_key(KEY))])) as url:
        yield url


def reference(http: httpx.Client, url: str, q: str, filters: dict | None = None,
              headers: dict[str, str] | None = None) -> dict[str, Any]:
    """An uninterrupted streamed answer: its text (the deltas joined), events and final citations."""
    body: dict[str, Any] = {"question": q, "stream": True, **({"filters": filters} if filters else {})}
    with http.stream("POST", f"{url}/v1/ask", json=body, headers=headers) as r:
        assert r.status_code == 200
        events = list(sse_events(r.iter_lines()))
    assert events[-1]["event"] == "done"
    text = "".join(json.loads(e["data"])["text"] for e in events if e["event"] == "delta")
    return {"text": text, "events": len(events), "deltas": sum(e["event"] == "delta" for e in events),
            "citations": json.loads(events[-1]["data"])["citations"]}


def finished(state: Any, stream_id: str) -> bool:
    info = asyncio.run(state.streams.store.info(stream_id))
    return info is not None and info.finished


def resumes_counted(http: httpx.Client, url: str) -> float:
    """Successful ``GET /v1/streams/{stream_id}`` requests so far (one metrics registry per process)."""
    for line in http.get(f"{url}/metrics").text.splitlines():
        if line.startswith('http_requests_total{method="GET",route="/v1/streams/{stream_id}",status="200"}'):
            return float(line.split()[-1])
    return 0.0


# -- the browser side ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    reason = browser_missing()
    if reason:
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tmp_path_factory.mktemp("chromium")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--no-proxy-server", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--window-size=1200,1000", f"--user-data-dir={profile / 'profile'}"):
        options.add_argument(arg)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SE_OFFLINE", "true")  # never let Selenium Manager look for a browser online
        driver = webdriver.Chrome(options=options,
                                  service=Service(CHROMEDRIVER, log_output=str(profile / "chromedriver.log")))
    driver.set_page_load_timeout(WAIT_S)
    driver.set_script_timeout(WAIT_S)
    try:
        yield driver
    finally:
        driver.quit()


TURN = """
const t = [...document.querySelectorAll('#transcript .turn')].pop();
if (!t) return null;
const a = t.querySelector('.answer');
return {
  state: t.dataset.state, text: a.textContent, busy: a.getAttribute('aria-busy'),
  reconnects: Number(t.dataset.reconnects), lastEventId: t.dataset.lastEventId || null,
  status: t.querySelector('.turn-status').textContent,
  refs: [...a.querySelectorAll('a.cite-ref')].map(x => [x.textContent, x.getAttribute('href')]),
  citations: [...t.querySelectorAll('.citations li')].map(li => ({
    id: li.id, label: li.value, title: li.querySelector('.source-title').textContent,
    url: li.querySelector('a.source-title') ? li.querySelector('a.source-title').getAttribute('href') : null,
    snippet: li.querySelector('.snippet') ? li.querySelector('.snippet').textContent : ''})),
  send: !document.getElementById('send').disabled, stop: !document.getElementById('stop').disabled,
};
"""

# Every distinct text the answer element shows, with when (ms), as the DOM changes.
RECORD = """
window.snapshots = [];
new MutationObserver(() => {
  const a = [...document.querySelectorAll('#transcript .answer')].pop();
  const s = window.snapshots;
  if (a && (!s.length || s[s.length - 1][1] !== a.textContent)) s.push([performance.now(), a.textContent]);
}).observe(document.getElementById('transcript'), {subtree: true, childList: true, characterData: true});
"""


def turn(browser: Any) -> dict[str, Any] | None:
    return browser.execute_script(TURN)


def wait(condition: Callable[[], Any], what: str, browser: Any = None, timeout_s: float = WAIT_S) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; the page shows {browser and turn(browser)}")
        time.sleep(0.05)


def open_page(browser: Any, url: str) -> None:
    browser.get(f"{url}/")
    loaded = ("return document.querySelectorAll('#source option').length > 1"
              " || !!document.getElementById('source-note').textContent")
    wait(lambda: browser.execute_script(loaded), "the list of sources", browser)
    browser.execute_script(RECORD)


def ask(browser: Any, text: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    box = browser.find_element(By.ID, "question")
    box.clear()
    box.send_keys(text, Keys.ENTER)


def answered(browser: Any, state: str = "done") -> dict[str, Any]:
    return wait(lambda: (t := turn(browser)) and t["state"] == state and t, f"the answer to be {state}", browser)


def snapshots(browser: Any) -> list[tuple[float, str]]:
    return [(t, s) for t, s in browser.execute_script("return window.snapshots") if s]


def assert_only_grew(shots: list[tuple[float, str]]) -> None:
    """Each text the answer showed starts with the one before: nothing lost, nothing repeated."""
    for (_, before), (_, after) in itertools.pairwise(shots):
        assert after.startswith(before), (before, after)


def citations_of(ref: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"label": c["label"], "title": c["title"], "url": c["url"], "snippet": c["snippet"]}
            for c in ref["citations"]]


def shown(t: dict[str, Any]) -> list[dict[str, Any]]:
    return [{k: c[k] for k in ("label", "title", "url", "snippet")} for c in t["citations"]]


# -- without a browser -------------------------------------------------------------------------
def test_the_page_and_its_files_are_served_without_external_resources(site, http):
    url = site[0]
    page = http.get(f"{url}/")
    assert page.status_code == 200 and page.headers["content-type"] == "text/html; charset=utf-8"
    assert "script-src 'self'" in page.headers["content-security-policy"]
    html = page.text
    for ref in re.findall(r'(?:src|href)="([^"]*)"', html):
        assert not re.match(r"^(?!data:)(?:[a-z]+:|//)", ref), f"{ref} is not on this server"
    assert '<label for="question">' in html and 'id="stop"' in html
    for name, kind in (("app.js", "text/javascript"), ("style.css", "text/css")):
        r = http.get(f"{url}/static/{name}")
        assert r.status_code == 200 and r.headers["content-type"].startswith(kind), (name, r.headers)
        assert "http://" not in r.text and "https://" not in r.text  # no CDN
        assert f"static/{name}" in html
    assert http.get(f"{url}/static/nope.js").status_code == 404
    assert "/" not in http.get(f"{url}/openapi.json").json()["paths"]


# -- in Chromium -------------------------------------------------------------------------------
def test_an_answer_streams_in_and_cites_its_sources(browser, site, gen, http):
    url, link, _ = site
    ref = reference(http, url, question(3))
    gen.delay_s = 0.08
    open_page(browser, link.url)
    ask(browser, question(3))
    t = answered(browser)
    shots = snapshots(browser)
    # Tokens arrived one after another over time, each shown as it came.
    assert len(shots) >= max(5, ref["deltas"] // 2), [s for _, s in shots]
    assert shots[-1][0] - shots[0][0] >= 0.5 * (ref["deltas"] - 1) * gen.delay_s * 1000
    assert_only_grew(shots)
    assert t["text"] == shots[-1][1] == ref["text"] and question(3) in t["text"]
    assert t["busy"] == "false" and t["send"] and not t["stop"] and t["status"].startswith("Answered in")
    # Numbered citations link to their sources, and each [n] of the answer to its citation.
    assert shown(t) == citations_of(ref) and t["citations"][0]["url"].endswith("/alpha/d03.md")
    assert t["citations"][0]["title"] == doc_text(3)[0] and question(3) in t["citations"][0]["snippet"]
    ids = {c["id"] for c in t["citations"]}
    assert t["refs"] and all(href.removeprefix("#") in ids and text == f"[{href.rsplit('-', 1)[1]}]"
                             for text, href in t["refs"])


def test_the_sources_show_while_the_model_reads_them(browser, site, gen, http):
    """Retrieval ends before the model's first token: the page lists the sources at once and
    says that the model is reading them."""
    url, link, _ = site
    ref = reference(http, url, question(5))
    gen.hold_at = 0  # the model has not written a word yet
    open_page(browser, link.url)
    ask(browser, question(5))
    wait(lambda: gen.waiting, "the generation to start", browser)
    t = wait(lambda: (t := turn(browser)) and t["citations"] and t, "the sources", browser)
    assert t["state"] == "reading" and t["text"] == "" and t["busy"] == "true"
    assert re.fullmatch(r"Found \d+ sources?; the model is reading (it|them)…", t["status"]), t["status"]
    assert [c["label"] for c in t["citations"]] == list(range(1, len(t["citations"]) + 1))
    gen.gate.set()
    t = answered(browser)
    assert t["text"] == ref["text"] and shown(t) == citations_of(ref)


def test_the_source_filter_and_the_date_range(browser, site, gen, http):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    url, link, _ = site
    open_page(browser, link.url)
    source = Select(browser.find_element(By.ID, "source"))
    assert [o.get_attribute("value") for o in source.options] == ["", "alpha", "beta"]

    def ask_with(q: str, filters: dict[str, str]) -> dict[str, Any]:
        browser.find_element(By.ID, "new").click()
        assert turn(browser) is None
        ask(browser, q)
        t = answered(browser)
        ref = reference(http, url, q, filters)
        assert t["text"] == ref["text"] and shown(t) == citations_of(ref)
        return t

    source.select_by_value("beta")
    t = ask_with(question(3), {"source": "beta"})  # an alpha note, asked of beta only
    assert t["citations"] and all("/beta/" in c["url"] for c in t["citations"])
    assert question(3) not in t["text"]

    source.select_by_value("")
    set_date = ("const e = document.getElementById(arguments[0]); e.value = arguments[1];"
                " e.dispatchEvent(new Event('change'))")
    browser.execute_script(set_date, "modified-to", "2024-12-31")
    t = ask_with(question(25), {"modified_to": "2024-12-31T23:59:59.999999Z"})  # a beta note, before beta's time
    assert t["citations"] and all("/alpha/" in c["url"] for c in t["citations"]) and question(25) not in t["text"]
    browser.execute_script(set_date, "modified-to", "")
    browser.execute_script(set_date, "modified-from", "2025-06-01")  # beta's day itself is included
    t = ask_with(question(3), {"modified_from": "2025-06-01T00:00:00Z"})
    assert t["citations"] and all("/beta/" in c["url"] for c in t["citations"])


def test_stop_ends_the_answer_and_the_server_aborts_it_after_the_grace(browser, impatient, gen, http):
    from selenium.webdriver.common.by import By

    ref = reference(http, impatient, question(7))
    gen.hold_at = 4
    open_page(browser, impatient)
    ask(browser, question(7))
    wait(lambda: gen.waiting, "the generation to reach the gate", browser)
    partial = wait(lambda: (t := turn(browser)) and t["text"] and t, "the first tokens", browser)
    assert ref["text"].startswith(partial["text"]) and partial["stop"] and not partial["send"]
    stopped_at = time.monotonic()  # before the click: the page lets go of the stream during it
    browser.find_element(By.ID, "stop").click()
    t = answered(browser, "stopped")
    assert t["text"] == partial["text"] and t["status"] == "Stopped." and t["send"] and not t["stop"]
    # Nobody reads the stream any more: the server aborts the generation once the grace is over.
    wait(lambda: gen.closed_early, "the server to abort the generation", browser)
    assert gen.closed_at - stopped_at >= 0.95  # not before the grace of 1 s (less clock slack)
    stream_id = partial["lastEventId"].rsplit(":", 1)[0]
    with http.stream("GET", f"{impatient}/v1/streams/{stream_id}?after=0") as r:
        events = list(sse_events(r.iter_lines()))
    assert events[-1]["event"] == "error" and json.loads(events[-1]["data"])["error"]["code"] == "aborted"
    assert turn(browser)["text"] == partial["text"] and turn(browser)["reconnects"] == 0


def test_a_dropped_connection_resumes_without_losing_or_repeating_text(browser, site, gen, http):
    url, link, state = site
    ref = reference(http, url, question(9))
    resumed_before = resumes_counted(http, url)
    gen.delay_s, gen.hold_at = 0.02, 3
    open_page(browser, link.url)
    ask(browser, question(9))
    wait(lambda: gen.waiting, "the generation to reach the gate", browser)
    head = wait(lambda: (t := turn(browser)) and t["text"] and t, "the first tokens", browser)
    stream_id = head["lastEventId"].rsplit(":", 1)[0]

    # 1. The network drops while the answer is being written; the page retries until it is back.
    refused = link.refused
    link.offline = True
    link.cut()
    wait(lambda: turn(browser)["state"] == "reconnecting", "the page to notice the drop", browser)
    wait(lambda: link.refused > refused, "a failed attempt to reconnect", browser)
    link.offline = False
    wait(lambda: turn(browser)["reconnects"] == 1, "the page to reconnect", browser)
    assert turn(browser)["state"] == "streaming" and gen.waiting and not finished(state, stream_id)

    # 2. It drops again, and the answer is finished while the page is away.
    link.offline = True
    link.cut()
    wait(lambda: turn(browser)["state"] == "reconnecting", "the page to notice the second drop", browser)
    gen.gate.set()
    wait(lambda: finished(state, stream_id), "the generation to finish", browser)
    link.offline = False
    t = answered(browser)

    assert t["text"] == ref["text"] and question(9) in t["text"]
    assert shown(t) == citations_of(ref) and t["reconnects"] == 2
    assert t["lastEventId"] == f"{stream_id}:{ref['events']}"  # every event, the last one included
    assert_only_grew(snapshots(browser))
    assert resumes_counted(http, url) >= resumed_before + 2
    assert not gen.closed_early


def test_a_server_that_wants_an_api_key_gets_the_one_typed_into_the_page(browser, keyed, gen, http):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    open_page(browser, keyed)
    assert "Enter an API key" in browser.find_element(By.ID, "source-note").text
    assert browser.find_element(By.ID, "connection").get_attribute("open") is not None
    ask(browser, question(4))
    t = answered(browser, "error")
    assert "API key" in t["status"] and t["text"] == "" and t["send"]
    browser.find_element(By.ID, "api-key").send_keys(KEY, Keys.TAB)  # a change event: the sources load
    wait(lambda: browser.execute_script("return document.querySelectorAll('#source option').length") == 3,
         "the sources, with the key", browser)
    ask(browser, question(4))
    t = answered(browser)
    ref = reference(http, keyed, question(4), headers={"Authorization": f"Bearer {KEY}"})
    assert t["text"] == ref["text"] and shown(t) == citations_of(ref)
    assert browser.execute_script("return sessionStorage.getItem('ragqa.apiKey')") == KEY
    browser.execute_script("sessionStorage.clear()")
