"""A service on uvloop, profiled with no code change by ``asyncflow run``.

Requests are handled on a uvloop event loop (as uvicorn does with ``--loop uvloop``, or with
``--loop auto`` when ``uvicorn[standard]`` is installed); one handler blocks the loop with a
``time.sleep``.

    asyncflow run examples/uvloop_service.py
"""

from __future__ import annotations

import asyncio
import time

import uvloop


async def lookup(key: int) -> int:
    await asyncio.sleep(0.01)  # a database, an upstream
    return key * 2


async def handle(request: int) -> int:
    if request == 7:
        time.sleep(0.15)  # a blocking call on the loop: every other request waits
    return await lookup(request)


async def main() -> None:
    async with asyncio.TaskGroup() as tg:
        for request in range(20):
            tg.create_task(handle(request))


if __name__ == "__main__":
    uvloop.run(main())
