"""Instrumented anyio memory object streams: transparency, pairing, waits, closing."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

import asyncflow
from asyncflow.clock import FakeClock
from asyncflow.schema import ChannelEntry, ChannelLogs, Snapshot

Pair = tuple[MemoryObjectSendStream[Any], MemoryObjectReceiveStream[Any]]
Track = Callable[[Pair], Pair]


def _channel(snap: Snapshot, label: str) -> tuple[ChannelEntry, ChannelLogs]:
    assert snap.channels is not None
    (entry,) = [c for c in snap.channels.channels if c.label == label]
    (logs,) = [log for log in snap.channel_logs if log.channel_id == entry.id]
    return entry, logs


async def _scenario(size: float, track: Track) -> list[Any]:
    send, receive = track(anyio.create_memory_object_stream[Any](size))
    seen: list[Any] = [send.statistics()]
    try:
        receive.receive_nowait()
    except anyio.WouldBlock:
        seen.append("would block")
    got: list[Any] = []

    async def consume(stream: MemoryObjectReceiveStream[Any]) -> None:
        async with stream:
            async for item in stream:
                got.append(item)

    async with anyio.create_task_group() as tg:
        tg.start_soon(consume, receive.clone())
        receive.close()
        with anyio.move_on_after(0):  # a send cancelled while it waits
            await send.send("cancelled?") if size == 0 else None
        clone = send.clone()
        async with send, clone:
            for i in range(10):
                await (send if i % 2 else clone).send(i)
            seen.append(send.statistics().open_receive_streams)
    seen.append(got)
    try:
        await send.send("after close")
    except anyio.ClosedResourceError:
        seen.append("closed")
    return seen


def _identity(pair: Pair) -> Pair:
    return pair


@pytest.mark.parametrize("size", [0, 2, math.inf])
async def test_instrumented_streams_behave_exactly_as_before(size: float) -> None:
    plain = await _scenario(size, _identity)
    with asyncflow.profile("memory", format="none") as prof:

        def track(pair: Pair) -> Pair:
            out = asyncflow.instrument_memory_stream(*pair, name=f"mem-{size}")
            assert out[0] is pair[0] and out[1] is pair[1]
            return out

        tracked = await _scenario(size, track)
        snap = prof.snapshot()
    assert tracked == plain
    entry, _ = _channel(snap, f"mem-{size}")
    assert (entry.sent_count, entry.received_count, entry.unpaired_count) == (10, 10, 0)
    assert entry.state == "closed"
    assert entry.channel_type == ("unbounded" if size == math.inf else f"bounded[{size}]")


async def test_pairing_delays_and_waits_on_a_fake_clock(fake_clock: FakeClock) -> None:
    with asyncflow.profile("memory-clock", format="none") as prof:
        send, receive = asyncflow.instrument_memory_stream(
            *anyio.create_memory_object_stream[str](1), name="m", log_messages=True
        )
        send.send_nowait("a")
        fake_clock.advance(300)
        assert receive.receive_nowait() == "a"
        async with anyio.create_task_group() as tg:

            async def blocked_sender() -> None:
                await send.send("c")  # waits: the buffer holds "b"

            send.send_nowait("b")
            tg.start_soon(blocked_sender)
            await anyio.sleep(0)
            await anyio.sleep(0)
            fake_clock.advance(500)
            assert await receive.receive() == "b"
            assert await receive.receive() == "c"
        send.close()
        receive.close()
        snap = prof.snapshot()
    entry, logs = _channel(snap, "m")
    assert (entry.sent_count, entry.received_count) == (3, 3)
    delays = {e.message: e.delay_ns for e in logs.received_logs}
    assert delays == {"'a'": 300, "'b'": 500, "'c'": 500}
    assert entry.producers_blocked_ns == 500
    sent_ids = {e.message: e.msg_id for e in logs.sent_logs}
    assert {e.message: e.msg_id for e in logs.received_logs} == sent_ids


async def test_cancelled_and_broken_sends_are_never_counted() -> None:
    with asyncflow.profile("memory-cancel", format="none") as prof:
        send, receive = asyncflow.instrument_memory_stream(
            *anyio.create_memory_object_stream[int](0), name="rendezvous"
        )
        with anyio.move_on_after(0.01):
            await send.send(1)  # nobody receives: cancelled while waiting
        async with anyio.create_task_group() as tg:

            async def receiver() -> None:
                assert await receive.receive() == 2

            tg.start_soon(receiver)
            while not send.statistics().tasks_waiting_receive:
                await anyio.sleep(0)
            await send.send(2)  # handed straight to the waiting receiver
        receive.close()
        with pytest.raises(anyio.BrokenResourceError):
            send.send_nowait(3)
        send.close()
        snap = prof.snapshot()
    entry, logs = _channel(snap, "rendezvous")
    assert (entry.sent_count, entry.received_count) == (1, 1)
    assert logs.received_logs[0].delay_ns == 0
    assert entry.consumers_starved_ns > 0


def test_misuse() -> None:
    send, receive = anyio.create_memory_object_stream[int]()
    other_send, other_receive = anyio.create_memory_object_stream[int]()
    with pytest.raises(TypeError, match="needs the \\(send, receive\\) pair"):
        asyncflow.instrument_memory_stream(receive, send)  # type: ignore[type-var]
    with pytest.raises(TypeError, match="different streams"):
        asyncflow.instrument_memory_stream(send, other_receive)
    with pytest.raises(TypeError, match="log_messages"):
        asyncflow.instrument_memory_stream(send, receive, log_messages=None)  # type: ignore[arg-type]
    for stream in (send, receive, other_send, other_receive):
        stream.close()
