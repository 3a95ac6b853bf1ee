"""A service that leaks a task per request: each request starts a watcher for the client's
acknowledgement, which never comes, and nothing ever stops the watchers. asyncio's shutdown
cancels them at exit."""

from __future__ import annotations

import asyncio

REQUESTS = 500


async def watch_ack(request_id: int, acks: dict[int, asyncio.Future[None]]) -> None:
    ack = acks.setdefault(request_id, asyncio.get_running_loop().create_future())
    await ack  # the client never acknowledges: nobody sets it


async def handle(request_id: int, acks: dict[int, asyncio.Future[None]], tasks: set[object]) -> str:
    await asyncio.sleep(0.001)  # the work of the request
    tasks.add(asyncio.create_task(watch_ack(request_id, acks)))
    return "ok"


async def main() -> None:
    acks: dict[int, asyncio.Future[None]] = {}
    tasks: set[object] = set()
    for request_id in range(REQUESTS):
        await handle(request_id, acks, tasks)
        await asyncio.sleep(0.002)
    print(f"served {REQUESTS} requests", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
