"""The run command's answers, timed: ``ragqa serve`` on this project's ``docs/``, questions over HTTP.

What a new user of ``scripts/dev.sh`` sees. It ingests ``docs/`` into a data dir (once; reused
with ``--data-dir``), starts ``ragqa serve --no-auth`` on 127.0.0.1 with the settings given by
``--env KEY=VALUE`` (nothing: the default), waits for ``/ready``, then asks each question of
:data:`QUESTIONS` once, in order, as a streamed ``POST /v1/ask``, and times from sending the
question to the ``sources`` event (retrieval done), to the first text, and to the last event.
The first question is the first after start, as a new user would ask it.

    source ~/.cache/ragqa/venv/bin/activate
    python bench/bench_first_answer.py --data-dir /tmp/fa                    # the default
    python bench/bench_first_answer.py --data-dir /tmp/fa --label previous \\
        --env RAG_RETRIEVAL__MAX_CONTEXT_TOKENS=3000 --env RAG_RETRIEVAL__MAX_CONTEXT_CHUNKS=8 \\
        --env RAG_PROMPT__EXAMPLES=[] --env RAG_GENERATOR__FLASH_ATTN=false

Loopback only. Prints one row per question and a summary row (p50/p99) in Markdown.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
QUESTIONS = [
    "How does incremental reindexing decide what to redo?",
    "What happens to my documents when a crawl fails?",
    "Which file types does a folder source read?",
    "How is text split into chunks?",
    "When does the scheduler run crawls?",
    "What does the embedded default use for BM25?",
    "How do I point ragqa at an Elasticsearch cluster?",
    "How do I create an API key?",
    "Where does ragqa keep its state?",
    "What does the answer cache key include?",
    "增量重建索引时，怎样判断文档是否改变？",
    "抓取失败时会删除文档吗？",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ingest(env: dict[str, str]) -> None:
    listed = subprocess.run(["ragqa", "sources", "--json"], env=env, capture_output=True, text=True, check=True)
    if '"name": "docs"' not in listed.stdout:
        subprocess.run(["ragqa", "ingest", str(ROOT / "docs"), "--name", "docs", "--trust", "high"], env=env,
                       check=True, stdout=subprocess.DEVNULL)


def ask(client: httpx.Client, base: str, question: str) -> dict[str, float | int | str]:
    sent = time.perf_counter()
    marks: dict[str, float] = {}
    text, done = "", {}
    with client.stream("POST", f"{base}/v1/ask", json={"question": question, "stream": True, "no_cache": True},
                       timeout=600) as r:
        r.raise_for_status()
        event = None
        for line in r.iter_lines():
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:") and event:
                data = json.loads(line[5:])
                now = time.perf_counter() - sent
                marks.setdefault(event, now)
                if event == "delta":
                    text += data.get("text", "")
                elif event == "done":
                    done = data
    usage = done.get("usage") or {}
    cited = done.get("citations") or []
    return {"question": question, "sources_s": marks.get("sources", float("nan")),
            "ttft_s": marks.get("delta", float("nan")), "total_s": marks.get("done", float("nan")),
            "prompt_tokens": usage.get("prompt_tokens", 0), "completion_tokens": usage.get("completion_tokens", 0),
            "cited": len(cited), "inferred": sum(1 for c in cited if c.get("inferred")),
            "answer": re.sub(r"\s+", " ", text).strip()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, required=True, help="where docs/ is ingested (reused)")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="a setting for the server")
    parser.add_argument("--label", default="default")
    parser.add_argument("--limit", type=int, default=len(QUESTIONS), help="ask only the first N questions")
    parser.add_argument("--show", action="store_true", help="print each answer")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    env = {**os.environ, "RAG_DATA_DIR": str(args.data_dir), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.update(dict(item.split("=", 1) for item in args.env))
    ingest(env)
    port = free_port()
    started = time.perf_counter()
    server = subprocess.Popen(["ragqa", "serve", "--host", "127.0.0.1", "--port", str(port), "--no-auth"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    rows = []
    try:
        with httpx.Client() as client:
            while True:
                try:
                    if client.get(f"{base}/ready", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if server.poll() is not None or time.perf_counter() - started > 600:
                    sys.exit("the server did not become ready")
                time.sleep(0.5)
            ready_s = time.perf_counter() - started
            print(f"<!-- {args.label}: ready {ready_s:.1f} s after start; load {os.getloadavg()[0]:.2f} -->")
            print("| run | question | sources s | TTFT s | total s | prompt tokens | answer tokens | cited (inferred) |")
            print("|---|---|---:|---:|---:|---:|---:|---|")
            for question in QUESTIONS[: args.limit]:
                row = ask(client, base, question)
                rows.append(row)
                print(f"| {args.label} | {question} | {row['sources_s']:.2f} | {row['ttft_s']:.2f} | {row['total_s']:.2f} "
                      f"| {row['prompt_tokens']} | {row['completion_tokens']} | {row['cited']} ({row['inferred']}) |",
                      flush=True)
                if args.show:
                    print(f"<!-- {row['answer']} -->")
    finally:
        server.terminate()
        server.wait(30)

    def pct(key: str, q: float) -> float:
        values = sorted(float(r[key]) for r in rows)
        return float(statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]) if len(values) > 1 else values[0]

    print(f"\n{args.label}: {len(rows)} questions; TTFT p50 {pct('ttft_s', 50):.2f} s, p99 {pct('ttft_s', 99):.2f} s; "
          f"total p50 {pct('total_s', 50):.2f} s, p99 {pct('total_s', 99):.2f} s; "
          f"answers citing a source {sum(1 for r in rows if r['cited'])}/{len(rows)}")
    if args.json:
        args.json.write_text(json.dumps(rows, ensure_ascii=False, indent=1))


if __name__ == "__main__":
    main()
