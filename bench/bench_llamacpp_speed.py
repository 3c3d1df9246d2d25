"""How fast llama.cpp reads a RAG prompt and writes an answer on this machine, per model and setting.

For each packaged chat model and each llama.cpp setting, on real prompts (the product prompt
over XQuAD passages, English and Chinese, ``--passages`` passages each):

- **prefill**: tokens/s reading the whole prompt from an empty KV cache, and the same with
  the static prefix (the system message) already in the cache, which is what
  ``generator.prefix_cache`` gives every request;
- **decode**: tokens/s writing a greedy answer of up to ``--max-tokens`` tokens, with and
  without prompt-lookup decoding (``generator.prompt_lookup``: draft tokens copied from the
  prompt, checked in one batch).

It talks to llama-cpp-python directly, so it measures the engine, not the service.
``ragqa eval answers`` measures the whole answer path (retrieval, packing, TTFT, quality).

    source ~/.cache/ragqa/venv/bin/activate
    python bench/bench_llamacpp_speed.py                             # the default sweep
    python bench/bench_llamacpp_speed.py --models qwen2.5-coder-0.5b-instruct --passages 2 4 --sets batch
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from rag.generators.gguf_models import packaged_model_path
from rag.generators.llamacpp import LlamaCppGenerator
from rag.packing import SEPARATOR, PackedContext, passage_header
from rag.prompts import build_prompt
from rag.types import Chunk, Passage

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"

# name: Llama() keyword arguments on top of n_ctx and threads
SETS: dict[str, dict[str, dict[str, Any]]] = {
    "base": {"default": {}},
    "threads": {"threads=1": {"n_threads": 1, "n_threads_batch": 1}, "threads=2": {}},
    "batch": {f"n_batch={n}": {"n_batch": n, "n_ubatch": n} for n in (64, 128, 256, 512)},
    "flash": {"flash_attn=off": {"flash_attn": False}, "flash_attn=on": {"flash_attn": True}},
    "kv": {"kv=f16": {}, "kv=q8_0": {"type_k": 8, "type_v": 8, "flash_attn": True}},
}


def prompts(lang: str, passages: int, count: int) -> list[tuple[Any, str]]:
    """``count`` product prompts: each XQuAD question over its own paragraph and the next ones."""
    folder = DATA / ("xquad-zh" if lang == "zh" else "xquad-en")
    corpus = [json.loads(line) for line in (folder / "corpus.jsonl").open(encoding="utf-8")]
    queries = [json.loads(line) for line in (folder / "queries.jsonl").open(encoding="utf-8")]
    out = []
    for i, q in enumerate(queries[: count * 37 : 37]):  # questions spread over the set
        docs = [corpus[(i * 13 + j) % len(corpus)] for j in range(passages)]
        chunks = [Chunk(id=d["id"], doc_id=d["id"], source="xquad", text=d["text"], hash=d["id"],
                        title=d.get("title") or d["id"], lang=lang)
                  for d in docs]
        blocks = [f"{passage_header(n + 1, c)}\n{c.text}" for n, c in enumerate(chunks)]
        packed = PackedContext(SEPARATOR.join(blocks), tuple(Passage(n + 1, c, 0, 1.0) for n, c in enumerate(chunks)),
                               {}, 0, 0)
        out.append((build_prompt(q["text"], packed, lang=lang), q["text"]))
    return out


def render(llm: Any, formatter: Any, prompt: Any) -> tuple[list[int], int]:
    """The prompt's token ids and the length of its static prefix (the system message), as
    the generator's prefix cache counts it."""
    rendered = formatter(messages=[dict(m) for m in prompt.messages]).prompt
    ids = llm.tokenize(rendered.encode(), add_bos=False, special=True)
    return ids, LlamaCppGenerator._static_head(llm, prompt, rendered, ids, False, True)


def run(model: str, label: str, kwargs: dict[str, Any], args: argparse.Namespace) -> list[dict[str, Any]]:
    import llama_cpp
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    rows = []
    for lookup in args.lookup:
        extra = {"draft_model": LlamaPromptLookupDecoding(num_pred_tokens=lookup)} if lookup else {}
        params = {"n_ctx": 4096, "n_threads": args.threads, "n_threads_batch": args.threads, "verbose": False,
                  **kwargs, **extra}
        llm = llama_cpp.Llama(model_path=str(packaged_model_path(model)), **params)
        vocab = llm._model
        formatter = Jinja2ChatFormatter(template=llm.metadata["tokenizer.chat_template"],
                                        eos_token=vocab.token_get_text(llm.token_eos()), bos_token="")
        for passages in args.passages:
            for lang in ("en", "zh"):
                cold, warm, decode, tokens, n_prefix = [], [], [], [], []
                for prompt, _question in prompts(lang, passages, args.questions):
                    ids, n = render(llm, formatter, prompt)
                    llm.reset()
                    t0 = time.perf_counter()
                    llm.eval(ids)
                    cold.append(len(ids) / (time.perf_counter() - t0))
                    # the same prompt with only the prefix cached: drop everything after it
                    llm.n_tokens = n
                    t0 = time.perf_counter()
                    llm.eval(ids[n:])
                    warm.append(time.perf_counter() - t0)
                    llm.reset()
                    t0 = time.perf_counter()
                    first = None
                    count = 0
                    for _chunk in llm.create_completion(ids, max_tokens=args.max_tokens, temperature=0.0,
                                                        repeat_penalty=1.0, stream=True):
                        count += 1
                        first = first or time.perf_counter()
                    end = time.perf_counter()
                    if first and count > 1 and end > first:
                        decode.append((count - 1) / (end - first))
                    tokens.append(len(ids))
                    n_prefix.append(n)
                row = {"model": model, "setting": label, "lookup": lookup, "lang": lang, "passages": passages,
                       "prompt_tokens": statistics.median(tokens), "prefix_tokens": statistics.median(n_prefix),
                       "prefill_tok_s": round(statistics.median(cold), 1),
                       "ttft_cold_s": round(statistics.median(tokens) / statistics.median(cold), 2),
                       "ttft_warm_prefix_s": round(statistics.median(warm), 2),
                       "decode_tok_s": round(statistics.median(decode), 1) if decode else None,
                       "load": os.getloadavg()[0]}
                print("| " + " | ".join(str(row[k]) for k in row) + " |", flush=True)
                rows.append(row)
        llm.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"])
    parser.add_argument("--sets", nargs="+", default=["base"], choices=list(SETS))
    parser.add_argument("--passages", nargs="+", type=int, default=[3])
    parser.add_argument("--questions", type=int, default=3, help="prompts per language (medians are shown)")
    parser.add_argument("--lookup", nargs="+", type=int, default=[0], help="prompt-lookup draft tokens; 0 is off")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    header = ["model", "setting", "lookup", "lang", "passages", "prompt_tokens", "prefix_tokens", "prefill_tok_s",
              "ttft_cold_s", "ttft_warm_prefix_s", "decode_tok_s", "load"]
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header), flush=True)
    rows = []
    for model in args.models:
        for group in args.sets:
            for label, kwargs in SETS[group].items():
                rows += run(model, label, kwargs, args)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
