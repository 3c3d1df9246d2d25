"""Which instance's scheduler runs the jobs: a lease on the state database.

On PostgreSQL the lease is a session advisory lock (``pg_try_advisory_lock``) held on a
connection of its own, named after the schema, so it is one per shared state; it goes when
its holder stops or its connection dies, and the server then lets the next one take it. On
SQLite, where instances share a data directory at most, it is a file lock beside the
database.

Example::

    lease = lease_for("postgresql+psycopg://ragqa@db/ragqa", data_dir)
    if lease.try_acquire():
        ...  # run the jobs while lease.holds()
    lease.release()
"""

from __future__ import annotations

import logging
from pathlib import Path

import sqlalchemy as sa
from filelock import FileLock, Timeout

from ingest.state_sql import make_engine, shown
from rag.types import Lease

__all__ = ["Lease", "AdvisoryLease", "FileLease", "lease_for", "write_lease_for"]

log = logging.getLogger("ragqa.scheduler")


class AdvisoryLease:
    """A PostgreSQL session advisory lock, held as long as its connection lives."""

    def __init__(self, url: str, name: str = "ragqa.scheduler") -> None:
        self._engine = make_engine(url).execution_options(isolation_level="AUTOCOMMIT")
        self._key = sa.func.hashtextextended(sa.func.concat(f"{name}:", sa.func.current_schema()), 0)
        self._conn: sa.Connection | None = None
        self._held = False

    def try_acquire(self) -> bool:
        if self._held:
            return self.holds()
        try:
            if self._conn is None:
                self._conn = self._engine.connect()
            self._held = bool(self._conn.execute(sa.select(sa.func.pg_try_advisory_lock(self._key))).scalar())
        except sa.exc.DBAPIError as exc:
            log.warning("scheduler lease: %s unreachable: %s", shown(self._engine.url), exc.orig)
            self._drop()
        return self._held

    def holds(self) -> bool:
        if not self._held or self._conn is None:
            return False
        try:
            self._conn.execute(sa.select(1))
        except sa.exc.DBAPIError:
            self._drop()  # the session is gone, and its lock with it
        return self._held

    def release(self) -> None:
        if self._held and self._conn is not None:
            try:
                self._conn.execute(sa.select(sa.func.pg_advisory_unlock(self._key)))
            except sa.exc.DBAPIError:
                pass  # a lost session already let it go
        self._drop()
        self._engine.dispose()

    def _drop(self) -> None:
        self._held = False
        if self._conn is not None:
            try:
                self._conn.invalidate()
                self._conn.close()
            except sa.exc.DBAPIError:
                pass
            self._conn = None


class FileLease:
    """A file lock: one holder among the processes of this machine."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = FileLock(str(path), thread_local=False)

    def try_acquire(self) -> bool:
        if self._lock.is_locked:
            return True
        try:
            self._lock.acquire(timeout=0)
        except Timeout:
            return False
        return True

    def holds(self) -> bool:
        return self._lock.is_locked

    def release(self) -> None:
        if self._lock.is_locked:
            self._lock.release()


def write_lease_for(url: str) -> Lease | None:
    """The write lock that instances sharing the state at ``url`` hold while they reindex: an
    advisory lock on PostgreSQL; None for SQLite, where the data directory's lock is the one."""
    if sa.make_url(url).get_backend_name() == "postgresql":
        return AdvisoryLease(url, name="ragqa.write")
    return None


def lease_for(url: str, data_dir: Path) -> Lease:
    """The scheduler's lease for the state at ``url``: an advisory lock on PostgreSQL, else a
    file lock beside the SQLite file (in ``data_dir`` for an in-memory database)."""
    parsed = sa.make_url(url)
    if parsed.get_backend_name() == "postgresql":
        return AdvisoryLease(url)
    database = parsed.database
    folder = Path(database).parent if database and database != ":memory:" else data_dir
    return FileLease(folder / "scheduler.lock")
