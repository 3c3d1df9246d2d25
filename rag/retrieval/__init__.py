"""Retrieval: one retriever over the lexical and vector indexes, and rank fusion.

Example::

    from rag.retrieval import HybridRetriever
    hits = HybridRetriever.from_services(services).retrieve("certificate verification", k=5)
"""

from rag.retrieval.fusion import rrf
from rag.retrieval.hybrid import MODES, HybridRetriever, Mode, Retrieval
from rag.retrieval.postprocess import boost_recent, drop_near_duplicates

__all__ = ["MODES", "HybridRetriever", "Mode", "Retrieval", "boost_recent", "drop_near_duplicates", "rrf"]
