"""Instrumented anyio memory object streams: transparency, pairing, waits, closing."""

from __future__ import annotations

import asyncio
import math
import sys
import threading
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

import asyncflow
from asyncflow.clock import FakeClock
from asyncflow.schema import ChannelEntry, ChannelLogs, Snapshot

# Marked, not only run by the anyio_mode = "auto" setting: CI also runs this file on the lowest
# anyio allowed (4.4), whose pytest plugin has no auto mode.
pytestmark = pytest.mark.anyio

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
    assert logs.received_logs[0].msg_id == 1  # taken by the receiver: see the hand-off tests
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


async def test_cancelled_blocked_sends_leave_nothing_behind(fake_clock: FakeClock) -> None:
    with asyncflow.profile("memory-withdrawn", format="none") as prof:
        send, receive = asyncflow.instrument_memory_stream(
            *anyio.create_memory_object_stream[int](0), name="withdrawn"
        )
        waiting = send._state.waiting_senders
        for i in range(100):
            async with anyio.create_task_group() as tg:

                async def blocked(i: int = i) -> None:
                    await send.send(i)  # nobody receives: waits until cancelled

                tg.start_soon(blocked)
                while not send.statistics().tasks_waiting_send:
                    await anyio.sleep(0)
                fake_clock.advance(10)
                tg.cancel_scope.cancel()
        assert len(waiting) == 0
        assert waiting.since == {}  # type: ignore[attr-defined]
        send.close()
        receive.close()
        snap = prof.snapshot()
    entry, _ = _channel(snap, "withdrawn")
    assert (entry.sent_count, entry.received_count) == (0, 0)
    assert entry.producers_blocked_ns == 100 * 10


async def test_every_way_out_of_a_waiting_map_is_seen(fake_clock: FakeClock) -> None:
    """Whichever method an anyio version uses to take a waiting sender out (4.4 and 4.16 use
    ``del``, 4.12 ``pop``; a close ``clear``s the receivers), the wait ends and is timed."""
    with asyncflow.profile("memory-maps", format="none") as prof:
        send, receive = asyncflow.instrument_memory_stream(
            *anyio.create_memory_object_stream[str](0), name="maps"
        )
        senders: Any = send._state.waiting_senders
        events = [anyio.Event() for _ in range(5)]
        for event, item in zip(events, "abcde", strict=True):
            senders[event] = item
        fake_clock.advance(7)
        del senders[events[0]]
        assert senders.pop(events[1]) == "b"
        assert senders.pop(events[1], None) is None
        with pytest.raises(KeyError):
            senders.pop(events[1])
        assert senders.popitem(last=False) == (events[2], "c")  # taken: a receive moved it in
        senders.clear()
        assert (len(senders), senders.since) == (0, {})
        receive.close()
        send.close()
        snap = prof.snapshot()
    entry, _ = _channel(snap, "maps")
    assert entry.producers_blocked_ns == 5 * 7
    assert entry.sent_count == 1  # only the one taken by popitem


async def test_a_stream_closed_with_unread_items_counts_them_as_lost() -> None:
    with asyncflow.profile("memory-lost", format="none") as prof:
        send, receive = asyncflow.instrument_memory_stream(
            *anyio.create_memory_object_stream[int](10), name="lost"
        )
        for i in range(6):
            send.send_nowait(i)
        assert receive.receive_nowait() == 0
        receive.close()
        send.close()
        snap = prof.snapshot()
    entry, _ = _channel(snap, "lost")
    assert (entry.sent_count, entry.received_count, entry.lost_count) == (6, 1, 5)
    assert entry.state == "closed"


class _Cancelling:
    def __repr__(self) -> str:
        raise asyncio.CancelledError


async def test_a_repr_raising_a_base_exception_never_reaches_the_program() -> None:
    with asyncflow.profile("memory-repr", format="none") as prof:
        send, receive = asyncflow.instrument_memory_stream(
            *anyio.create_memory_object_stream[Any](1), name="repr", log_messages=True
        )
        item = _Cancelling()
        with send, receive:
            send.send_nowait(item)  # completes: asyncflow's repr raised inside, and stayed there
            assert receive.receive_nowait() is item
        snap = prof.snapshot()
    _, logs = _channel(snap, "repr")
    assert [e.message for e in logs.sent_logs] == ["<repr() failed: CancelledError>"]


