"""A simulated day of hourly incremental reindexes under a question log: how many answers the
cache keeps, and whether any of them is stale.

The site is a slice of the Python docs (``--pages`` pages of ``tutorial/``, ``howto/`` and
``library/``, release v1), a folder source indexed with the packaged MiniLM and answered by the
extractive generator (deterministic, so a cached answer can be compared with a fresh one).
Each of ``--hours`` hours:

1. the site changes like a docs site does: at ``--release-hour`` every page becomes its v2
   release (the real diff of the two releases: the text of 5 pages, always in the slice,
   and the markup and footers of the rest), and in
   ``--edit-hours`` one page gains a paragraph; the other hours nothing changes;
2. an incremental reindex runs (the scheduler's hourly job);
3. ``--asks`` questions are asked, drawn with a Zipf law (``--zipf``) from a log of questions
   made from the pages' section headings ("What about <heading> in <page>?"): popular
   questions repeat, as in a real log.

Three caches answer the same questions side by side over the same index:

- ``deps``: the cache as it is (dependency invalidation, rechecks after additions);
- ``epoch``: the previous rule, every run starts a new scope (a purge after each run);
- ``never``: nothing is invalidated (the upper bound on hits, and what it costs in staleness).

Every answer a cache serves is compared with the answer generated afresh (``no_cache``) at
that moment: a difference is a **stale hit**. Prints the hit rate per hour and for the day.

    python bench/bench_cache_day.py                     # 40 pages, 24 hours, ~6 min on 2 cores
    python bench/bench_cache_day.py --pages 80 --asks 100 --json day.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ingest.pipeline import reindex  # noqa: E402
from ingest.services import open_services  # noqa: E402
from rag.answer import Answerer  # noqa: E402
from rag.cache import AnswerCacheLayer, MemoryAnswerCache, config_fingerprint  # noqa: E402
from rag.config import Settings, SourceConfig  # noqa: E402
from rag.generators.extractive import ExtractiveGenerator  # noqa: E402
from rag.services import Services  # noqa: E402
from tests.httpserver import unpack_pydocs  # noqa: E402

POLICIES = ("deps", "epoch", "never")


def pick_pages(v1: Path, v2: Path, n: int, rng: random.Random) -> list[str]:
    """``n`` pages, those whose text the v2 release changed first (the rest changed markup only)."""
    changed = [line.split("\t")[0] for line in (ROOT / "tests/data/crawl-pydocs311/changes.tsv").read_text().splitlines()
               if "\tcontent_changed\t" in line]
    pages = sorted(str(p.relative_to(v1)) for folder in ("tutorial", "howto", "library")
                   for p in (v1 / folder).glob("*.html") if (v2 / p.relative_to(v1)).exists())
    rest = [p for p in pages if p not in changed]
    return sorted([p for p in changed if p in pages] + rng.sample(rest, max(0, min(n, len(pages)) - len(changed))))


def questions_from(services: Services, limit: int, rng: random.Random) -> list[str]:
    seen: dict[str, None] = {}
    for chunk in services.state.iter_chunks():
        heading = " ".join(chunk.heading.replace("¶", "").split()[-6:])
        if heading and len(heading) > 3:
            seen.setdefault(f"What about {heading} in {chunk.title.split('—')[0].strip()}?", None)
    log = list(seen)
    rng.shuffle(log)
    return log[:limit]


def zipf_sample(log: list[str], k: int, s: float, rng: random.Random) -> list[str]:
    weights = [1 / (i + 1) ** s for i in range(len(log))]
    return rng.choices(log, weights=weights, k=k)


async def answer(answerer: Answerer, question: str, no_cache: bool = False) -> tuple[str, str]:
    result = await answerer.ask(question, no_cache=no_cache)
    return result.text, result.cache


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", type=int, default=40)
    ap.add_argument("--hours", type=int, default=24)
    ap.add_argument("--asks", type=int, default=60, help="questions asked per hour")
    ap.add_argument("--log-size", type=int, default=200, help="distinct questions in the log")
    ap.add_argument("--zipf", type=float, default=1.1)
    ap.add_argument("--release-hour", type=int, default=9)
    ap.add_argument("--edit-hours", default="3,14,20")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json", dest="json_out")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="ragqa-cache-day-"))
    v1, v2 = unpack_pydocs("v1", work / "pydocs"), unpack_pydocs("v2", work / "pydocs")
    site = work / "site"
    pages = pick_pages(v1, v2, args.pages, rng)
    for page in pages:
        (site / page).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(v1 / page, site / page)

    settings = Settings(data_dir=work / "data", embedder={"backend": "sentence-transformers", "progress": False},
                        generator={"backend": "extractive"}, cache={"backend": "off"})
    services = open_services(settings)
    services.state.add_source(SourceConfig(name="pydocs", kind="folder", location=str(site), lang="en"))
    started = time.monotonic()
    with services.write_lock():
        first = reindex(services, "pydocs", "full")
    print(f"indexed {len(pages)} pages, {services.state.counts()[1]} chunks in {time.monotonic() - started:.0f} s",
          file=sys.stderr)
    log = questions_from(services, args.log_size, rng)
    generator = ExtractiveGenerator()
    fingerprint = config_fingerprint(settings, generator.name)

    def layer(policy: str) -> AnswerCacheLayer:
        # Exact lookups only: a semantic hit is another question's answer by design, which the
        # comparison with a fresh answer would count as stale (the threshold is measured by
        # ``ragqa eval cache``).
        return AnswerCacheLayer(MemoryAnswerCache(), embed=None, fingerprint=fingerprint,
                                changes=services.state if policy == "deps" else None,
                                default_top_k=settings.retrieval.top_k)

    answerers = {p: Answerer(services, generator=generator, cache=layer(p)) for p in POLICIES}
    fresh = Answerer(services, generator=generator, cache=layer("never"))
    edit_hours = {int(h) for h in args.edit_hours.split(",") if h}
    rows, totals = [], {p: {"asked": 0, "hits": 0, "stale": 0} for p in POLICIES}

    async def hour_of_questions(hour: int, report: dict) -> dict:
        row = {"hour": hour, "changed": report["changed"] + report["added"] + report["deleted"],
               "dropped": 0}
        for policy in POLICIES:
            row[policy] = {"hits": 0, "stale": 0}
        for question in zipf_sample(log, args.asks, args.zipf, rng):
            truth, _ = await answer(fresh, question, no_cache=True)
            for policy, answerer in answerers.items():
                text, cache = await answer(answerer, question)
                totals[policy]["asked"] += 1
                if cache in ("hit", "semantic"):
                    row[policy]["hits"] += 1
                    totals[policy]["hits"] += 1
                    if text != truth:
                        row[policy]["stale"] += 1
                        totals[policy]["stale"] += 1
        row["dropped"] = answerers["deps"].cache.backend.stats()["dropped"]  # type: ignore[union-attr]
        return row

    for hour in range(args.hours):
        if hour == args.release_hour:
            for page in pages:
                shutil.copy2(v2 / page, site / page)
                (site / page).touch()
        if hour in edit_hours:
            page = site / rng.choice(pages)
            text = page.read_text(encoding="utf-8")
            page.write_text(text.replace("</h1>", f"</h1><p>Note added at hour {hour}: the behaviour of this "
                                                  "module changed in this release.</p>", 1), encoding="utf-8")
        with services.write_lock():
            report = reindex(services, "pydocs", "incremental").as_dict() if hour else first.as_dict()
        if hour:
            answerers["epoch"].cache.clear()  # type: ignore[union-attr]  # the previous rule: a new scope per run
        row = asyncio.run(hour_of_questions(hour, report))
        rows.append(row)
        cells = "  ".join(f"{p} {row[p]['hits']:3d} ({row[p]['stale']} stale)" for p in POLICIES)
        print(f"hour {hour:2d}: {row['changed']:3d} pages changed  {cells}", file=sys.stderr)

    summary = {p: {**t, "hit_rate": round(t["hits"] / max(t["asked"], 1), 3)} for p, t in totals.items()}
    deps_stats = answerers["deps"].cache.stats()  # type: ignore[union-attr]
    print("\n| policy | asked | hits | hit rate | stale hits |\n|---|---|---|---|---|")
    for p, t in summary.items():
        print(f"| {p} | {t['asked']} | {t['hits']} | {t['hit_rate']:.1%} | {t['stale']} |")
    print(f"\ndeps: {deps_stats['dropped']} answers dropped by changes, rechecks {deps_stats['rechecks']}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"args": vars(args), "rows": rows, "summary": summary,
                                                   "deps": deps_stats}, indent=1))
    services.close()
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
