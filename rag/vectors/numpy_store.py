"""The SQLite file behind :class:`~rag.vectors.numpy_index.NumpyVectorIndex`: its tables, a
chunk and its vector as a row and back, and the queries the index runs.

One table holds every chunk field and the vector bytes; ``meta`` holds the dimension, the
live table (``live``) and a change token per table (``token:<table>``), replaced by every
write so that other connections know to reload. Generations are tables of the same file:
``chunks`` (generation 0, also the whole layout of files written before generations
existed), then ``chunks_g1``, ``chunks_g2``, ... Table names are never user input: they
come from :data:`GENERATIONS` or are :data:`LEGACY`.

Example::

    db = connect(path, dim=384, create_legacy=True)
    table = live(db)                       # "chunks_g2"
    mem = load(db, table, dim=384)
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from rag.codec import compact_json, from_micros, opt_micros
from rag.errors import SchemaMismatch
from rag.generations import GenerationNames
from rag.types import Chunk, Trust
from rag.vectors.numpy_memory import Memory

__all__ = ["BATCH", "GENERATIONS", "LEGACY", "batches", "connect", "create_table", "delete_rows",
           "drop_tables", "is_table", "live", "load", "read_chunks", "row", "tables", "token",
           "vectors_by_hash", "write_rows"]

LEGACY = "chunks"  # generation 0
GENERATIONS = GenerationNames("chunks_g")
BATCH = 500
_COLUMNS = ("id", "doc_id", "source", "text", "hash", "ordinal", "title", "url", "heading", "lang",
            "published", "modified", "trust", "tags", "tenant")
_LOAD_COLUMNS = "id, source, tenant, lang, trust, published, modified, tags, vector"
_META_DDL = "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)"


def _table_ddl(t: str) -> list[str]:
    return [
        f"""CREATE TABLE IF NOT EXISTS {t} (
    id TEXT PRIMARY KEY, doc_id TEXT NOT NULL, source TEXT NOT NULL, text TEXT NOT NULL,
    hash TEXT NOT NULL, ordinal INTEGER NOT NULL, title TEXT NOT NULL, url TEXT NOT NULL,
    heading TEXT NOT NULL, lang TEXT NOT NULL, published INTEGER, modified INTEGER,
    trust INTEGER NOT NULL, tags TEXT NOT NULL, tenant TEXT, vector BLOB NOT NULL)""",
        f"CREATE INDEX IF NOT EXISTS {t}_doc_id ON {t} (doc_id)",
        f"CREATE INDEX IF NOT EXISTS {t}_hash ON {t} (hash)",
    ]


def is_table(name: str) -> bool:
    """Whether ``name`` is one of the chunk tables (of any generation)."""
    return name == LEGACY or GENERATIONS.matches(name)


def connect(path: Path | None, dim: int, *, create_legacy: bool) -> sqlite3.Connection:
    """Open the file (``None``: in memory) and check its dimension. With ``create_legacy``,
    a file that has no live table yet (new, or from before generations) gets ``chunks``."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(str(path or ":memory:"), check_same_thread=False)
    db.execute(_META_DDL)
    if path is not None:
        db.execute("PRAGMA journal_mode=WAL")
    found = db.execute("SELECT value FROM meta WHERE key = 'dim'").fetchone()
    if found is None:
        with db:
            db.execute("INSERT OR IGNORE INTO meta VALUES ('dim', ?)", (str(dim),))
    elif int(found[0]) != dim:
        db.close()
        raise SchemaMismatch(
            f"{path} holds {found[0]}-dimensional vectors but the embedder makes "
            f"{dim}; use another data directory or the original embedder"
        )
    if create_legacy and db.execute("SELECT 1 FROM meta WHERE key = 'live'").fetchone() is None:
        create_table(db, LEGACY)
        db.commit()
    return db


def create_table(db: sqlite3.Connection, table: str) -> None:
    for statement in _table_ddl(table):
        db.execute(statement)


