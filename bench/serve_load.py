"""The request phases of ``bench_serve.py``: a lean HTTP/1.1 client, closed-loop load, paraphrases.

The client is a keep-alive connection on asyncio streams that sends prebuilt requests and
reads ``Content-Length`` or chunked bodies, nothing else (no TLS, redirects or cookies). It
costs the client a few tens of microseconds a request where httpx costs a few hundred, so
that on a small machine the client is not what caps a trivial route's requests/s (client
and server share the cores).

Example::

    phase = await closed_loop(url, Phase("trivial", 16, 10.0), [Request("GET", "/health")])
    print(phase.summary()["req_per_s"])
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

__all__ = ["LOOPBACK", "Connection", "Phase", "Request", "closed_loop", "cpu_seconds", "paraphrases", "pct"]

LOOPBACK = "127.0.0.1"
_CACHE = re.compile(rb'"cache"\s*:\s*"(\w+)"')


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system, all threads) a process has used so far, from /proc (Linux);
    NaN elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def pct(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1), nearest rank; NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


@dataclass
class Request:
    method: str
    path: str
    body: dict[str, Any] | None = None
    _wire: dict[str, bytes] = field(default_factory=dict, repr=False, compare=False)

    def wire(self, host: str) -> bytes:
        """The request's bytes for the server at ``host`` (host:port), encoded once."""
        data = self._wire.get(host)
        if data is None:
            body = b"" if self.body is None else json.dumps(self.body).encode()
            head = f"{self.method} {self.path} HTTP/1.1\r\nHost: {host}\r\n"
            if self.body is not None:
                head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            data = self._wire[host] = head.encode() + b"\r\n" + body
        return data


