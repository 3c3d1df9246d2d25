"""Full rebuilds of :class:`~rag.vectors.numpy_index.NumpyVectorIndex`, one table per generation.

A rebuild fills a new table of the same SQLite file (see :mod:`rag.vectors.numpy_store`),
and its commit is one SQLite transaction that points ``meta.live`` at it; SQLite's journal
makes that switch atomic and durable, so a crash leaves the old table live and the
half-filled new one as a leftover for ``cleanup``. Dropped tables leave free pages that
later rebuilds reuse; the file does not shrink. One rebuild runs at a time per file, guarded
by a :class:`~rag.generations.RebuildLock` beside it.
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

from rag.errors import BackendError
from rag.generations import RebuildLock, RebuildTracking
from rag.vectors import numpy_store as store

if TYPE_CHECKING:
    from rag.vectors.numpy_index import NumpyVectorIndex

__all__ = ["NumpyGenerations"]


class NumpyGenerations(RebuildTracking):
    """The rebuild methods of :class:`~rag.vectors.numpy_index.NumpyVectorIndex`."""

    def begin_rebuild(self: NumpyVectorIndex) -> NumpyVectorIndex:
        """A writable index on a new, empty table that nothing reads until it is committed."""
        self._refuse_unless_live()
        new = type(self)(self.path, self.dim)
        new._origin = self
        if self.path is None:
            return new
        lock = self._rebuild_lock()
        lock.acquire()
        try:
            with self._lock:
                db = self._db or self._connect()
                with db:
                    db.execute("BEGIN IMMEDIATE")
                    new._table = store.GENERATIONS.next(store.tables(db))
                    store.create_table(db, new._table)
            new._rebuilding = lock
        except sqlite3.Error as exc:
            lock.release()
            raise BackendError(f"cannot write the vector store {self.path}: {exc}") from exc
        except BaseException:
            lock.release()
            raise
        return new

    def commit_rebuild(self: NumpyVectorIndex, new: NumpyVectorIndex) -> None:
        """Make ``new`` (from :meth:`begin_rebuild`) the live index, then drop the old one."""
        self._check_rebuild(new)
        with new._lock:
            db, mem, loaded, version = new._db, new._mem, new._loaded, new._version
            new._db, new._mem, new._retired = None, None, True
        if self.path is None:
            with self._lock:
                old = self._db
                self._db, self._mem, self._loaded, self._version = db, mem, loaded, version
            if old is not None:
                old.close()
            return
        if db is not None:
            db.close()
        try:
            with self._lock:
                own = self._db or self._connect()
                try:
                    with own:
                        own.execute("BEGIN IMMEDIATE")
                        if new._table not in store.tables(own):
                            raise BackendError(f"the rebuild's table {new._table} is gone from {self.path}")
                        old_table = store.live(own)
                        own.execute("INSERT OR REPLACE INTO meta VALUES ('live', ?)", (new._table,))
                        token = store.token(own, new._table)
                except sqlite3.Error as exc:
                    raise BackendError(f"cannot write the vector store {self.path}: {exc}") from exc
                self._table, self._version = new._table, -1
                self._mem, self._loaded = (mem, (new._table, token)) if mem is not None else (None, None)
            if old_table != new._table:
                self._drop_tables([old_table])
        finally:
            self._release_rebuild(new)

    def _drop_rebuild(self, new: NumpyVectorIndex) -> None:
        self._drop_tables([new._table])

    def cleanup(self: NumpyVectorIndex) -> list[str]:
        """Drop tables that are not live (left by a crashed rebuild); return their names.

        Raises ``DataDirLocked`` while a rebuild of this file is running.
        """
        if self.path is None or self._origin is not None or not self.path.exists():
            return []
        with self._rebuild_lock():
            with self._lock:
                db = self._db or self._connect()
                try:
                    live = store.live(db)
                    leftovers = [t for t in store.tables(db) if store.is_table(t) and t != live]
                except sqlite3.Error as exc:
                    raise BackendError(f"cannot read the vector store {self.path}: {exc}") from exc
            self._drop_tables(leftovers)
        return leftovers

    def _rebuild_lock(self) -> RebuildLock:
        assert self.path is not None
        return RebuildLock(self.path.with_name(self.path.name + ".rebuild.lock"),
                           f"the vector store {self.path}")

    def _drop_tables(self, tables: list[str]) -> None:
        # A connection of its own, so reads through this instance go on meanwhile.
        if not tables:
            return
        assert self.path is not None
        try:
            store.drop_tables(self.path, tables)
        except sqlite3.Error as exc:
            raise BackendError(f"cannot drop {', '.join(tables)} from {self.path}: {exc}") from exc
