"""Where the server's time goes on an answer-cache hit: py-spy on ``ragqa serve`` under load.

Starts ``ragqa serve`` as ``bench_serve.py`` does (the same index and settings, 127.0.0.1),
then for each phase (``trivial``: ``GET /health``; ``exact``: the same questions again and
again, all exact hits; ``semantic``: their paraphrases, all semantic hits) runs the
closed-loop load while ``py-spy record --gil`` samples the server. Only stacks holding the
GIL are kept: one worker's Python work is serial, so they are what limits its requests/s.

Each sample goes to the innermost frame that belongs to a category below (libraries such as
json, re, pydantic or sqlite3 count toward the ragqa or framework code that called them),
and the table gives each category's share and its GIL-held microseconds per request.
Compare ``exact`` with ``trivial`` to see what a hit adds to the cheapest route.

    pip install py-spy    # or: pip install --target /tmp/pyspy py-spy (then --py-spy /tmp/pyspy/bin/py-spy)
    python bench/profile_hit.py --data-dir /tmp/bsv --duration 10
    python bench/profile_hit.py --data-dir /tmp/bsv-minilm --embedder minilm --phases exact,semantic --raw-dir /tmp/prof

py-spy needs ptrace rights on the server (root, or CAP_SYS_PTRACE, or
``kernel.yama.ptrace_scope`` 0).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path

from bench_serve import EMBEDDERS, ROOT, prepare, server_env, start_server
from serve_load import (
    Connection,
    Phase,
    Request,
    ask_once,
    closed_loop,
    semantic_requests,
)

# (category, what a frame's "function (file)" must contain), innermost match wins; order breaks ties
# within one frame only, so a library frame never claims a sample that ragqa code above it called.
CATEGORIES: list[tuple[str, tuple[str, ...]]] = [
    ("cache: state DB read (index epoch; change token)", ("index_epoch (", "change_token (", "(ingest/state.py")),
    ("cache: query embedding", ("embed_query (", "_embed (rag/cache.py", "rag/embedders/", "sentence_transformers/",
                                "torch/")),
    ("cache: semantic search", ("nearest (",)),
    ("cache: lookup (scope, key, get, decode)", ("(rag/cache", "(rag/lang.py")),
    ("injection check of the question", ("(rag/injection.py",)),
    ("answerer: stream and replay", ("(rag/answer.py",)),
    ("QA log (redact, JSON, file write)", ("(serve/qa_log.py", "logging/")),
    ("metrics (prometheus)", ("observe_answer (", "prometheus_client/", "(serve/metrics.py")),
    ("auth gate and rate limit", ("(serve/auth.py", "(serve/ratelimit.py", "fastapi/security/")),
    ("conversations", ("(serve/conversations.py",)),
    ("route: disconnect watcher", ("until_disconnected (",)),
    ("route: answer plumbing (observed, collect)", ("(serve/answers.py",)),
    ("route: ask body, AskResponse", ("(serve/routes_ask.py", "(serve/schemas.py", "(rag/filters.py")),
    ("body-limit middleware", ("(serve/limits.py",)),
    ("response: validation and JSON encoding", ("serialize_response (", "jsonable_encoder (", "render (starlette",
                                                "_prepare_response_content (")),
    ("request: body read, parse, validate, dependencies", ("solve_dependencies (", "request_body_to_args (",
                                                            "get_request_handler", "_get_body", "body (starlette",
                                                            "json (starlette")),
    ("thread handoff (asyncio.to_thread)", ("asyncio/threads.py", "concurrent/futures/", "threading.py")),
    # The response's socket write: the syscall, which on loopback also delivers to the client and
    # wakes it, and any time the server was descheduled there still holding the GIL (py-spy
    # samples wall time: on a busy machine this grows with the load, not with the server's work).
    ("socket write (uvicorn send)", ("RequestResponseCycle.send (",)),
    ("HTTP protocol (uvicorn, httptools/h11)", ("uvicorn/protocols/", "h11/", "httptools/")),
    ("routing and middleware (Starlette, FastAPI)", ("starlette/", "fastapi/")),
    ("event loop (uvloop/asyncio)", ("uvloop/", "asyncio/", "<built-in method run")),
]


def category(stack: list[str]) -> str:
    for frame in reversed(stack):  # innermost first
        for name, needles in CATEGORIES:
            if any(n in frame for n in needles):
                return name
    return "other"


def breakdown(raw: Path) -> Counter[str]:
    """Samples per category from py-spy's raw (collapsed) output: ``frame;frame;... count``."""
    out: Counter[str] = Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            out[category(stack.split(";"))] += int(count)
    return out


