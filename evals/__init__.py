"""ragqa: evals."""
