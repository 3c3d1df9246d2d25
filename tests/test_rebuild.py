"""Crash-safe full rebuilds (begin_rebuild / commit_rebuild / abort_rebuild / cleanup) on
tantivy and numpy on disk, on Milvus Lite and on a Milvus server (RAG_TEST_MILVUS_URI): the
switch, reads while it happens, a rebuild killed halfway, and indexes written before
generations existed."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from rag.errors import BackendError, DataDirLocked
from rag.lexical.tantivy_index import TantivyIndex
from rag.types import Chunk
from rag.vectors.numpy_index import NumpyVectorIndex
from tests.backend_suite import make_corpus, unit_vectors
from tests.fixtures.milvus import collection_name

ROOT = Path(__file__).resolve().parent.parent
DIM = 8
QUERY = unit_vectors(1, DIM, seed=99)[0]


def content(prefix: str, n: int, seed: int) -> tuple[list[Chunk], np.ndarray]:
    chunks = [replace(c, id=f"{prefix}{i:03d}", doc_id=f"{prefix}-doc{i // 3}")
              for i, c in enumerate(make_corpus(n, seed=seed))]
    return chunks, unit_vectors(n, DIM, seed=seed)


OLD, NEW = content("old", 30, 1), content("new", 20, 2)
OLD_IDS, NEW_IDS = {c.id for c in OLD[0]}, {c.id for c in NEW[0]}
SERVER_URI = os.environ.get("RAG_TEST_MILVUS_URI", "")
# The Milvus server's kind: skipped without a server, run as an integration test with one.
MILVUS_SERVER = pytest.param("milvus-server", marks=[
    pytest.mark.integration,
    pytest.mark.skipif(not SERVER_URI, reason="RAG_TEST_MILVUS_URI is not set"),
])


class Backend:
    """Opens instances of one backend at one location, writes and reads them alike."""

    def __init__(self, kind: str, location: str, collection: str = "") -> None:
        self.kind, self.location, self.collection = kind, location, collection
        self.milvus = kind in ("milvus", "milvus-server")

    def open(self):
        if self.kind == "tantivy":
            return TantivyIndex(Path(self.location))
        if self.kind == "numpy":
            return NumpyVectorIndex(Path(self.location), DIM)
        from rag.vectors.milvus import MilvusVectorIndex

        return MilvusVectorIndex(self.location, self.collection, DIM)

    def write(self, index, data: tuple[list[Chunk], np.ndarray], start: int = 0,
              stop: int | None = None) -> None:
        chunks, vectors = data
        if self.kind == "tantivy":
            index.upsert(chunks[start:stop])
        else:
            index.upsert(chunks[start:stop], vectors[start:stop])

    def hit_ids(self, index) -> set[str]:
        """A search that every stored chunk matches."""
        hits = index.search("common", k=100) if self.kind == "tantivy" else index.search(QUERY, k=100)
        assert all(h.chunk is not None and h.chunk.id == h.chunk_id for h in hits)
        return {h.chunk_id for h in hits}

    def assert_holds(self, index, ids: set[str]) -> None:
        assert index.chunk_ids() == ids
        assert self.hit_ids(index) == ids
        assert index.count() == len(ids)

    def physical(self) -> list[str]:
        """The physical indexes on disk or on the server, live or not."""
        if self.kind == "tantivy":
            folder = Path(self.location)
            names = sorted(p.name for p in folder.iterdir() if p.name.startswith(("gen-", ".trash-")))
            return ["."] * (folder / "meta.json").exists() + names
        if self.kind == "numpy":
            with sqlite3.connect(self.location) as db:
                rows = db.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name != 'meta'")
                return sorted(name for (name,) in rows)
        index = self.open()
        client = index._raw_client()
        names = sorted(n for n in client.list_collections() if n.startswith(self.collection))
        index.close()
        return names

    def generation(self, n: int) -> str:
        if self.milvus:
            return f"{self.collection}_g{n}"
        return {"tantivy": f"gen-{n}", "numpy": f"chunks_g{n}"}[self.kind]


@pytest.fixture(scope="session")
def milvus_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("milvus-rebuild") / "milvus.db")


def _backend(kind: str, request: pytest.FixtureRequest, tmp_path: Path):
    if kind == "tantivy":
        yield Backend(kind, str(tmp_path / "lexical"))
    elif kind == "numpy":
        yield Backend(kind, str(tmp_path / "vectors.db"))
    else:
        uri = SERVER_URI if kind == "milvus-server" else request.getfixturevalue("milvus_uri")
        backend = Backend(kind, uri, collection_name(request))
        index = backend.open()
        index.drop()
        yield backend
        index.drop()
        index.close()


@pytest.fixture(params=["tantivy", "numpy", "milvus", MILVUS_SERVER])
def backend(request: pytest.FixtureRequest, tmp_path: Path):
    yield from _backend(request.param, request, tmp_path)


def test_commit_switches_every_reader_to_the_new_content(backend: Backend) -> None:
    live = backend.open()
    backend.write(live, OLD)
    other = backend.open()  # another instance on the same location, opened before the rebuild
    backend.assert_holds(other, OLD_IDS)

    new = live.begin_rebuild()
    assert new.count() == 0
    backend.write(new, NEW)
    backend.assert_holds(new, NEW_IDS)
    backend.assert_holds(live, OLD_IDS)  # nothing reads the rebuild before the commit
    backend.assert_holds(other, OLD_IDS)

    live.commit_rebuild(new)
    backend.assert_holds(live, NEW_IDS)
    backend.assert_holds(other, NEW_IDS)
    assert backend.physical() == [backend.generation(1)]  # the old one is gone
    with pytest.raises(BackendError, match="already committed"):
        new.count()

    live.delete_documents(["new-doc0"])  # the live index stays writable
    backend.assert_holds(live, NEW_IDS - {"new000", "new001", "new002"})
    for index in (live, other):
        index.close()
    fresh = backend.open()
    backend.assert_holds(fresh, NEW_IDS - {"new000", "new001", "new002"})
    assert fresh.cleanup() == []

    again = fresh.begin_rebuild()  # and a second rebuild replaces the first
    backend.write(again, OLD)
    fresh.commit_rebuild(again)
    backend.assert_holds(fresh, OLD_IDS)
    assert backend.physical() == [backend.generation(2)]
    fresh.close()


def test_abort_keeps_the_old_content(backend: Backend) -> None:
    live = backend.open()
    backend.write(live, OLD)
    new = live.begin_rebuild()
    backend.write(new, NEW, 0, 5)
    live.abort_rebuild(new)
    backend.assert_holds(live, OLD_IDS)
    live.close()
    fresh = backend.open()
    backend.assert_holds(fresh, OLD_IDS)
    assert fresh.cleanup() == []
    assert len(backend.physical()) == 1
    with pytest.raises(ValueError, match="not a rebuild in progress"):
        fresh.commit_rebuild(new)
    fresh.close()


@pytest.mark.parametrize("kind", ["tantivy", "numpy", "milvus", MILVUS_SERVER])
def test_reads_never_fail_nor_see_partial_content_during_a_rebuild(
        kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    for backend in _backend(kind, request, tmp_path):
        live = backend.open()
        backend.write(live, OLD)
        other = backend.open()
        stop, errors, saw_new = threading.Event(), [], []

        def read(index, backend=backend, stop=stop, errors=errors, saw_new=saw_new) -> None:
            try:
                while not stop.is_set():
                    for got in (index.chunk_ids(), backend.hit_ids(index)):
                        assert got in (OLD_IDS, NEW_IDS), sorted(got)[:3]
                        saw_new.append(got == NEW_IDS)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        readers = [threading.Thread(target=read, args=(index,)) for index in (live, other)]
        for t in readers:
            t.start()
        new = live.begin_rebuild()
        for start in range(0, 20, 5):
            backend.write(new, NEW, start, start + 5)
            time.sleep(0.02)
        live.commit_rebuild(new)
        time.sleep(0.3)
        stop.set()
        for t in readers:
            t.join()
        assert errors == []
        assert saw_new and saw_new[-1] and not saw_new[0]
        backend.assert_holds(other, NEW_IDS)
        live.close()
        other.close()


_CRASHING_REBUILD = """
import sys, time
sys.path.insert(0, sys.argv[1])
from tests.test_rebuild import Backend, NEW, OLD
backend = Backend(*sys.argv[2:])
live = backend.open()
if backend.milvus:  # one process per Milvus Lite file: the old content is made here
    backend.write(live, OLD)
    live.flush()
