"""A wait still going on counts in a channel's starved (or blocked) time up to now: a consumer
stuck on an empty channel, whose wait may never end, shows in the figures while it waits."""

from __future__ import annotations

import asyncio

import anyio

import asyncflow
from asyncflow.clock import FakeClock
from asyncflow.schema import ChannelEntry


def _entry(prof: asyncflow.Profiler, label: str) -> ChannelEntry:
    snap = prof.snapshot()
    assert snap.channels is not None
    (entry,) = [c for c in snap.channels.channels if c.label == label]
    return entry


async def test_a_queues_waits_in_progress_count_up_to_now(fake_clock: FakeClock) -> None:
    with asyncflow.profile("now", format="none", port=None) as prof:
        empty: asyncio.Queue[int] = asyncflow.instrument_queue(asyncio.Queue(1), name="empty")
        full: asyncio.Queue[int] = asyncflow.instrument_queue(asyncio.Queue(1), name="full")
        full.put_nowait(0)
        getter, putter = asyncio.create_task(empty.get()), asyncio.create_task(full.put(1))
        await asyncio.sleep(0)
        fake_clock.advance(700)
        assert _entry(prof, "empty").consumers_starved_ns == 700
        assert _entry(prof, "full").producers_blocked_ns == 700
        fake_clock.advance(300)  # still waiting: more
        assert _entry(prof, "empty").consumers_starved_ns == 1_000
        getter.cancel()
        putter.cancel()
        await asyncio.gather(getter, putter, return_exceptions=True)
        fake_clock.advance(500)  # withdrawn: counted once, and no more
        assert _entry(prof, "empty").consumers_starved_ns == 1_000
        assert _entry(prof, "full").producers_blocked_ns == 1_000


async def test_a_memory_streams_waits_in_progress_count_up_to_now(fake_clock: FakeClock) -> None:
    with asyncflow.profile("now", format="none", port=None) as prof:
        send, receive = anyio.create_memory_object_stream[int](0)
        asyncflow.instrument_memory_stream(send, receive, name="stream")
        async with send, receive:
            async with anyio.create_task_group() as tg:
                tg.start_soon(receive.receive)
                await anyio.wait_all_tasks_blocked()
                fake_clock.advance(600)
                assert _entry(prof, "stream").consumers_starved_ns == 600
                tg.cancel_scope.cancel()
            fake_clock.advance(400)  # withdrawn: counted once, and no more
            assert _entry(prof, "stream").consumers_starved_ns == 600
            async with anyio.create_task_group() as tg:
                tg.start_soon(send.send, 1)
                await anyio.wait_all_tasks_blocked()
                fake_clock.advance(250)
                assert _entry(prof, "stream").producers_blocked_ns == 250
                tg.cancel_scope.cancel()
