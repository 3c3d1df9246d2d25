"""Load on the HTTP service through a real uvicorn server on 127.0.0.1: req/s, p50/p99, SSE.

Builds (or reuses, with ``--data-dir``) a small real index, starts ``ragqa serve --port 0
--no-auth`` in a subprocess with the extractive generator (so it measures the service, not
a model; ``--generator`` keeps the configured one) and rate limits off, then runs phases,
each bounded in time, all request phases on the same server process:

  trivial   ``GET /health``: a route that returns ``{"status": "ok"}`` through the same app
            (its middleware included): the yardstick for the hit path
  exact     the same ``--cached-questions`` questions again and again (answer cache on;
            each is asked once before the clock starts, so every timed request is an
            exact hit; ``cached`` is its old name)
  semantic  paraphrases of those questions (a polite preamble, the articles dropped, a
            comma dropped or added: each misses the exact key, which ignores only case,
            spacing and trailing punctuation); each is asked once before the clock and
            only those answered ``cache: semantic`` are timed (a miss was stored under its
            own key). With ``--embedder hash`` the comma and articles variants embed almost
            alike; ``--embedder minilm`` measures a real query embedding
  uncached  ``--concurrency`` clients send distinct questions with ``no_cache: true``
  sse       ``--streams`` (500) streamed ``/v1/ask`` answers (``no_cache``) opened at once and
            held open together: max concurrent open, completed, errors (must be 0), time
            to the first event (``sources``, after retrieval) and to the first delta, both
            processes' event loop lag, and how late deltas were sent, read from the
            stream store by their route and received by the client

The request phases print requests/s, p50/p99 latency, errors, the server process's CPU
time (all its threads, from /proc: % of one core, and per request) and the replies' ``cache``
field; at the end the exact hit's req/s as a share of the trivial route's and both hits'
p99 beside issue 13's goals (exact >= 50% of trivial, p99 <= 5 ms; semantic p99 <= 20 ms).
``NAME@N`` runs a request phase with N clients (``--phases semantic@1``). ``--loop asyncio
--http h11`` serves without uvloop and httptools (uvicorn[standard]) to measure them.

Streams only overlap if each lasts longer than it takes to open them all, and the
extractive answer streams in a few milliseconds, so for the ``sse`` phase (``--hold-s`` >
0) a second server runs: the same app (``create_app``) with the generator wrapped to spread
each answer's deltas over ``--hold-s`` seconds, started by this script in a subprocess
(``--child-server``), also on 127.0.0.1. Opening 500 answers takes 500 retrievals, so the hold must exceed that ramp
(the script warns when the first streams ended before the last opened).

    python bench/bench_serve.py                         # pydocs index in a temp dir, ~4 min
    python bench/bench_serve.py --data-dir /tmp/bsv     # build once, reuse on the next runs
    python bench/bench_serve.py --phases sse --streams 1000 --hold-s 120
    python bench/bench_serve.py --corpus docs --embedder minilm --json out.json
    python bench/bench_serve.py --phases trivial,exact,semantic --duration 10 --loop asyncio --http h11

The client is asyncio rather than locust or wrk: one process holds 500 SSE streams (httpx)
as cheaply as 500 sockets, reads every event to time it, and needs no extra package
(locust brings gevent; wrk cannot parse SSE without Lua). The request phases use a lean
keep-alive HTTP/1.1 client instead (``serve_load.py``), as httpx's own cost per request
would cap the trivial route. Client and server share the machine's cores, so the figures
are of the pair, not of the server alone.

Loopback only: the servers bind 127.0.0.1 and the client refuses any other host.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from serve_load import (  # noqa: E402 - beside this file, found through sys.path above
    LOOPBACK,
    Connection,
    Phase,
    Request,
    ask_once,
    closed_loop,
    pct,
    semantic_requests,
)

REQUEST_PHASES = ("trivial", "exact", "semantic", "uncached")
PHASES = (*REQUEST_PHASES, "sse")

PYDOCS = ROOT / "tests" / "data" / "crawl-pydocs311" / "v1.tar.xz"
EMBEDDERS = {"hash": {"backend": "hash", "dim": 256, "progress": False},
             "minilm": {"backend": "sentence-transformers", "progress": False}}


# -- the index ----------------------------------------------------------------------------
def bench_config(data_dir: Path, embedder: str, vector: str) -> dict[str, Any]:
    """The settings the index is built with and the servers read (RAG_CONFIG)."""
    return {"data_dir": str(data_dir), "embedder": EMBEDDERS[embedder], "vector": {"backend": vector},
            "cache": {"backend": "memory"},
            "serve": {"host": LOOPBACK, "auth": False, "rate_limit_per_minute": 0}}


def prepare(data_dir: Path, corpus: str, embedder: str, vector: str) -> tuple[Path, list[str]]:
    """Index ``corpus`` into ``data_dir`` unless it is there already; the config file and questions."""
    import yaml

    config_path, questions_path = data_dir / "bench.yaml", data_dir / "questions.json"
    wanted = bench_config(data_dir, embedder, vector)
    if config_path.is_file() and questions_path.is_file():
        if yaml.safe_load(config_path.read_text()) == wanted:
            print(f"reusing the index in {data_dir}", file=sys.stderr)
            return config_path, json.loads(questions_path.read_text())
        raise SystemExit(f"{data_dir} holds an index built with other settings; use another --data-dir")
    from ingest.pipeline import reindex
    from ingest.services import open_services
    from rag.config import Settings, SourceConfig

    data_dir.mkdir(parents=True, exist_ok=True)
    folder = data_dir / "corpus"
    if corpus == "pydocs":
        if not folder.is_dir():
            with tarfile.open(PYDOCS) as tar:
                tar.extractall(folder, filter="data")
    else:
        shutil.copytree(ROOT / "docs", folder, dirs_exist_ok=True)
    config_path.write_text(yaml.safe_dump(wanted))
    t0 = time.perf_counter()
    services = open_services(Settings.load(config_path))
    try:
        services.state.add_source(SourceConfig(name=corpus, kind="folder", location=str(folder), lang="en"))
        with services.write_lock():
            report = reindex(services, corpus, "full")
        docs, chunks = services.state.counts(corpus)
        questions = questions_from(services)
    finally:
        services.close()
    print(f"indexed {corpus}: {docs} documents, {chunks} chunks in {time.perf_counter() - t0:.0f} s "
          f"({report.failed} failed); {len(questions)} questions", file=sys.stderr)
    questions_path.write_text(json.dumps(questions, ensure_ascii=False))
    return config_path, questions


def questions_from(services: Any, limit: int = 5000) -> list[str]:
    """Distinct sentences of the indexed chunks (8-24 words): the extractive answer quotes them."""
    seen: set[str] = set()
    for chunk in services.state.iter_chunks():
        for sentence in re.split(r"(?<=[.?!])\s+|\n+", chunk.text):
            sentence = sentence.strip().rstrip(".")
            n = len(sentence.split())
            if 8 <= n <= 24 and sentence.isascii() and re.fullmatch(r"[\w ,;:'()\-]+", sentence):
                seen.add(sentence)
    questions = sorted(seen)
    random.Random(0).shuffle(questions)
    return questions[:limit]


# -- the servers --------------------------------------------------------------------------
def raise_nofile(want: int) -> tuple[int, int]:
    """Raise this process's soft open-file limit toward ``want`` (children inherit it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def nofile(pid: int) -> str:
    """A process's open-file limits, soft/hard, from /proc (Linux)."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
            if line.startswith("Max open files"):
                soft, hard = line.split()[3:5]
                return f"{soft}/{hard}"
    return "unknown"


@dataclass
class Server:
    proc: subprocess.Popen[str]
    url: str
    stderr: list[str] = field(default_factory=list)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # uvicorn drains, then re-raises it
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@contextlib.contextmanager
def start_server(argv: list[str], env: dict[str, str], what: str) -> Iterator[Server]:
    """Run ``argv`` (a server that prints its URL on a stdout line) until the block ends."""
    proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    server = Server(proc, "")
    threading.Thread(target=lambda: server.stderr.extend(proc.stderr), daemon=True).start()  # type: ignore[arg-type]
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        found = re.search(r"http://127\.0\.0\.1:\d+", line)
        if not found:
            proc.wait(10)
            raise SystemExit(f"{what} did not start: {line}{''.join(server.stderr)[-3000:]}")
        server.url = found.group(0)
        if proc.stdout:  # drained, so that a chatty server never blocks on a full pipe
            threading.Thread(target=proc.stdout.read, daemon=True).start()
        print(f"{what}: {server.url} (pid {proc.pid}; open files {nofile(proc.pid)})", file=sys.stderr)
        yield server
    finally:
        server.stop()
        problems = [line for line in server.stderr if re.search(r"Traceback|ERROR|Exception", line)]
        if problems:
            print(f"{what} logged {len(problems)} error lines; its log's end:\n{''.join(server.stderr)[-4000:]}",
                  file=sys.stderr)


def server_env(config_path: Path, data_dir: Path, keep_generator: bool) -> dict[str, str]:
    env = {**os.environ, "RAG_CONFIG": str(config_path), "RAG_DATA_DIR": str(data_dir),
           "RAG_SERVE__RATE_LIMIT_PER_MINUTE": "0", "RAG_SERVE__AUTH": "false", "PYTHONUNBUFFERED": "1"}
    # Admission control off (set RAG_SERVE__MAX_IN_FLIGHT to measure it): the phases measure
    # how the server copes with everything it is sent, 500 streams held at once included.
    env.setdefault("RAG_SERVE__MAX_IN_FLIGHT", "1000000")
    if not keep_generator:
        env["RAG_GENERATOR__BACKEND"] = "extractive"
    return env


class SlowGenerator:
    """Another generator's answer, its deltas spread evenly over ``hold_s`` seconds.

    The answer is generated first (the extractive one takes milliseconds), then delta ``k``
    (from 0) of ``n`` is sent ``k * hold_s / (n - 1)`` after generation started: the first at
    once, the last after ``hold_s``. Deadlines, not sleeps, so a busy event loop delays
    deltas but does not make the stream last longer.
    """

    def __init__(self, inner: Any, hold_s: float) -> None:
        self.inner, self.hold_s = inner, hold_s
        self.name, self.context_window = inner.name, inner.context_window
        self.late_ms: list[float] = []  # how long after its deadline each delta was handed on

    def count_tokens(self, text: str) -> int:
        return self.inner.count_tokens(text)

    async def start(self) -> None:
        await self.inner.start()

    async def close(self) -> None:
        await self.inner.close()

    async def stream(self, prompt: Any, params: Any) -> AsyncIterator[Any]:
        loop = asyncio.get_running_loop()
        started = loop.time()
        deltas = [delta async for delta in self.inner.stream(prompt, params)]
        step = self.hold_s / max(1, len(deltas) - 1)
        for k, delta in enumerate(deltas):
            await asyncio.sleep(max(0.0, started + k * step - loop.time()))
            self.late_ms.append(max(0.0, (loop.time() - started - k * step) * 1000))
            yield delta


class TimedStore:
    """A stream store that notes when each event was stored and when a reader took it
    (``time.perf_counter()``: CLOCK_MONOTONIC, the same clock in the client's process)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.stored: dict[str, list[float]] = {}
        self.read_ms: list[float] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def append(self, stream_id: str, data: str, event: str | None = None) -> int:
        seq = await self.inner.append(stream_id, data, event)
        self.stored.setdefault(stream_id, []).append(time.perf_counter())
        return int(seq)

    async def read_after(self, stream_id: str, after: int, wait_s: float) -> Any:
        events, finished = await self.inner.read_after(stream_id, after, wait_s)
        now, stored = time.perf_counter(), self.stored.get(stream_id, [])
        self.read_ms.extend((now - stored[e.seq - 1]) * 1000 for e in events if e.seq <= len(stored))
        return events, finished


def child_server(hold_s: float, lag_file: Path | None, loop: str = "auto", http: str = "auto") -> None:
    """The ``sse`` phase's server: ``ragqa serve``'s app with a slowed generator, on 127.0.0.1.
    Its event loop's lag (how late a 50 ms timer fires) goes to ``lag_file`` when it stops."""
    import socket

    import uvicorn

    from ingest.services import open_services
    from rag.answer import Answerer
    from rag.config import Settings
    from serve.app import create_app

    settings = Settings.load()
    services = open_services(settings)
    load = getattr(services.embedder, "load", None)
    if load is not None:  # a lazy model (MiniLM): loaded now, not by the burst of questions
        load()
    generator = SlowGenerator(services.generator, hold_s)
    app = create_app(settings, services=services, answerer=Answerer(services, generator=generator))
    streams = app.state.ragqa.streams
    streams.store = store = TimedStore(streams.store)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((LOOPBACK, 0))

    lag = LoopLag(stall_s=0.5)

    class Announcing(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if self.started:  # listening now
                lag.start()
                print(f"serving on http://{LOOPBACK}:{sock.getsockname()[1]}", flush=True)

        async def shutdown(self, sockets: Any = None) -> None:
            # here, not after run(): uvicorn re-raises the SIGTERM it caught once run() is done
            if lag_file is not None:
                lag_file.write_text(json.dumps({"loop_lag": lag.stop(), "stalls": lag.stalls(), "stored": store.stored,
                                                "store_to_reader": stats(store.read_ms),
                                                "delta_after_deadline": stats(generator.late_ms)}))
            await super().shutdown(sockets)
            services.close()

    Announcing(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=10, backlog=4096,
                              loop=loop, http=http)).run(sockets=[sock])


class LoopLag:
    """How late an event loop wakes a task that sleeps ``every_s``: how long callbacks wait.

    With ``stall_s``, a thread also notes the loop thread's stack every 0.1 s while the loop
    has not woken that task for ``stall_s``: what blocks it (``stalls()``).
    """

    def __init__(self, every_s: float = 0.05, stall_s: float | None = None) -> None:
        self.every_s, self.stall_s, self.late_ms = every_s, stall_s, []  # type: ignore[var-annotated]
        self.task: asyncio.Task[None] | None = None
        self.beat = time.perf_counter()
        self.stacks: Counter[str] = Counter()
        self._done = threading.Event()

    async def _run(self) -> None:
        while True:
            t0 = self.beat = time.perf_counter()
            await asyncio.sleep(self.every_s)
            self.late_ms.append(max(0.0, (time.perf_counter() - t0 - self.every_s) * 1000))

    def _watch(self, ident: int) -> None:
        import traceback

        while not self._done.wait(0.1):
            if time.perf_counter() - self.beat > (self.stall_s or 0):
                frame = sys._current_frames().get(ident)
                if frame is not None:
                    ours = [f"{Path(f.filename).parent.name}/{Path(f.filename).name} {f.name}"
                            for f in traceback.extract_stack(frame) if f.filename.startswith(str(ROOT))
                            and "<" not in f.name and not f.filename.endswith("bench_serve.py")]
                    self.stacks[" < ".join(reversed(ours[-3:])) or "(outside ragqa: uvicorn, h11, asyncio)"] += 1

    def start(self) -> LoopLag:
        self.task = asyncio.get_running_loop().create_task(self._run())
        if self.stall_s is not None:
            threading.Thread(target=self._watch, args=(threading.get_ident(),), daemon=True).start()
        return self

    def stop(self) -> dict[str, float]:
        self._done.set()
        if self.task is not None:
            self.task.cancel()
        return stats(self.late_ms)

    def stalls(self, top: int = 6) -> list[tuple[float, str]]:
        """Where the loop thread was while stalled (its innermost three ragqa functions), commonest
    first, with the seconds seen there."""
        return [(round(n * 0.1, 1), stack) for stack, n in self.stacks.most_common(top)]


def stats(ms: Sequence[float]) -> dict[str, float]:
    return {"p50_ms": round(pct(ms, 0.5), 1), "p99_ms": round(pct(ms, 0.99), 1),
            "max_ms": round(max(ms), 1) if ms else float("nan"), "n": len(ms)}


# -- the load -----------------------------------------------------------------------------
def client(base: str, connections: int) -> Any:
    import httpx

    if httpx.URL(base).host != LOOPBACK:
        raise SystemExit(f"refusing to load {base}: loopback ({LOOPBACK}) only")
    return httpx.AsyncClient(base_url=base, timeout=httpx.Timeout(120, connect=60),
                             limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections))


