"""A BM25 index of chunks on tantivy, with metadata filters run inside tantivy.

What is indexed and how a query is built live in :mod:`rag.lexical.tantivy_schema`; the
generation folders and full rebuilds in :mod:`rag.lexical.tantivy_generations`.

One process writes at a time: tantivy's lock file makes a second writer fail, which is
raised as :class:`~rag.errors.DataDirLocked`. Readers need no lock and see commits. Every
read stats the ``CURRENT`` file (a few microseconds) and reopens when another instance or
process has switched the live generation.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

import tantivy
from tantivy import Query

from rag.errors import BackendError, DataDirLocked, SchemaMismatch
from rag.generations import pointer_signature, read_pointer
from rag.lexical.tantivy_generations import (
    LEGACY,
    TantivyGenerations,
    generation_folder,
    pointer,
)
from rag.lexical.tantivy_schema import build_query, decode, document, schema
from rag.lexical.tokenize import ENGLISH_TOKENIZER, english_analyzer
from rag.types import Chunk, Filters, Hit

__all__ = ["TantivyIndex"]

_OPEN_TRIES = 50


class TantivyIndex(TantivyGenerations):
    """The default :class:`~rag.types.LexicalIndex`: tantivy on disk, or in memory for tests.

    Nothing is opened until first use. The writer (and its lock) is taken at the first write,
    or with :meth:`acquire_writer`, and held until :meth:`close`.

    A full rebuild is crash-safe: :meth:`begin_rebuild` returns an index bound to a new,
    empty generation that readers do not see; :meth:`commit_rebuild` makes it live in one
    atomic step (the ``CURRENT`` file) and only then deletes the old one, and
    :meth:`abort_rebuild` deletes it instead. One rebuild runs at a time per folder (a second
    gets ``DataDirLocked``). After a crash, readers still answer from the old generation and
    :meth:`cleanup` deletes what the crashed rebuild left behind. In memory, a rebuild is
    another in-memory index that the commit swaps in.

    Example::

        index = TantivyIndex(Path(".ragqa/lexical"))
        index.upsert([Chunk(id="c1", doc_id="d1", source="docs", text="Crawled pages", hash="h")])
        hits = index.search("crawling", k=5, filters=Filters(source=("docs",)))

        new = index.begin_rebuild()
        new.upsert(all_chunks)
        index.commit_rebuild(new)     # or index.abort_rebuild(new)
        index.close()
    """

    def __init__(self, path: Path | None = None, *, writer_heap_bytes: int = 64_000_000) -> None:
        self.path = Path(path) if path is not None else None
        self._heap = writer_heap_bytes
        self._schema = schema()
        self._index: tantivy.Index | None = None
        self._writer: tantivy.IndexWriter | None = None
        self._lock = threading.RLock()
        self._signature: tuple[int, int, int] | None = None  # of CURRENT when the index was opened
        self._generation: str | None = None  # the one opened; fixed for a rebuild
        self._rebuilding = None  # the RebuildLock held by an index made by begin_rebuild
        self._origin: TantivyIndex | None = None
        self._retired = False
        self._pointer = os.path.join(self.path, "CURRENT") if self.path is not None else ""

    # -- opening -----------------------------------------------------------------------------
    def _switched(self) -> bool:
        """Whether CURRENT changed since the index was opened: one ``stat``, on every read."""
        return pointer_signature(self._pointer) != self._signature

    def _follows_current(self) -> bool:
        return self.path is not None and self._origin is None

    def _idx(self) -> tantivy.Index:
        index = self._index
        if index is not None and (not self._follows_current() or not self._switched()):
            return index
        with self._lock:
            self._refuse_if_retired()
            if self._index is None:
                self._index = self._open_live()
            elif self._follows_current() and self._switched():
                self._release_writer(wait=False)  # its generation is no longer live
                self._index = self._open_live()
            return self._index

    def _open_live(self) -> tantivy.Index:
        if self.path is None:
            return self._open(None)
        if not self._follows_current():
            assert self._generation is not None
            return self._open(self.path / self._generation)
        current = pointer(self.path)
        for _ in range(_OPEN_TRIES):
            # Open what CURRENT names, then check that CURRENT did not change meanwhile: a
            # commit may delete the generation this read had chosen.
            signature = pointer_signature(current)
            name = read_pointer(current) or LEGACY
            folder = generation_folder(self.path, name)
            if name != LEGACY and not (folder.is_dir() and tantivy.Index.exists(str(folder))):
                continue  # deleted by a commit that has already replaced CURRENT
            try:
                index = self._open(folder)
            except BackendError:
                if pointer_signature(current) != signature:
                    continue
                raise
            if pointer_signature(current) == signature:
                self._signature, self._generation = signature, name
                return index
        raise BackendError(f"the lexical index at {self.path} keeps switching generations")

    def _open(self, folder: Path | None) -> tantivy.Index:
        try:
            if folder is None:
                index = tantivy.Index(self._schema)
            else:
                if folder == self.path:
                    folder.mkdir(parents=True, exist_ok=True)
                index = tantivy.Index(self._schema, path=str(folder), reuse=True)
        except ValueError as exc:
            if "schema does not match" in str(exc):
                raise SchemaMismatch(
                    f"the lexical index at {self.path} was built with another schema; "
                    "delete that folder and reindex"
                ) from exc
            raise BackendError(f"cannot open the lexical index at {folder}: {exc}") from exc
        except OSError as exc:
            raise BackendError(f"cannot open the lexical index at {folder}: {exc}") from exc
        index.register_tokenizer(ENGLISH_TOKENIZER, english_analyzer())
        return index

    def acquire_writer(self) -> None:
        """Take the writer lock now; raises ``DataDirLocked`` if another writer holds it."""
        with self._lock:
            index = self._idx()  # first: a switched generation drops the old writer
            if self._writer is not None:
                return
            threads = max(1, min(4, os.cpu_count() or 1))
            try:
                self._writer = index.writer(heap_size=max(self._heap, threads * 16_000_000),
                                            num_threads=threads)
            except ValueError as exc:
                if "LockBusy" in str(exc):
                    raise DataDirLocked(
                        f"the lexical index at {self.path} is being written by another process "
                        "(or another TantivyIndex in this one); wait for it to finish or close it"
                    ) from exc
                raise BackendError(f"cannot open a writer on the lexical index: {exc}") from exc

    # -- writes ------------------------------------------------------------------------------
    def upsert(self, chunks: Sequence[Chunk]) -> None:
        if not chunks:
            return
        docs = [document(c) for c in chunks]  # jieba runs outside the lock
        with self._lock:
            self.acquire_writer()
            writer = self._writer
            assert writer is not None
            try:
                for chunk, doc in zip(chunks, docs, strict=True):
                    writer.delete_documents_by_term("id", chunk.id)
                    writer.add_document(doc)
            except ValueError as exc:
                writer.rollback()
                raise BackendError(f"cannot index chunks: {exc}") from exc
            self._commit()

    def delete_documents(self, doc_ids: Iterable[str]) -> None:
        self._delete("doc_id", doc_ids)

    def delete_chunks(self, chunk_ids: Iterable[str]) -> None:
        self._delete("id", chunk_ids)

    def _delete(self, field: str, values: Iterable[str]) -> None:
        """Delete every chunk whose ``field`` (``id`` or ``doc_id``) is one of ``values``."""
        terms = list(dict.fromkeys(values))
        if not terms:
            return
        with self._lock:
            self.acquire_writer()
            writer = self._writer
            assert writer is not None
            try:
                for term in terms:
                    writer.delete_documents_by_term(field, term)
            except ValueError as exc:
                writer.rollback()
                raise BackendError(f"cannot delete from the lexical index: {exc}") from exc
            self._commit()

    def _commit(self) -> None:
        assert self._writer is not None and self._index is not None
        try:
            self._writer.commit()
        except ValueError as exc:
            raise BackendError(f"cannot commit the lexical index: {exc}") from exc
        self._index.reload()

    # -- reads -------------------------------------------------------------------------------
    def search(self, query: str, k: int = 10, filters: Filters | None = None) -> list[Hit]:
        q = self.build_query(query, filters)
        if q is None or k <= 0:
            return []
        searcher = self._idx().searcher()
        hits = []
        for score, address in searcher.search(q, limit=k, count=False).hits:
            chunk = decode(searcher.doc(address))
            hits.append(Hit(chunk_id=chunk.id, score=float(score), doc_id=chunk.doc_id, chunk=chunk))
        return hits

    def build_query(self, query: str, filters: Filters | None = None) -> Query | None:
        """The tantivy query for a user query and filters; ``None`` when it has no terms."""
        return build_query(self._schema, query, filters)

    def count(self) -> int:
        return self._idx().searcher().num_docs

    def chunk_ids(self, source: str | None = None) -> set[str]:
        searcher = self._idx().searcher()
        total = searcher.num_docs
        if total == 0:
            return set()
        q = Query.all_query() if source is None else Query.term_query(self._schema, "source", source)
        return {searcher.doc(a).get_first("id") for _, a in searcher.search(q, limit=total, count=False).hits}  # type: ignore[misc]

    def close(self) -> None:
        """Release the writer (and its lock). The index reopens on the next use."""
        with self._lock:
            self._release_writer(wait=True)
            self._index = None

    def _release_writer(self, *, wait: bool) -> None:
        writer, self._writer = self._writer, None
        if writer is not None and wait:
            try:
                writer.wait_merging_threads()
            except ValueError:
                pass  # merges are an optimisation; the last commit is already durable
        del writer  # dropping the writer releases tantivy's lock file

    def __enter__(self) -> TantivyIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
