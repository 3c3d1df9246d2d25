"""Ingestion figures on the full Python docs corpus (530 pages), served on loopback.

Runs, on a fresh data dir with the configured (default: embedded) backends:
  1. a full crawl of release v1 (everything is new),
  2. an incremental crawl of v1 again (conditional requests: nothing changed),
  3. a full crawl of v1 again (every page fetched and extracted, nothing re-embedded),
  4. an incremental crawl of release v2 (every file is new, five pages' text changed),
and prints pages/s, chunks/s and embeddings/s for each.

    python bench/bench_ingest.py [--embedder sentence-transformers|onnx-int8|hash] [--vector milvus|numpy]
                                 [--max-pages N] [--cold-only]
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
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

from ingest.pipeline import reindex  # noqa: E402
from ingest.registry import source_from_argument  # noqa: E402
from ingest.services import open_services  # noqa: E402
from rag.config import Settings  # noqa: E402

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--embedder", default="sentence-transformers",
                    choices=["sentence-transformers", "onnx-int8", "hash"])
    ap.add_argument("--vector", default="milvus", choices=["milvus", "numpy"])
    ap.add_argument("--max-pages", type=int, default=None, help="crawl at most this many pages (default: all)")
    ap.add_argument("--cold-only", action="store_true", help="only the first step, the cold full crawl")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="ragqa-bench-"))
    for version in ("v1", "v2"):
        with tarfile.open(DATA / f"{version}.tar.xz") as tar:
            tar.extractall(work / version, filter="data")
    served = work / "www" / "site"
    publish(work / "v1" / "site", served)
    handler = functools.partial(_Quiet, directory=str(work / "www"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/site/index.html"

    settings = Settings.load(None, data_dir=work / "data",
                             embedder={"backend": args.embedder, "progress": False},
                             vector={"backend": args.vector},
                             crawl={"max_pages": args.max_pages} if args.max_pages else {})
    services = open_services(settings)
    services.state.add_source(source_from_argument(url, name="pydocs"))
    steps = [("v1 full (cold)", "full", None), ("v1 incremental", "incremental", None),
             ("v1 full", "full", None), ("v2 incremental", "incremental", "v2")][:1 if args.cold_only else 4]
    rows = []
    for label, mode, release in steps:
        if release:
            publish(work / release / "site", served)
        t0 = time.perf_counter()
        report = reindex(services, "pydocs", mode)
        secs = time.perf_counter() - t0
        chunks = report.chunks_embedded + report.chunks_reused
        rows.append({
            "step": label, "seconds": round(secs, 2), "pages": report.fetched,
            "pages_per_s": round(report.fetched / secs, 1), "changed_or_added": report.changed + report.added,
            "chunks": chunks, "chunks_per_s": round(chunks / secs, 1) if chunks else 0.0,
            "embedded": report.chunks_embedded,
            "embeddings_per_s": round(report.chunks_embedded / secs, 1) if report.chunks_embedded else 0.0,
        })
    docs, total_chunks = services.state.counts()
    services.close()
    server.shutdown()
    shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps({"documents": docs, "chunks": total_chunks, "steps": rows}))
        return
    print(f"pydocs: {docs} documents, {total_chunks} chunks; embedder={args.embedder}, vector={args.vector}")
    header = f"{'step':18} {'seconds':>8} {'pages':>6} {'pages/s':>8} {'changed':>8} {'chunks/s':>9} {'embedded':>9} {'emb/s':>7}"
    print(header)
    for r in rows:
        print(f"{r['step']:18} {r['seconds']:8.1f} {r['pages']:6d} {r['pages_per_s']:8.1f} "
              f"{r['changed_or_added']:8d} {r['chunks_per_s']:9.1f} {r['embedded']:9d} {r['embeddings_per_s']:7.1f}")


if __name__ == "__main__":
    main()
