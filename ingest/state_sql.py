"""The state database's tables and engines: SQLite in the data directory, or PostgreSQL.

The tables are those the state has always had in ``state.db`` (same names, columns and
indexes), so a file written by an earlier ragqa opens as it is; on PostgreSQL they are created
in the connection's schema (its ``search_path``). Driver errors become :mod:`rag.errors` here.

Example::

    engine = make_engine("postgresql+psycopg://ragqa@127.0.0.1:5432/ragqa")
    create_tables(engine)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, Engine

from rag.errors import BackendUnavailable, ConfigError

__all__ = ["METADATA", "meta", "sources", "documents", "chunks", "runs", "changes",
           "make_engine", "create_tables", "shown", "translated", "dialect_insert"]

METADATA = sa.MetaData()
# SQLite's AUTOINCREMENT needs INTEGER PRIMARY KEY; PostgreSQL gets a 64-bit identity.
_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_REAL: sa.Double[float] = sa.Double()
_TEXT = sa.Text()

meta = sa.Table("meta", METADATA, sa.Column("key", _TEXT, primary_key=True),
                sa.Column("value", _TEXT, nullable=False))
sources = sa.Table("sources", METADATA, sa.Column("name", _TEXT, primary_key=True),
                   sa.Column("config", _TEXT, nullable=False), sa.Column("created_at", _REAL, nullable=False))
documents = sa.Table(
    "documents", METADATA,
    sa.Column("id", _TEXT, primary_key=True), sa.Column("source", _TEXT, nullable=False),
    sa.Column("url", _TEXT, nullable=False), sa.Column("title", _TEXT, nullable=False),
    sa.Column("text_hash", _TEXT, nullable=False), sa.Column("etag", _TEXT), sa.Column("last_modified", _TEXT),
    sa.Column("lang", _TEXT), sa.Column("modified", _TEXT), sa.Column("published", _TEXT),
    sa.Column("fetched_at", _TEXT), sa.Column("updated_at", _REAL, nullable=False),
    sa.Index("documents_source", "source"), sa.Index("documents_url", "source", "url"),
)
chunks = sa.Table(
    "chunks", METADATA,
    sa.Column("id", _TEXT, primary_key=True), sa.Column("doc_id", _TEXT, nullable=False),
    sa.Column("source", _TEXT, nullable=False), sa.Column("ordinal", sa.Integer, nullable=False),
    sa.Column("hash", _TEXT, nullable=False), sa.Column("data", _TEXT, nullable=False),
    sa.Index("chunks_doc", "doc_id"), sa.Index("chunks_source", "source"),
)
runs = sa.Table(
    "runs", METADATA,
    sa.Column("id", _ID, primary_key=True, autoincrement=True), sa.Column("source", _TEXT, nullable=False),
    sa.Column("mode", _TEXT, nullable=False), sa.Column("started_at", _REAL, nullable=False),
    sa.Column("finished_at", _REAL), sa.Column("status", _TEXT, nullable=False), sa.Column("report", _TEXT),
    sa.Index("runs_source", "source", "started_at"),
    sqlite_autoincrement=True,
)
changes = sa.Table(
    "changes", METADATA,
    sa.Column("seq", _ID, primary_key=True, autoincrement=True), sa.Column("at", _REAL, nullable=False),
    sa.Column("source", _TEXT, nullable=False), sa.Column("kind", _TEXT, nullable=False),
    sa.Column("removed", _TEXT, nullable=False), sa.Column("added", sa.Integer, nullable=False),
    sqlite_autoincrement=True,  # a sequence number is never reused, even after the log is trimmed
)


def shown(url: str | URL) -> str:
    """The URL without its password, for messages."""
    return sa.make_url(url).render_as_string(hide_password=True)


def make_engine(url: str, *, pre_ping: bool = True) -> Engine:
    """An engine for ``url``: SQLite in WAL mode, or PostgreSQL through psycopg 3 (``pre_ping``:
    test each pooled connection before use, so one the server dropped is replaced silently)."""
    parsed = sa.make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        memory = not parsed.database or parsed.database == ":memory:"
        engine = sa.create_engine(parsed, connect_args={"check_same_thread": False, "timeout": 30},
                                  **({"poolclass": sa.pool.StaticPool} if memory else {}))

        @sa.event.listens_for(engine, "connect")
        def _sqlite_connection(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.isolation_level = None  # transactions are begun by hand (BEGIN IMMEDIATE)
            dbapi_conn.execute("PRAGMA journal_mode=WAL")
            dbapi_conn.execute("PRAGMA synchronous=NORMAL")

        return engine
    if parsed.get_backend_name() != "postgresql":
        raise ConfigError(f"state.url {shown(parsed)}: only sqlite and postgresql databases are supported")
    if parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    try:
        import psycopg  # noqa: F401
    except ImportError as exc:
        raise ConfigError(f"state.url {shown(parsed)} needs psycopg 3: pip install 'ragqa[postgres]'") from exc
    return sa.create_engine(parsed, pool_pre_ping=pre_ping, pool_size=5, max_overflow=10)


@contextlib.contextmanager
def translated(engine: Engine) -> Iterator[None]:
    """Driver errors about reaching the database as ``BackendUnavailable``, naming it."""
    try:
        yield
    except sa.exc.OperationalError as exc:
        reason = " ".join(str(exc.orig).split())[:300]
        raise BackendUnavailable(f"state database {shown(engine.url)}: {reason}") from exc


def create_tables(engine: Engine, also: sa.Table | None = None) -> None:
    """Create what is missing (tables of an older state keep their rows), and ``also`` another
    table (the scheduler's jobs). On PostgreSQL instances starting together would race on the
    catalog, so an advisory lock serialises it."""
    with translated(engine), engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.execute(sa.select(sa.func.pg_advisory_xact_lock(sa.func.hashtextextended(
                sa.func.concat("ragqa.state.create:", sa.func.current_schema()), 0))))
        METADATA.create_all(conn, checkfirst=True)
        if also is not None:
            also.create(conn, checkfirst=True)


def dialect_insert(engine: Engine, table: sa.Table) -> Any:
    """``INSERT`` in the engine's dialect, which has ``on_conflict_do_update`` / ``_nothing``."""
    insert = postgresql.insert if engine.dialect.name == "postgresql" else sqlite.insert
    return insert(table)
