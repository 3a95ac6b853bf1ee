"""Workers wait for the configuration to be loaded; the loader fails on a bad file and returns
without setting the event, so every worker waits its whole life. main gives up after 1.5 s and
asyncio's shutdown cancels the workers."""

from __future__ import annotations

import asyncio
import json


async def load_config(ready: asyncio.Event, config: dict[str, object]) -> None:
    try:
        config.update(json.loads("{not json"))
    except ValueError:
        return  # the bug: the error is swallowed and the event never set
    ready.set()


async def worker(n: int, ready: asyncio.Event, done: list[int]) -> None:
    await ready.wait()
    done.append(n)


async def main() -> None:
    ready = asyncio.Event()
    config: dict[str, object] = {}
    done: list[int] = []
    workers = [asyncio.create_task(worker(n, ready, done)) for n in range(20)]
    await load_config(ready, config)
    _, pending = await asyncio.wait(workers, timeout=1.5)
    print(f"{len(done)} workers ran, {len(pending)} still waiting", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
