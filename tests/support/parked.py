"""A program's loop running in a thread of its own, with tasks parked on an event: what the
readings of the tasks walk, from the test's thread, in slices on that loop."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator

import asyncflow
from asyncflow.instrumentation import loops
from asyncflow.instrumentation.loops import LoopRecord


@contextlib.contextmanager
def parked_loop(n: int, tracked: bool = False, prefix: str = "p") -> Iterator[LoopRecord]:
    """A loop running in its own thread with ``n`` tasks named ``{prefix}00000``... waiting on
    an event (calls of a future ``waiter`` made in whole-program mode when ``tracked``, which
    needs a profiler running), until the block ends."""
    ready = threading.Event()
    held: list[tuple[asyncio.AbstractEventLoop, asyncio.Event, LoopRecord]] = []

    @asyncflow.future(name="waiter")
    async def waiter(go: asyncio.Event) -> None:
        await go.wait()

    async def main() -> None:
        go = asyncio.Event()
        loop = asyncio.get_running_loop()
        held.append((loop, go, loops.see(loop)))
        with asyncflow.instrument_tasks() if tracked else contextlib.nullcontext():
            crew = [
                asyncio.create_task(waiter(go) if tracked else go.wait(), name=f"{prefix}{i:05}")
                for i in range(n)
            ]
        await asyncio.sleep(0)
        ready.set()
        await asyncio.gather(*crew)

    thread = threading.Thread(target=asyncio.run, args=(main(),))
    thread.start()
    try:
        assert ready.wait(30)
        yield held[0][2]
    finally:
        loop, go, _ = held[0]
        loop.call_soon_threadsafe(go.set)
        thread.join(30)
