"""ragqa: ingest."""
