"""Consistency between the state database and every index: ``ragqa verify``.

The state database is the record of what should be indexed. For each source and each
index (lexical, vector, and the local vector cache when it is separate), ``verify`` lists
chunks the state has but the index lacks (*missing*) and chunks the index has but the
state does not (*extra*). Chunk ids are derived from the text's hash, so an index that
holds an outdated version of a chunk shows it as one extra id plus one missing id; the
documents with both are reported as *stale*.

``repair`` fixes drift by touching only the affected chunks: missing ones are written
from the state (their vectors come from the vector cache by text hash, or are embedded),
extra ones are deleted.

Example::

    report = verify(services, repair=True)
    assert report.drift == 0
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from ingest.services import state_db
from ingest.vectors import vectors_for
from rag.metrics import DRIFT_META, INDEX_DRIFT_CHUNKS
from rag.services import Services
from rag.types import Chunk

__all__ = ["verify", "VerifyReport", "IndexDrift"]


@dataclass
class IndexDrift:
    index: str
    source: str
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    stale_documents: list[str] = field(default_factory=list)


@dataclass
class VerifyReport:
    indexes: list[IndexDrift] = field(default_factory=list)
    repaired: int = 0

    @property
    def drift(self) -> int:
        return sum(len(d.missing) + len(d.extra) for d in self.indexes)

    def as_dict(self, limit: int = 20) -> dict[str, Any]:
        rows = []
        for d in self.indexes:
            row = asdict(d)
            row["missing_count"], row["extra_count"] = len(d.missing), len(d.extra)
            row["missing"], row["extra"] = d.missing[:limit], d.extra[:limit]
            rows.append(row)
        return {"drift": self.drift, "repaired": self.repaired, "indexes": rows}


def verify(services: Services, source: str | None = None, repair: bool = False) -> VerifyReport:
    """Compare the state with every index, per source; with ``repair``, fix what differs."""
    state = state_db(services)
    names = [source] if source else [s.name for s in state.sources()]
    if source:
        state.source(source)  # an unknown source is a clear error
    report = VerifyReport()
    for name in names:
        expected: dict[str, Chunk] = {c.id: c for c in state.iter_chunks(name)}
        for label, index in services.indexes().items():
            present = index.chunk_ids(name)
            drift = IndexDrift(label, name, sorted(set(expected) - present), sorted(present - set(expected)))
            missing_docs = {expected[c].doc_id for c in drift.missing}
            drift.stale_documents = sorted(missing_docs) if drift.extra else []
            report.indexes.append(drift)
            if repair and (drift.missing or drift.extra):
                report.repaired += _repair(services, label, index, [expected[c] for c in drift.missing],
                                           drift.extra)
    totals: dict[str, int] = defaultdict(int)
    for d in report.indexes:
        totals[d.index] += len(d.missing) + len(d.extra)
    for label, n in totals.items():
        INDEX_DRIFT_CHUNKS.labels(label).set(0 if repair else n)
    # Kept in the state too, so that a server's /metrics shows what a `ragqa verify` process found.
    recorded = json.loads(state.get_meta(DRIFT_META) or "{}")
    recorded.update({label: {"chunks": 0 if repair else n, "at": time.time()} for label, n in totals.items()})
    state.set_meta(DRIFT_META, json.dumps(recorded))
    return report


def _repair(services: Services, label: str, index: Any, missing: list[Chunk], extra: list[str]) -> int:
    if extra:
        index.delete_chunks(extra)
    if missing:
        if label == "lexical":
            index.upsert(missing)
        else:
            index.upsert(missing, vectors_for(services, missing)[0])
    return len(missing) + len(extra)