class Connection:
    """One keep-alive HTTP/1.1 connection to a loopback server; reconnects after a close."""

    def __init__(self, base: str) -> None:
        url = urlsplit(base)
        if url.hostname != LOOPBACK or url.port is None:
            raise SystemExit(f"refusing to load {base}: loopback ({LOOPBACK}) only")
        self.host, self.port = url.hostname, url.port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def connect(self) -> None:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    async def request(self, request: Request) -> tuple[int, dict[str, str], bytes]:
        """Send ``request``; its status, headers (names lowercased) and body."""
        await self.connect()
        assert self.reader is not None and self.writer is not None
        try:
            self.writer.write(request.wire(f"{self.host}:{self.port}"))
            lines = (await self.reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            status = int(lines[0].split(" ", 2)[1])
            headers = {}
            for line in lines[1:]:
                if line:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
            if "content-length" in headers:
                content = await self.reader.readexactly(int(headers["content-length"]))
            elif headers.get("transfer-encoding", "").lower() == "chunked":
                content = await self._chunked()
            else:  # the body ends with the connection
                content, headers["connection"] = await self.reader.read(), "close"
        except BaseException:
            self.close()
            raise
        if headers.get("connection", "").lower() == "close":
            self.close()
        return status, headers, content

    async def _chunked(self) -> bytes:
        assert self.reader is not None
        parts = []
        while True:
            size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await self.reader.readuntil(b"\r\n")  # no trailers are sent here
                return b"".join(parts)
            parts.append((await self.reader.readexactly(size + 2))[:-2])


def cache_kind(body: bytes) -> str | None:
    """The ``cache`` field of a native answer (hit, semantic, miss), read without parsing it all."""
    found = _CACHE.search(body)
    return found.group(1).decode() if found else None


@dataclass
class Phase:
    name: str
    concurrency: int
    duration_s: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    cache: Counter[str] = field(default_factory=Counter)
    extra: dict[str, Any] = field(default_factory=dict)  # what the phase adds to its summary

    def summary(self) -> dict[str, Any]:
        ok = len(self.latencies_ms)
        return {"phase": self.name, "concurrency": self.concurrency, "duration_s": round(self.duration_s, 2),
                "requests": ok + sum(self.errors.values()), "ok": ok, "errors": sum(self.errors.values()),
                "error_kinds": dict(self.errors), "req_per_s": round(ok / self.duration_s, 1) if self.duration_s else 0,
                "p50_ms": round(pct(self.latencies_ms, 0.5), 2), "p99_ms": round(pct(self.latencies_ms, 0.99), 2),
                "mean_ms": round(statistics.fmean(self.latencies_ms), 2) if ok else float("nan"),
                "cache": dict(self.cache), **self.extra}


async def closed_loop(base: str, phase: Phase, requests: Sequence[Request], server_pid: int | None = None) -> Phase:
    """``phase.concurrency`` connections, each sending the next of ``requests`` (round robin)
    when its last reply has been read, until ``phase.duration_s`` has passed. With
    ``server_pid``, the server's CPU time over the phase too (``server_cpu_*`` in the summary)."""
    conns = [Connection(base) for _ in range(phase.concurrency)]
    await asyncio.gather(*(c.connect() for c in conns))  # before the clock
    counter = iter(range(10**12))
    deadline = time.perf_counter() + phase.duration_s

    async def worker(conn: Connection) -> None:
        while time.perf_counter() < deadline:
            request = requests[next(counter) % len(requests)]
            t0 = time.perf_counter()
            try:
                status, _, content = await conn.request(request)
            except Exception as exc:  # noqa: BLE001 - counted, the load goes on
                phase.errors[type(exc).__name__] += 1
                await asyncio.sleep(0.01)  # a refused connection is not retried in a busy loop
                continue
            if status != 200:
                phase.errors[f"HTTP {status}"] += 1
                continue
            phase.latencies_ms.append((time.perf_counter() - t0) * 1000)
            kind = cache_kind(content) if request.path == "/v1/ask" else None
            if kind is not None:
                phase.cache[kind] += 1

    t0, cpu0 = time.perf_counter(), cpu_seconds(server_pid) if server_pid else float("nan")
    try:
        await asyncio.gather(*(worker(c) for c in conns))
    finally:
        for conn in conns:
            conn.close()
    phase.duration_s = time.perf_counter() - t0  # includes the requests in flight at the deadline
    if server_pid:
        cpu = cpu_seconds(server_pid) - cpu0
        phase.extra.update(server_cpu_pct=round(100 * cpu / phase.duration_s),
                           server_cpu_us_per_req=round(cpu / max(1, len(phase.latencies_ms)) * 1e6))
    return phase


async def ask_once(conn: Connection, question: str) -> str:
    """Ask ``question`` (answer cache on); its ``cache`` field. Raises on a non-200 reply."""
    status, _, content = await conn.request(Request("POST", "/v1/ask", {"question": question}))
    if status != 200:
        raise RuntimeError(f"HTTP {status} for {question!r}: {content[:300]!r}")
    return cache_kind(content) or "?"


_ARTICLES = re.compile(r"\b(?:the|a|an)\s+", re.IGNORECASE)


def paraphrases(question: str) -> list[str]:
    """Rewordings that keep a question's meaning but not its exact-cache key (which ignores
    case, spacing and trailing punctuation only): a polite preamble, the articles dropped,
    and a comma dropped (or one added mid-sentence). Whether each is near enough to be a
    semantic hit depends on the embedder and ``cache.semantic_threshold``: the caller checks."""
    words = question.split()
    comma = (question.replace(",", "", 1) if "," in question
             else " ".join(words[: len(words) // 2]) + ", " + " ".join(words[len(words) // 2:]))
    out = [f"Please tell me: {question}", _ARTICLES.sub("", question), comma]
    return [p for p in dict.fromkeys(out) if p.strip() and p != question]


async def semantic_requests(base: str, originals: Sequence[str]) -> tuple[list[Request], dict[str, Any]]:
    """Ask each of ``originals`` once (so the cache holds their answers), then each of their
    paraphrases once: those answered ``semantic`` are the phase's requests (one answered
    ``miss`` was generated and stored under its own key, and would now be an exact hit)."""
    conn = Connection(base)
    try:
        for q in originals:
            await ask_once(conn, q)
        tried: Counter[str] = Counter()
        kept: list[Request] = []
        for q in originals:
            for p in paraphrases(q):
                kind = await ask_once(conn, p)
                tried[kind] += 1
                if kind == "semantic":
                    kept.append(Request("POST", "/v1/ask", {"question": p}))
    finally:
        with contextlib.suppress(Exception):
            conn.close()
    return kept, {"paraphrases_tried": sum(tried.values()), "paraphrases_semantic": len(kept),
                  "paraphrases_by_kind": dict(tried)}
