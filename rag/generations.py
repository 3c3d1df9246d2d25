"""Helpers for index generations: their names, atomic pointer files, the rebuild lock, and
the bookkeeping between an index and the rebuild begun from it.

A full rebuild writes a new physical index (a *generation*) beside the live one and then
switches a pointer to it in one atomic step; the old generation is dropped only after the
switch. The embedded backends keep that pointer in a small file (``CURRENT``), replaced with
``os.replace`` after an ``fsync``, so a crash leaves either the old or the new name in it,
never a torn one. One rebuild runs at a time per index, guarded by :class:`RebuildLock`.
Generation 0 is the layout from before generations existed, so a rebuild is always 1 or more.

Example::

    GenerationNames("gen-").next(["gen-1", "gen-2", "CURRENT"])   # "gen-3"
    write_pointer(folder / "CURRENT", "gen-3")
    read_pointer(folder / "CURRENT")          # "gen-3"
    with RebuildLock(folder / "rebuild.lock", "the lexical index"):
        ...
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Self

from filelock import FileLock, Timeout

from rag.errors import BackendError, DataDirLocked

__all__ = ["GenerationNames", "RebuildLock", "RebuildTracking", "fsync_dir", "next_generation",
           "pointer_signature", "read_pointer", "write_pointer"]


def write_pointer(path: Path, value: str) -> None:
    """Replace the file at ``path`` with ``value``, atomically and durably."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(value)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(path.parent)


def read_pointer(path: Path) -> str | None:
    """The name stored at ``path``; ``None`` when there is no pointer yet."""
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except FileNotFoundError:
        return None


def pointer_signature(path: str | Path) -> tuple[int, int, int] | None:
    """Identifies one version of the pointer file cheaply (one ``stat``): every
    :func:`write_pointer` makes a new inode, so a switch always changes it."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def fsync_dir(folder: Path) -> None:
    """Make renames and deletions in ``folder`` durable (a no-op where unsupported)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # Windows cannot open a folder; its renames are durable on their own
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def next_generation(names: Iterable[str], pattern: re.Pattern[str]) -> int:
    """One more than the highest generation number among ``names`` (0 when there is none)."""
    numbers = [int(m.group(1)) for name in names if (m := pattern.fullmatch(name))]
    return max(numbers, default=-1) + 1


class GenerationNames:
    """The names ``<prefix><N>`` of one index's generations.

    Example::

        names = GenerationNames("chunks_g")
        names.name(0)                                # "chunks_g0"
        names.matches("chunks_g12")                  # True
        names.next(["chunks", "chunks_g1", "meta"])  # "chunks_g2"
    """

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.pattern = re.compile(re.escape(prefix) + r"(\d+)")

    def name(self, n: int) -> str:
        return f"{self.prefix}{n}"

    def matches(self, name: str) -> bool:
        return self.pattern.fullmatch(name) is not None

    def next(self, names: Iterable[str]) -> str:
        """The name for a new rebuild: past every generation in ``names``, and never 0."""
        return self.name(max(1, next_generation(names, self.pattern)))


class RebuildLock:
    """A process-wide exclusive lock on one index's rebuilds, taken without waiting.

    The operating system releases it when the holder dies, so a killed rebuild never leaves
    it stuck. Two instances in one process also exclude each other.
    """

    def __init__(self, path: Path, what: str) -> None:
        self.path, self._what = path, what
        self._lock = FileLock(str(path), thread_local=False)

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._lock.acquire(timeout=0)
        except Timeout:
            raise DataDirLocked(
                f"{self._what} is being rebuilt (or cleaned up) by another process or instance; "
                "wait for it to finish"
            ) from None

    def release(self) -> None:
        if self._lock.is_locked:
            self._lock.release(force=True)

    def __enter__(self) -> RebuildLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class RebuildTracking:
    """What an index and the rebuilds begun from it know of each other; a base of the index classes.

    ``begin_rebuild`` sets ``_origin`` on the index it returns. ``commit_rebuild`` and
    ``abort_rebuild`` retire that index, after which every call on it raises ``BackendError``.
    Where a backend serialises its rebuilds, the rebuild holds its :class:`RebuildLock` in
    ``_rebuilding`` until then. An embedded index keeps its data at ``path`` (``None``: in
    memory) and implements :meth:`_drop_rebuild`; an index kept elsewhere overrides
    :meth:`_owns_rebuild` and :meth:`abort_rebuild`.
    """

    path: Path | None
    _lock: threading.RLock
    _origin: Self | None = None
    _retired = False
    _rebuilding: RebuildLock | None = None

    def close(self) -> None:
        raise NotImplementedError

    def abort_rebuild(self, new: Self) -> None:
        """Delete ``new`` (from ``begin_rebuild``); the live index stays as it is."""
        self._check_rebuild(new)
        self._close_and_retire(new)
        if self.path is not None:
            try:
                self._drop_rebuild(new)
            finally:
                self._release_rebuild(new)

    def _drop_rebuild(self, new: Self) -> None:
        """Delete what ``new`` had written (its folder, its table)."""
        raise NotImplementedError

    def _refuse_if_retired(self) -> None:
        if self._retired:
            raise BackendError("this rebuild was already committed or aborted; "
                               "use the index it was begun from")

    def _refuse_unless_live(self) -> None:
        if self._origin is not None or self._retired:
            raise ValueError("begin_rebuild is called on the live index, not on a rebuild")

    def _check_rebuild(self, new: Self) -> None:
        if new._origin is None or new._retired:
            raise ValueError("not a rebuild in progress (use the index begin_rebuild returned)")
        if not self._owns_rebuild(new):
            raise ValueError("that rebuild belongs to another index")

    def _owns_rebuild(self, new: Self) -> bool:
        """Whether ``new`` rebuilds this index's data: the same location on disk; in memory,
        only a rebuild begun from this very instance."""
        return new._origin is self if self.path is None else new.path == self.path

    @staticmethod
    def _close_and_retire(new: RebuildTracking) -> None:
        with new._lock:
            new.close()
            new._retired = True

    @staticmethod
    def _release_rebuild(new: RebuildTracking) -> None:
        lock, new._rebuilding = new._rebuilding, None
        if lock is not None:
            lock.release()
