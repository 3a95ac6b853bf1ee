"""A pool made for each of 150 jobs, then the program waits (docs/how-it-stays-cheap.md).

Each job runs in a ``ThreadPoolExecutor`` of its own, made and shut down around one
``run_in_executor``: the executors document keeps the last gone pools as they were and sums
the older ones, which ``asyncflow snapshot`` then ``asyncflow report --limit 4`` shows.
"""

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import asyncflow


def thumbnail(i: int) -> int:
    return sum(range(i * 10))


async def main() -> None:
    asyncflow.instrument_executors()  # every pool's jobs on this loop, counted and timed
    loop = asyncio.get_running_loop()
    for i in range(150):
        with ThreadPoolExecutor(1, thread_name_prefix="thumbs") as pool:
            await loop.run_in_executor(pool, thumbnail, i)


with asyncflow.profile("thumbs", format="none") as prof:
    print(f"asyncflow: profiling 'thumbs'; endpoint: {prof.url}", flush=True)
    asyncio.run(main())
    print("made 150 thumbnails; waiting", flush=True)
    time.sleep(600)
