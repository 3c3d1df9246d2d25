"""``ragqa rebuild``: rebuild every index into a new generation, then switch atomically.

Use it after changing the index schema or analysis, after restoring a backup, or to
compact. The chunks come from the state database, so nothing is crawled again, and their
vectors come from the local vector cache (by text hash) where it has them, so nothing is
embedded again either.

Each index writes a new physical index (an Elasticsearch index behind the alias, a Milvus
collection behind an alias, a tantivy generation folder, a numpy table) while the old one
keeps answering queries. Only when every new index is complete are they switched, one
atomic switch each, and the old ones dropped. A crash before the switch leaves the old
indexes serving; the orphans are removed by the next rebuild.

Example::

    with services.write_lock():
        report = rebuild(services)
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from itertools import islice
from typing import Any

from tqdm import tqdm

from ingest.services import state_db
from ingest.vectors import vectors_for
from rag.services import Services
from rag.types import Chunk

__all__ = ["rebuild", "RebuildReport"]

log = logging.getLogger("ragqa.rebuild")
BATCH = 512


@dataclass
class RebuildReport:
    chunks: int = 0
    chunks_embedded: int = 0
    indexes: list[str] = field(default_factory=list)
    removed_orphans: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _batches(chunks: Iterator[Chunk], n: int) -> Iterator[list[Chunk]]:
    while batch := list(islice(chunks, n)):
        yield batch


def rebuild(services: Services, *, progress: bool = False) -> RebuildReport:
    """Rebuild the lexical and vector indexes from the state database. Hold the write lock."""
    started = time.monotonic()
    report = RebuildReport()
    targets: dict[str, Any] = services.indexes()
    for name, index in targets.items():
        orphans = index.cleanup()
        report.removed_orphans += [f"{name}:{o}" for o in orphans]
    fresh = {name: index.begin_rebuild() for name, index in targets.items()}
    try:
        total = state_db(services).counts()[1]
        bar = tqdm(total=total, desc="rebuild", unit="chunk", file=sys.stderr,
                   disable=None if progress else True)
        for batch in _batches(state_db(services).iter_chunks(), BATCH):
            # Vectors are read from the live cache while a new cache is being written.
            vectors, embedded = vectors_for(services, batch)
            report.chunks_embedded += embedded
            for name, new in fresh.items():
                if name == "lexical":
                    new.upsert(batch)
                else:
                    new.upsert(batch, vectors)
            report.chunks += len(batch)
            bar.update(len(batch))
        bar.close()
    except BaseException:
        for name, new in fresh.items():
            try:
                targets[name].abort_rebuild(new)
            except Exception:  # the original error matters more; cleanup() catches the rest
                log.exception("could not drop the unfinished %s index", name)
        raise
    for name, new in fresh.items():
        targets[name].commit_rebuild(new)
        report.indexes.append(name)
    report.seconds = round(time.monotonic() - started, 3)
    return report
