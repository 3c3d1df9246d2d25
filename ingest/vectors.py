"""Vectors for chunks, reusing every vector already computed for the same text.

Example::

    matrix, embedded = vectors_for(services, chunks)   # embedded: how many were computed
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rag.services import Services
from rag.types import Chunk

__all__ = ["vectors_for"]


def vectors_for(services: Services, chunks: Sequence[Chunk]) -> tuple[np.ndarray, int]:
    """One unit vector per chunk (rows in order) and the number of texts that were embedded.

    Vectors come from the local vector cache by text hash when there is one; otherwise from
    the vector index by chunk id, which is stable for an unchanged text in its document.
    Only texts found in neither are embedded, each distinct text once.
    """
    if not chunks:
        return np.zeros((0, services.embedder.dim), dtype=np.float32), 0
    cache = services.vector_cache
    if cache is not None and hasattr(cache, "vectors_by_hash"):
        known = cache.vectors_by_hash(sorted({c.hash for c in chunks}))
    else:
        by_id = services.vector.get_vectors([c.id for c in chunks])
        known = {c.hash: by_id[c.id] for c in chunks if c.id in by_id}
    todo = sorted({c.hash: c.text for c in chunks if c.hash not in known}.items())
    if todo:
        vecs = services.embedder.embed_documents([text for _, text in todo])
        known.update({h: vecs[i] for i, (h, _) in enumerate(todo)})
    return np.stack([known[c.hash] for c in chunks]).astype(np.float32), len(todo)
