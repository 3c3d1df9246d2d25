"""MiniLM as int8 ONNX (onnxruntime) against fp32 sentence-transformers (torch), on CPU.

On real passages: the XQuAD-en paragraphs (240, ~150 tokens) and chunks of the Python 3.11
docs cut by ragqa's chunker at its default size (tests/data/crawl-pydocs311, up to 254
tokens), it prints

- the cosine of each passage's int8 vector to its fp32 one (min, p1, mean);
- passages/s of both, and the median ms of one query;
- batching by length: passages/s with batches in input order, sorted by characters and
  sorted by token count, and the least cosine between the sorted and unsorted vectors (the
  int8 embedder runs each text alone, several side by side; its padded batches, on one
  thread, are shown for comparison);
- with ``--options``: the quality and speed of other quantization recipes (per tensor or per
  channel, MatMul only or every op onnxruntime quantizes), built in a temporary folder.

Every figure comes with the machine's 1-minute load average when it was taken.

    python bench/bench_onnx.py                     # prints Markdown tables
    python bench/bench_onnx.py --options --pages 40
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DATA = ROOT / "tests" / "data"


def load() -> str:
    return f"{os.getloadavg()[0]:.1f}"


def xquad() -> list[str]:
    with (DATA / "xquad-en" / "corpus.jsonl").open(encoding="utf-8") as fh:
        return [json.loads(line)["text"] for line in fh if line.strip()]


def pydocs_chunks(pages: int, count_tokens: Callable[[str], int], size: int) -> list[str]:
    """Chunks of the first ``pages`` library pages of the Python docs, as ingestion cuts them."""
    from ingest.chunking import Chunker
    from ingest.extract import extract

    chunker = Chunker(size, 32, count_tokens=count_tokens)
    out: list[str] = []
    with tarfile.open(DATA / "crawl-pydocs311" / "v1.tar.xz") as tar:
        members = sorted((m for m in tar.getmembers() if m.name.startswith("site/library/")
                          and m.name.endswith(".html")), key=lambda m: m.name)[:pages]
        for member in members:
            data = tar.extractfile(member).read()  # type: ignore[union-attr]
            page = extract(data, "html", url=f"https://docs.python.org/3.11/{member.name[5:]}")
            out.extend(passage for _, passage in chunker.split(page.text))
    return out


def rate(fn: Callable[[], Any], n: int) -> tuple[float, Any]:
    start = time.perf_counter()
    result = fn()
    return n / (time.perf_counter() - start), result


def cosines(a: np.ndarray, b: np.ndarray) -> str:
    c = (a * b).sum(axis=1)
    return f"{c.min():.4f} | {np.percentile(c, 1):.4f} | {c.mean():.4f}"


def query_ms(embedder: Any, queries: Sequence[str]) -> float:
    embedder.embed_query(queries[0])
    times = []
    for q in queries:
        start = time.perf_counter()
        embedder.embed_query(q)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def batching(name: str, texts: list[str], run: Callable[[Sequence[int] | None], np.ndarray],
             tokens: list[int]) -> None:
    """Passages/s with batches unsorted, sorted by characters, by tokens; vectors compared."""
    base_rate, base = rate(lambda: run([0] * len(texts)), len(texts))  # a stable sort keeps the order
    line = f"| {name} | {base_rate:.1f} ({load()})"
    for lengths in (None, tokens):
        r, vectors = rate(lambda lengths=lengths: run(lengths), len(texts))
        c = (vectors * base).sum(axis=1)
        line += f" | {r:.1f} ({load()}), min cos {c.min():.6f}"
    print(line + " |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pages", type=int, default=25, help="Python docs pages to chunk")
    p.add_argument("--threads", type=int, default=None, help="default: the usable cores")
    p.add_argument("--options", action="store_true", help="also compare quantization recipes")
    args = p.parse_args()

    from rag.embedders import encode_batched
    from rag.embedders.onnx_int8 import OnnxInt8Embedder
    from rag.embedders.st import SentenceTransformerEmbedder

    fp32 = SentenceTransformerEmbedder(threads=args.threads, progress=False)
    int8 = OnnxInt8Embedder(threads=args.threads, progress=False)
    start = time.perf_counter()
    int8.load()
    print(f"int8 model ready (built or found) in {time.perf_counter() - start:.1f} s, load {load()}")
    fp32.load()
    sets = {"xquad-en paragraphs": xquad(),
            "pydocs chunks": pydocs_chunks(args.pages, fp32.count_tokens, int8.max_text_tokens)}
    queries = [json.loads(line)["text"] for line in (DATA / "xquad-en" / "queries.jsonl").open()][:50]

    print("\n| passages | n | mean tokens | cosine min | p1 | mean | fp32 passages/s | int8 passages/s |")
    print("|---|---|---|---|---|---|---|---|")
    for name, texts in sets.items():
        tokens = fp32.count_tokens_batch(texts)
        r32, v32 = rate(lambda texts=texts: fp32.embed_documents(texts), len(texts))
        l32 = load()
        r8, v8 = rate(lambda texts=texts: int8.embed_documents(texts), len(texts))
        print(f"| {name} | {len(texts)} | {statistics.mean(tokens):.0f} | {cosines(v8, v32)} | "
              f"{r32:.1f} ({l32}) | {r8:.1f} ({load()}) |")
    print(f"\nquery p50: fp32 {query_ms(fp32, queries):.1f} ms ({load()}), "
          f"int8 {query_ms(int8, queries):.1f} ms ({load()}) over {len(queries)} XQuAD questions")

    texts = sets["pydocs chunks"]
    tokens = fp32.count_tokens_batch(texts)
    print("\nBatching by length on the pydocs chunks (passages/s, load in brackets):\n")
    print("| embedder | input order | by characters | by tokens |")
    print("|---|---|---|---|")
    batching("fp32 torch", texts, lambda lengths: encode_batched(
        texts, fp32._encode, fp32.dim, fp32.batch_size, False, "", lengths), tokens)
    encodings = [int8._truncating.encode(t) for t in texts]
    # The int8 embedder runs each text alone; padded batches change its vectors (the cosine
    # columns here are to the input-order batches, not to one-at-a-time).
    batching("int8 onnx, padded batches", texts, lambda lengths: encode_batched(
        encodings, int8._run_padded, int8.dim, int8.batch_size, False, "",
        [len(t) for t in texts] if lengths is None else lengths), tokens)
    # As shipped: each text alone, a batch's texts side by side on the usable cores. The padded
    # batches above run on the session's one thread.
    alone_rate, alone = rate(lambda: encode_batched(
        encodings, int8._run, int8.dim, int8.batch_size, False, ""), len(texts))
    padded = encode_batched(encodings, int8._run_padded, int8.dim, int8.batch_size, False, "", tokens)
    print(f"| int8 onnx, each text alone, side by side (shipped) | {alone_rate:.1f} ({load()}) | | min cos to "
          f"padded by tokens {(alone * padded).sum(axis=1).min():.4f} |")

    if args.options:
        compare_options(int8, sets["xquad-en paragraphs"], fp32.embed_documents(sets["xquad-en paragraphs"]))


def compare_options(int8: Any, texts: list[str], reference: np.ndarray) -> None:
    """Build each quantization recipe from one fp32 export and score it like the shipped one."""
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from rag.embedders import encode_batched, usable_cpus
    from rag.embedders.onnx_export import export_fp32

    print("\nQuantization recipes on the XQuAD paragraphs (cosine to torch fp32):\n")
    print("| recipe | size MB | cosine min | p1 | mean | passages/s |")
    print("|---|---|---|---|---|---|")
    encodings = [int8._truncating.encode(t) for t in texts]
    with tempfile.TemporaryDirectory() as tmp:
        fp32 = Path(tmp) / "fp32.onnx"
        export_fp32(int8._model_folder(), fp32)
        recipes: dict[str, dict[str, Any] | None] = {
            "fp32 (no quantization)": None,
            "MatMul, per tensor": {"op_types_to_quantize": ["MatMul"]},
            "MatMul, per channel": {"op_types_to_quantize": ["MatMul"], "per_channel": True},
            "all ops, per tensor": {},
            "all ops, per channel (shipped)": {"per_channel": True},
        }
        for name, options in recipes.items():
            path = fp32
            if options is not None:
                path = Path(tmp) / f"q{len(os.listdir(tmp))}.onnx"
                quantize_dynamic(str(fp32), str(path), weight_type=QuantType.QInt8, **options)
            so = ort.SessionOptions()
            so.intra_op_num_threads = int8.threads or usable_cpus()
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")
            int8._model = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
            r, vectors = rate(lambda: encode_batched(encodings, int8._run, int8.dim, 1, False, ""), len(texts))
            print(f"| {name} | {path.stat().st_size / 1e6:.0f} | {cosines(vectors, reference)} | {r:.1f} ({load()}) |")


if __name__ == "__main__":
    main()