def live(db: sqlite3.Connection) -> str:
    found = db.execute("SELECT value FROM meta WHERE key = 'live'").fetchone()
    return LEGACY if found is None else found[0]


def token(db: sqlite3.Connection, table: str) -> str:
    found = db.execute("SELECT value FROM meta WHERE key = ?", (f"token:{table}",)).fetchone()
    return "" if found is None else found[0]


def tables(db: sqlite3.Connection) -> list[str]:
    return [name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]


def batches(items: list) -> Iterable[list]:
    for i in range(0, len(items), BATCH):
        yield items[i: i + BATCH]


def load(db: sqlite3.Connection, table: str, dim: int) -> Memory:
    """The matrix and filter columns of every row of ``table``."""
    mem = Memory(dim, capacity=max(1024, db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]))
    for cid, source, tenant, lang, trust, published, modified, tags, blob in db.execute(
            f"SELECT {_LOAD_COLUMNS} FROM {table}"):
        mem.add(cid, source, tenant, lang, trust, published, modified, json.loads(tags),
                np.frombuffer(blob, dtype=np.float32))
    return mem


def row(c: Chunk, v: np.ndarray) -> tuple:
    return (c.id, c.doc_id, c.source, c.text, c.hash, c.ordinal, c.title, c.url, c.heading, c.lang,
            opt_micros(c.published), opt_micros(c.modified), int(c.trust),
            compact_json(list(c.tags)), c.tenant, v.tobytes())


def _chunk(values: Sequence) -> Chunk:
    (cid, doc_id, source, text, h, ordinal, title, url, heading, lang,
     published, modified, trust, tags, tenant) = values
    return Chunk(
        id=cid, doc_id=doc_id, source=source, text=text, hash=h, ordinal=ordinal, title=title,
        url=url, heading=heading, lang=lang, published=from_micros(published),
        modified=from_micros(modified), trust=Trust(trust), tags=tuple(json.loads(tags)), tenant=tenant,
    )


def write_rows(db: sqlite3.Connection, table: str, rows: list[tuple]) -> None:
    db.executemany(f"INSERT OR REPLACE INTO {table} VALUES ({', '.join('?' * 16)})", rows)


def delete_rows(db: sqlite3.Connection, table: str, column: str, values: list[str]) -> list[str]:
    """Delete the rows whose ``column`` (``id`` or ``doc_id``) is in ``values``; their ids."""
    assert column in ("id", "doc_id")
    gone: list[str] = []
    for batch in batches(values):
        marks = ", ".join("?" * len(batch))
        where = f"FROM {table} WHERE {column} IN ({marks})"
        gone.extend(cid for (cid,) in db.execute(f"SELECT id {where}", batch))
        db.execute(f"DELETE {where}", batch)
    return gone


def read_chunks(db: sqlite3.Connection, table: str, ids: list[str]) -> dict[str, Chunk]:
    out: dict[str, Chunk] = {}
    for batch in batches(ids):
        marks = ", ".join("?" * len(batch))
        sql = f"SELECT {', '.join(_COLUMNS)} FROM {table} WHERE id IN ({marks})"
        out.update((values[0], _chunk(values)) for values in db.execute(sql, batch))
    return out


def vectors_by_hash(db: sqlite3.Connection, table: str, hashes: list[str]) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for batch in batches(hashes):
        sql = f"SELECT hash, vector FROM {table} WHERE hash IN ({', '.join('?' * len(batch))})"
        for h, blob in db.execute(sql, batch):
            out.setdefault(h, np.frombuffer(blob, dtype=np.float32).copy())
    return out


def drop_tables(path: Path, names: list[str]) -> None:
    """Drop chunk tables and their change tokens, on a connection of its own."""
    assert all(is_table(t) for t in names)
    db = sqlite3.connect(str(path), timeout=30)
    try:
        with db:
            db.execute("BEGIN IMMEDIATE")
            for table in names:
                db.execute(f"DROP TABLE IF EXISTS {table}")
                db.execute("DELETE FROM meta WHERE key = ?", (f"token:{table}",))
    finally:
        db.close()
