"""Memory of a cold ingest of a large synthetic site: is it bounded, or does it grow with the pages?

A second process serves a generated site of ``--pages`` linked HTML pages (deterministic
text, a few KB each; an index links to 100 section pages, each section to its pages, and
each page to its neighbours) on loopback. This process crawls and ingests it on a fresh
data directory with the embedded default backends (tantivy, Milvus Lite and the local
vector store) and the chosen embedder (default ``hash``, so that embedding is not the
bottleneck), while a thread samples the resident memory of this process and of its
children (Milvus Lite runs as one) every half second. It prints the peak RSS, the RSS when
1k, 5k and 10k pages had been served, pages/s and chunks/s.

    python bench/bench_ingest_memory.py [--pages 10000] [--embedder hash|sentence-transformers|onnx-int8]
                                        [--vector milvus|numpy] [--port 8791] [--json]
"""

from __future__ import annotations

import argparse
import http.server
import json
import multiprocessing as mp
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SECTIONS = 100
_WORDS = ("index crawler vector chunk token embed query answer source page document server cache "
          "network memory thread process batch model latency throughput schedule release version "
          "protocol header request response timeout retry backoff cluster shard replica storage "
          "segment merge commit record field filter score rank fusion lexical semantic dense sparse "
          "certificate signature policy tenant trust language parser extract boilerplate sitemap").split()


def _paragraphs(page: int, n: int = 6) -> list[str]:
    rnd = random.Random(page)
    paras = []
    for _ in range(n):
        sentences = []
        for _ in range(rnd.randint(4, 7)):
            words = [rnd.choice(_WORDS) for _ in range(rnd.randint(8, 16))]
            sentences.append(" ".join(words).capitalize() + f" (page {page}).")
        paras.append(" ".join(sentences))
    return paras


