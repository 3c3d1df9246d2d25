"""Generations of a tantivy index folder, and the full rebuilds of :class:`TantivyIndex`.

A full rebuild goes into a new *generation*, a folder ``gen-<N>`` inside the index folder;
the file ``CURRENT`` names the live one and is replaced atomically when a rebuild is
committed. An index folder without ``CURRENT`` (a new one, or one written before
generations existed) is generation 0 and lives in the folder itself until its first
rebuild. A generation is deleted by renaming it to ``.trash-*`` first, so that a reader
never opens a half-deleted one.

Example::

    live_generation(folder)                  # "gen-2", or "." for the folder itself
    generation_folder(folder, "gen-2")       # folder / "gen-2"
"""

from __future__ import annotations

import contextlib
import re
import shutil
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from rag.generations import (
    GenerationNames,
    RebuildLock,
    RebuildTracking,
    fsync_dir,
    read_pointer,
    write_pointer,
)

if TYPE_CHECKING:
    from rag.lexical.tantivy_index import TantivyIndex

__all__ = ["GENERATIONS", "LEGACY", "TantivyGenerations", "generation_folder", "live_generation",
           "pointer"]

GENERATIONS = GenerationNames("gen-")
LEGACY = "."  # the name of generation 0 when it lives in the index folder itself
# what tantivy writes into an index folder (cleanup deletes nothing else from its top level)
_TANTIVY_FILE = re.compile(r"meta\.json|\.managed\.json|\.tantivy-\w+\.lock|[0-9a-f]{32}\.\w+(\.del)?")


def pointer(folder: Path) -> Path:
    """The file that names the live generation."""
    return folder / "CURRENT"


def live_generation(folder: Path) -> str:
    return read_pointer(pointer(folder)) or LEGACY


def generation_folder(folder: Path, name: str) -> Path:
    return folder if name == LEGACY else folder / name


def _rebuild_lock(folder: Path) -> RebuildLock:
    return RebuildLock(folder / "rebuild.lock", f"the lexical index at {folder}")


class TantivyGenerations(RebuildTracking):
    """The rebuild methods of :class:`~rag.lexical.tantivy_index.TantivyIndex`."""

    def begin_rebuild(self: TantivyIndex) -> TantivyIndex:
        """A writable index on a new, empty generation that nothing reads until it is committed."""
        self._refuse_unless_live()
        new = type(self)(self.path, writer_heap_bytes=self._heap)
        new._origin = self
        if self.path is None:
            return new
        lock = _rebuild_lock(self.path)
        lock.acquire()
        try:
            new._generation = GENERATIONS.next(p.name for p in self.path.iterdir())
            (self.path / new._generation).mkdir()
            new._rebuilding = lock
            new._idx()
        except BaseException:
            lock.release()
            raise
        return new

    def commit_rebuild(self: TantivyIndex, new: TantivyIndex) -> None:
        """Make ``new`` (from :meth:`begin_rebuild`) the live index, then delete the old one."""
        self._check_rebuild(new)
        if self.path is None:
            with self._lock, new._lock:
                self._release_writer(wait=False)
                self._index, self._writer = new._index, new._writer
                new._index = new._writer = None
                new._retired = True
            return
        assert new._generation is not None
        self._close_and_retire(new)  # its commits are durable; merges finish before it goes live
        try:
            with self._lock:
                old = live_generation(self.path)
                write_pointer(pointer(self.path), new._generation)
                self._release_writer(wait=True)
                self._index = self._open_live()
            if old != new._generation:
                self._drop_generation(old)
        finally:
            self._release_rebuild(new)

    def _drop_rebuild(self, new: TantivyIndex) -> None:
        assert new._generation is not None
        self._drop_generation(new._generation)

    def cleanup(self: TantivyIndex) -> list[str]:
        """Delete generations that are not live (left by a crashed rebuild); return their names.

        ``"."`` stands for a pre-generation index in the folder itself. Raises
        ``DataDirLocked`` while a rebuild of this folder is running.
        """
        if self.path is None or self._origin is not None or not self.path.is_dir():
            return []
        dropped = []
        with _rebuild_lock(self.path):
            live = live_generation(self.path)
            for entry in sorted(self.path.iterdir()):
                name = entry.name
                if (GENERATIONS.matches(name) and name != live) or name.startswith(".trash-"):
                    self._drop_generation(name)
                    dropped.append(name)
                elif name.startswith(".CURRENT.") and name.endswith(".tmp"):
                    entry.unlink(missing_ok=True)
            if live != LEGACY and self._drop_legacy_files():
                dropped.append(LEGACY)
        return dropped

    def _drop_generation(self, name: str) -> None:
        assert self.path is not None
        if name == LEGACY:
            self._drop_legacy_files()
            return
        folder = self.path / name
        if not name.startswith(".trash-"):
            # a rename first, so that a reader never opens a half-deleted generation
            trash = self.path / f".trash-{name}-{uuid.uuid4().hex[:8]}"
            try:
                folder.rename(trash)
            except FileNotFoundError:
                return
            fsync_dir(self.path)
            folder = trash
        shutil.rmtree(folder, ignore_errors=True)

    def _drop_legacy_files(self) -> bool:
        assert self.path is not None
        found = False
        for entry in self.path.iterdir():
            if _TANTIVY_FILE.fullmatch(entry.name) and entry.is_file():
                with contextlib.suppress(FileNotFoundError):
                    entry.unlink()
                found = True
        return found
