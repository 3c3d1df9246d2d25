"""Retrieval: one retriever over the lexical and vector indexes, and rank fusion.

Example::

    from rag.retrieval import HybridRetriever
    hits = HybridRetriever(services, mode="rrf").retrieve("certificate verification", k=5)
"""

from rag.retrieval.fusion import rrf
from rag.retrieval.hybrid import MODES, HybridRetriever, Mode

__all__ = ["MODES", "HybridRetriever", "Mode", "rrf"]
