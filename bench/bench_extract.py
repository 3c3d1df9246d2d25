"""HTML extraction: seconds per page and the text it gives, for trafilatura settings side by side.

Each page of a corpus goes through :func:`ingest.extract.extract` once per variant of the
``bare_extraction`` call in :mod:`ingest.htmlpage`; the text of each variant is compared with
the first variant's: share of identical pages, similarity of the others (difflib's ratio over
lines, weighted by their characters), and the lines only one of them has.

Variants:
  recall       ``favor_recall=True`` with trafilatura's fallback extractors (ragqa before 2026-12)
  fast         ``favor_recall=True, fast=True``: no fallback (readability, jusText) comparison
  main-fast    ``fast=True`` on the page's one ``<main>`` / ``role=main`` element, when it has one
  current      whatever ingest.htmlpage does now

Corpora: ``pydocs-v1`` / ``pydocs-v2`` (the Python docs releases in tests/data), or a folder of
``.html`` files (e.g. a QA set rendered with ../shared/data/tools/render_site.py):

    python bench/bench_extract.py pydocs-v1 --variants recall,fast,main-fast [--limit N] [--show 3]
    python bench/bench_extract.py /tmp/h2-sites/xquad-en --variants recall,current
"""

from __future__ import annotations

import argparse
import difflib
import os
import statistics
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import trafilatura  # noqa: E402

import ingest.htmlpage as htmlpage  # noqa: E402
from ingest.extract import extract  # noqa: E402

PYDOCS = ROOT / "tests" / "data" / "crawl-pydocs311"
_CURRENT = htmlpage.bare_extraction


def _recall(tree: Any, **kw: Any) -> Any:
    return trafilatura.bare_extraction(tree, **{**kw, "favor_recall": True, "fast": False})


def _fast(tree: Any, **kw: Any) -> Any:
    return trafilatura.bare_extraction(tree, **{**kw, "favor_recall": True, "fast": True})


def _main_fast(tree: Any, **kw: Any) -> Any:
    mains = tree.xpath("//main|//*[@role='main']")
    return _fast(mains[0] if len(mains) == 1 else tree, **kw)


VARIANTS: dict[str, Callable[..., Any]] = {"recall": _recall, "fast": _fast, "main-fast": _main_fast,
                                           "current": _CURRENT}


def pages(corpus: str) -> Iterator[tuple[str, bytes]]:
    if corpus.startswith("pydocs-"):
        with tarfile.open(PYDOCS / f"{corpus.split('-', 1)[1]}.tar.xz") as tar:
            for member in tar:
                if member.isfile() and member.name.endswith(".html"):
                    fh = tar.extractfile(member)
                    assert fh is not None
                    yield member.name, fh.read()
        return
    if Path(corpus, "v1").is_dir() and not any(Path(corpus).glob("*.html")):
        corpus = str(Path(corpus, "v1"))
    for path in sorted(Path(corpus).rglob("*.html")):
        yield str(path.relative_to(corpus)), path.read_bytes()


def run(corpus: str, variants: list[str], limit: int | None) -> dict[str, Any]:
    texts: dict[str, dict[str, str]] = {v: {} for v in variants}
    secs: dict[str, list[float]] = {v: [] for v in variants}
    for n, (name, data) in enumerate(pages(corpus)):
        if limit is not None and n >= limit:
            break
        url = f"http://127.0.0.1/{name}"
        for v in variants:
            htmlpage.bare_extraction = VARIANTS[v]  # type: ignore[assignment]
            t0 = time.perf_counter()
            page = extract(data, "html", url=url)
            secs[v].append(time.perf_counter() - t0)
            texts[v][name] = f"{page.title}\n{page.text}"
    htmlpage.bare_extraction = _CURRENT  # type: ignore[assignment]
    return {"texts": texts, "secs": secs}


def _similarity(a: list[str], b: list[str]) -> float:
    """difflib's ratio counted in characters over matching lines: 2 * matched / (len(a) + len(b)).

    (A character-level SequenceMatcher is quadratic on these 10-100 KB pages: minutes per corpus.)
    """
    matched = sum(sum(len(x) for x in a[m.a:m.a + m.size])
                  for m in difflib.SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks())
    total = sum(map(len, a)) + sum(map(len, b))
    return 2 * matched / total if total else 1.0


def compare(base: dict[str, str], other: dict[str, str], show: int) -> dict[str, Any]:
    same = [k for k in base if base[k] == other[k]]
    ratios, only_base, only_other, shown = [], 0, 0, []
    for k in base:
        if base[k] == other[k]:
            continue
        a, b = base[k].splitlines(keepends=True), other[k].splitlines(keepends=True)
        ratios.append(_similarity(a, b))
        gone = [line for line in a if line not in set(b)]
        new = [line for line in b if line not in set(a)]
        only_base += sum(len(x) for x in gone)
        only_other += sum(len(x) for x in new)
        if len(shown) < show:
            shown.append((k, ratios[-1], gone[:4], new[:4]))
    return {"pages": len(base), "identical": len(same), "ratios": ratios, "chars_only_base": only_base,
            "chars_only_other": only_other, "chars_base": sum(len(t) for t in base.values()),
            "chars_other": sum(len(t) for t in other.values()), "shown": shown}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("corpus", help="pydocs-v1, pydocs-v2 or a folder of .html files")
    ap.add_argument("--variants", default="recall,fast,main-fast", help=f"of {', '.join(VARIANTS)}")
    ap.add_argument("--limit", type=int, default=None, help="at most this many pages")
    ap.add_argument("--show", type=int, default=3, help="differing pages to show per variant")
    args = ap.parse_args()
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for v in variants:
        if v not in VARIANTS:
            ap.error(f"unknown variant {v!r}")
    load0 = os.getloadavg()[0]
    result = run(args.corpus, variants, args.limit)
    print(f"{args.corpus}: {len(result['texts'][variants[0]])} pages; trafilatura {trafilatura.__version__}; "
          f"load {load0:.2f} -> {os.getloadavg()[0]:.2f}")
    print(f"{'variant':10} {'total s':>8} {'mean ms':>8} {'median ms':>9} {'p90 ms':>7} {'identical':>10} "
          f"{'min ratio':>9} {'mean ratio*':>11} {'chars':>10}")
    base = result["texts"][variants[0]]
    for v in variants:
        s = sorted(result["secs"][v])
        c = compare(base, result["texts"][v], args.show)
        mean_ratio = statistics.fmean(c["ratios"]) if c["ratios"] else 1.0
        print(f"{v:10} {sum(s):8.1f} {1000 * statistics.fmean(s):8.1f} {1000 * statistics.median(s):9.1f} "
              f"{1000 * s[int(0.9 * (len(s) - 1))]:7.1f} {c['identical']:5d}/{c['pages']:<4d} "
              f"{min(c['ratios'], default=1.0):9.4f} {mean_ratio:11.4f} {c['chars_other']:10d}")
        if v != variants[0] and c["ratios"]:
            print(f"  vs {variants[0]}: {len(c['ratios'])} pages differ; characters on lines only in "
                  f"{variants[0]}: {c['chars_only_base']}, only in {v}: {c['chars_only_other']} "
                  f"(of {c['chars_base']} / {c['chars_other']})")
            for name, ratio, gone, new in c["shown"]:
                print(f"  {name} (ratio {ratio:.4f})")
                for line in gone:
                    print(f"    - {line[:160]}")
                for line in new:
                    print(f"    + {line[:160]}")
    print("* mean ratio over the pages that differ from the first variant")


if __name__ == "__main__":
    main()
