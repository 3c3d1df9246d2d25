"""The paired significance test of the retrieval results (evals/stats.py)."""

from __future__ import annotations

import numpy as np
import pytest

from evals.stats import paired_p


def test_paired_p_separates_a_real_difference_from_noise():
    rng = np.random.default_rng(1)
    base = rng.uniform(0, 1, 200)
    better = np.clip(base + 0.05 + rng.normal(0, 0.05, 200), 0, 1)  # better on most queries
    noise = np.clip(base + rng.normal(0, 0.05, 200), 0, 1)
    assert paired_p(better, base) < 0.001
    assert paired_p(noise, base) > 0.05
    assert paired_p(base, base) == 1.0  # nothing differs
    assert paired_p(better, base) == pytest.approx(paired_p(base, better))  # two-sided
