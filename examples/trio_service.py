"""A trio service whose one handler calls a blocking client: ``asyncflow run`` watches trio's
loop as it does asyncio's, and names the line that blocked it.

    asyncflow run examples/trio_service.py
"""

from __future__ import annotations

import time

import trio


def legacy_lookup(key: str) -> str:
    time.sleep(0.2)  # a synchronous client: every other task waits meanwhile
    return key.upper()


async def handle(request: str) -> str:
    if request.startswith("legacy:"):
        return legacy_lookup(request)
    await trio.sleep(0.01)
    return request


async def main() -> None:
    served: list[str] = []

    async def serve(request: str) -> None:
        served.append(await handle(request))

    async with trio.open_nursery() as nursery:
        for i in range(20):
            nursery.start_soon(serve, f"request-{i}")
        nursery.start_soon(serve, "legacy:user-7")
    print(f"served {len(served)} requests")


if __name__ == "__main__":
    trio.run(main)