@dataclass
class SseRun:
    streams: int
    open_now: int = 0
    max_open: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    completed: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    first_event_ms: list[float] = field(default_factory=list)
    first_delta_ms: list[float] = field(default_factory=list)
    total_ms: list[float] = field(default_factory=list)
    deltas: list[int] = field(default_factory=list)  # per completed stream
    started: float = 0.0  # perf_counter() at the start
    last_open_s: float = 0.0  # when the last stream to open opened, from the start
    client_lag: dict[str, float] = field(default_factory=dict)
    server: dict[str, Any] = field(default_factory=dict)  # the child server's own timings
    arrived: dict[str, list[tuple[int, float]]] = field(default_factory=dict)  # stream id: (seq, perf_counter)

    def join_server(self, report: dict[str, Any]) -> None:
        """Add the child server's timings, and how long each event took from its store to here."""
        stored = report.pop("stored", {})
        delivery = [(at, (at - stored[sid][seq - 1]) * 1000) for sid, events in self.arrived.items()
                    for seq, at in events if sid in stored and seq <= len(stored[sid])]
        opening = self.started + self.last_open_s  # until the last stream opened, questions were being answered
        self.server = {**report, "store_to_client": stats([ms for _, ms in delivery]),
                       "store_to_client_while_opening": stats([ms for at, ms in delivery if at <= opening]),
                       "store_to_client_after": stats([ms for at, ms in delivery if at > opening])}
    events: int = 0
    server_running_max: float = 0.0
    wall_s: float = 0.0
    all_open_at_s: float | None = None

    def summary(self) -> dict[str, Any]:
        return {"phase": "sse", "streams": self.streams, "max_concurrent_open": self.max_open,
                "all_open_after_s": None if self.all_open_at_s is None else round(self.all_open_at_s, 2),
                "max_in_flight": self.max_in_flight, "server_streams_running_max": int(self.server_running_max),
                "completed": self.completed, "errors": sum(self.errors.values()), "error_kinds": dict(self.errors),
                "events": self.events, "wall_s": round(self.wall_s, 2),
                "first_event_p50_ms": round(pct(self.first_event_ms, 0.5), 1),
                "first_event_p99_ms": round(pct(self.first_event_ms, 0.99), 1),
                "first_delta_p50_ms": round(pct(self.first_delta_ms, 0.5), 1),
                "first_delta_p99_ms": round(pct(self.first_delta_ms, 0.99), 1),
                "deltas_per_stream_p50": pct(self.deltas, 0.5),
                "last_open_s": round(self.last_open_s, 2),
                "client_loop_lag": self.client_lag, "server": self.server,
                "stream_p50_s": round(pct(self.total_ms, 0.5) / 1000, 2),
                "stream_p99_s": round(pct(self.total_ms, 0.99) / 1000, 2)}


