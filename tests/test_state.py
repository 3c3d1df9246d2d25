"""The ingestion state (``ingest.state.StateDB``), the same tests on SQLite and on a real
PostgreSQL (each test in a fresh schema): sources, documents and their chunks, the change log
and its order under concurrent writers, runs, and a ``state.db`` written by the raw-sqlite3
StateDB of earlier releases."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ingest.services import open_services
from ingest.state import StateDB, chunk_to_json
from rag.config import SourceConfig
from rag.errors import BackendUnavailable, ConfigError
from rag.types import Chunk, Document, Trust
from tests.conftest import make_settings
from tests.fixtures.postgres import NO_POSTGRES, POSTGRES_URL, STATE_DATABASES, fresh_schema, state_database


@pytest.fixture(params=STATE_DATABASES)
def state_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database for one test: a new SQLite file, or a new schema on the test PostgreSQL."""
    yield from state_database(request, tmp_path)


@pytest.fixture
def state(state_url: str) -> Iterator[StateDB]:
    db = StateDB(state_url)
    yield db
    db.close()


def doc(i: int, source: str = "docs", lang: str | None = "en") -> Document:
    return Document(id=f"d{i}", source=source, url=f"file:///docs/{i}.md", title=f"Doc {i}", text=f"text {i}",
                    lang=lang, modified=datetime(2024, 3, 1, tzinfo=UTC), fetched_at=datetime(2025, 1, 2, tzinfo=UTC))


def chunks_of(d: Document, texts: list[str]) -> list[Chunk]:
    return [Chunk(id=f"{d.id}-{t}", doc_id=d.id, source=d.source, text=t, hash=f"h-{t}", ordinal=n, url=d.url,
                  title=d.title, lang=d.lang, modified=d.modified, trust=Trust.high, tags=("a", "b"))
            for n, t in enumerate(texts)]


def test_sources_are_added_updated_listed_and_removed(state: StateDB) -> None:
    state.add_source(SourceConfig(name="docs", kind="folder", location="docs"))
    added = state.source_added("docs")
    state.add_source(SourceConfig(name="docs", kind="folder", location="docs", tags=("x",)))
    state.add_source(SourceConfig(name="blog", kind="feed", location="https://example.com/feed.xml"))
    assert [s.name for s in state.sources()] == ["blog", "docs"]
    assert state.source("docs").tags == ("x",)
    assert state.source_added("docs") == added  # re-adding keeps when it was first added
    state.remove_source("blog")
    with pytest.raises(ConfigError, match=r"unknown source 'blog' \(known: docs\)"):
        state.source("blog")
    assert state.source_added("blog") is None


def test_documents_and_chunks_round_trip(state: StateDB) -> None:
    d0, d1 = doc(0), doc(1, source="other", lang=None)
    c0, c1 = chunks_of(d0, ["alpha", "beta"]), chunks_of(d1, ["gamma"])
    state.save_document(d0, "hash0", '"etag0"', "Mon, 01 Jan 2024 00:00:00 GMT", c0)
    state.save_document(d1, "hash1", None, None, c1)
    assert state.documents("docs") == {"d0": state.documents("docs")["d0"]}
    s0 = state.documents("docs")["d0"]
    assert (s0.url, s0.text_hash, s0.etag, s0.last_modified) == (d0.url, "hash0", '"etag0"', "Mon, 01 Jan 2024 00:00:00 GMT")
    assert state.get_chunks([c0[1].id, "missing", c1[0].id]) == {c0[1].id: c0[1], c1[0].id: c1[0]}
    assert state.chunk_hashes("d0") == {c.id: c.hash for c in c0}
    assert list(state.iter_chunks()) == c0 + c1 and list(state.iter_chunks("other")) == c1
    assert state.counts() == (2, 3) and state.counts("docs") == (1, 2)
    assert state.languages() == {"en": 1, "und": 1}
    row = state.document_row("d0")
    assert row is not None and row["modified"] == "2024-03-01T00:00:00+00:00" and row["title"] == "Doc 0"

    state.touch_document("d0", '"etag1"', None, datetime(2025, 2, 1, tzinfo=UTC))
    s0 = state.documents("docs")["d0"]
    assert (s0.etag, s0.last_modified, s0.text_hash) == ('"etag1"', None, "hash0")
    many = [f"id{i}" for i in range(1200)]  # more ids than one query takes
    assert state.get_chunks([*many, c0[0].id]) == {c0[0].id: c0[0]}


