"""Admission control under overload: open-loop load at multiples of the sustainable rate.

Starts ``ragqa serve`` on 127.0.0.1 over a ``bench_serve.py`` data directory (the extractive
generator, rate limits off, admission control as configured: ``serve.max_in_flight`` 8 and
``serve.max_queued`` 64 unless ``--env`` says otherwise), then:

1. measures the sustainable rate on a server without the bound: ``--clients`` closed-loop
   clients asking distinct uncached questions for ``--duration`` seconds (req/s; ``--rate``
   gives it instead);
2. for each multiple in ``--multiples`` (0.5, 2, 5), sends uncached questions **open loop** at
   that multiple of the sustainable rate for ``--duration`` seconds: each request leaves on
   schedule on a connection of its own, whether or not the earlier ones were answered (as
   real users do), and reports accepted (200) p50/p99, refused (503) count and p99, and any
   other status or error.

The issue's goal: at 2x and 5x, accepted requests keep their p99 within 2x of the unloaded
(0.5x) p99, the rest get a fast 503, and there are 0 other errors.

    python bench/bench_overload.py --data-dir /tmp/bsv-minilm
    python bench/bench_overload.py --data-dir /tmp/bsv-minilm --env RAG_SERVE__MAX_IN_FLIGHT=1000000   # off

Loopback only. Client and server share the machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from bench_serve import server_env, start_server  # noqa: E402
from serve_load import Connection, Phase, Request, closed_loop, pct  # noqa: E402


async def open_loop(url: str, rate: float, duration: float, questions: list[str], offset: int) -> dict:
    """Requests at ``rate``/s for ``duration`` s, each on its own connection, on schedule."""
    results: list[tuple[int, float]] = []
    errors: Counter[str] = Counter()

    async def one(question: str) -> None:
        conn = Connection(url)
        started = time.perf_counter()
        try:
            status, _, _ = await conn.request(Request("POST", "/v1/ask", {"question": question, "no_cache": True}))
            results.append((status, (time.perf_counter() - started) * 1000))
        except Exception as exc:  # noqa: BLE001 - counted, reported
            errors[type(exc).__name__] += 1
        finally:
            conn.close()

    tasks = []
    n = int(rate * duration)
    start = time.perf_counter()
    for i in range(n):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(questions[(offset + i) % len(questions)])))
    await asyncio.gather(*tasks)
    ok = [ms for status, ms in results if status == 200]
    refused = [ms for status, ms in results if status == 503]
    other = Counter(str(status) for status, _ in results if status not in (200, 503))
    return {"rate": round(rate, 1), "sent": n, "ok": len(ok), "ok_p50_ms": round(pct(ok, 0.5), 1),
            "ok_p99_ms": round(pct(ok, 0.99), 1), "refused": len(refused),
            "refused_p99_ms": round(pct(refused, 0.99), 1), "other_statuses": dict(other), "errors": dict(errors),
            "wall_s": round(time.perf_counter() - start, 1)}


async def sustainable_rate(args: argparse.Namespace, url: str, questions: list[str]) -> float:
    requests = [Request("POST", "/v1/ask", {"question": q, "no_cache": True}) for q in questions[:2000]]
    base = await closed_loop(url, Phase("sustainable", args.clients, args.duration), requests)
    print(f"sustainable: {base.summary()['req_per_s']:.1f} req/s with {args.clients} closed-loop clients, "
          f"admission control off (p99 {base.summary().get('p99_ms')} ms)", file=sys.stderr)
    return float(base.summary()["req_per_s"])


async def run(args: argparse.Namespace, url: str, questions: list[str], sustainable: float) -> dict:
    out = {"sustainable_req_per_s": sustainable, "runs": []}
    for i, multiple in enumerate(args.multiples):
        await asyncio.sleep(2)  # let the previous run's queue drain
        row = await open_loop(url, sustainable * multiple, args.duration, questions, 3000 + i * 5000)
        row["multiple"] = multiple
        out["runs"].append(row)
        print(json.dumps(row), file=sys.stderr)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", required=True, type=Path, help="a data directory made by bench_serve.py")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--multiples", type=lambda s: [float(x) for x in s.split(",")], default=[0.5, 2.0, 5.0])
    ap.add_argument("--rate", type=float, help="the sustainable rate, req/s (default: measured first)")
    ap.add_argument("--env", action="append", default=[], help="KEY=VALUE for the server (repeatable)")
    ap.add_argument("--json", dest="json_out")
    args = ap.parse_args()
    data_dir = args.data_dir.resolve()
    questions = json.loads((data_dir / "questions.json").read_text())
    env = server_env(data_dir / "bench.yaml", data_dir, keep_generator=False)
    env.pop("RAG_SERVE__MAX_IN_FLIGHT", None)  # admission control as configured
    env.update(dict(kv.split("=", 1) for kv in args.env))
    argv = [sys.executable, "-m", "ragqa.cli", "serve", "--port", "0", "--no-auth"]
    print(f"load average {os.getloadavg()[0]:.2f}", file=sys.stderr)
    with start_server(argv, {**env, "RAG_SERVE__MAX_IN_FLIGHT": "1000000"}, "ragqa serve (no admission bound)") as server:
        sustainable = args.rate or asyncio.run(sustainable_rate(args, server.url, questions))
    with start_server(argv, env, "ragqa serve") as server:
        out = asyncio.run(run(args, server.url, questions, sustainable))
    print("\n| load | sent | accepted | accepted p50 / p99 ms | refused 503 | 503 p99 ms | other |")
    print("|---|---|---|---|---|---|---|")
    for r in out["runs"]:
        other = sum(r["other_statuses"].values()) + sum(r["errors"].values())
        print(f"| {r['multiple']:g}x ({r['rate']}/s) | {r['sent']} | {r['ok']} | {r['ok_p50_ms']} / {r['ok_p99_ms']} "
              f"| {r['refused']} | {r['refused_p99_ms']} | {other} |")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