async def sse_phase(base: str, n: int, questions: list[str], timeout_s: float) -> SseRun:
    """Open ``n`` streamed answers at once and read every event of each until ``done``."""
    run = SseRun(n)
    started = run.started = time.perf_counter()
    async with client(base, n + 8) as http:

        async def one(i: int) -> None:
            body = {"question": questions[i % len(questions)], "stream": True, "no_cache": True}
            t0 = time.perf_counter()
            run.in_flight += 1
            run.max_in_flight = max(run.max_in_flight, run.in_flight)
            opened = done = False
            try:
                async with http.stream("POST", "/v1/ask", json=body) as reply:
                    if reply.status_code != 200:
                        await reply.aread()
                        run.errors[f"HTTP {reply.status_code}"] += 1
                        return
                    opened = True
                    run.open_now += 1
                    run.last_open_s = time.perf_counter() - started
                    if run.open_now > run.max_open:
                        run.max_open = run.open_now
                        if run.max_open == n:
                            run.all_open_at_s = time.perf_counter() - started
                    name, first, first_delta, deltas = None, True, True, 0
                    arrived = run.arrived.setdefault(reply.headers.get("x-stream-id", f"?{i}"), [])
                    async for line in reply.aiter_lines():
                        if line.startswith("event:"):
                            name = line[6:].strip()
                        elif line.startswith("id:"):
                            arrived.append((int(line.rpartition(":")[2]), time.perf_counter()))
                        elif line.startswith("data:"):
                            now = (time.perf_counter() - t0) * 1000
                            run.events += 1
                            if first:
                                run.first_event_ms.append(now)
                                first = False
                            if name == "delta":
                                deltas += 1
                                if first_delta:
                                    run.first_delta_ms.append(now)
                                    first_delta = False
                            elif name == "done":
                                done = True
                            elif name == "error":
                                run.errors["error event: " + line[5:].strip()[:80]] += 1
                                return
                    if not done:
                        run.errors["ended without done"] += 1
                        return
                    run.completed += 1
                    run.deltas.append(deltas)
                    run.total_ms.append((time.perf_counter() - t0) * 1000)
            except Exception as exc:  # noqa: BLE001 - counted
                run.errors[type(exc).__name__] += 1
            finally:
                run.in_flight -= 1
                if opened:
                    run.open_now -= 1

        async def watch_server() -> None:
            while True:
                with contextlib.suppress(Exception):
                    text = (await http.get("/metrics")).text
                    found = re.search(r"^streams_running\s+([\d.e+]+)$", text, re.MULTILINE)
                    if found:
                        run.server_running_max = max(run.server_running_max, float(found.group(1)))
                await asyncio.sleep(1.0)

        watcher, lag = asyncio.create_task(watch_server()), LoopLag().start()
        tasks = [asyncio.create_task(one(i)) for i in range(n)]
        _, pending = await asyncio.wait(tasks, timeout=timeout_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        if pending:
            run.errors[f"not finished in {timeout_s:g} s"] += len(pending)
        watcher.cancel()
        run.client_lag = lag.stop()
    run.wall_s = time.perf_counter() - started
    return run


# -- the report ---------------------------------------------------------------------------
def print_phase(s: dict[str, Any]) -> None:
    if s["phase"] == "server":
        print(f"  server    {s['implementation']}")
        return
    if s["phase"] == "first":
        embed = (s["timings"] or {}).get("embed_ms")
        print(f"  first     the first question after start-up: HTTP {s['status']} in {s['ms']} ms (embed {embed} ms)")
        return
    if s["phase"] == "sse":
        print(f"  sse       {s['streams']} streams: max concurrent open {s['max_concurrent_open']} "
              f"(all open after {s['all_open_after_s']} s; "
              f"server streams_running max {s['server_streams_running_max']}), "
              f"completed {s['completed']}, errors {s['errors']} {s['error_kinds'] or ''}")
        print(f"            first event p50 {s['first_event_p50_ms']} ms p99 {s['first_event_p99_ms']} ms; "
              f"first delta p50 {s['first_delta_p50_ms']} ms p99 {s['first_delta_p99_ms']} ms; "
              f"{s['deltas_per_stream_p50']} deltas a stream; "
              f"stream p50 {s['stream_p50_s']} s p99 {s['stream_p99_s']} s; {s['events']} events in {s['wall_s']} s")
        server = s["server"]
        print(f"            event loop lag p99/max: "
              f"server {fmt_lag(server.get('loop_lag'))}, client {fmt_lag(s['client_loop_lag'])}")
        if server:
            print(f"            p50/p99/max: delta sent after its deadline "
                  f"{fmt_lag(server['delta_after_deadline'], True)}, "
                  f"stored to read by the route {fmt_lag(server['store_to_reader'], True)}, "
                  f"stored to received by the client {fmt_lag(server['store_to_client'], True)} "
                  f"(while streams were opening {fmt_lag(server['store_to_client_while_opening'], True)}, "
                  f"after {fmt_lag(server['store_to_client_after'], True)})")
            for seconds, stack in server.get("stalls", []):
                print(f"            while the server loop was > 0.5 s behind, {seconds} s in: {stack}")
        return
    print(f"  {s['phase']:<9} c={s['concurrency']:<3} {s['req_per_s']:>7} req/s  p50 {s['p50_ms']:>7} ms  "
          f"p99 {s['p99_ms']:>7} ms  ok {s['ok']}  errors {s['errors']} {s['error_kinds'] or ''}"
          + (f"  server CPU {s['server_cpu_pct']}%, {s['server_cpu_us_per_req']} us/req" if "server_cpu_pct" in s else "")
          + (f"  cache {s['cache']}" if s["cache"] else ""))
    if "paraphrases_tried" in s:
        print(f"            {s['paraphrases_semantic']} of {s['paraphrases_tried']} paraphrases were semantic hits "
              f"when first asked ({s['paraphrases_by_kind']}); the phase asks those")


def fmt_lag(lag: dict[str, float] | None, p50: bool = False) -> str:
    if not lag:
        return "n/a"
    return (f"{lag['p50_ms']}/" if p50 else "") + f"{lag['p99_ms']}/{lag['max_ms']} ms"


def cpu_state() -> str:
    load = os.getloadavg()
    return f"{os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"


async def run_phases(args: argparse.Namespace, env: dict[str, str], questions: list[str]) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    phases: list[tuple[str, int]] = args.phases
    names = {name for name, _ in phases}
    serve_cmd = [sys.executable, "-m", "ragqa.cli", "serve", "--port", "0", "--no-auth",
                 "--loop", args.loop, "--http", args.http]
    if names & set(REQUEST_PHASES) or ("sse" in names and args.hold_s <= 0):
        with start_server(serve_cmd, env, "ragqa serve") as server:
            results.append({"phase": "server", "implementation": await implementation(server)})
            print_phase(results[-1])
            results.append(await first_answer(server.url, questions[-1]))
            print_phase(results[-1])
            originals = questions[: args.cached_questions]
            semantic: tuple[list[Request], dict[str, Any]] | None = None
            for name, concurrency in phases:
                if name == "sse":
                    if args.hold_s <= 0:
                        results.append((await sse(args, server.url, questions)).summary())
                        print_phase(results[-1])
                    continue
                extra: dict[str, Any] = {}
                if name == "trivial":
                    requests = [Request("GET", "/health")]
                elif name == "uncached":
                    requests = [Request("POST", "/v1/ask", {"question": q, "no_cache": True}) for q in questions]
                elif name == "exact":  # each asked once before the clock: every timed request is a hit
                    requests = [Request("POST", "/v1/ask", {"question": q}) for q in originals]
                    conn = Connection(server.url)
                    for q in originals:
                        await ask_once(conn, q)
                    conn.close()
                else:  # semantic: paraphrases of the exact phase's questions, kept if they were semantic hits
                    semantic = semantic or await semantic_requests(server.url, originals)
                    requests, extra = semantic
                    if not requests:
                        print(f"semantic: none of {extra['paraphrases_tried']} paraphrases was a semantic hit "
                              f"({extra['paraphrases_by_kind']}); phase skipped", file=sys.stderr)
                        continue
                print(f"{name}: {cpu_state()}", file=sys.stderr)
                phase = await closed_loop(server.url, Phase(name, concurrency, args.duration, extra=dict(extra)),
                                          requests, server.proc.pid)
                results.append(phase.summary())
                print_phase(results[-1])
    if "sse" in names and args.hold_s > 0:
        with tempfile.TemporaryDirectory(prefix="bench-serve-lag-") as tmp:
            lag_file = Path(tmp) / "lag.json"
            child = [sys.executable, str(Path(__file__).resolve()), "--child-server", "--hold-s", str(args.hold_s),
                     "--lag-file", str(lag_file), "--loop", args.loop, "--http", args.http]
            with start_server(child, env, f"app with answers held {args.hold_s:g} s") as server:
                run = await sse(args, server.url, questions)
            if lag_file.is_file():  # written as the server stopped
                run.join_server(json.loads(lag_file.read_text()))
            summary = run.summary()
            results.append(summary)
            print_phase(summary)
    return results


async def implementation(server: Server, wait_s: float = 5.0) -> str:
    """The event loop and HTTP parser ``ragqa serve`` named on stderr when it started."""
    deadline = time.perf_counter() + wait_s
    while time.perf_counter() < deadline:
        found = next((line.strip() for line in server.stderr if "event loop" in line), None)
        if found:
            return found.removeprefix("ragqa: ")
        await asyncio.sleep(0.05)
    return "unknown (ragqa serve did not name it)"


def parse_phases(text: str, concurrency: int) -> list[tuple[str, int]]:
    """``trivial,exact,semantic@1`` -> [("trivial", 16), ("exact", 16), ("semantic", 1)]."""
    out = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        name, _, clients = item.partition("@")
        name = {"cached": "exact"}.get(name, name)  # its name before the trivial and semantic phases
        if name not in PHASES:
            raise ValueError(f"unknown phase {name!r}: choose from {', '.join(PHASES)}")
        if name == "sse" and clients:
            raise ValueError("the sse phase's clients are --streams, not @N")
        out.append((name, int(clients) if clients else concurrency))
    return out


def goals(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The hit path's figures beside issue 13's goals: exact hit >= 50% of the trivial route's
    req/s with p99 <= 5 ms, semantic hit p99 <= 20 ms (at the same concurrency)."""
    out: dict[str, Any] = {}
    trivial = {r["concurrency"]: r for r in results if r["phase"] == "trivial"}
    for r in results:
        c = r.get("concurrency")
        if r["phase"] == "exact":
            base = trivial.get(c)
            share = round(100 * r["req_per_s"] / base["req_per_s"], 1) if base and base["req_per_s"] else None
            out[f"exact@{c}"] = {"req_per_s": r["req_per_s"], "trivial_req_per_s": base and base["req_per_s"],
                                 "pct_of_trivial": share, "p99_ms": r["p99_ms"],
                                 "met": share is not None and share >= 50 and r["p99_ms"] <= 5}
        elif r["phase"] == "semantic":
            out[f"semantic@{c}"] = {"p99_ms": r["p99_ms"], "semantic_replies": r["cache"].get("semantic", 0),
                                    "replies": r["ok"], "met": r["p99_ms"] <= 20}
    return out


def print_goals(found: dict[str, Any]) -> None:
    for name, g in found.items():
        kind, _, c = name.partition("@")
        met = "met" if g["met"] else "not met"
        if kind == "exact":
            share = "n/a (no trivial phase at this concurrency)" if g["pct_of_trivial"] is None else (
                f"{g['req_per_s']} / {g['trivial_req_per_s']} req/s = {g['pct_of_trivial']}% of the trivial route's")
            print(f"  goal      exact hit at c={c}: {share} (>= 50%), p99 {g['p99_ms']} ms (<= 5 ms): {met}")
        else:
            print(f"  goal      semantic hit at c={c}: p99 {g['p99_ms']} ms (<= 20 ms): {met}; "
                  f"{g['semantic_replies']} of {g['replies']} timed replies were semantic hits")


async def first_answer(base: str, question: str) -> dict[str, Any]:
    """The first question after start-up, alone and untimed by the phases (it warms them up)."""
    async with client(base, 1) as http:
        t0 = time.perf_counter()
        reply = await http.post("/v1/ask", json={"question": question, "no_cache": True})
        ms = (time.perf_counter() - t0) * 1000
    body = reply.json() if reply.status_code == 200 else {}
    return {"phase": "first", "status": reply.status_code, "ms": round(ms, 1), "timings": body.get("timings")}


async def sse(args: argparse.Namespace, url: str, questions: list[str]) -> SseRun:
    print(f"sse: {cpu_state()}", file=sys.stderr)
    run = await sse_phase(url, args.streams, questions, args.sse_timeout)
    if run.max_open < args.streams and not run.errors:
        print(f"warning: the first streams ended before the last opened (after {run.last_open_s:.1f} s); "
              "raise --hold-s to hold them all open together", file=sys.stderr)
    return run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", type=Path,
                   help="Build the index here, or reuse the one built here (default: a temp dir).")
    p.add_argument("--corpus", choices=["pydocs", "docs"], default="pydocs",
                   help="pydocs: the vendored Python 3.11 docs (530 pages); docs: this repo's docs/.")
    p.add_argument("--embedder", choices=sorted(EMBEDDERS), default="hash")
    p.add_argument("--vector", choices=["numpy", "milvus"], default="numpy")
    p.add_argument("--generator", action="store_true", help="Use the configured generator, not extractive.")
    p.add_argument("--phases", default=",".join(PHASES),
                   help=f"Comma-separated, in this order: {', '.join(PHASES)} (cached: exact); "
                        "NAME@N runs a request phase with N clients (semantic@1).")
    p.add_argument("--duration", type=float, default=20.0, help="Seconds per request phase.")
    p.add_argument("--concurrency", type=int, default=16, help="Clients in the request phases.")
    p.add_argument("--cached-questions", type=int, default=8,
                   help="Distinct questions in the exact phase (their paraphrases: the semantic phase).")
    p.add_argument("--loop", choices=["auto", "asyncio", "uvloop"], default="auto",
                   help="The servers' event loop (ragqa serve --loop); auto: uvloop when installed.")
    p.add_argument("--http", choices=["auto", "h11", "httptools"], default="auto",
                   help="The servers' HTTP parser (ragqa serve --http); auto: httptools when installed.")
    p.add_argument("--streams", type=int, default=500, help="SSE streams opened at once.")
    p.add_argument("--hold-s", type=float, default=75.0,
                   help="The sse phase's server spreads each answer over this many seconds (0: the plain ragqa serve).")
    p.add_argument("--sse-timeout", type=float, default=300.0,
                   help="The sse phase ends after this many seconds; streams still open count as errors.")
    p.add_argument("--json", type=Path, help="Also write the figures here.")
    p.add_argument("--child-server", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--lag-file", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child_server:
        raise_nofile(65536)
        child_server(args.hold_s, args.lag_file, args.loop, args.http)
        return
    try:
        args.phases = parse_phases(args.phases, args.concurrency)
    except ValueError as exc:
        p.error(str(exc))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 2 * args.streams + 256
    got = raise_nofile(need)
    print(f"open files: soft {soft} hard {hard}" + (f", raised to {got[0]}" if got[0] != soft else "")
          + f" (each of client and server holds ~{args.streams} sockets)", file=sys.stderr)
    if got[0] < need:
        print(f"warning: {got[0]} open files may be too few for {args.streams} streams", file=sys.stderr)
    with contextlib.ExitStack() as stack:
        data_dir = args.data_dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-serve-")))
        config_path, questions = prepare(data_dir.resolve(), args.corpus, args.embedder, args.vector)
        if len(questions) < args.cached_questions:
            raise SystemExit(f"only {len(questions)} questions in the corpus")
        env = server_env(config_path, data_dir.resolve(), args.generator)
        print(f"ragqa serve bench: corpus {args.corpus}, embedder {args.embedder}, vector {args.vector}, generator "
              f"{'configured' if args.generator else 'extractive'}; --loop {args.loop} --http {args.http}; "
              f"{cpu_state()}")
        t0 = time.perf_counter()
        results = asyncio.run(run_phases(args, env, questions))
        found = goals(results)
        print_goals(found)
        print(f"done in {time.perf_counter() - t0:.0f} s; {cpu_state()}")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "results": results,
                                         "goals": found}, indent=2))


if __name__ == "__main__":
    main()
