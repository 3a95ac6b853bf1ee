"""Histograms: bounded relative error, exact small values, percentiles by rank."""

from __future__ import annotations

import math
import random
import sys

import pytest

from asyncflow import stats


@pytest.mark.parametrize("ns", [0, 1, 63, 64, 65, 127, 128, 1_000, 65_535, 65_536, 10**6, 10**12])
def test_bucket_value_is_within_one_sixty_fourth(ns: int) -> None:
    value = stats.bucket_value(stats.bucket_of(ns))
    assert abs(value - ns) <= ns / 64


def test_buckets_are_monotonic_and_small_table_agrees() -> None:
    previous = -1
    for ns in range(0, stats.SMALL_LIMIT, 7):
        bucket = stats.bucket_of(ns)
        assert bucket >= previous
        assert stats.SMALL_BUCKET[ns] == bucket
        previous = bucket
    assert stats.bucket_of(2**64) < stats.BUCKETS


def test_percentiles_by_rank() -> None:
    h = stats.new_histogram()
    for ns in range(1, 101):
        stats.record(h, ns * 1000)
    p = stats.percentiles(h, [50, 99, 100])
    assert abs(p["p50"] - 50_000) <= 50_000 / 64
    assert abs(p["p99"] - 99_000) <= 99_000 / 64
    assert abs(p["p100"] - 100_000) <= 100_000 / 64
    assert stats.percentiles(stats.new_histogram(), [50]) == {}


def _first_reaching(histogram: dict[int, int] | list[int], q: float) -> int | None:
    """The percentile as its definition reads: the first filled bucket, in bucket order, whose
    running count reaches the rank ceil(total * q / 100) (at least 1)."""
    pairs = sorted(histogram.items()) if isinstance(histogram, dict) else enumerate(histogram)
    filled = [(b, n) for b, n in pairs if n > 0]
    total = sum(n for _, n in filled)
    rank = max(1, math.ceil(total * q / 100))
    seen = 0
    for bucket, count in filled:
        seen += count
        if seen >= rank:
            return stats.bucket_value(bucket)
    return None


def test_each_percentile_is_the_first_bucket_whose_running_count_reaches_its_rank() -> None:
    rng = random.Random(11)
    qs = [0.1, 1, 33.3, 50, 90, 99, 99.9, 100]
    for _ in range(500):
        h = stats.new_histogram()
        for _ in range(rng.randrange(0, 200)):
            stats.record(h, rng.randrange(0, 10 ** rng.randrange(2, 12)), rng.randrange(1, 4))
        if h and rng.random() < 0.3:
            h[rng.choice(list(h))] = 0  # a bucket emptied (a merge can leave one)
        dense = [rng.choice([0, 0, 1, 2, 7]) for _ in range(rng.randrange(0, 40))]
        for histogram in (dict(h), dense):
            got = stats.percentiles(histogram, qs)
            expected = {
                stats.percentile_key(q): v
                for q in qs
                if (v := _first_reaching(histogram, q)) is not None
            }
            assert got == expected


def test_memory_is_bounded_whatever_the_sample_count() -> None:
    h = stats.new_histogram()
    rng = random.Random(7)
    for _ in range(20_000):
        stats.record(h, rng.randrange(0, 10**10))
    assert len(h) <= stats.BUCKETS
    assert sum(h.values()) == 20_000


def test_a_histogram_holds_only_the_buckets_it_filled() -> None:
    h = stats.new_histogram()
    for ns in range(1_024, 2_048):  # one octave: 32 buckets of 2,080
        stats.record(h, ns)
    assert len(h) == 32
    assert sys.getsizeof(h) < 2_000  # a dense list of every bucket takes 16.6 KB
    assert stats.percentiles(h, [50]) == stats.percentiles(_dense(h), [50])


def _dense(h: dict[int, int]) -> list[int]:
    dense = [0] * stats.BUCKETS
    for bucket, count in h.items():
        dense[bucket] = count
    return dense


def test_merge_adds_counts_and_weights_count() -> None:
    a, b = stats.new_histogram(), stats.new_histogram()
    stats.record(a, 100)
    stats.record(b, 100, weight=3)
    stats.record(b, 10**6)
    stats.merge(a, b)
    assert dict(a) == {stats.bucket_of(100): 4, stats.bucket_of(10**6): 1}
    assert stats.percentiles(a, [80, 100]) == {
        "p80": stats.bucket_value(stats.bucket_of(100)),
        "p100": stats.bucket_value(stats.bucket_of(10**6)),
    }


def test_percentile_keys() -> None:
    assert stats.percentile_key(50) == "p50"
    assert stats.percentile_key(99.9) == "p99.9"
