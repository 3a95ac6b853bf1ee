"""A service stuck in plain asyncio, never profiled: a transfer holds the ledger's lock while it
waits for an approval nobody gives, two more wait for the lock, and the auditor waits for
entries (docs/attach.md, issue 30). It serves until its standard input closes."""

import asyncio
import sys


async def transfer(ledger: asyncio.Lock, approved: asyncio.Event, amount: int) -> None:
    async with ledger:
        await approved.wait()


async def audit(entries: asyncio.Queue[int]) -> None:
    while True:
        await entries.get()


async def main() -> None:
    ledger, approved = asyncio.Lock(), asyncio.Event()
    entries: asyncio.Queue[int] = asyncio.Queue()
    tasks = [asyncio.create_task(transfer(ledger, approved, 100), name="transfer-1")]
    await asyncio.sleep(0)  # transfer-1 takes the lock
    for n in (2, 3):
        tasks.append(asyncio.create_task(transfer(ledger, approved, 10 * n), name=f"transfer-{n}"))
    auditor = asyncio.create_task(audit(entries), name="auditor")
    await asyncio.sleep(0)
    print("serving", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    approved.set()
    await asyncio.gather(*tasks)
    auditor.cancel()


asyncio.run(main())
