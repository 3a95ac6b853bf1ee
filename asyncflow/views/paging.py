"""Helpers every document builder shares: one page of a list, percentiles capped at the max."""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

__all__ = ["at_most", "ordered_page", "within"]

_R = TypeVar("_R")


def ordered_page(
    records: Sequence[_R], key: Callable[[_R], Any], offset: int, limit: int | None
) -> list[_R]:
    """The records of one page, in ``key`` order, without ordering the records past it."""
    if limit is None:
        return sorted(records, key=key)[offset:]
    if limit <= 0 or offset >= len(records):
        return []
    return heapq.nsmallest(offset + limit, records, key=key)[offset:]


def at_most(percentiles: dict[str, int], ceiling: int) -> dict[str, int]:
    """Percentiles never above the largest sample: a bucket's midpoint can lie above it."""
    return {key: min(value, ceiling) for key, value in percentiles.items()}


def within(
    percentiles: dict[str, int], low: float | int | None, high: float | int | None
) -> dict[str, int]:
    """Percentiles between the smallest and the largest sample (as integers): a bucket's
    midpoint can lie outside them."""
    out = {}
    for key, value in percentiles.items():
        if high is not None and value > high:
            value = math.floor(high)
        if low is not None and value < low:
            value = math.ceil(low)
        out[key] = value
    return out
