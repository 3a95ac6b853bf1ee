"""Helpers every document builder shares: one page of a list, percentiles capped at the max."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

__all__ = ["at_most", "ordered_page"]

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