def test_the_change_log_records_what_left_and_what_arrived(state: StateDB) -> None:
    d0 = doc(0)
    assert state.last_change() == 0 and state.changes_since(0) == []
    state.save_document(d0, "h", None, None, chunks_of(d0, ["alpha", "beta"]))
    state.save_document(d0, "h", None, None, chunks_of(d0, ["alpha", "beta"]))  # nothing changed: no entry
    state.save_document(d0, "h2", None, None, chunks_of(d0, ["alpha", "delta"]))
    purge = state.log_purge("docs")
    assert state.delete_documents(["d0", "never-stored"]) == 2
    log = state.changes_since(0)
    assert [(e.kind, e.source, e.removed, e.added) for e in log] == [
        ("chunks", "docs", (), 2),
        ("chunks", "docs", ("d0-beta",), 1),
        ("purge", "docs", (), 0),
        ("chunks", "docs", ("d0-alpha", "d0-delta"), 0),
    ]
    assert [e.seq for e in log] == sorted(e.seq for e in log) and log[2].seq == purge
    assert state.last_change() == log[-1].seq and state.changes_since(log[1].seq) == log[2:]
    assert state.counts() == (0, 0)
    summary = state.change_summary()
    assert {k: summary[k] for k in ("documents_changed", "chunks_removed", "chunks_added", "purges")} == {
        "documents_changed": 3, "chunks_removed": 3, "chunks_added": 3, "purges": 1}


def test_another_instance_sees_writes_and_the_token_moves(state: StateDB, state_url: str) -> None:
    other = StateDB(state_url)
    try:
        assert other.log_id == state.log_id  # one log, named once
        assert (state.path is None) == state_url.startswith("postgresql")
        token = other.change_token()
        d0 = doc(0)
        state.save_document(d0, "h", None, None, chunks_of(d0, ["alpha"]))
        assert other.change_token() != token
        assert other.get_chunks(["d0-alpha"])["d0-alpha"].text == "alpha"
        assert [e.added for e in other.changes_since(0)] == [1]
    finally:
        other.close()


def test_concurrent_writers_commit_the_log_in_sequence_order(state: StateDB, state_url: str) -> None:
    """Writers on two StateDB objects (two instances) and several threads, with a reader
    following the log as the answer cache does: every entry is seen, in order, none skipped
    because a smaller sequence number committed after a larger one was read."""
    other = StateDB(state_url)
    seen: list[int] = []
    done = threading.Event()

    def follow() -> None:
        cursor = 0
        while True:
            finished = done.is_set()
            for entry in state.changes_since(cursor):
                assert entry.seq > cursor
                seen.append(entry.seq)
                cursor = entry.seq
            if finished:
                return

    def write(db: StateDB, writer: int) -> None:
        for i in range(15):
            d = doc(writer * 100 + i)
            db.save_document(d, "h", None, None, chunks_of(d, ["x", "y"]))

    reader = threading.Thread(target=follow)
    reader.start()
    writers = [threading.Thread(target=write, args=(db, n)) for n, db in enumerate([state, other, state, other])]
    try:
        for t in writers:
            t.start()
        for t in writers:
            t.join()
    finally:
        done.set()
        reader.join()
        other.close()
    assert len(seen) == 60 and seen == sorted(set(seen))
    assert state.counts() == (60, 120)


def test_runs_record_progress_and_results(state: StateDB) -> None:
    first = state.start_run("docs", "full")
    state.run_progress(first, {"done": 3, "total": 10})
    running = state.last_run("docs")
    assert running is not None and running["status"] == "running" and running["progress"] == {"done": 3, "total": 10}
    state.finish_run(first, "ok", {"added": 2, "at": datetime(2025, 1, 1)})
    second = state.start_run("docs", "incremental")
    state.finish_run(second, "failed", {"error": "boom"})
    assert second > first
    last = state.last_run("docs")
    assert last is not None and (last["id"], last["status"], last["progress"]) == (second, "failed", None)
    assert [r["id"] for r in state.runs("docs")] == [second, first] and state.runs("docs", limit=1)[0]["id"] == second
    ok = state.runs("docs")[1]
    assert state.last_success("docs") == ok["finished_at"] and ok["finished_at"] >= ok["started_at"]
    assert state.last_run("elsewhere") is None and state.last_success("elsewhere") is None


def test_finishing_a_run_trims_the_log_past_its_window(state: StateDB, monkeypatch: pytest.MonkeyPatch) -> None:
    old = state.log_purge()
    later = time.time() + 9 * 86_400  # past CHANGE_LOG_S
    monkeypatch.setattr("ingest.state.time.time", lambda: later)
    state.finish_run(state.start_run("docs", "full"), "ok", {})
    fresh = state.log_purge()
    assert [e.seq for e in state.changes_since(0)] == [fresh] and fresh > old


def test_services_use_the_configured_database(state_url: str, tmp_path: Path) -> None:
    services = open_services(make_settings(tmp_path / "data", state={"url": state_url},
                                           sources=[{"name": "docs", "kind": "folder", "location": "docs"}]))
    try:
        assert [s.name for s in services.state.sources()] == ["docs"]
        services.state.set_meta("k", "v")
    finally:
        services.close()
    check = StateDB(state_url)
    try:
        assert check.get_meta("k") == "v"
    finally:
        check.close()
    assert not (tmp_path / "data" / "state.db").exists()  # the configured database, not the default


# The schema of the raw-sqlite3 StateDB, as it wrote state.db before the state moved to SQLAlchemy.
OLD_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE sources (name TEXT PRIMARY KEY, config TEXT NOT NULL, created_at REAL NOT NULL);
CREATE TABLE documents (
    id TEXT PRIMARY KEY, source TEXT NOT NULL, url TEXT NOT NULL, title TEXT NOT NULL,
    text_hash TEXT NOT NULL, etag TEXT, last_modified TEXT, lang TEXT,
    modified TEXT, published TEXT, fetched_at TEXT, updated_at REAL NOT NULL);
