"""Log-linear histograms with bounded memory and bounded relative error, and their percentiles.

A duration ``ns`` falls in bucket ``bucket_of(ns)``: values below 64 keep their own bucket; above,
a bucket spans 1/32 of its power of two, so any value is reported within 1/64 (~1.6%) of the truth
once the bucket's midpoint stands for it. There are ``BUCKETS`` (2,080) possible buckets, but a
future, a channel or an edge fills a few dozen of them, so a histogram is sparse: a
``defaultdict(int)`` from bucket to count, which the hot path bumps in place without a call
(``h[b] += 1``) and which stays a few hundred bytes where a dense list costs 16.6 KB.
``SMALL_BUCKET`` maps the common small durations straight to their bucket.

Why a dict and not a ``sortedcontainers.SortedDict``: the poll path bumps a histogram on every
poll, and a ``SortedDict`` bump is a Python-level call (~340 ns against ~70 ns for a dict,
measured side by side); percentiles sort the few filled buckets on the cold path instead.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from itertools import accumulate
from operator import itemgetter
from typing import TypeAlias

__all__ = [
    "BUCKETS",
    "SMALL_BUCKET",
    "SMALL_LIMIT",
    "Histogram",
    "bucket_of",
    "bucket_value",
    "merge",
    "new_histogram",
    "percentile_key",
    "percentiles",
    "record",
]

_SUB_BITS = 5  # 32 sub-buckets per power of two
_LINEAR = 1 << (_SUB_BITS + 1)  # values below this are exact
BUCKETS = (64 + 1) << _SUB_BITS
SMALL_LIMIT = 1 << 16  # ~65 µs: covers almost every poll of a healthy program

#: bucket -> count; a missing bucket counts 0 (``h[b] += n`` needs no check)
Histogram: TypeAlias = "defaultdict[int, int]"


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


def _small_table() -> list[int]:
    """``bucket_of(ns)`` for every ``ns < SMALL_LIMIT``, built a bucket's run at a time: calling
    bucket_of 65,536 times cost ~25 ms of every ``import asyncflow``; this costs ~1 ms."""
    table = _INTERNED[:_LINEAR]
    bits = _LINEAR.bit_length()
    while len(table) < SMALL_LIMIT:
        width = 1 << (bits - _SUB_BITS - 1)  # the values one bucket spans at this power of two
        for sub in range(1 << _SUB_BITS):
            table += [_INTERNED[(bits << _SUB_BITS) | sub]] * width
        bits += 1
    return table


#: ``SMALL_BUCKET[ns]`` is ``bucket_of(ns)`` for ``ns < SMALL_LIMIT``, sharing the int objects.
SMALL_BUCKET: list[int] = _small_table()


def new_histogram() -> Histogram:
    """An empty (sparse) histogram."""
    return defaultdict(int)


def record(histogram: Histogram, ns: int, weight: int = 1) -> None:
    """Count one duration (cold-path helper; the hot path inlines the same two lines)."""
    histogram[SMALL_BUCKET[ns] if 0 <= ns < SMALL_LIMIT else bucket_of(ns)] += weight


def merge(into: MutableMapping[int, int], other: Mapping[int, int]) -> None:
    """Add every count of ``other`` to ``into`` (folding a gone object into an aggregate)."""
    for bucket, count in list(other.items()):
        if count:
            into[bucket] += count


def _items(histogram: Mapping[int, int] | Sequence[int]) -> list[tuple[int, int]]:
    """(bucket, count) of the filled buckets, in bucket order; a copy taken safely while the hot
    path may add buckets from another thread."""
    if isinstance(histogram, Mapping):
        for _ in range(100):
            try:
                pairs = list(histogram.items())
                break
            except RuntimeError:  # a bucket was added mid-copy: take it again
                continue
        else:
            return []
        pairs.sort()
        return [p for p in pairs if p[1] > 0]
    return [(b, n) for b, n in enumerate(histogram) if n > 0]


def percentiles(
    histogram: Mapping[int, int] | Sequence[int], qs: Iterable[float]
) -> dict[str, int]:
    """Percentiles of a histogram, keyed ``"p50"``, ``"p99.9"``...; empty when nothing counted.

    Args:
        histogram: bucket counts, sparse (as made by :func:`new_histogram`) or a dense list.
        qs: percentiles in (0, 100].

    Returns:
        A mapping from ``"p<q>"`` to nanoseconds (the bucket's representative value).
    """
    filled = _items(histogram)
    if not filled:
        return {}
    # the counts up to each bucket: a percentile is the first bucket whose count reaches its
    # rank, found by bisection (documents ask this of every future's histograms each second)
    cumulative = list(accumulate(map(itemgetter(1), filled)))
    total = cumulative[-1]
    out: dict[str, int] = {}
    for q in qs:
        rank = max(1, -(-total * q // 100))  # ceil(total * q / 100), at least the first sample
        at = bisect_left(cumulative, rank)
        if at < len(filled):
            out[percentile_key(q)] = bucket_value(filled[at][0])
    return out


def percentile_key(q: float) -> str:
    """``50`` -> ``"p50"``, ``99.9`` -> ``"p99.9"``."""
    return f"p{q:g}"
