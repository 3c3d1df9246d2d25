"""Ingestion figures on the full Python docs corpus (530 pages), served on loopback.

Runs, on a fresh data dir with the configured (default: embedded) backends:
  1. a full crawl of release v1 (everything is new),
  2. an incremental crawl of v1 again (conditional requests: nothing changed),
  3. a full crawl of v1 again (every page fetched and extracted, nothing re-embedded),
  4. an incremental crawl of release v2 (every file is new, five pages' text changed),
and prints pages/s, chunks/s and embeddings/s for each.

With ``--embedder-alone``, after the steps the same embedder (already loaded) embeds the
stored chunk texts again on their own, in batches of the pipeline's size, and the cold
step's chunks/s is compared with that rate (the goal: ingest at 0.9 of the embedder alone).
Each step also reports the machine's busy and idle CPU seconds (``/proc/stat``: every process,
this one's extraction workers and Milvus Lite's server included), and the ratio's ceiling: the
embedder alone's seconds times the usable cores over the ingest's busy core-seconds, what the
ratio would be were the ingest's CPU work packed onto the cores with none ever idle. A ratio
near its ceiling is bound by CPU work, not by waiting.
``--embedder a,b`` and ``--rounds N`` run several embedders alternately, each on a fresh data
directory, and print one table, so figures taken under the same load sit side by side:

    python bench/bench_ingest.py --cold-only --max-pages 40 --embedder-alone \
        --embedder sentence-transformers,onnx-int8 --rounds 2

``--extract-workers`` and ``--threads`` take lists too: every embedder runs with every number
of extraction processes (``crawl.extract_workers``; 0: in the crawl's thread) and of embedder
threads (``embedder.threads``; default: the usable cores), each combination a row:

    python bench/bench_ingest.py --cold-only --max-pages 150 --embedder-alone \
        --embedder sentence-transformers,onnx-int8 --extract-workers 0,1 --threads 2

    python bench/bench_ingest.py [--embedder sentence-transformers|onnx-int8|hash[,...]] [--vector milvus|numpy]
                                 [--max-pages N] [--cold-only] [--embedder-alone] [--rounds N]
                                 [--extract-workers N[,...]] [--threads N[,...]] [--port P] [--json]
"""

from __future__ import annotations

import argparse
import functools
import http.server
import itertools
import json
import math
import os
import shutil
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ingest.pipeline import EMBED_BATCH_CHUNKS, reindex  # noqa: E402
from ingest.registry import source_from_argument  # noqa: E402
from ingest.services import open_services  # noqa: E402
from rag.config import Settings  # noqa: E402
from rag.embedders import usable_cpus  # noqa: E402

DATA = ROOT / "tests" / "data" / "crawl-pydocs311"


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


def publish(src: Path, dest: Path) -> None:
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src, dest)
    now = time.time()
    for p in dest.rglob("*"):
        if p.is_file():
            os.utime(p, (now, now))


