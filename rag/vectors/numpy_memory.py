"""The in-memory side of :class:`~rag.vectors.numpy_index.NumpyVectorIndex`: one float32
matrix of unit vectors and its filter columns, with filters as boolean masks and exact top-k.

Filter fields are numpy arrays beside the matrix: strings as integer codes, dates as int64
epoch microseconds with :data:`NO_DATE` for "no date", tags as per-tag row lists. A search
is one matrix-vector product (on unit vectors the inner product is the cosine), and a
selective filter only scores the rows it keeps. Deleted or replaced rows are masked, and
compacted away once they make up a quarter of the matrix.

Example::

    mem = Memory(dim=384)
    mem.add("c1", "docs", None, "en", 1, None, None, ("faq",), vector)
    mem.top(query, k=10, filters=Filters(tags=("faq",)))    # [("c1", 0.83)]
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from rag.codec import micros
from rag.types import Filters

__all__ = ["NO_DATE", "Codes", "Memory"]

NO_DATE = np.iinfo(np.int64).min
_COLUMNS = ("matrix", "alive", "source", "tenant", "lang", "trust", "published", "modified")


class Codes:
    """Interns strings to small integer codes (-1 stands for ``None``)."""

    def __init__(self) -> None:
        self.of: dict[str, int] = {}

    def code(self, value: str | None) -> int:
        return -1 if value is None else self.of.setdefault(value, len(self.of))

    def known(self, values: Iterable[str]) -> list[int]:
        return [self.of[v] for v in values if v in self.of]


class Memory:
    """The in-memory matrix and filter columns; row ``i`` belongs to ``ids[i]``."""

    def __init__(self, dim: int, capacity: int = 1024) -> None:
        self.dim, self.n = dim, 0
        self.ids: list[str | None] = []
        self.row_of: dict[str, int] = {}
        self.sources, self.tenants, self.langs = Codes(), Codes(), Codes()
        self.tag_rows: dict[str, list[int]] = {}
        self._tag_cache: dict[str, np.ndarray] = {}
        self._grow(capacity)

    def _grow(self, capacity: int) -> None:
        def resized(old: np.ndarray | None, dtype: type, fill: int = 0, shape: tuple = ()) -> np.ndarray:
            new = np.full((capacity, *shape), fill, dtype=dtype)
            if old is not None:
                new[: self.n] = old[: self.n]
            return new

        get = self.__dict__.get
        self.matrix = resized(get("matrix"), np.float32, shape=(self.dim,))
        self.alive = resized(get("alive"), np.bool_)
        self.source = resized(get("source"), np.int32)
        self.tenant = resized(get("tenant"), np.int32, -1)
        self.lang = resized(get("lang"), np.int32)
        self.trust = resized(get("trust"), np.int8)
        self.published = resized(get("published"), np.int64, NO_DATE)
        self.modified = resized(get("modified"), np.int64, NO_DATE)

    def add(self, cid: str, source: str, tenant: str | None, lang: str, trust: int,
            published: int | None, modified: int | None, tags: Iterable[str], vector: np.ndarray) -> None:
        old = self.row_of.get(cid)
        if old is not None:
            self.kill(old)
        if self.n == len(self.alive):
            self._grow(max(1024, 2 * self.n))
        r = self.n
        self.n += 1
        self.ids.append(cid)
        self.row_of[cid] = r
        self.matrix[r] = vector
        self.alive[r] = True
        self.source[r] = self.sources.code(source)
        self.tenant[r] = self.tenants.code(tenant)
        self.lang[r] = self.langs.code(lang)
        self.trust[r] = trust
        self.published[r] = NO_DATE if published is None else published
        self.modified[r] = NO_DATE if modified is None else modified
        for tag in set(tags):
            self.tag_rows.setdefault(tag, []).append(r)
            self._tag_cache.pop(tag, None)

    def kill(self, row: int) -> None:
        cid = self.ids[row]
        if cid is not None:
            del self.row_of[cid]
            self.ids[row] = None
            self.alive[row] = False

    def remove(self, chunk_ids: Iterable[str]) -> None:
        """Mask the rows of ``chunk_ids`` (ids not held are ignored), compacting if sparse."""
        for cid in chunk_ids:
            if (row := self.row_of.get(cid)) is not None:
                self.kill(row)
        self.compact_if_sparse()

    def tag_array(self, tag: str) -> np.ndarray:
        arr = self._tag_cache.get(tag)
        if arr is None:
            arr = self._tag_cache[tag] = np.asarray(self.tag_rows.get(tag, ()), dtype=np.int64)
        return arr

    def compact_if_sparse(self) -> None:
        dead = self.n - len(self.row_of)
        if dead < 1024 or dead * 4 < self.n:
            return
        keep = np.flatnonzero(self.alive[: self.n])
        remap = np.full(self.n, -1, dtype=np.int64)
        remap[keep] = np.arange(len(keep))
        for name in _COLUMNS:
            setattr(self, name, getattr(self, name)[keep].copy())
        self.ids = [self.ids[i] for i in keep]
        self.row_of = {cid: i for i, cid in enumerate(self.ids)}  # type: ignore[misc]
        tag_rows = {}
        for tag in self.tag_rows:
            rows = remap[self.tag_array(tag)]
            if (rows := rows[rows >= 0]).size:
                tag_rows[tag] = rows.tolist()
        self.tag_rows, self._tag_cache, self.n = tag_rows, {}, len(keep)
        self._grow(max(1024, self.n + self.n // 2))

    def mask(self, f: Filters) -> np.ndarray:
        n = self.n
        mask = self.alive[:n].copy()
        for column, codes, wanted in ((self.source, self.sources, f.source), (self.lang, self.langs, f.lang)):
            if wanted:
                mask &= _any_of(column[:n], codes.known(wanted))
        if f.tenant is not None:
            mask &= self.tenant[:n] == self.tenants.of.get(f.tenant, -2)
        if f.tags:
            has_tag = np.zeros(n, dtype=np.bool_)
            for tag in f.tags:
                has_tag[self.tag_array(tag)] = True
            mask &= has_tag
        if f.min_trust is not None:
            mask &= self.trust[:n] >= int(f.min_trust)
        for name in ("published", "modified"):
            lo, hi = getattr(f, f"{name}_from"), getattr(f, f"{name}_to")
            column = getattr(self, name)[:n]
            if lo is not None:  # also excludes NO_DATE, the smallest int64
                mask &= column >= micros(lo)
            elif hi is not None:
                mask &= column != NO_DATE
            if hi is not None:
                mask &= column <= micros(hi)
        return mask

    def top(self, q: np.ndarray, k: int, filters: Filters | None) -> list[tuple[str, float]]:
        """The ``k`` best (chunk id, score) pairs for unit query ``q``, best first."""
        n = self.n
        if filters is None or filters.is_empty():
            rows = None if len(self.row_of) == n else np.flatnonzero(self.alive[:n])
        else:
            rows = np.flatnonzero(self.mask(filters))
        if rows is None:
            scores = self.matrix[:n] @ q
        elif rows.size * 4 < n:  # selective: score only the kept rows
            scores = self.matrix[rows] @ q
        else:
            scores = (self.matrix[:n] @ q)[rows]
        kk = min(k, scores.size)
        if kk == 0:
            return []
        best = np.argpartition(-scores, kk - 1)[:kk]
        best = best[np.argsort(-scores[best], kind="stable")]
        at = best if rows is None else rows[best]
        ids = self.ids
        return [(ids[int(r)], float(scores[i])) for r, i in zip(at, best, strict=True)]  # type: ignore[misc]

    def ids_of_source(self, source: str) -> set[str]:
        code = self.sources.of.get(source)
        if code is None:
            return set()
        rows = np.flatnonzero(self.alive[: self.n] & (self.source[: self.n] == code))
        return {self.ids[r] for r in rows}  # type: ignore[misc]


def _any_of(column: np.ndarray, codes: list[int]) -> np.ndarray:
    if len(codes) == 1:
        return column == codes[0]
    if not codes:
        return np.zeros(len(column), dtype=np.bool_)
    out = column == codes[0]
    for code in codes[1:]:
        out |= column == code
    return out
