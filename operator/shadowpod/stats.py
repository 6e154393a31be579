"""Small statistics helpers for benchmark reports."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100), nearest-rank on the sorted values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def summary_ms(seconds: Sequence[float]) -> dict[str, float]:
    return {
        "p50": round(percentile(seconds, 50) * 1000, 3),
        "p99": round(percentile(seconds, 99) * 1000, 3),
    }
