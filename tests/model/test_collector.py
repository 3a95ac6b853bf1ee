"""The collector's drain loop."""

from __future__ import annotations

import asyncio

import pytest

from asyncflow.config import resolve_options
from asyncflow.instrumentation import _session
from asyncflow.model.collector import Collector


async def test_a_failing_drain_is_counted_and_the_collector_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    col = Collector(_session.Session(0, 0), resolve_options("test", {}))
    drains = [0]

    def broken() -> int:
        drains[0] += 1
        raise RuntimeError("folding failed")

    async def next_round(_seconds: float) -> None:  # no real sleep: three rounds, then stop
        if drains[0] == 3:
            raise asyncio.CancelledError

    monkeypatch.setattr(col, "drain", broken)
    monkeypatch.setattr(asyncio, "sleep", next_round)  # the collector's, for this test
    before = _session.errors.count
    try:
        with pytest.raises(asyncio.CancelledError):
            await col.run()
    finally:
        col.monitor.stop()
    assert drains[0] == 3 and _session.errors.count == before + 3
    assert _session.errors.last == "collecting: RuntimeError: folding failed"
