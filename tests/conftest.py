"""Shared fixtures: the real Python docs releases, services on a fresh data dir, served corpora,
and answer caches of each backend (``new_cache``)."""

from __future__ import annotations

import contextlib
import csv
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

from ingest.services import open_services
from rag.cache import AnswerCacheLayer, make_answer_cache
from rag.config import CacheSettings, Settings
from rag.services import Services
from rag.types import AnswerCache
from tests.corpus import NEW, OLD, index_notes
from tests.fixtures.cache import NO_REDIS, REDIS_URL, flush_redis
from tests.httpserver import LocalServer, serve_dir, unpack_pydocs

if TYPE_CHECKING:
    from tests.live import Gated

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Idle OpenMP threads spin by default, which starves a 2-core machine.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
PYDOCS = DATA / "crawl-pydocs311"


@pytest.fixture(scope="session")
def pydocs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The two Python docs releases, unpacked once per session, and the list of changes."""
    base = tmp_path_factory.mktemp("pydocs")
    out: dict[str, object] = {version: unpack_pydocs(version, base) for version in ("v1", "v2")}
    with open(PYDOCS / "changes.tsv", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    out["pages"] = [r["path"] for r in rows]
    out["changed"] = sorted(r["path"] for r in rows if r["status"] == "content_changed")
    return out


def publish(src: Path, dest: Path, pages: list[str] | None = None) -> None:
    """Copy a site (or some of its pages) to the served folder, as a deploy would: the files
    get fresh modification times, so conditional requests see them as new."""
    if dest.exists():
        shutil.rmtree(dest)
    if pages is None:
        shutil.copytree(src, dest)
    else:
        for page in pages:
            target = dest / page
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / page, target)
    now = time.time()
    for path in dest.rglob("*"):
        if path.is_file():
            os.utime(path, (now, now))


def write_sitemap(folder: Path, base_url: str, pages: list[str]) -> str:
    urls = "".join(f"<url><loc>{base_url}/{p}</loc></url>" for p in pages)
    (folder / "sitemap.xml").write_text(
        '<?xml version="1.0" encoding="UTF-8"?>'
        f'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{urls}</urlset>',
        encoding="utf-8",
    )
    return f"{base_url}/sitemap.xml"


def make_settings(data_dir: Path, **overrides: object) -> Settings:
    base: dict[str, object] = {
        "data_dir": data_dir,
        "embedder": {"backend": "hash", "dim": 256, "progress": False},
        "vector": {"backend": "numpy"},
        "crawl": {"retries": 1, "backoff_s": 0.01, "timeout_s": 5, "concurrency": 4},
        # Off, so that asking a question twice generates twice; tests of the cache turn it on.
        "cache": {"backend": "off"},
    }
    base.update(overrides)
    # Adaptive fusion weights (the default) are fitted to real models' cosines; the hash
    # embedder's are character n-gram overlaps, so its tests fuse at fixed equal weights.
    # test_language_aware.py tests adaptive fusion with the packaged models.
    embedder = base["embedder"]
    if isinstance(embedder, dict) and embedder.get("backend") == "hash":
        retrieval = dict(base.get("retrieval") or {})  # type: ignore[call-overload]
        retrieval.setdefault("weights", (1.0, 1.0))
        base["retrieval"] = retrieval
    return Settings.load(None, **base)


@pytest.fixture
def services(tmp_path: Path) -> Iterator[Services]:
    """Services on a fresh data dir with the deterministic hash embedder and numpy vectors."""
    svc = open_services(make_settings(tmp_path / "data"))
    yield svc
    svc.close()


@pytest.fixture(scope="module")
def static_server_factory() -> Iterator[Callable[[Path], LocalServer]]:
    """Start real HTTP servers on 127.0.0.1 serving folders; all stop with the module."""
    with contextlib.ExitStack() as stack:
        yield lambda root: stack.enter_context(serve_dir(root))


# -- shared indexes and servers (module-scoped: each test module that asks gets its own) ----------
NOTES = {"alpha": (range(20), OLD), "beta": (range(20, 30), NEW)}
"""The two sources of ``indexed`` and ``corpus``: 20 notes modified in 2024, 10 in 2025."""


@pytest.fixture(scope="module")
def indexed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    """Two folder sources: ``alpha`` (20 notes, modified 2024) and ``beta`` (10 notes, 2025)."""
    base = tmp_path_factory.mktemp("retrieval")
    svc = index_notes(open_services(make_settings(base / "data")), base, NOTES)
    yield svc
    svc.close()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    """``alpha`` (20 notes, 2024) and ``beta`` (10 notes, 2025), indexed with the hash embedder,
    with the service's test settings (``tests.live.serve_settings``)."""
    from tests.live import serve_settings  # tests.live imports this module

    base = tmp_path_factory.mktemp("serve")
    svc = index_notes(open_services(serve_settings(base / "data")), base, NOTES)
    yield svc
    svc.close()


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    """Plain HTTP, patient enough for a busy 2-core machine."""
    with httpx.Client(timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def gen() -> Gated:
    """The extractive generator with knobs (``tests.live.Gated``), shared by a module's servers."""
    from tests.live import Gated

    return Gated()


@pytest.fixture
def knobs(gen: Gated) -> Iterator[Gated]:
    gen.reset()
    yield gen
    gen.gate.set()  # never leave a generation waiting
    gen.reset()


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.skipif(not REDIS_URL, reason=NO_REDIS))])
def new_cache(request: pytest.FixtureRequest, corpus: Services) -> Iterator[Callable[..., AnswerCacheLayer]]:
    """Builds answer caches of one backend from ``cache.*`` settings, as the answerer does, over
    the module's ``corpus``."""
    prefix = f"ragqa-test-cache:{uuid.uuid4().hex[:8]}"

    def make(**settings: object) -> AnswerCacheLayer:
        cfg = CacheSettings(backend=request.param, redis_url=REDIS_URL, prefix=prefix, **settings)
        layer = make_answer_cache(corpus, settings=cfg, salt="test")
        assert layer is not None and isinstance(layer.backend, AnswerCache)
        return layer

    yield make
    if request.param == "redis":
        flush_redis(prefix)
