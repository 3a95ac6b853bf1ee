"""Timing functions and blocks, and the program's own counters, gauges and histograms.

A toy shop handler: 200 requests, 20 at a time; every 25th fetch times out. Run it and read the
exit report's function and metric tables (``--json`` prints the two documents instead).

    python examples/shop_timing.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
from typing import Any

import asyncflow

requests = asyncflow.counter("requests")
in_flight = asyncflow.gauge("in_flight")
sizes = asyncflow.histogram("response_bytes")


@asyncflow.measure
def parse(body: bytes) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(body)
    return data


@asyncflow.measure
async def fetch(i: int) -> bytes:
    await asyncio.sleep(random.uniform(0.001, 0.004))
    if i % 25 == 0:
        raise TimeoutError(f"request {i} timed out")
    return json.dumps({"id": i, "items": list(range(i % 50))}).encode()


@asyncflow.measure
async def handle(i: int) -> None:
    requests.add()
    in_flight.inc()
    try:
        body = await fetch(i)
        sizes.record(len(body))
        with asyncflow.measure_block("validate"):
            data = parse(body)
            assert data["id"] == i
    except TimeoutError:
        pass
    finally:
        in_flight.dec()
    asyncflow.value("last_id", i)


async def main(as_json: bool) -> None:
    random.seed(1)
    with asyncflow.profile("shop", format="none" if as_json else "table", limit=5) as prof:
        for batch in range(10):
            await asyncio.gather(*(handle(batch * 20 + i) for i in range(20)))
        if as_json:
            snapshot = prof.snapshot()
            from asyncflow.schema import dumps

            print(dumps(snapshot.functions).decode())
            print(dumps(snapshot.user_metrics).decode())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the documents as JSON")
    asyncio.run(main(parser.parse_args().json))
