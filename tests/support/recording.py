"""Recording a short program in the test's process, and waiting for the recorder's moments."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import anyio

import asyncflow
from asyncflow import schema

#: the recorder of the profile :func:`profiled` runs now (the program waits for its moments)
_recorders: list[Any] = []


def profiled(
    path: Path,
    program: Callable[[], Coroutine[Any, Any, None]],
    name: str = "rec",
    queues: bool = True,
    **options: Any,
) -> schema.Snapshot:
    """Run ``program()`` under a profile recording to ``path`` (every asyncio queue
    instrumented unless ``queues`` is False); returns the final snapshot."""
    profile = asyncflow.profile(name, record=str(path), port=None, format="none", **options)
    with profile as prof:
        _recorders.append(prof._record)
        try:
            if queues:
                with asyncflow.instrument_queues():
                    asyncio.run(program())
            else:
                asyncio.run(program())
        finally:
            _recorders.pop()
    final = prof.stop()
    assert final is not None
    return final


async def moments(count: int = 3) -> None:
    """Wait until the running recorder has written ``count`` more moments: counted, not timed
    (a machine short of CPU stretches the collector's ticks, and so does the walk of a long
    test session's leftovers)."""
    recorder = _recorders[-1]
    seen = recorder.ticks
    with anyio.fail_after(60):
        while recorder.ticks < seen + count:
            await asyncio.sleep(0.01)
