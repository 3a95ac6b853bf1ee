"""One small program with every problem asyncflow names planted in it, one of each.

Run it and read the warnings first in the report (the manual's "Diagnosing a slow service"
page, docs/warnings.md, shows them and explains each):

    python examples/every_problem.py

Each function below is a few lines of what a real service does, with one bug in it; the comment
at the end of a line says which.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gc
import time
import warnings

import asyncflow

never = asyncio.Event()


async def fetch_pages(raw: asyncio.Queue[int]) -> None:
    for i in range(40):
        await raw.put(i)
    await raw.put(-1)


async def enrich(raw: asyncio.Queue[int]) -> None:
    while await raw.get() >= 0:
        await asyncio.sleep(0.005)  # a slow backend: the bottleneck of the pipeline


async def notify(outbox: asyncio.Queue[int]) -> None:
    for i in range(25):
        outbox.put_nowait(i)  # nobody ever reads outbox


async def lookup() -> None:
    await never.wait()  # every call ends cancelled


async def poll_forever() -> None:
    with contextlib.suppress(asyncio.CancelledError):  # a cancellation swallowed
        await never.wait()


async def render_page() -> None:
    time.sleep(0.15)  # blocks the event loop
    await asyncio.sleep(0)


async def send_mail() -> None:
    pass


async def refresh(cache: asyncio.Lock) -> None:
    async with cache:
        await asyncio.sleep(0.002)  # awaits while holding the lock every worker needs


async def query(pool: asyncio.Semaphore) -> None:
    await pool.acquire()
    raise ConnectionResetError("peer went away")  # never gives the connection back


async def wait_config(config_loaded: asyncio.Event) -> None:
    await config_loaded.wait()  # nobody sets it


def resize() -> None:
    time.sleep(0.003)  # one worker for all of them: the pool is saturated


async def subscribe() -> None:
    await never.wait()  # never ends: one more task on every tick


async def main() -> None:
    loop = asyncio.get_running_loop()
    raw: asyncio.Queue[int] = asyncio.Queue(2)
    outbox: asyncio.Queue[int] = asyncio.Queue()
    doomed: asyncio.Queue[int] = asyncio.Queue()
    for i in range(5):
        doomed.put_nowait(i)
    del doomed  # dropped with 5 messages in it
    cache, pool, config_loaded = asyncio.Lock(), asyncio.Semaphore(2), asyncio.Event()
    await asyncio.gather(fetch_pages(raw), enrich(raw), notify(outbox))
    for _ in range(12):  # each lookup times out: its work is thrown away
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.create_task(lookup()), 0.005)
    stubborn = asyncio.create_task(poll_forever())
    await asyncio.sleep(0)
    stubborn.cancel()
    await asyncio.gather(stubborn, return_exceptions=True)
    await asyncio.create_task(render_page())
    with warnings.catch_warnings():  # the program hides Python's warning: asyncflow still counts
        warnings.simplefilter("ignore")
        send_mail()  # type: ignore[unused-coroutine]  # called, never awaited
        gc.collect()
    await asyncio.gather(*(refresh(cache) for _ in range(20)))
    await asyncio.gather(query(pool), query(pool), return_exceptions=True)
    waiting = [asyncio.create_task(wait_config(config_loaded)) for _ in range(3)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="img") as images:
        await asyncio.gather(*(loop.run_in_executor(images, resize) for _ in range(10)))
    leaked: list[asyncio.Task[None]] = []
    for _ in range(10):
        leaked += [asyncio.create_task(subscribe()) for _ in range(20)]
        await asyncio.sleep(0.15)
    asyncflow.stop()  # the report is written now, while the leaked tasks are still alive
    for task in [*leaked, *waiting]:
        task.cancel()
    await asyncio.gather(*leaked, *waiting, return_exceptions=True)


def run() -> int:
    asyncflow.start("every-problem", limit=3)
    with (
        asyncflow.instrument_queues(),
        asyncflow.instrument_locks(),
        asyncflow.track_never_awaited(),
        asyncio.Runner() as runner,
    ):
        asyncflow.instrument_tasks(runner.get_loop())
        asyncflow.instrument_executors(runner.get_loop())
        runner.run(main())
    return 0


if __name__ == "__main__":
    raise SystemExit(run())
