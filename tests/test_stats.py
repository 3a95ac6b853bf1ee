"""Histograms: bounded relative error, exact small values, percentiles by rank."""

from __future__ import annotations

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
