"""A job dispatcher whose workers wait on one Condition for new jobs; the dispatcher calls
``notify_all()`` for every job, so each job wakes all 200 workers, of which one takes it and
199 go back to waiting."""

from __future__ import annotations

import asyncio
import collections


async def worker(jobs: collections.deque[int], ready: asyncio.Condition, done: list[int]) -> None:
    while True:
        async with ready:
            await ready.wait_for(lambda: bool(jobs))
            job = jobs.popleft()
        await asyncio.sleep(0.001)  # run the job
        done.append(job)


async def dispatch(jobs: collections.deque[int], ready: asyncio.Condition, count: int) -> None:
    for job in range(count):
        async with ready:
            jobs.append(job)
            ready.notify_all()  # the storm: notify() would wake the one worker needed
        await asyncio.sleep(0.001)


async def main() -> None:
    jobs: collections.deque[int] = collections.deque()
    ready = asyncio.Condition()
    done: list[int] = []
    workers = [asyncio.create_task(worker(jobs, ready, done)) for _ in range(200)]
    await dispatch(jobs, ready, 500)
    while len(done) < 500:
        await asyncio.sleep(0.01)
    for w in workers:
        w.cancel()
    await asyncio.gather(*workers, return_exceptions=True)
    print(f"{len(done)} jobs done", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
