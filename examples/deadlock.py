"""Stuck, not slow: two transfers take two accounts' locks in opposite order.

A plain asyncio program (no asyncflow in it): each transfer locks its source account, reads
the balance, then locks the destination. Run at once in opposite directions, each holds the
lock the other waits for. The program's main gives up waiting after ``--wait`` seconds and
exits, as a service's shutdown would: asyncio then cancels the stuck transfers. Under

    asyncflow run examples/deadlock.py [--wait SECONDS]

the exit report names the deadlock: both tasks, both locks, where each waits and where each
took the lock it holds. ``--wait 0`` waits forever (end it with Ctrl-C or SIGTERM).
"""

from __future__ import annotations

import argparse
import asyncio


class Account:
    def __init__(self, name: str, balance: int) -> None:
        self.name = name
        self.balance = balance
        self.lock = asyncio.Lock()


async def transfer(source: Account, target: Account, amount: int) -> None:
    async with source.lock:
        await asyncio.sleep(0.05)  # read the balance from the database
        async with target.lock:
            source.balance -= amount
            target.balance += amount


async def main(wait: float) -> None:
    alice, bob = Account("alice", 100), Account("bob", 100)
    transfers = [
        asyncio.create_task(transfer(alice, bob, 10)),
        asyncio.create_task(transfer(bob, alice, 20)),
    ]
    print("transfers started", flush=True)
    _, pending = await asyncio.wait(transfers, timeout=wait or None)
    print(f"gave up: {len(pending)} transfers still pending", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wait", type=float, default=1.5, help="seconds to wait (0: forever)")
    asyncio.run(main(parser.parse_args().wait))
