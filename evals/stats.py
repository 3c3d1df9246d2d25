"""The paired significance test behind every "Δ (p)" of the retrieval results.

Two-sided paired randomization (sign-flip) test of the mean difference between two systems'
per-query scores, by ``scipy.stats.permutation_test`` (``permutation_type="samples"`` swaps
the two systems' scores within a query, which flips the sign of that query's difference).

Example::

    paired_p([0.5, 0.7, 0.9], [0.4, 0.7, 0.6])   # p of "the means differ"
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.stats import permutation_test

__all__ = ["ROUNDS", "paired_p"]

ROUNDS = 10_000


def paired_p(a: Sequence[float], b: Sequence[float], rounds: int = ROUNDS, seed: int = 0) -> float:
    """The p-value of mean(a - b) != 0 over paired scores (1.0 when they never differ)."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if not (x - y).any():
        return 1.0
    result = permutation_test((x, y), lambda u, v, axis: np.mean(u - v, axis=axis), vectorized=True,
                              permutation_type="samples", n_resamples=rounds, alternative="two-sided",
                              random_state=seed)
    return float(result.pvalue)
