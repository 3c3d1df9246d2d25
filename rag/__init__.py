"""ragqa: rag."""
