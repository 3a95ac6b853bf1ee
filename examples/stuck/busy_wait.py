"""A cache warm-up that callers wait for by polling a flag with ``await asyncio.sleep(0)``:
each wait spins the loop for the whole warm-up instead of waiting on an Event."""

from __future__ import annotations

import asyncio


async def warm_cache(state: dict[str, bool]) -> None:
    await asyncio.sleep(0.4)  # load the cache from the database
    state["ready"] = True


async def wait_until_ready(state: dict[str, bool]) -> None:
    while not state["ready"]:
        await asyncio.sleep(0)


async def main() -> None:
    for _ in range(3):
        state = {"ready": False}
        await asyncio.gather(warm_cache(state), wait_until_ready(state))
    print("cache warmed 3 times", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
