"""Keyword (BM25) search over chunks. The default backend is :class:`TantivyIndex`."""

from rag.lexical.tantivy_index import TantivyIndex

__all__ = ["TantivyIndex"]
