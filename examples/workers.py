"""Worker processes, each profiled on its own by ``asyncflow run``.

The program hands two batches of jobs to two worker processes (multiprocessing's spawn, as
uvicorn's ``--workers`` are started); each worker handles its batch on an event loop of its own.
Under ``asyncflow run`` each worker has its own profile, ``workers/process-1`` and
``workers/process-2``, and its own report:

    asyncflow run examples/workers.py
    asyncflow run --output report.txt examples/workers.py   # report.process-1.txt... beside it
"""

from __future__ import annotations

import asyncio
import multiprocessing
import sys


async def fetch(job: int) -> int:
    await asyncio.sleep(0.01)  # a database, an upstream
    return job


async def handle(job: int) -> int:
    return 2 * await fetch(job)


async def serve(jobs: list[int]) -> int:
    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(handle(job)) for job in jobs]
    return sum(task.result() for task in tasks)


def worker(jobs: list[int]) -> None:
    asyncio.run(serve(jobs))


def main() -> int:
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=worker, args=(list(range(n, 40, 2)),)) for n in range(2)]
    for process in workers:
        process.start()
    for process in workers:
        process.join()
    print(f"{len(workers)} workers done", flush=True)
    return max(process.exitcode or 0 for process in workers)


if __name__ == "__main__":
    sys.exit(main())
