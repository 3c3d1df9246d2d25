"""What reading the live experiment costs a request, and how soon a change reaches a reader.

Every answer reads the experiment before it starts (rag/experiments.py): a ``stat`` of
``<data_dir>/experiment.json`` without Redis, one GET with ``serve.redis_url``. This prints the
per-read time (p50, p99) of each store and of assigning an arm, and the time from a save by one
store object to the change being seen by another (a second worker, in effect).

    python bench/bench_experiment_store.py [--redis redis://127.0.0.1:6379/0] [--reads 5000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from rag.experiments import Arm, Experiment, FileExperimentStore, RedisExperimentStore


def _pct(samples: list[float], q: int) -> float:
    return statistics.quantiles(samples, n=100)[q - 1] * 1e6


async def _reads(store, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        await store.current()
        out.append(time.perf_counter() - t)
    return out


async def _propagation(writer, reader, exp: Experiment, rounds: int = 50) -> list[float]:
    out = []
    for i in range(rounds):
        version = Experiment.create(exp.name, [Arm("control", "default", 1), Arm("alt", "alt", i + 1)])
        t = time.perf_counter()
        writer.save(version)
        while await reader.current() != version:
            pass
        out.append(time.perf_counter() - t)
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--redis", help="A Redis URL to measure the Redis store too.")
    parser.add_argument("--reads", type=int, default=5000)
    args = parser.parse_args()
    exp = Experiment.create("bench", [Arm("control", "default", 90), Arm("alt", "alt", 10)])
    stores = []
    folder = Path(tempfile.mkdtemp())
    stores.append(("file", FileExperimentStore(folder / "experiment.json"), FileExperimentStore(folder / "experiment.json")))
    if args.redis:
        key = f"ragqa-bench:{uuid.uuid4().hex[:8]}:experiment"
        stores.append(("redis", RedisExperimentStore(args.redis, key), RedisExperimentStore(args.redis, key)))
    units = [f"key:{i}" for i in range(args.reads)]
    t = time.perf_counter()
    for u in units:
        exp.assign(u)
    print(f"assign an arm: {(time.perf_counter() - t) / len(units) * 1e6:.2f} us per request")
    for name, writer, reader in stores:
        writer.save(exp)
        reads = await _reads(reader, args.reads)
        seen = await _propagation(writer, reader, exp)
        print(f"{name} store: read p50 {_pct(reads, 50):.1f} us, p99 {_pct(reads, 99):.1f} us; "
              f"a save seen by another reader after p50 {_pct(seen, 50) / 1000:.2f} ms, "
              f"max {max(seen) * 1000:.2f} ms (including the save)")
        if name == "redis":
            import redis

            redis.Redis.from_url(args.redis).delete(writer.key)
            await reader.aclose()
            await writer.aclose()


if __name__ == "__main__":
    asyncio.run(main())