CREATE INDEX documents_source ON documents(source);
CREATE INDEX documents_url ON documents(source, url);
CREATE TABLE chunks (
    id TEXT PRIMARY KEY, doc_id TEXT NOT NULL, source TEXT NOT NULL, ordinal INTEGER NOT NULL,
    hash TEXT NOT NULL, data TEXT NOT NULL);
CREATE INDEX chunks_doc ON chunks(doc_id);
CREATE INDEX chunks_source ON chunks(source);
CREATE TABLE runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT, source TEXT NOT NULL, mode TEXT NOT NULL,
    started_at REAL NOT NULL, finished_at REAL, status TEXT NOT NULL, report TEXT);
CREATE INDEX runs_source ON runs(source, started_at);
CREATE TABLE changes (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, source TEXT NOT NULL, kind TEXT NOT NULL,
    removed TEXT NOT NULL, added INTEGER NOT NULL);
"""


def test_a_state_db_of_the_raw_sqlite_releases_opens_and_keeps_working(tmp_path: Path) -> None:
    path = tmp_path / "data" / "state.db"
    path.parent.mkdir()
    d0 = doc(0)
    c0 = chunks_of(d0, ["alpha", "beta"])
    now = time.time()
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA journal_mode=WAL")
        db.executescript(OLD_SCHEMA)
        db.execute("INSERT INTO meta VALUES ('log_id', 'old-log'), ('embedder', 'minilm')")
        db.execute("INSERT INTO sources VALUES ('docs', ?, ?)",
                   (SourceConfig(name="docs", kind="folder", location="docs").model_dump_json(), now - 60))
        db.execute("INSERT INTO documents VALUES ('d0', 'docs', ?, 'Doc 0', 'hash0', NULL, NULL, 'en', NULL, NULL, NULL, ?)",
                   (d0.url, now))
        db.executemany("INSERT INTO chunks VALUES (?, 'd0', 'docs', ?, ?, ?)",
                       [(c.id, c.ordinal, c.hash, chunk_to_json(c)) for c in c0])
        db.execute("INSERT INTO runs (source, mode, started_at, finished_at, status, report) "
                   "VALUES ('docs', 'full', ?, ?, 'ok', '{}')", (now - 30, now - 20))
        for _ in range(5):  # the log's last entry is 5; entries 1-4 were trimmed
            db.execute("INSERT INTO changes (at, source, kind, removed, added) VALUES (?, 'docs', 'chunks', '[]', 1)",
                       (now,))
        db.execute("DELETE FROM changes WHERE seq < 5")
    db.close()

    state = StateDB(path)
    try:
        assert state.path == path and state.log_id == "old-log" and state.get_meta("embedder") == "minilm"
        assert [s.name for s in state.sources()] == ["docs"] and state.counts() == (1, 2)
        assert state.get_chunks([c0[0].id]) == {c0[0].id: c0[0]}
        assert state.last_success("docs") == pytest.approx(now - 20)
        assert state.last_change() == 5
        assert state.log_purge() == 6  # sequence numbers go on from the old log's, never reused
        state.save_document(d0, "hash1", None, None, chunks_of(d0, ["alpha", "gamma"]))
        assert state.changes_since(6)[0].removed == ("d0-beta",)
        assert state.start_run("docs", "incremental") == 2
    finally:
        state.close()


def test_an_unreachable_postgresql_is_a_backend_error() -> None:
    with pytest.raises(BackendUnavailable, match=r"state database postgresql\+psycopg://ragqa:\*\*\*@127.0.0.1:9/x"):
        StateDB("postgresql+psycopg://ragqa:secret@127.0.0.1:9/x?connect_timeout=2")


def test_an_unsupported_database_url_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="state.url"):
        make_settings(tmp_path, state={"url": "mysql://root@127.0.0.1/ragqa"})


@pytest.mark.integration
def test_connections_the_server_dropped_are_replaced(tmp_path: Path) -> None:
    """After PostgreSQL ends the state's sessions (a restart, an idle timeout), the next read
    and the next write still work: the read retries once on a fresh connection, the write's
    pool tests its connection first."""
    import sqlalchemy as sa

    if not POSTGRES_URL:
        pytest.skip(NO_POSTGRES)
    with fresh_schema("dropped") as url:
        state = StateDB(url)
        try:
            state.set_meta("k", "v")
            assert state.get_meta("k") == "v"
            admin = sa.create_engine(POSTGRES_URL, poolclass=sa.pool.NullPool)
            with admin.connect() as conn:
                ended = conn.execute(sa.text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid() AND usename = current_user "
                    "AND application_name = '' AND backend_type = 'client backend'")).scalar()
            admin.dispose()
            assert ended and ended >= 2  # the reader's and the writer's pooled sessions
            assert state.get_meta("k") == "v"
            state.set_meta("k", "w")
            assert state.get_meta("k") == "w"
        finally:
            state.close()
