"""What the llamacpp generator's answer confidence costs, and a check of its values.

For the packaged Qwen2.5-Coder-0.5B (or ``--model``): answers one short prompt greedily with
``LlamaCppGenerator`` and prints the per-token log-probabilities it scored next to
llama-cpp-python's own ``logprobs`` from a ``logits_all=True`` model on the same tokens (with
``flash_attn`` on and off), then times ``--runs`` answers: the milliseconds per decoded token
and the milliseconds spent in the logits processor (``TokenLogprobs``) per token. Log the load
average with the figures: the machine is shared. Results: evals/RESULTS-profiles.md ("The cascade
with the small model's confidence")::

    source ~/.cache/ragqa/venv/bin/activate
    python bench/bench_confidence.py --runs 3
"""

from __future__ import annotations

import argparse
import asyncio
import time

import numpy as np

import rag.generators.llamacpp as L
from rag.generators.gguf_models import packaged_model_path
from rag.types import GenerationParams, Prompt

PROMPT = Prompt(messages=({"role": "system", "content": "Answer briefly."},
                          {"role": "user", "content": "Explain in two sentences what a hash table is."}))


def load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


async def answer(model: str, threads: int, tokens: int, runs: int) -> tuple[list[float], list[int]]:
    spent = [0.0, 0]
    scored: list[L.TokenLogprobs] = []
    plain = L.TokenLogprobs.__call__

    def timed(self: L.TokenLogprobs, ids: object, scores: object) -> object:
        started = time.perf_counter()
        out = plain(self, ids, scores)
        spent[0] += time.perf_counter() - started
        spent[1] += 1
        if not scored or scored[-1] is not self:
            scored.append(self)
        return out

    L.TokenLogprobs.__call__ = timed  # type: ignore[method-assign]
    params = GenerationParams(temperature=0.0, max_tokens=tokens, repetition_penalty=1.0, seed=0)
    generator = L.LlamaCppGenerator(model=model, threads=threads, n_ctx=512, prefix_cache=False)
    await generator.start()
    try:
        for _ in range(runs):
            spent[:] = [0.0, 0]
            started, first = time.perf_counter(), None
            async for delta in generator.stream(PROMPT, params):
                if delta.text and first is None:
                    first = time.perf_counter()
            end = time.perf_counter()
            n = delta.completion_tokens or 0
            per_token = (end - (first or end)) / max(n - 1, 1) * 1000
            print(f"decode {per_token:.1f} ms/token over {n} tokens; processor {spent[0] / max(spent[1], 1) * 1000:.2f} "
                  f"ms/token ({spent[0] / (end - started) * 100:.1f}% of the answer); load {load()}")
        ids, _stop, _head = generator._tokens(generator._llm, PROMPT, params)
    finally:
        await generator.close()
        L.TokenLogprobs.__call__ = plain  # type: ignore[method-assign]
    return scored[-1].values, ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    values, ids = asyncio.run(answer(args.model, args.threads, args.tokens, args.runs))
    import llama_cpp

    print(f"ours          {np.round(values[:12], 4)}")
    for flash in (True, False):
        ref = llama_cpp.Llama(model_path=str(packaged_model_path(args.model)), n_ctx=512, n_threads=args.threads,
                              logits_all=True, flash_attn=flash, verbose=False)
        out = ref.create_completion(ids, max_tokens=args.tokens, temperature=0.0, repeat_penalty=1.0, logprobs=1)
        expected = out["choices"][0]["logprobs"]["token_logprobs"][: len(values)]
        gap = float(np.max(np.abs(np.array(values[: len(expected)]) - np.array(expected))))
        print(f"flash_attn={flash!s:<5} {np.round(expected[:12], 4)}  largest difference {gap:.4f}")
        ref.close()


if __name__ == "__main__":
    main()
