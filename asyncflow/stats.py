"""Log-linear histograms with bounded memory and bounded relative error, and their percentiles.

A duration ``ns`` falls in bucket ``bucket_of(ns)``: values below 64 keep their own bucket; above,
a bucket spans 1/32 of its power of two, so any value is reported within 1/64 (~1.6%) of the truth
once the bucket's midpoint stands for it. A histogram is a plain ``list[int]`` of ``BUCKETS``
counts so that the hot path can bump it in place without a call; ``SMALL_BUCKET`` maps the common
small durations straight to their bucket.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Sequence
from itertools import accumulate

__all__ = [
    "BUCKETS",
    "SMALL_BUCKET",
    "SMALL_LIMIT",
    "bucket_of",
    "bucket_value",
    "new_histogram",
    "percentiles",
    "record",
]

_SUB_BITS = 5  # 32 sub-buckets per power of two
_LINEAR = 1 << (_SUB_BITS + 1)  # values below this are exact
BUCKETS = (64 + 1) << _SUB_BITS
SMALL_LIMIT = 1 << 16  # ~65 µs: covers almost every poll of a healthy program


def bucket_of(ns: int) -> int:
    """The histogram bucket of a non-negative duration in nanoseconds."""
    if ns < _LINEAR:
        return max(ns, 0)
    bits = ns.bit_length()
    if bits > 64:  # beyond 584 years: count it in the last bucket rather than overflow
        return BUCKETS - 1
    return (bits << _SUB_BITS) | ((ns >> (bits - _SUB_BITS - 1)) & ((1 << _SUB_BITS) - 1))


def bucket_value(index: int) -> int:
    """The value a bucket stands for: its midpoint (exact below 64 ns)."""
    if index < _LINEAR:
        return index
    bits, sub = index >> _SUB_BITS, index & ((1 << _SUB_BITS) - 1)
    low = ((1 << _SUB_BITS) | sub) << (bits - _SUB_BITS - 1)
    width = 1 << (bits - _SUB_BITS - 1)
    return low + width // 2


_INTERNED = list(range(BUCKETS))
#: ``SMALL_BUCKET[ns]`` is ``bucket_of(ns)`` for ``ns < SMALL_LIMIT``, sharing the int objects.
SMALL_BUCKET: list[int] = [_INTERNED[bucket_of(ns)] for ns in range(SMALL_LIMIT)]


def new_histogram() -> list[int]:
    """An empty histogram."""
    return [0] * BUCKETS


def record(histogram: list[int], ns: int) -> None:
    """Count one duration (cold-path helper; the hot path inlines the same two lines)."""
    histogram[SMALL_BUCKET[ns] if 0 <= ns < SMALL_LIMIT else bucket_of(ns)] += 1


def percentiles(histogram: Sequence[int], qs: Iterable[float]) -> dict[str, int]:
    """Percentiles of a histogram, keyed ``"p50"``, ``"p99.9"``...; empty when nothing counted.

    Args:
        histogram: bucket counts as made by :func:`new_histogram`.
        qs: percentiles in (0, 100].

    Returns:
        A mapping from ``"p<q>"`` to nanoseconds (the bucket's representative value).
    """
    cumulative = list(accumulate(histogram))
    total = cumulative[-1] if cumulative else 0
    if total == 0:
        return {}
    out: dict[str, int] = {}
    for q in qs:
        rank = max(1, -(-total * q // 100))  # ceil(total * q / 100), at least the first sample
        out[percentile_key(q)] = bucket_value(bisect_left(cumulative, rank))
    return out


def percentile_key(q: float) -> str:
    """``50`` -> ``"p50"``, ``99.9`` -> ``"p99.9"``."""
    return f"p{q:g}"
