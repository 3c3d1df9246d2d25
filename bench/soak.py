"""Soak: a long mixed load on a real ``ragqa serve``, with the server's memory per window.

Builds a data directory from the XQuAD-en contexts shipped with the tests (``--docs`` of them,
one Markdown file each, ingested with the default embedder), starts ``ragqa serve`` on
127.0.0.1 (extractive generator, the memory answer cache, rate limits off, a deep admission
queue: this measures leaks, not refusals), and runs ``--clients`` clients for ``--duration``
seconds. Each client picks, by weight:

- **cached**: one of 20 questions asked before (answer-cache hits), ``POST /v1/ask``;
- **uncached**: a question not asked yet, or with ``rag.no_cache`` once they run out;
- **stream**: ``POST /v1/chat/completions`` with ``stream: true``; every event must parse as a
  ``ChatCompletionChunk`` (``serve.schemas``), the ids must count up from 1 with no gap, and the
  stream must end with ``[DONE]``;
- **reconnect**: the same, dropping the connection after two events and resuming with
  ``Last-Event-ID``; the events after the resume must continue the count exactly.

Half way, ten of the files change and the server reindexes them (``POST
/v1/sources/soak/reindex``, as its scheduler would) while the load goes on. Every ``--window`` seconds it prints requests, p50/p99 latency, errors and the
server's RSS (its ``VmRSS``, all worker processes summed), and at the end whether the RSS
levelled off: its growth over the second half of the run, against the first half's.

    python bench/soak.py                                  # 10 minutes, windows of 60 s
    python bench/soak.py --duration 60 --window 10 --docs 60 --json /tmp/soak.json

Loopback only. Client and server share the machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from serve.schemas import ChatCompletionChunk  # noqa: E402

DATA = ROOT / "tests" / "data" / "xquad-en"
WEIGHTS = {"cached": 4, "uncached": 2, "stream": 3, "reconnect": 1}
LOOPBACK = "127.0.0.1"


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


def rss_mb(pid: int) -> float:
    """VmRSS of ``pid`` and its children (uvicorn's workers), in MB."""
    total = 0
    pids = [pid]
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        pids += [int(c) for c in children]
    except OSError:
        pass
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


@dataclass
class Window:
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    errors: Counter[str] = field(default_factory=Counter)
    rss: list[float] = field(default_factory=list)

    def row(self, index: int, seconds: float) -> dict[str, Any]:
        every = [ms for values in self.latencies.values() for ms in values]
        return {
            "window": index, "seconds": round(seconds, 1),
            "requests": {kind: len(values) for kind, values in sorted(self.latencies.items())},
            "p50_ms": round(pct(every, 0.5), 1), "p99_ms": round(pct(every, 0.99), 1),
            "errors": dict(self.errors), "rss_mb": round(self.rss[-1], 1) if self.rss else None,
            "rss_max_mb": round(max(self.rss), 1) if self.rss else None,
        }


class Soak:
    def __init__(self, base: str, questions: list[str], window_s: float, duration_s: float) -> None:
        self.base = base
        self.pool = questions[:20]
        self.fresh = iter(questions[20:])
        self.questions = questions
        self.window_s = window_s
        self.last = max(0, int(-(-duration_s // window_s)) - 1)  # what ends after the run goes in the last
        self.started = time.monotonic()
        self.windows: list[Window] = [Window()]
        self.resumes = 0

    @property
    def now(self) -> Window:
        index = min(self.last, int((time.monotonic() - self.started) // self.window_s))
        while len(self.windows) <= index:
            self.windows.append(Window())
        return self.windows[index]

    def error(self, kind: str, what: str) -> None:
        self.now.errors[f"{kind}: {what}"[:120]] += 1

    async def client(self, http: httpx.AsyncClient, until: float, seed: int) -> None:
        rng = random.Random(seed)
        kinds, weights = zip(*WEIGHTS.items(), strict=True)
        while time.monotonic() < until:
            kind = rng.choices(kinds, weights)[0]
            t0 = time.perf_counter()
            try:
                await getattr(self, kind)(http, rng)
            except (httpx.HTTPError, ValueError, AssertionError) as exc:
                self.error(kind, f"{type(exc).__name__}: {exc}")
                continue
            self.now.latencies[kind].append((time.perf_counter() - t0) * 1000)

    async def _ask(self, http: httpx.AsyncClient, question: str, no_cache: bool = False) -> dict[str, Any]:
        body: dict[str, Any] = {"question": question}
        if no_cache:
            body["no_cache"] = True
        r = await http.post(f"{self.base}/v1/ask", json=body)
        if r.status_code != 200:
            raise AssertionError(f"HTTP {r.status_code}: {r.text[:80]}")
        return r.json()

    async def cached(self, http: httpx.AsyncClient, rng: random.Random) -> None:
        await self._ask(http, rng.choice(self.pool))

    async def uncached(self, http: httpx.AsyncClient, rng: random.Random) -> None:
        question = next(self.fresh, None)
        await self._ask(http, question or rng.choice(self.questions), no_cache=question is None)

    def _chat(self, question: str) -> dict[str, Any]:
        return {"model": "ragqa", "stream": True, "messages": [{"role": "user", "content": question}],
                "rag": {"no_cache": True}}

    async def _events(self, response: httpx.Response, after: int, stop_after: int | None = None) -> int:
        """Read SSE events, checking each; the number of the last one read."""
        if response.status_code != 200:
            raise AssertionError(f"HTTP {response.status_code}")
        seq, done, data, event_id = after, False, None, None
        async for line in response.aiter_lines():
            if line.startswith("id:"):
                event_id = line[3:].strip()
            elif line.startswith("data:"):
                data = line[5:].strip()
            elif line == "" and data is not None:
                if data == "[DONE]":
                    done = True
                    break
                payload = json.loads(data)
                if "error" in payload:
                    raise AssertionError(f"error event {payload['error'].get('code')}")
                ChatCompletionChunk.model_validate(payload)
                number = int((event_id or ":0").rsplit(":", 1)[1])
                if number != seq + 1:
                    raise AssertionError(f"event {number} after {seq}")
                seq, data, event_id = number, None, None
                if stop_after is not None and seq >= stop_after:
                    return seq
        if not done:
            raise AssertionError("the stream ended without [DONE]")
        return seq

    async def stream(self, http: httpx.AsyncClient, rng: random.Random) -> None:
        async with http.stream("POST", f"{self.base}/v1/chat/completions",
                               json=self._chat(rng.choice(self.questions))) as response:
            await self._events(response, 0)

    async def reconnect(self, http: httpx.AsyncClient, rng: random.Random) -> None:
        body = self._chat(rng.choice(self.questions))
        async with http.stream("POST", f"{self.base}/v1/chat/completions", json=body) as response:
            stream_id = response.headers["x-stream-id"]
            seen = await self._events(response, 0, stop_after=2)
        # the connection is dropped here, mid-stream
        async with http.stream("POST", f"{self.base}/v1/chat/completions", json=body,
                               headers={"Last-Event-ID": f"{stream_id}:{seen}"}) as response:
            await self._events(response, seen)
        self.resumes += 1

    async def sample_rss(self, pid: int, until: float) -> None:
        while time.monotonic() < until:
            self.now.rss.append(rss_mb(pid))
            await asyncio.sleep(1.0)


def prepare(work: Path, docs: int, env: dict[str, str]) -> tuple[Path, list[str]]:
    corpus = [json.loads(line) for line in (DATA / "corpus.jsonl").read_text().splitlines()][:docs]
    folder = work / "docs"
    folder.mkdir(parents=True)
    for row in corpus:
        (folder / f"{row['id']}.md").write_text(f"# {row['title']}\n\n{row['text']}\n")
    ids = {row["id"] for row in corpus}
    qrels = [line.split("\t") for line in (DATA / "qrels.tsv").read_text().splitlines()]
    wanted = {q for q, d, *_ in qrels if d in ids}
    questions = [row["text"] for line in (DATA / "queries.jsonl").read_text().splitlines()
                 if (row := json.loads(line))["id"] in wanted]
    subprocess.run([sys.executable, "-m", "ragqa.cli", "ingest", str(folder), "--name", "soak"],
                   env=env, check=True, stdout=subprocess.DEVNULL)
    random.Random(7).shuffle(questions)
    return folder, questions


async def reindex_midway(http: httpx.AsyncClient, base: str, folder: Path) -> dict[str, Any]:
    """Change ten files and reindex through the server (the embedded default's Milvus Lite
    file is held by the serving process; a scheduler in it does the same)."""
    for path in sorted(folder.iterdir())[:10]:
        path.write_text(path.read_text() + "\nThis paragraph was revised during the soak.\n")
    t0 = time.monotonic()
    r = await http.post(f"{base}/v1/sources/soak/reindex", timeout=600)
    report = r.json() if r.status_code == 200 else {}
    return {"status": r.status_code, "seconds": round(time.monotonic() - t0, 1),
            "changed": report.get("changed"), "failed": report.get("failed"),
            "error": "" if r.status_code == 200 else r.text[:300]}


async def soak(args: argparse.Namespace, base: str, pid: int, folder: Path, questions: list[str]) -> dict[str, Any]:
    run = Soak(base, questions, args.window, args.duration)
    until = run.started + args.duration
    limits = httpx.Limits(max_connections=args.clients * 2)
    async with httpx.AsyncClient(timeout=60, limits=limits) as http:
        tasks = [asyncio.create_task(run.client(http, until, seed)) for seed in range(args.clients)]
        tasks.append(asyncio.create_task(run.sample_rss(pid, until)))
        await asyncio.sleep(args.duration / 2)
        reindex = await reindex_midway(http, base, folder)
        print(f"reindex in the middle: {reindex}", flush=True)
        printed = 0
        while not all(t.done() for t in tasks):
            await asyncio.sleep(0.5)
            printed = _print_done(run, printed)
        await asyncio.gather(*tasks)
    rows = [w.row(i, args.window) for i, w in enumerate(run.windows) if w.latencies or w.rss]
    for row in rows[printed:]:
        print(json.dumps(row), flush=True)
    return {"windows": rows, "reindex": reindex, "resumes": run.resumes, **verdict(rows)}


def _print_done(run: Soak, printed: int) -> int:
    current = int((time.monotonic() - run.started) // run.window_s)
    while printed < min(current, len(run.windows)):
        print(json.dumps(run.windows[printed].row(printed, run.window_s)), flush=True)
        printed += 1
    return printed


def verdict(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """RSS growth over each half of the run (window ends), and the errors in all."""
    rss = [r["rss_mb"] for r in rows if r["rss_mb"] is not None]
    half = len(rss) // 2
    first = rss[half] - rss[0] if half else float("nan")
    second = rss[-1] - rss[half] if half else float("nan")
    errors = sum(sum(r["errors"].values()) for r in rows)
    requests = Counter()
    for r in rows:
        requests.update(r["requests"])
    return {"rss_start_mb": rss[0] if rss else None, "rss_end_mb": rss[-1] if rss else None,
            "rss_growth_first_half_mb": round(first, 1), "rss_growth_second_half_mb": round(second, 1),
            "errors": errors, "requests": dict(requests)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of load (default 600)")
    parser.add_argument("--window", type=float, default=60.0, help="seconds per printed window (default 60)")
    parser.add_argument("--clients", type=int, default=4, help="concurrent clients (default 4)")
    parser.add_argument("--docs", type=int, default=240, help="XQuAD-en contexts to index (default all 240)")
    parser.add_argument("--workers", type=int, default=1, help="ragqa serve --workers (default 1)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="ragqa-soak-") as tmp:
        work = Path(tmp)
        env = {**os.environ, "RAG_DATA_DIR": str(work / "data"), "RAG_GENERATOR__BACKEND": "extractive",
               "RAG_SERVE__RATE_LIMIT_PER_MINUTE": "0", "RAG_CACHE__BACKEND": "memory",
               "RAG_SERVE__MAX_IN_FLIGHT": "4", "RAG_SERVE__MAX_QUEUED": "256",
               "RAG_EMBEDDER__PROGRESS": "false"}
        t0 = time.monotonic()
        folder, questions = prepare(work, args.docs, env)
        print(f"indexed {args.docs} documents in {time.monotonic() - t0:.0f} s; "
              f"{len(questions)} questions", flush=True)
        port = free_port()
        log = (work / "serve.log").open("wb")
        server = subprocess.Popen(
            [sys.executable, "-m", "ragqa.cli", "serve", "--no-auth", "--host", LOOPBACK, "--port", str(port),
             "--workers", str(args.workers)], env=env, stdout=log, stderr=subprocess.STDOUT)
        base = f"http://{LOOPBACK}:{port}"
        try:
            _wait_ready(base, server, work / "serve.log")
            results = asyncio.run(soak(args, base, server.pid, folder, questions))
        finally:
            server.terminate()
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
    results.update(duration_s=args.duration, clients=args.clients, docs=args.docs, workers=args.workers,
                   load_average=os.getloadavg())
    print(json.dumps({k: v for k, v in results.items() if k != "windows"}, indent=1))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


def _wait_ready(base: str, server: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"ragqa serve exited: {log.read_text(errors='replace')[-2000:]}")
        try:
            if httpx.get(f"{base}/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise SystemExit("ragqa serve was not ready within 120 s")


if __name__ == "__main__":
    main()
