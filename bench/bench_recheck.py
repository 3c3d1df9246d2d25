"""What a recheck costs: an answer-cache hit whose sources gained documents since it was stored.

The answerer then retrieves and packs the context again (no generation) and serves the cached
answer only if it is the same passages. This times, in process on an existing index (a data
directory made by ``bench/bench_serve.py --data-dir``, or any other), for ``--questions``
questions: the miss that stores each answer, a plain exact hit, and a recheck (forced by
telling the cache that every source gained a chunk), as the answer's ``total_ms``.

    python bench/bench_recheck.py --data-dir /tmp/bsv-minilm --questions 40
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ingest.services import open_services  # noqa: E402
from rag.answer import Answerer  # noqa: E402
from rag.config import Settings  # noqa: E402
from rag.generators.extractive import ExtractiveGenerator  # noqa: E402
from rag.types import IndexChange  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", required=True, type=Path)
    ap.add_argument("--questions", type=int, default=40)
    args = ap.parse_args()
    config = args.data_dir / "bench.yaml"
    settings = Settings.load(str(config) if config.exists() else None, data_dir=args.data_dir,
                             cache={"backend": "memory"})
    services = open_services(settings)
    questions = json.loads((args.data_dir / "questions.json").read_text())[: args.questions]
    answerer = Answerer(services, generator=ExtractiveGenerator())
    sources = [s.name for s in services.state.sources()]
    times: dict[str, list[float]] = {"miss": [], "hit": [], "recheck kept": [], "recheck stale": []}

    async def run() -> None:
        for q in questions:
            first = await answerer.ask(q)
            hit = await answerer.ask(q)
            answerer.cache.backend.apply([IndexChange(0, s, added=1) for s in sources])  # type: ignore[union-attr]
            before = answerer.cache.backend.stats()["rechecks"]  # type: ignore[union-attr]
            again = await answerer.ask(q)
            after = answerer.cache.backend.stats()["rechecks"]  # type: ignore[union-attr]
            kind = "recheck kept" if after["kept"] > before["kept"] else "recheck stale"
            times["miss"].append(first.timings["total_ms"])
            times["hit"].append(hit.timings["total_ms"])
            times[kind].append(again.timings["total_ms"])

    asyncio.run(run())
    print(f"{len(questions)} questions on {args.data_dir} ({services.state.counts()[1]} chunks, "
          f"{services.embedder.name}, retrieval {settings.retrieval.mode})")
    print("| answer | n | p50 ms | p90 ms |\n|---|---|---|---|")
    for kind, values in times.items():
        if values:
            values.sort()
            print(f"| {kind} | {len(values)} | {statistics.median(values):.2f} | {values[int(0.9 * (len(values) - 1))]:.2f} |")
    services.close()


if __name__ == "__main__":
    main()
