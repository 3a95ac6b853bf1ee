"""A profiler with every loop tracked, as ``asyncflow run`` runs a program, for the tests of
whole-program mode's hooks (routes, loops)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import asyncflow
from asyncflow.instrumentation.every_loop import track_every_loop


@contextlib.contextmanager
def every_loop_tracked(name: str, **options: Any) -> Iterator[asyncflow.Profiler]:
    """A profiler that writes no report (``options`` are ``asyncflow.profile``'s), and every
    loop made from now on tracked, until the block ends."""
    with asyncflow.profile(name, format="none", **options) as prof:
        tracking = track_every_loop(executors=False)
        try:
            yield prof
        finally:
            tracking.undo()