def report(name: str, phase: Phase, counts: Counter[str], rate: int) -> None:
    s = phase.summary()
    total = sum(counts.values()) or 1
    print(f"\n{name}: {s['req_per_s']} req/s, p50 {s['p50_ms']} ms, p99 {s['p99_ms']} ms, {s['ok']} requests, "
          f"errors {s['errors']}, cache {s['cache'] or '-'}; server CPU {s['server_cpu_pct']}% of a core, "
          f"{s['server_cpu_us_per_req']} us/req; {total} GIL samples "
          f"({total / rate / phase.duration_s:.0%} of the time the GIL was held)")
    print(f"  {'':50} {'share':>6} {'us/req':>7}")
    for cat, n in counts.most_common():
        print(f"  {cat:50} {n / total:6.1%} {n / rate / max(1, s['ok']) * 1e6:7.0f}")
    print(f"  {'all':50} {1:6.0%} {total / rate / max(1, s['ok']) * 1e6:7.0f}")


async def run(args: argparse.Namespace, env: dict[str, str], questions: list[str], spy: str, out: Path) -> None:
    serve_cmd = [sys.executable, "-m", "ragqa.cli", "serve", "--port", "0", "--no-auth",
                 "--loop", args.loop, "--http", args.http]
    with start_server(serve_cmd, env, "ragqa serve") as server:
        originals = questions[: args.cached_questions]
        conn = Connection(server.url)
        for q in originals:
            await ask_once(conn, q)  # stored: from now on exact hits
        conn.close()
        for name in args.phases:
            if name == "trivial":
                requests = [Request("GET", "/health")]
            elif name == "exact":
                requests = [Request("POST", "/v1/ask", {"question": q}) for q in originals]
            else:
                requests, _ = await semantic_requests(server.url, originals)
            await closed_loop(server.url, Phase("warm-up", args.concurrency, 1.0), requests)
            raw = out / f"{name}.txt"
            spy_proc = await asyncio.create_subprocess_exec(
                spy, "record", "--pid", str(server.proc.pid), "--duration", str(int(args.duration)), "--rate",
                str(args.rate), "--gil", "--nolineno", "--format", "raw", "--output", str(raw),
                *(["--native"] * args.native), *(["--nonblocking"] * (not args.blocking)),
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
            await asyncio.sleep(0.5)  # py-spy attaches
            phase = await closed_loop(server.url, Phase(name, args.concurrency, args.duration), requests,
                                      server.proc.pid)
            _, err = await spy_proc.communicate()
            if spy_proc.returncode != 0 or not raw.is_file():
                raise SystemExit(f"py-spy failed ({spy_proc.returncode}): {err.decode().strip()[-2000:]}")
            report(name, phase, breakdown(raw), args.rate)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", type=Path, required=True, help="The index (built here by bench_serve.py if absent).")
    p.add_argument("--corpus", choices=["pydocs", "docs"], default="pydocs")
    p.add_argument("--embedder", choices=sorted(EMBEDDERS), default="hash")
    p.add_argument("--vector", choices=["numpy", "milvus"], default="numpy")
    p.add_argument("--phases", default="trivial,exact,semantic", help="Comma-separated: trivial, exact, semantic.")
    p.add_argument("--duration", type=float, default=10.0, help="Seconds sampled per phase.")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--cached-questions", type=int, default=8)
    p.add_argument("--rate", type=int, default=500, help="py-spy samples per second.")
    p.add_argument("--loop", choices=["auto", "asyncio", "uvloop"], default="auto")
    p.add_argument("--http", choices=["auto", "h11", "httptools"], default="auto")
    p.add_argument("--py-spy", default=shutil.which("py-spy"), help="The py-spy binary (default: on PATH).")
    p.add_argument("--native", action="store_true", help="Sample C frames too (py-spy --native).")
    p.add_argument("--blocking", action="store_true",
                   help="Pause the server for each sample (exact stacks, but it slows the server a lot).")
    p.add_argument("--raw-dir", type=Path, help="Keep py-spy's raw stacks here (default: a temp dir).")
    args = p.parse_args()
    args.phases = [x.strip() for x in args.phases.split(",") if x.strip()]
    if set(args.phases) - {"trivial", "exact", "semantic"}:
        p.error("phases: trivial, exact, semantic")
    if not args.py_spy:
        p.error("py-spy not found: pip install py-spy, or pass --py-spy PATH")
    config_path, questions = prepare(args.data_dir.resolve(), args.corpus, args.embedder, args.vector)
    env = server_env(config_path, args.data_dir.resolve(), keep_generator=False)
    print(f"profile of ragqa serve ({ROOT}): {args.embedder} embedder, --loop {args.loop} --http {args.http}, "
          f"{args.concurrency} clients, {args.duration:g} s a phase, py-spy --gil at {args.rate} Hz")
    with tempfile.TemporaryDirectory(prefix="profile-hit-") as tmp:
        out = args.raw_dir or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        asyncio.run(run(args, env, questions, args.py_spy, out))


if __name__ == "__main__":
    main()