new = live.begin_rebuild()
backend.write(new, NEW, 0, 8)
print("ready", flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("kind", ["tantivy", "numpy", "milvus", MILVUS_SERVER])
def test_a_rebuild_killed_halfway_leaves_the_old_content(kind: str, tmp_path: Path,
                                                        request: pytest.FixtureRequest) -> None:
    if kind == "milvus-server":
        for backend in _backend(kind, request, tmp_path):
            _kill_a_rebuild_halfway(backend)
        return
    location = {"tantivy": tmp_path / "lexical", "numpy": tmp_path / "vectors.db",
                "milvus": tmp_path / "milvus.db"}[kind]
    backend = Backend(kind, str(location), "crash" if kind == "milvus" else "")
    if kind != "milvus":
        first = backend.open()
        backend.write(first, OLD)
        first.close()
    _kill_a_rebuild_halfway(backend)


def _kill_a_rebuild_halfway(backend: Backend) -> None:
    child = subprocess.Popen([sys.executable, "-c", _CRASHING_REBUILD, str(ROOT), backend.kind,
                              backend.location, backend.collection],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    finally:
        child.send_signal(signal.SIGKILL)
        child.communicate()
    assert child.returncode == -signal.SIGKILL

    fresh = backend.open()
    backend.assert_holds(fresh, OLD_IDS)
    assert backend.generation(1) in backend.physical()
    assert fresh.cleanup() == [backend.generation(1)]
    assert fresh.cleanup() == []
    backend.assert_holds(fresh, OLD_IDS)

    new = fresh.begin_rebuild()
    backend.write(new, NEW)
    fresh.commit_rebuild(new)
    backend.assert_holds(fresh, NEW_IDS)
    fresh.close()
    reopened = backend.open()
    backend.assert_holds(reopened, NEW_IDS)
    assert backend.physical() == [backend.generation(1)]
    reopened.close()


def test_a_crash_between_the_switch_and_the_drop_leaves_the_old_one_to_cleanup(
        backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    live = backend.open()
    backend.write(live, OLD)
    new = live.begin_rebuild()
    backend.write(new, NEW)
    if backend.kind == "tantivy":
        monkeypatch.setattr(TantivyIndex, "_drop_generation", lambda self, name: None)
    elif backend.kind == "numpy":
        monkeypatch.setattr(NumpyVectorIndex, "_drop_tables", lambda self, tables: None)
    else:
        monkeypatch.setattr(live._raw_client(), "drop_collection", lambda *args, **kwargs: None)
    live.commit_rebuild(new)
    monkeypatch.undo()
    live.close()
    fresh = backend.open()
    backend.assert_holds(fresh, NEW_IDS)
    old = backend.generation(0) if backend.milvus else {"tantivy": ".", "numpy": "chunks"}[backend.kind]
    assert fresh.cleanup() == [old]
    assert backend.physical() == [backend.generation(1)]
    backend.assert_holds(fresh, NEW_IDS)
    fresh.close()


@pytest.mark.parametrize("kind", ["tantivy", "numpy"])
def test_one_rebuild_at_a_time(kind: str, tmp_path: Path) -> None:
    backend = Backend(kind, str(tmp_path / ("lexical" if kind == "tantivy" else "vectors.db")))
    live, other = backend.open(), backend.open()
    backend.write(live, OLD)
    new = live.begin_rebuild()
    with pytest.raises(DataDirLocked, match="being rebuilt"):
        other.begin_rebuild()
    with pytest.raises(DataDirLocked):
        other.cleanup()  # it would take the running rebuild for a leftover
    live.abort_rebuild(new)
    again = other.begin_rebuild()
    other.commit_rebuild(again)
    backend.assert_holds(live, set())
    with pytest.raises(ValueError, match="on the live index"):
        again.begin_rebuild()
    live.close()
    other.close()


def test_pre_generation_layouts_are_generation_0(tmp_path: Path) -> None:
    lexical = TantivyIndex(tmp_path / "lexical")  # a new folder: the index lives in the folder itself
    lexical.upsert(OLD[0])
    assert (tmp_path / "lexical" / "meta.json").exists()
    new = lexical.begin_rebuild()
    new.upsert(NEW[0])
    lexical.commit_rebuild(new)
    assert (tmp_path / "lexical" / "CURRENT").read_text() == "gen-1"
    assert not (tmp_path / "lexical" / "meta.json").exists()
    assert lexical.chunk_ids() == NEW_IDS
    lexical.close()

    vectors = NumpyVectorIndex(tmp_path / "vectors.db", DIM)
    vectors.upsert(*OLD)
    new = vectors.begin_rebuild()
    new.upsert(*NEW)
    vectors.commit_rebuild(new)
    vectors.close()
    with sqlite3.connect(tmp_path / "vectors.db") as db:
        assert db.execute("SELECT value FROM meta WHERE key = 'live'").fetchone() == ("chunks_g1",)
        assert db.execute("SELECT name FROM sqlite_master WHERE name = 'chunks'").fetchone() is None


@pytest.mark.parametrize("kind", ["milvus", MILVUS_SERVER])
def test_pre_generation_milvus_collection_is_generation_0(kind: str, request: pytest.FixtureRequest) -> None:
    for backend in _backend(kind, request, Path()):
        live = backend.open()
        client = live._raw_client()
        live._create(client, backend.collection)  # as made before generations: no alias
        backend.write(live, OLD)
        backend.assert_holds(live, OLD_IDS)
        other = backend.open()
        new = live.begin_rebuild()
        assert client.describe_alias(backend.collection)["collection_name"] == backend.generation(0)
        backend.assert_holds(other, OLD_IDS)
        backend.write(new, NEW)
        live.commit_rebuild(new)
        assert client.describe_alias(backend.collection)["collection_name"] == backend.generation(1)
        assert backend.physical() == [backend.generation(1)]
        backend.assert_holds(other, NEW_IDS)
        other.close()


@pytest.mark.parametrize("kind", ["tantivy", "numpy"])
def test_in_memory_rebuild_swaps_the_index(kind: str) -> None:
    backend = Backend(kind, "")
    live = TantivyIndex(None) if kind == "tantivy" else NumpyVectorIndex(None, DIM)
    backend.write(live, OLD)
    new = live.begin_rebuild()
    backend.write(new, NEW)
    backend.assert_holds(live, OLD_IDS)
    live.commit_rebuild(new)
    backend.assert_holds(live, NEW_IDS)
    aborted = live.begin_rebuild()
    backend.write(aborted, OLD)
    live.abort_rebuild(aborted)
    backend.assert_holds(live, NEW_IDS)
    assert live.cleanup() == []
    live.close()
