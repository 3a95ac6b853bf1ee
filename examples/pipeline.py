"""A fetch -> parse -> store pipeline with bounded queues and one slow stage, profiled.

Two fetchers feed a bounded queue of raw pages, four parsers feed a bounded queue of records,
and a single storer writes them out slowly (simulated). The report shows where messages wait:
the records queue is full, the parsers are blocked on it, and the storer is the bottleneck.

    python examples/pipeline.py [--pages N]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib

import asyncflow

PARSERS = 4


@asyncflow.future
async def fetch(start: int, pages: int, raw: asyncio.Queue[tuple[int, bytes]]) -> None:
    """Download pages (simulated latency) into the raw queue."""
    for page in range(start, pages, 2):
        await asyncio.sleep(0.0005)
        await raw.put((page, f"<html>page {page}</html>".encode() * 20))


@asyncflow.future
async def parse(raw: asyncio.Queue[tuple[int, bytes]], records: asyncio.Queue[str]) -> None:
    """Turn pages into records (a little CPU work each)."""
    while True:
        page, body = await raw.get()
        digest = hashlib.sha256(body).hexdigest()
        await records.put(f"{page}:{digest[:12]}")
        raw.task_done()


@asyncflow.future
async def store(records: asyncio.Queue[str], stored: list[str]) -> None:
    """Write records one at a time: the slow stage."""
    while True:
        record = await records.get()
        await asyncio.sleep(0.002)  # a slow database write
        stored.append(record)
        records.task_done()


async def main(pages: int) -> int:
    with asyncflow.instrument_tasks():
        raw = asyncflow.instrument_queue(asyncio.Queue[tuple[int, bytes]](8), name="raw pages")
        records = asyncflow.instrument_queue(asyncio.Queue[str](8), name="records")
        stored: list[str] = []
        fetchers = [asyncio.create_task(fetch(i, pages, raw)) for i in range(2)]
        workers = [asyncio.create_task(parse(raw, records)) for _ in range(PARSERS)]
        workers.append(asyncio.create_task(store(records, stored)))
        await asyncio.gather(*fetchers)
        await raw.join()
        await records.join()
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        return len(stored)


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=200, help="pages to fetch (default 200)")
    args = parser.parse_args(argv)
    with asyncflow.profile("pipeline", limit=6):
        stored = asyncio.run(main(args.pages))
    print(f"stored {stored} records", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(run())