def cpu_seconds() -> tuple[float, float]:
    """The machine's busy and idle CPU seconds so far, all cores and processes (Linux
    ``/proc/stat``; the extraction workers and Milvus Lite's server count too, and so does
    anything else running). ``(nan, nan)`` where there is no ``/proc/stat``."""
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            fields = [int(x) for x in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return math.nan, math.nan
    hz = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + fields[4]  # idle, iowait
    busy = sum(fields[:8]) - idle - fields[7]  # user nice system irq softirq (steal apart)
    return busy / hz, idle / hz


def embedder_alone(services, source: str) -> tuple[int, float]:  # type: ignore[no-untyped-def]
    """Distinct chunk texts of ``source`` and the seconds the loaded embedder takes on them,
    in batches as the pipeline makes them (documents in order, about EMBED_BATCH_CHUNKS each)."""
    texts, seen = [], set()
    for chunk in services.state.iter_chunks(source):
        if chunk.hash not in seen:
            seen.add(chunk.hash)
            texts.append((chunk.hash, chunk.text))
    t0 = time.perf_counter()
    for i in range(0, len(texts), EMBED_BATCH_CHUNKS):
        services.embedder.embed_documents([t for _, t in sorted(texts[i:i + EMBED_BATCH_CHUNKS])])
    return len(texts), time.perf_counter() - t0


def run_one(embedder: str, args: argparse.Namespace, work: Path, served: Path, url: str,
            rnd: int, workers: int | None = None, threads: int | None = None) -> dict:  # type: ignore[type-arg]
    publish(work / "v1" / "site", served)
    # A data directory per run: Milvus Lite keeps one server per file path in the process, and
    # one whose file was deleted cannot be reopened.
    data = Path(tempfile.mkdtemp(prefix=f"data-{embedder}-{rnd}-", dir=work))
    shutil.rmtree(data, ignore_errors=True)
    crawl: dict[str, int] = {"max_pages": args.max_pages} if args.max_pages else {}
    if workers is not None:
        crawl["extract_workers"] = workers
    settings = Settings.load(None, data_dir=data,
                             embedder={"backend": embedder, "progress": False, "threads": threads},
                             vector={"backend": args.vector}, crawl=crawl)
    services = open_services(settings)
    services.state.add_source(source_from_argument(url, name="pydocs"))
    steps = [("v1 full (cold)", "full", None), ("v1 incremental", "incremental", None),
             ("v1 full", "full", None), ("v2 incremental", "incremental", "v2")][:1 if args.cold_only else 4]
    rows = []
    for label, mode, release in steps:
        if release:
            publish(work / release / "site", served)
        t0, (busy0, idle0) = time.perf_counter(), cpu_seconds()
        report = reindex(services, "pydocs", mode)
        secs = time.perf_counter() - t0
        busy1, idle1 = cpu_seconds()
        chunks = report.chunks_embedded + report.chunks_reused
        rows.append({
            "step": label, "seconds": round(secs, 2), "pages": report.fetched,
            "pages_per_s": round(report.fetched / secs, 1), "changed_or_added": report.changed + report.added,
            "chunks": chunks, "chunks_per_s": round(chunks / secs, 1) if chunks else 0.0,
            "embedded": report.chunks_embedded,
            "embeddings_per_s": round(report.chunks_embedded / secs, 1) if report.chunks_embedded else 0.0,
            "load_1m": round(os.getloadavg()[0], 1),
            "busy_core_s": round(busy1 - busy0, 1), "idle_core_s": round(idle1 - idle0, 1),
        })
    out: dict = {"embedder": embedder, "steps": rows,  # type: ignore[type-arg]
                 "extract_workers": settings.crawl.extract_workers, "threads": threads}
    if args.embedder_alone:
        busy0, _ = cpu_seconds()
        n, secs = embedder_alone(services, "pydocs")
        busy1, _ = cpu_seconds()
        cold = rows[0]
        out["alone"] = {"texts": n, "seconds": round(secs, 2), "chunks_per_s": round(n / secs, 1),
                        "load_1m": round(os.getloadavg()[0], 1), "busy_core_s": round(busy1 - busy0, 1)}
        out["ratio"] = round(cold["embeddings_per_s"] / (n / secs), 3)
        # Were the cold ingest's CPU work done with no core ever idle, it would take
        # busy / cores seconds: the ratio cannot pass alone-seconds * cores / busy.
        out["ratio_ceiling"] = round(secs * usable_cpus() / cold["busy_core_s"], 3)
    out["documents"], out["chunks"] = services.state.counts()
    services.close()
    shutil.rmtree(data, ignore_errors=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--embedder", default="sentence-transformers",
                    help="sentence-transformers, onnx-int8 or hash; several, comma-separated, run alternately")
    ap.add_argument("--vector", default="milvus", choices=["milvus", "numpy"])
    ap.add_argument("--max-pages", type=int, default=None, help="crawl at most this many pages (default: all)")
    ap.add_argument("--cold-only", action="store_true", help="only the first step, the cold full crawl")
    ap.add_argument("--embedder-alone", action="store_true",
                    help="also time the embedder alone on the same chunk texts, and the ratio")
    ap.add_argument("--rounds", type=int, default=1, help="run the embedders alternately this many times")
    ap.add_argument("--extract-workers", default=None,
                    help="extraction processes (crawl.extract_workers), comma-separated; default: the setting's")
    ap.add_argument("--threads", default=None,
                    help="embedder threads (embedder.threads), comma-separated; default: the usable cores")
    ap.add_argument("--port", type=int, default=18200, help="loopback port of the served site")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    embedders = [e.strip() for e in args.embedder.split(",") if e.strip()]
    for e in embedders:
        if e not in ("sentence-transformers", "onnx-int8", "hash"):
            ap.error(f"unknown embedder {e!r}: choose sentence-transformers, onnx-int8 or hash")

    work = Path(tempfile.mkdtemp(prefix="ragqa-bench-"))
    for version in ("v1", "v2"):
        with tarfile.open(DATA / f"{version}.tar.xz") as tar:
            tar.extractall(work / version, filter="data")
    served = work / "www" / "site"
    handler = functools.partial(_Quiet, directory=str(work / "www"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/site/index.html"

    def numbers(text: str | None) -> list[int | None]:
        return [int(x) for x in text.split(",") if x.strip()] if text else [None]

    runs = []
    for rnd in range(args.rounds):
        for emb, workers, threads in itertools.product(
                embedders, numbers(args.extract_workers), numbers(args.threads)):
            result = run_one(emb, args, work, served, url, rnd, workers, threads)
            result["round"] = rnd + 1
            runs.append(result)
            if not args.json:
                _print(result, args)
    server.shutdown()
    shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(runs))
        return
    if len(runs) > 1 and args.embedder_alone:
        print("\nembedder              workers threads round  ingest s  ingest chunks/s  alone chunks/s  ratio  "
              "ceiling  load")
        for r in runs:
            c = r["steps"][0]
            print(f"{r['embedder']:21} {r['extract_workers']:7d} {r['threads'] or 'auto':>7} {r['round']:5d} "
                  f"{c['seconds']:9.1f} {c['embeddings_per_s']:16.1f} {r['alone']['chunks_per_s']:15.1f} "
                  f"{r['ratio']:6.2f} {r['ratio_ceiling']:8.2f}  {c['load_1m']}/{r['alone']['load_1m']}")


def _print(r: dict, args: argparse.Namespace) -> None:  # type: ignore[type-arg]
    print(f"pydocs: {r['documents']} documents, {r['chunks']} chunks; embedder={r['embedder']}, "
          f"extract_workers={r['extract_workers']}, threads={r['threads'] or 'auto'}, vector={args.vector}, "
          f"round {r['round']}", flush=True)
    header = (f"{'step':18} {'seconds':>8} {'pages':>6} {'pages/s':>8} {'changed':>8} {'chunks/s':>9} "
              f"{'embedded':>9} {'emb/s':>7} {'load':>5}")
    print(header + f" {'busy core-s':>11} {'idle core-s':>11}")
    for s in r["steps"]:
        print(f"{s['step']:18} {s['seconds']:8.1f} {s['pages']:6d} {s['pages_per_s']:8.1f} "
              f"{s['changed_or_added']:8d} {s['chunks_per_s']:9.1f} {s['embedded']:9d} {s['embeddings_per_s']:7.1f} "
              f"{s['load_1m']:5.1f} {s['busy_core_s']:11.1f} {s['idle_core_s']:11.1f}")
    if "alone" in r:
        a = r["alone"]
        print(f"embedder alone on the same {a['texts']} texts: {a['seconds']:.1f} s, {a['chunks_per_s']} chunks/s "
              f"(load {a['load_1m']}, {a['busy_core_s']} busy core-s); ingest/alone = {r['ratio']:.2f}, "
              f"at most {r['ratio_ceiling']:.2f} for the ingest's CPU work on {usable_cpus()} cores")


if __name__ == "__main__":
    main()