def render(path: str, pages: int) -> bytes | None:
    """The HTML at ``path`` of a site of ``pages`` pages, or None for a 404."""
    per = -(-pages // SECTIONS)
    if path in ("/site/", "/site/index.html"):
        links = "".join(f'<li><a href="s{s}.html">Section {s}</a></li>' for s in range(SECTIONS) if s * per < pages)
        body = f"<h1>Synthetic site</h1><ul>{links}</ul>"
        return _html("Synthetic site", body)
    name = path.rsplit("/", 1)[-1]
    if path.startswith("/site/s") and name[1:-5].isdigit():
        s = int(name[1:-5])
        first, last = s * per, min(pages, (s + 1) * per)
        if first >= pages:
            return None
        links = "".join(f'<li><a href="p{p}.html">Page {p}</a></li>' for p in range(first, last))
        return _html(f"Section {s}", f"<h1>Section {s}</h1><p>Pages {first} to {last - 1}.</p><ul>{links}</ul>")
    if path.startswith("/site/p") and name[1:-5].isdigit():
        p = int(name[1:-5])
        if p >= pages:
            return None
        paras = "".join(f"<p>{t}</p>" for t in _paragraphs(p))
        nav = "".join(f'<a href="p{q}.html">Page {q}</a> ' for q in (p - 1, p + 1) if 0 <= q < pages)
        return _html(f"Page {p}", f"<nav>{nav}</nav><article><h1>Page {p}</h1>{paras}</article>")
    return None


def _html(title: str, body: str) -> bytes:
    return (f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{title}</title></head>"
            f"<body>{body}</body></html>").encode()


def serve(port: int, pages: int, served: mp.Value, ready: mp.Event) -> None:  # type: ignore[valid-type]
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/robots.txt":
                self.send_error(404)
                return
            body = render(self.path.split("?", 1)[0], pages)
            if body is None:
                self.send_error(404)
                return
            if "/site/p" in self.path:
                with served.get_lock():
                    served.value += 1
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    ready.set()
    server.serve_forever()


def _rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


class Sampler(threading.Thread):
    """RSS (MB) of this process and of its descendants but ``exclude``, every ``every`` seconds."""

    def __init__(self, served: mp.Value, exclude: int, every: float = 0.5) -> None:  # type: ignore[valid-type]
        super().__init__(daemon=True)
        self.served, self.exclude, self.every = served, exclude, every
        self.samples: list[tuple[float, int, float, float]] = []  # (t, pages served, own MB, children MB)
        self.stop = threading.Event()

    def run(self) -> None:
        t0 = time.perf_counter()
        me = os.getpid()
        while not self.stop.is_set():
            kids, todo = [], [c for c in _children(me) if c != self.exclude]
            while todo:
                c = todo.pop()
                kids.append(c)
                todo += _children(c)
            self.samples.append((time.perf_counter() - t0, self.served.value, _rss_kb(me) / 1024,
                                 sum(_rss_kb(c) for c in kids) / 1024))
            self.stop.wait(self.every)


def at_pages(samples: list[tuple[float, int, float, float]], n: int) -> tuple[float, float] | None:
    for _, pages, own, kids in samples:
        if pages >= n:
            return own, kids
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pages", type=int, default=10_000)
    ap.add_argument("--embedder", default="hash", choices=["hash", "sentence-transformers", "onnx-int8"])
    ap.add_argument("--vector", default="milvus", choices=["milvus", "numpy"])
    ap.add_argument("--port", type=int, default=8791)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    served = mp.Value("i", 0)
    ready = mp.Event()
    server = mp.get_context("fork").Process(target=serve, args=(args.port, args.pages, served, ready), daemon=True)
    server.start()
    ready.wait(10)

    from ingest.pipeline import reindex
    from ingest.registry import source_from_argument
    from ingest.services import open_services
    from rag.config import Settings

    work = Path(tempfile.mkdtemp(prefix="ragqa-bench-mem-"))
    settings = Settings.load(None, data_dir=work / "data",
                             embedder={"backend": args.embedder, "progress": False},
                             vector={"backend": args.vector},
                             crawl={"max_pages": args.pages + SECTIONS + 1, "concurrency": 4})
    services = open_services(settings)
    services.state.add_source(source_from_argument(f"http://127.0.0.1:{args.port}/site/index.html", name="synth"))
    base_own = _rss_kb(os.getpid()) / 1024
    sampler = Sampler(served, exclude=server.pid)
    sampler.start()
    t0 = time.perf_counter()
    report = reindex(services, "synth", "full")
    secs = time.perf_counter() - t0
    sampler.stop.set()
    sampler.join()
    docs, chunks = services.state.counts()
    services.close()
    server.terminate()
    shutil.rmtree(work, ignore_errors=True)

    samples = sampler.samples
    marks = {n: at_pages(samples, n) for n in (1000, 5000, 10_000) if n <= args.pages}
    chunks_done = report.chunks_embedded + report.chunks_reused
    out = {
        "pages": args.pages, "embedder": args.embedder, "vector": args.vector,
        "fetched": report.fetched, "failed": report.failed, "documents": docs, "chunks": chunks,
        "seconds": round(secs, 1), "pages_per_s": round(report.fetched / secs, 1),
        "chunks_per_s": round(chunks_done / secs, 1),
        "rss_before_mb": round(base_own, 1),
        "peak_rss_mb": round(max(s[2] for s in samples), 1),
        "peak_rss_with_children_mb": round(max(s[2] + s[3] for s in samples), 1),
        "rss_at_pages_mb": {n: None if v is None else {"own": round(v[0], 1), "children": round(v[1], 1)}
                            for n, v in marks.items()},
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }
    if args.json:
        print(json.dumps(out))
        return
    print(f"{args.pages} pages, embedder={args.embedder}, vector={args.vector}: fetched {report.fetched}, "
          f"failed {report.failed}, {docs} documents, {chunks} chunks in {secs:.1f} s "
          f"({out['pages_per_s']} pages/s, {out['chunks_per_s']} chunks/s), load {out['load_avg_1m']}")
    print(f"RSS before the run {base_own:.0f} MB; peak {out['peak_rss_mb']:.0f} MB "
          f"({out['peak_rss_with_children_mb']:.0f} MB with Milvus Lite and other children)")
    for n, v in marks.items():
        if v is not None:
            print(f"  at {n:>6} pages: {v[0]:7.0f} MB own, {v[1]:7.0f} MB children")
    print("  rss over time (s, pages, own MB, children MB):",
          " ".join(f"({t:.0f},{p},{o:.0f},{k:.0f})" for t, p, o, k in samples[:: max(1, len(samples) // 20)]))


if __name__ == "__main__":
    main()
