"""A product page that gathers ten price lookups; one lookup in ten goes to a slow upstream
(300 ms instead of 5 ms), and every page waits for its slowest lookup."""

from __future__ import annotations

import asyncio


async def fetch_price(product: int) -> int:
    await asyncio.sleep(0.3 if product % 10 == 3 else 0.005)  # the upstream's answer
    return product * 10


async def render_page(page: int) -> list[int]:
    return await asyncio.gather(*(fetch_price(page * 10 + i) for i in range(10)))


async def main() -> None:
    for page in range(6):
        await render_page(page)
    print("6 pages rendered", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
