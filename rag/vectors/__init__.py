"""Vector stores: an exact in-process index (:class:`NumpyVectorIndex`) and Milvus
(:class:`rag.vectors.milvus.MilvusVectorIndex`, imported on demand because pymilvus is heavy)."""

from rag.vectors.numpy_index import NumpyVectorIndex

__all__ = ["NumpyVectorIndex"]