def test_threads_instrumenting_one_stream_at_once_register_it_once() -> None:
    pairs = [anyio.create_memory_object_stream[int]() for _ in range(300)]
    barrier = threading.Barrier(4)

    def instrument_all() -> None:
        barrier.wait(10)
        for send, receive in pairs:
            asyncflow.instrument_memory_stream(send, receive)

    interval = sys.getswitchinterval()
    with asyncflow.profile("memory-threads", format="none") as prof:
        sys.setswitchinterval(1e-6)  # hand the GIL over as often as possible: races show
        try:
            threads = [threading.Thread(target=instrument_all) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(10)
        finally:
            sys.setswitchinterval(interval)
        snap = prof.snapshot()
    assert snap.channels is not None
    mine = {f"memory-stream@{id(send._state):x}" for send, _ in pairs}
    assert sorted(c.label for c in snap.channels.channels if c.label in mine) == sorted(mine)
    for send, receive in pairs:
        send.close()
        receive.close()


Receive = str  # "receive" | "receive_nowait" | "iterate"


async def _hand_offs(
    fake_clock: FakeClock, size: float, nowait_send: bool, how: Receive, label: str
) -> Snapshot:
    """A tracked producer sends 5 items to a tracked consumer that waits for each of them (so
    anyio hands each one straight to the waiting consumer), 700 ns before the consumer wakes."""
    with asyncflow.profile(label, format="none", sampling=1) as prof:
        send, receive = asyncflow.instrument_memory_stream(
            *anyio.create_memory_object_stream[int](size), name=label
        )
        got: list[int] = []

        @asyncflow.future(name=f"{label}-consumer")
        async def consumer() -> None:
            with receive:
                if how == "iterate":
                    async for item in receive:
                        got.append(item)
                    return
                while True:
                    try:
                        if how == "receive":
                            got.append(await receive.receive())
                        else:  # receive_nowait until it would block, then wait for the next
                            try:
                                got.append(receive.receive_nowait())
                            except anyio.WouldBlock:
                                got.append(await receive.receive())
                    except anyio.EndOfStream:
                        return

        @asyncflow.future(name=f"{label}-producer")
        async def producer() -> None:
            with send:
                for i in range(5):
                    while not send.statistics().tasks_waiting_receive:
                        await anyio.sleep(0)
                    if nowait_send:
                        send.send_nowait(i)
                    else:
                        await send.send(i)  # hands the item over at once: never blocks
                    fake_clock.advance(700)  # before the consumer gets to run again
                    assert send.statistics().current_buffer_used == 0

        with anyio.fail_after(5):  # asyncio tasks: each one's own coroutine is the tracked call
            await asyncio.gather(asyncio.create_task(consumer()), asyncio.create_task(producer()))
        assert got == [0, 1, 2, 3, 4]
        return prof.snapshot()


@pytest.mark.parametrize("size", [0, 3])
@pytest.mark.parametrize("nowait_send", [False, True])
@pytest.mark.parametrize("how", ["receive", "receive_nowait", "iterate"])
async def test_an_item_handed_to_a_waiting_receiver_is_received_by_the_consumer(
    fake_clock: FakeClock, size: float, nowait_send: bool, how: Receive
) -> None:
    label = f"handoff-{size}-{int(nowait_send)}-{how}"
    snap = await _hand_offs(fake_clock, size, nowait_send, how, label)
    ids = {f.label: f.id for f in snap.futures.futures}
    consumer, producer = ids[f"{label}-consumer"], ids[f"{label}-producer"]
    entry, logs = _channel(snap, label)
    assert (entry.sent_count, entry.received_count, entry.unpaired_count) == (5, 5, 0)
    assert {e.future_id for e in logs.sent_logs} == {producer}
    assert {e.future_id for e in logs.received_logs} == {consumer}
    # timed when the consumer takes the item, not when the producer hands it over
    assert [e.delay_ns for e in logs.received_logs] == [700] * 5
    assert sorted(e.msg_id or 0 for e in logs.received_logs) == [1, 2, 3, 4, 5]
    assert snap.flow is not None
    edges = {(e.source, e.target): e.messages for e in snap.flow.edges}
    channel = f"channel:{entry.id}"
    assert edges[(f"future:{producer}", channel)] == 5
    assert edges[(channel, f"future:{consumer}")] == 5
    assert (channel, f"future:{producer}") not in edges


async def test_a_hand_off_is_received_by_the_consumer_even_if_the_stream_is_closed_meanwhile(
    fake_clock: FakeClock,
) -> None:
    """Another task closes the receive side between the hand-off and the consumer waking: the
    consumer still gets the item (anyio), and still is the one who received it."""
    with asyncflow.profile("handoff-close", format="none", sampling=1) as prof:
        send, receive = asyncflow.instrument_memory_stream(
            *anyio.create_memory_object_stream[int](0), name="handoff-close"
        )
        got: list[Any] = []

        @asyncflow.future(name="handoff-close-consumer")
        async def consumer() -> None:
            try:
                got.append(await receive.receive())
            except anyio.ClosedResourceError:
                got.append("closed")

        with anyio.fail_after(5):
            task = asyncio.create_task(consumer())
            while not send.statistics().tasks_waiting_receive:
                await anyio.sleep(0)
            send.send_nowait(7)
            fake_clock.advance(300)
            receive.close()
            fake_clock.advance(200)
            await task
        send.close()
        snap = prof.snapshot()
    entry, logs = _channel(snap, "handoff-close")
    ids = {f.label: f.id for f in snap.futures.futures}
    assert (entry.sent_count, entry.received_count) == (len(got), len(got))
    if got == [7]:  # every anyio version allowed hands it over; the check is for the record
        assert [(e.future_id, e.delay_ns) for e in logs.received_logs] == [
            (ids["handoff-close-consumer"], 500)
        ]
    assert receive._state.waiting_receivers.handed == {}  # type: ignore[attr-defined]


@pytest.mark.parametrize("how", ["receive", "receive_nowait", "iterate"])
async def test_a_blocked_send_taken_by_a_receiver_is_the_consumers_receive(
    fake_clock: FakeClock, how: Receive
) -> None:
    """The other way round: the producer waits in send() until the consumer takes its item
    (receive_nowait, receive or iteration): sent by the producer when it began to wait,
    received by the consumer when it took it."""
    label = f"blocked-send-{how}"
    with asyncflow.profile(label, format="none", sampling=1) as prof:
        send, receive = asyncflow.instrument_memory_stream(
            *anyio.create_memory_object_stream[int](0), name=label
        )
        got: list[int] = []

        @asyncflow.future(name=f"{label}-producer")
        async def producer() -> None:
            with send:
                for i in range(4):
                    await send.send(i)  # waits: nobody receives yet

        @asyncflow.future(name=f"{label}-consumer")
        async def consumer() -> None:
            with receive:
                for _ in range(4):
                    while not send.statistics().tasks_waiting_send:
                        await anyio.sleep(0)
                    fake_clock.advance(900)  # the item waits in the producer's send
                    if how == "receive_nowait":
                        got.append(receive.receive_nowait())
                    elif how == "receive":
                        got.append(await receive.receive())
                    else:
                        got.append(await receive.__anext__())

        with anyio.fail_after(5):
            await asyncio.gather(asyncio.create_task(producer()), asyncio.create_task(consumer()))
        assert got == [0, 1, 2, 3]
        snap = prof.snapshot()
    ids = {f.label: f.id for f in snap.futures.futures}
    entry, logs = _channel(snap, label)
    assert (entry.sent_count, entry.received_count, entry.unpaired_count) == (4, 4, 0)
    assert {e.future_id for e in logs.sent_logs} == {ids[f"{label}-producer"]}
    assert {e.future_id for e in logs.received_logs} == {ids[f"{label}-consumer"]}
    assert [e.delay_ns for e in logs.received_logs] == [900] * 4


async def test_instrumenting_a_stream_again_with_a_name_relabels_it() -> None:
    # as for queues and locks: the program's own name (and logging choice) win over a stream
    # instrumented already, under another name or none
    with asyncflow.profile("renamed", format="none") as prof:
        send, receive = asyncflow.instrument_memory_stream(
            *anyio.create_memory_object_stream[int](5)
        )
        same = asyncflow.instrument_memory_stream(send, receive, name="readings", log_messages=True)
        assert same == (send, receive)
        with send.clone() as clone:
            asyncflow.instrument_memory_stream(clone, receive)  # no name: changes nothing
        await send.send(1)
        assert await receive.receive() == 1
        snap = prof.snapshot()
    entry, logs = _channel(snap, "readings")
    assert (entry.sent_count, entry.received_count) == (1, 1)
    assert [e.message for e in logs.sent_logs] == ["1"]
    send.close()
    receive.close()
