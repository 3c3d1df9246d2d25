"""The ingestion state's cost: ingesting a small folder, and ``state.get_chunks`` of 8 ids.

Ingests ``--docs`` generated Markdown notes (a few chunks each) with the hash embedder and
the numpy vector store, so the state database's share is as large as it gets, in a fresh
data directory each of ``--runs`` times; then times an incremental reindex that changes
nothing, and ``get_chunks`` of 8 random stored ids (what hydrating a page of hits costs on the
embedded default) and ``change_token`` (what every answer-cache lookup costs). The state is
SQLite in the data directory, or ``--url`` (a PostgreSQL URL: the bench works in a schema of
its own, dropped at the end).

    python bench/bench_state.py [--docs 200] [--runs 3] [--repeats 3000] [--url postgresql+psycopg://...]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ingest.pipeline import reindex  # noqa: E402
from ingest.services import open_services  # noqa: E402
from rag.config import Settings, SourceConfig  # noqa: E402
from rag.services import Services  # noqa: E402

WORDS = ("river mountain lantern copper violin harbor meadow glacier falcon orchard compass thunder marble "
         "velvet canyon beacon saddle ember willow quartz tundra anchor cobalt prairie lagoon").split()


def write_notes(folder: Path, n: int) -> None:
    rnd = random.Random(0)
    folder.mkdir(parents=True)
    for i in range(n):
        paras = ["\n".join(" ".join(rnd.choices(WORDS, k=12)).capitalize() + "." for _ in range(8))
                 for _ in range(4)]
        (folder / f"note{i:04d}.md").write_text(f"# Note {i}\n\n" + "\n\n".join(paras) + "\n", encoding="utf-8")


def timed(fn: Callable[[], object], repeats: int) -> str:
    samples = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    samples.sort()
    p50, p99 = samples[len(samples) // 2], samples[int(len(samples) * 0.99)]
    return f"p50 {p50 * 1e6:8.1f} us   p99 {p99 * 1e6:8.1f} us   mean {statistics.fmean(samples) * 1e6:8.1f} us"


def pg_schema(url: str) -> tuple[str, Callable[[], None]]:
    """A fresh schema on the PostgreSQL at ``url``: the URL that works in it, and its drop."""
    import sqlalchemy as sa

    name = f"bench_{uuid.uuid4().hex[:10]}"
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{name}"')

    def drop() -> None:
        with engine.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA "{name}" CASCADE')
        engine.dispose()

    scoped = sa.make_url(url).update_query_dict({"options": f"-csearch_path={name}"})
    return scoped.render_as_string(hide_password=False), drop


def report_figures(services: Services, settings: Settings, added: int, full: list[float], full_cpu: list[float],
                   incremental: list[float], repeats: int) -> None:
    docs, chunks = services.state.counts()  # type: ignore[attr-defined]
    ids = [c.id for c in services.state.iter_chunks()]  # type: ignore[attr-defined]
    rnd = random.Random(1)
    pages = [rnd.sample(ids, 8) for _ in range(64)]
    get = services.state.get_chunks
    assert len(get(pages[0])) == 8
    it = iter(range(10**9))
    print(f"state: {settings.state_url.split('?')[0]}  ({docs} documents, {chunks} chunks, {added} added by the full run)")
    print(f"full ingest          median {statistics.median(full):7.3f} s   runs {', '.join(f'{x:.3f}' for x in full)}")
    print(f"full ingest, CPU     median {statistics.median(full_cpu):7.3f} s   (this process, all threads)")
    print(f"incremental, no-op   median {statistics.median(incremental):7.3f} s   "
          f"runs {', '.join(f'{x:.3f}' for x in incremental)}")
    print(f"get_chunks(8 ids)    {timed(lambda: get(pages[next(it) % 64]), repeats)}")
    print(f"change_token()       {timed(services.state.change_token, repeats)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=200, help="notes in the folder")
    ap.add_argument("--runs", type=int, default=3, help="fresh ingests (the median is printed)")
    ap.add_argument("--repeats", type=int, default=3000, help="get_chunks / change_token calls")
    ap.add_argument("--url", default=None, help="state.url (default: SQLite in the data directory)")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        write_notes(base / "notes", args.docs)
        full, full_cpu, incremental = [], [], []
        for run in range(args.runs):
            drop: Callable[[], None] = lambda: None  # noqa: E731
            state: dict[str, object] = {}
            if args.url:
                scoped, drop = pg_schema(args.url)
                state = {"url": scoped}
            settings = Settings.load(
                None, data_dir=base / f"data{run}", state=state,
                embedder={"backend": "hash", "dim": 256, "progress": False}, vector={"backend": "numpy"},
                cache={"backend": "off"})
            services = open_services(settings)
            try:
                services.state.add_source(SourceConfig(name="notes", kind="folder", location=str(base / "notes")))
                with services.write_lock():
                    t, cpu = time.perf_counter(), time.process_time()
                    report = reindex(services, "notes", "full")
                    full.append(time.perf_counter() - t)
                    full_cpu.append(time.process_time() - cpu)
                    t = time.perf_counter()
                    reindex(services, "notes", "incremental")
                    incremental.append(time.perf_counter() - t)
                if run == args.runs - 1:
                    report_figures(services, settings, report.added, full, full_cpu, incremental, args.repeats)
            finally:
                services.close()
                drop()


if __name__ == "__main__":
    main()
