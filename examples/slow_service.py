"""An order-processing service that is slower than it should be, profiled by asyncflow.

Orders arrive, are enriched from an inventory backend, get an invoice rendered as a PDF and are
shipped. Nothing crashes; the service is just slow. Run it and read the warnings asyncflow
prints first in its report:

    python examples/slow_service.py [--orders N] [--linger SECONDS]

(The problems are planted; the report names them without being told what they are.)
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import hashlib
import time
from dataclasses import dataclass

import asyncflow


@dataclass
class Order:
    number: int
    sku: str
    price_cents: int = 0
    invoice: bytes = b""


async def inventory_lookup(sku: str) -> int:
    """The inventory backend answers in about 6 ms."""
    await asyncio.sleep(0.006)
    return 100 + len(sku)


def render_invoice(order: Order) -> bytes:
    """CPU work, done off the loop as it should be: about 3 ms of hashing."""
    digest = f"{order.number}:{order.sku}:{order.price_cents}".encode()
    deadline = time.perf_counter() + 0.003
    while time.perf_counter() < deadline:
        digest = hashlib.sha256(digest).digest()
    return digest


async def accept_orders(count: int, orders: asyncio.Queue[Order | None]) -> None:
    for number in range(count):
        await orders.put(Order(number, f"sku-{number % 17}"))
    await orders.put(None)


async def enrich(orders: asyncio.Queue[Order | None], ready: asyncio.Queue[Order | None]) -> None:
    while (order := await orders.get()) is not None:
        order.price_cents = await inventory_lookup(order.sku)
        await ready.put(order)
    await ready.put(None)


async def invoice_and_ship(
    ready: asyncio.Queue[Order | None], pdf: concurrent.futures.Executor, shipped: list[int]
) -> None:
    """Ships in batches of 30: each batch's invoices are rendered at once on the PDF pool."""
    loop = asyncio.get_running_loop()
    batch: list[Order] = []
    done = False
    while not done:
        order = await ready.get()
        if order is not None:
            batch.append(order)
        done = order is None
        if len(batch) == 30 or (done and batch):
            invoices = [loop.run_in_executor(pdf, render_invoice, o) for o in batch]
            for shipped_order, invoice in zip(batch, await asyncio.gather(*invoices), strict=True):
                shipped_order.invoice = invoice
                shipped.append(shipped_order.number)
            batch = []


async def serve(count: int) -> int:
    with (
        asyncflow.instrument_tasks(),
        asyncflow.instrument_queues(),
        asyncflow.instrument_executors(),
        concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="pdf") as pdf,
    ):
        orders: asyncio.Queue[Order | None] = asyncio.Queue(10)
        ready: asyncio.Queue[Order | None] = asyncio.Queue()
        shipped: list[int] = []
        await asyncio.gather(
            accept_orders(count, orders),
            enrich(orders, ready),
            invoice_and_ship(ready, pdf, shipped),
        )
        return len(shipped)


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orders", type=int, default=120, help="orders to process (default 120)")
    parser.add_argument(
        "--linger", type=float, default=0.0, help="seconds to keep the endpoint up afterwards"
    )
    args = parser.parse_args(argv)
    # under `asyncflow run`, the command has said where the endpoint is
    hosted = asyncflow.active_profiler() is not None
    with asyncflow.profile("orders") as prof:
        if not hosted:
            print(
                f"asyncflow: profiling 'orders'; endpoint: {prof.url or 'not served'}", flush=True
            )
        shipped = asyncio.run(serve(args.orders))
        print(f"shipped {shipped} orders", flush=True)
        if args.linger > 0:
            print(f"endpoint stays up for {args.linger:g} s: curl {prof.url}/warnings", flush=True)
            time.sleep(args.linger)
    return 0


if __name__ == "__main__":
    raise SystemExit(run())
