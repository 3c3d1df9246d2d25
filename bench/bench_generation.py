"""Generation throughput and latency: sequential vs batched vs concurrent requests.

Through ragqa's own generators (``rag.generators``), so the figures include their
streaming path:

  sequential  one request at a time (what one user sees)
  batched     all ``--requests`` submitted at once: the engine batches them together
  concurrent  ``--concurrency`` clients, each sending its next request when one ends

and prints requests/s, output tokens/s, time to first token (p50/p99) and latency (p50).

    # in process, vLLM's engine (default: a tiny random Llama on CPU, no download)
    python bench/bench_generation.py --backend vllm
    python bench/bench_generation.py --backend vllm --model /models/qwen2.5-7b-instruct --load-format auto --dtype auto
    # any OpenAI-compatible server, e.g. `vllm serve` on a GPU box (nothing else changes)
    python bench/bench_generation.py --backend openai --base-url http://127.0.0.1:8001/v1 [--model NAME]

vLLM runs from its own venv: ``bash scripts/vllm_env.sh`` prints the python to use. On CPU
set ``VLLM_CPU_KVCACHE_SPACE`` (GiB; defaults to 1 here). The tiny model's output is
gibberish and most of a step's time on CPU is overhead, so its figures say how much the
engine batches, not how fast a real model is.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rag.types import GenerationParams, Prompt  # noqa: E402

QUESTION = "What is the capital of France, and which river runs through it?"
CONTEXT = "[1] Paris is the capital and largest city of France. The Seine flows through Paris."


@dataclass
class Result:
    ttft_s: float
    latency_s: float
    tokens: int


def make_prompt(context_words: int) -> Prompt:
    filler = " ".join(["The library server answers each request from the passage index."] * max(0, context_words // 9))
    user = f"Context:\n{CONTEXT}\n{filler}\n\nQuestion: {QUESTION}"
    return Prompt(
        messages=({"role": "system", "content": "Answer from the context; cite sources as [1]."},
                  {"role": "user", "content": user}),
        completion=f"{user}\nAnswer:",
    )


async def one(gen: Any, prompt: Prompt, params: GenerationParams) -> Result:
    t0 = time.perf_counter()
    first = None
    tokens = 0
    async for delta in gen.stream(prompt, params):
        if first is None and delta.text:
            first = time.perf_counter()
        if delta.finish_reason is not None:
            tokens = delta.completion_tokens or 0
    end = time.perf_counter()
    return Result((first or end) - t0, end - t0, tokens)


async def run_mode(gen: Any, mode: str, n: int, concurrency: int, prompt: Prompt, max_tokens: int) -> dict[str, Any]:
    params = [GenerationParams(max_tokens=max_tokens, temperature=0.8, seed=i) for i in range(n)]
    t0 = time.perf_counter()
    if mode == "sequential":
        results = [await one(gen, prompt, p) for p in params]
    elif mode == "batched":
        results = list(await asyncio.gather(*(one(gen, prompt, p) for p in params)))
    else:
        queue = list(params)
        results = []

        async def client() -> None:
            while queue:
                results.append(await one(gen, prompt, queue.pop()))

        await asyncio.gather(*(client() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    ttfts = sorted(r.ttft_s for r in results)
    tokens = sum(r.tokens for r in results)
    return {
        "mode": mode if mode != "concurrent" else f"concurrent x{concurrency}",
        "requests": n,
        "wall_s": round(wall, 3),
        "req_per_s": round(n / wall, 2),
        "tok_per_s": round(tokens / wall, 1),
        "tokens": tokens,
        "ttft_p50_ms": round(1000 * statistics.median(ttfts), 1),
        "ttft_p99_ms": round(1000 * ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))], 1),
        "latency_p50_ms": round(1000 * statistics.median(r.latency_s for r in results), 1),
    }


def make_generator(args: argparse.Namespace, workdir: Path) -> Any:
    if args.backend == "openai":
        from rag.generators.openai_server import OpenAIGenerator

        return OpenAIGenerator(args.base_url, args.model, api_key=os.environ.get("OPENAI_API_KEY"), timeout_s=120)
    from rag.generators.vllm_engine import VllmGenerator

    model = args.model
    if model is None:
        from tests.vllm_tiny import build_tiny_model

        model = str(build_tiny_model(workdir / "tiny-llama"))
    return VllmGenerator(
        model, dtype=args.dtype, load_format=args.load_format, enforce_eager=args.enforce_eager,
        max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
    )


async def bench(args: argparse.Namespace) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="ragqa-bench-gen-") as tmp:
        gen = make_generator(args, Path(tmp))
        t0 = time.perf_counter()
        await gen.start()
        print(f"# {args.backend}: {getattr(gen, 'model', '')} started in {time.perf_counter() - t0:.1f} s, "
              f"context window {gen.context_window}", file=sys.stderr)
        try:
            prompt = make_prompt(args.context_words)
            print(f"# prompt: {gen.count_tokens(prompt.messages[1]['content'])} tokens of user message; "
                  f"max_tokens {args.max_tokens}", file=sys.stderr)
            await one(gen, prompt, GenerationParams(max_tokens=8))  # warm-up
            rows = []
            for mode in ("sequential", "batched", "concurrent"):
                rows.append(await run_mode(gen, mode, args.requests, args.concurrency, prompt, args.max_tokens))
            return rows
        finally:
            await gen.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", choices=["vllm", "openai"], default="vllm")
    ap.add_argument("--model", default=None, help="vllm: a model folder or hub id (default: the tiny random Llama); "
                    "openai: the served model (default: the first one)")
    ap.add_argument("--base-url", default="http://127.0.0.1:8001/v1", help="openai: the server's /v1 URL")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--context-words", type=int, default=150, help="filler words added to the prompt's context")
    ap.add_argument("--dtype", default=None, help="vllm (default: float32 for the tiny model, else auto)")
    ap.add_argument("--load-format", default=None, help="vllm (default: dummy for the tiny model, else auto)")
    ap.add_argument("--max-model-len", type=int, default=None)
    ap.add_argument("--max-num-seqs", type=int, default=None)
    ap.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=None,
                    help="vllm (default: on for the tiny model on CPU, off otherwise: CUDA graphs)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    tiny = args.backend == "vllm" and args.model is None
    args.dtype = args.dtype or ("float32" if tiny else "auto")
    args.load_format = args.load_format or ("dummy" if tiny else "auto")
    args.enforce_eager = tiny if args.enforce_eager is None else args.enforce_eager
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout is the table

    rows = asyncio.run(bench(args))
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    cols = ["mode", "requests", "wall_s", "req_per_s", "tok_per_s", "ttft_p50_ms", "ttft_p99_ms", "latency_p50_ms"]
    print(" | ".join(cols))
    for row in rows:
        print(" | ".join(str(row[c]) for c in cols))


if __name__ == "__main__":
    main()
