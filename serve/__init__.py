"""ragqa: serve."""
