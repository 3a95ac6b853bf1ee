"""Instrumented asyncio queues: transparency, exact msg_id pairing, waits, the flow graph."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import random
import sys
import threading
from collections.abc import Callable
from typing import Any

import anyio
import pytest

import asyncflow
from asyncflow.clock import FakeClock
from asyncflow.instrumentation import _session
from asyncflow.render.report import render
from asyncflow.schema import ChannelEntry, ChannelLogs, Snapshot

QueueFactory = Callable[[int], "asyncio.Queue[Any]"]
KINDS: list[QueueFactory] = [asyncio.Queue, asyncio.LifoQueue, asyncio.PriorityQueue]


def _channel(snap: Snapshot, label: str) -> tuple[ChannelEntry, ChannelLogs]:
    assert snap.channels is not None
    (entry,) = [c for c in snap.channels.channels if c.label == label]
    (logs,) = [log for log in snap.channel_logs if log.channel_id == entry.id]
    return entry, logs


async def _scenario(make: QueueFactory) -> list[Any]:
    """Producers, consumers, a cancelled put and get, QueueFull/QueueEmpty, join/task_done."""
    q = make(3)
    seen: list[Any] = [q.maxsize, q.empty(), q.full(), q.qsize()]
    try:
        q.get_nowait()
    except asyncio.QueueEmpty:
        seen.append("empty")
    waiting_get = asyncio.create_task(q.get())
    await asyncio.sleep(0)
    waiting_get.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiting_get
    for item in [(5, "e"), (1, "a"), (3, "c")]:
        q.put_nowait(item)
    seen.append(q.full())
    try:
        q.put_nowait((9, "z"))
    except asyncio.QueueFull:
        seen.append("full")
    waiting_put = asyncio.create_task(q.put((0, "cancelled put")))
    await asyncio.sleep(0)
    waiting_put.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiting_put
    out: list[Any] = []

    async def consumer() -> None:
        while True:
            item = await q.get()
            out.append(item)
            q.task_done()

    consumers = [asyncio.create_task(consumer()) for _ in range(2)]

    async def producer(base: int) -> None:
        for i in range(5):
            await q.put((base + i, f"p{base}"))

    await asyncio.gather(producer(10), producer(20))
    await q.join()
    for c in consumers:
        c.cancel()
    await asyncio.gather(*consumers, return_exceptions=True)
    seen.append(out)
    seen.append(q.qsize())
    return seen


@pytest.mark.parametrize("make", KINDS, ids=lambda k: k.__name__)
async def test_instrumented_queue_behaves_exactly_as_before(make: QueueFactory) -> None:
    plain = await _scenario(make)
    with asyncflow.profile("queues", format="none") as prof:

        def instrumented(n: int) -> asyncio.Queue[Any]:
            q = make(n)
            assert asyncflow.instrument_queue(q, name=f"q-{make.__name__}") is q
            assert type(q) is make
            return q

        tracked = await _scenario(instrumented)
        snap = prof.snapshot()
    assert tracked == plain
    entry, _ = _channel(snap, f"q-{make.__name__}")
    assert (entry.sent_count, entry.received_count, entry.unpaired_count) == (13, 13, 0)
    assert entry.channel_type == "bounded[3]" and entry.max_queue_size == 3


@pytest.mark.parametrize("make", KINDS, ids=lambda k: k.__name__)
async def test_every_receive_is_paired_with_the_put_of_its_item(make: QueueFactory) -> None:
    rng = random.Random(3)
    with asyncflow.profile("pairing", format="none", recent_logs=10) as prof:
        q = asyncflow.instrument_queue(make(0), name=f"pairs-{make.__name__}", log_messages=True)
        items = [(rng.randrange(100), i) for i in range(60)]
        for item in items[:30]:
            q.put_nowait(item)
        got = [q.get_nowait() for _ in range(20)]
        for item in items[30:]:
            q.put_nowait(item)
        got += [q.get_nowait() for _ in range(40)]
        snap = prof.snapshot()
    assert sorted(got) == sorted(items)
    entry, logs = _channel(snap, f"pairs-{make.__name__}")
    assert (entry.sent_count, entry.received_count, entry.queue_size) == (60, 60, 0)
    sent = {e.msg_id: e.message for e in logs.sent_logs}
    received = [(e.msg_id, e.message) for e in logs.received_logs]
    assert len({mid for mid, _ in received}) == len(received)  # each msg_id received once
    for msg_id, message in received:
        if msg_id in sent:  # the logs keep the last 100 of each
            assert sent[msg_id] == message  # the receive carries its own put's msg_id


async def test_delays_and_waits_are_exact_on_a_fake_clock(fake_clock: FakeClock) -> None:
    with asyncflow.profile("delays", format="none") as prof:
        q: asyncio.Queue[str] = asyncflow.instrument_queue(asyncio.Queue(1), name="d")
        q.put_nowait("first")
        fake_clock.advance(250)
        assert q.get_nowait() == "first"
        starved = asyncio.create_task(q.get())
        await asyncio.sleep(0)
        fake_clock.advance(1_000)  # the consumer waits on an empty queue
        q.put_nowait("second")
        assert await starved == "second"
        q.put_nowait("third")
        blocked = asyncio.create_task(q.put("fourth"))
        await asyncio.sleep(0)
        fake_clock.advance(400)  # the producer waits on a full queue
        assert q.get_nowait() == "third"
        await blocked
        assert q.get_nowait() == "fourth"
        snap = prof.snapshot()
    entry, logs = _channel(snap, "d")
    assert [e.delay_ns for e in reversed(logs.received_logs)] == [250, 0, 400, 0]
    assert entry.max_delay_ns == 400
    assert (entry.consumers_starved_ns, entry.producers_blocked_ns) == (1_000, 400)


async def test_items_cleared_behind_the_queue_leave_the_pairing_exact() -> None:
    with asyncflow.profile("cleared", format="none") as prof:
        q: asyncio.Queue[int] = asyncflow.instrument_queue(
            asyncio.Queue(), name="c", log_messages=True
        )
        for i in range(5):
            q.put_nowait(i)
        q._queue.clear()  # type: ignore[attr-defined]
        q.put_nowait(99)
        assert q.get_nowait() == 99
        q.put_nowait(100)
        assert q.get_nowait() == 100
        snap = prof.snapshot()
    entry, logs = _channel(snap, "c")
    assert (entry.sent_count, entry.received_count, entry.unpaired_count) == (7, 2, 0)
    sent = {e.msg_id: e.message for e in logs.sent_logs}
    assert [(e.msg_id, e.message) for e in logs.received_logs] == [(7, "100"), (6, "99")]
    assert sent[6] == "99" and sent[7] == "100"  # each receive carries its own put's msg_id


@pytest.mark.parametrize("make", KINDS, ids=lambda k: k.__name__)
async def test_items_added_behind_the_queue_are_unpaired_never_mispaired(
    make: QueueFactory,
) -> None:
    with asyncflow.profile("added", format="none") as prof:
        q = asyncflow.instrument_queue(make(0), name=f"a-{make.__name__}", log_messages=True)
        q.put_nowait((1, "one"))
        q._put((0, "smuggled"))  # the hook itself: counted as a put
        storage = q._queue  # type: ignore[attr-defined]
        if isinstance(storage, list) and make is asyncio.PriorityQueue:
            import heapq

            heapq.heappush(storage, (2, "behind"))
        else:
            storage.append((2, "behind"))
        got = [q.get_nowait() for _ in range(3)]
        q.put_nowait((3, "after"))
        got.append(q.get_nowait())
        snap = prof.snapshot()
    entry, logs = _channel(snap, f"a-{make.__name__}")
    assert sorted(got) == [(0, "smuggled"), (1, "one"), (2, "behind"), (3, "after")]
    assert (entry.sent_count, entry.received_count) == (3, 4)
    # Which stored item lacks a put cannot be told, so none stored then is paired or timed.
    assert entry.unpaired_count == 3
    received = [e.msg_id for e in logs.received_logs]
    assert len(set(received)) == len(received)  # no msg_id is received twice
    sent = {e.msg_id: e.message for e in logs.sent_logs}
    for e in logs.received_logs:  # whatever is paired is paired with the right put
        assert sent[e.msg_id] == e.message
    assert logs.received_logs[0].message == "(3, 'after')"  # pairing resumes afterwards
    assert logs.received_logs[0].msg_id == 3


async def test_many_producers_and_consumers_with_cancellations_lose_nothing() -> None:
    with asyncflow.profile("busy", format="none") as prof:
        q: asyncio.Queue[int] = asyncflow.instrument_queue(asyncio.Queue(4), name="busy")
        got: list[int] = []
        put_done = 0

        async def producer(base: int) -> None:
            nonlocal put_done
            for i in range(50):
                await q.put(base + i)
                put_done += 1

        async def consumer() -> None:
            while True:
                got.append(await q.get())
                await asyncio.sleep(0)

        consumers = [asyncio.create_task(consumer()) for _ in range(3)]
        producers = [asyncio.create_task(producer(p * 1000)) for p in range(4)]
        for _ in range(30):
            await asyncio.sleep(0)
        producers[0].cancel()  # cancelled while possibly waiting on a full queue
        consumers[0].cancel()  # cancelled while possibly waiting on an empty queue
        await asyncio.gather(*producers, return_exceptions=True)
        while not q.empty():
            await asyncio.sleep(0)
        for c in consumers:
            c.cancel()
        await asyncio.gather(*consumers, return_exceptions=True)
        snap = prof.snapshot()
    entry, _ = _channel(snap, "busy")
    assert entry.sent_count == put_done
    assert entry.received_count == len(got) == put_done
    assert entry.unpaired_count == 0


async def test_flow_graph_reads_as_the_pipeline() -> None:
    with asyncflow.profile("flow", format="none") as prof:
        jobs: asyncio.Queue[int] = asyncflow.instrument_queue(asyncio.Queue(2), name="jobs")
        done: asyncio.Queue[int] = asyncflow.instrument_queue(asyncio.Queue(), name="done")

        @asyncflow.future(name="produce")
        async def produce() -> None:
            for i in range(12):
                await jobs.put(i)

        @asyncflow.future(name="work")
        async def work() -> None:
            while True:
                done.put_nowait(await jobs.get() * 2)

        # Messages are attributed to the call that runs the current task: pipeline stages run
        # as tasks of their own.
        workers = [asyncio.create_task(work()) for _ in range(3)]
        await asyncio.create_task(produce())
        while done.qsize() < 12:
            await asyncio.sleep(0)
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        snap = prof.snapshot()
    assert snap.flow is not None
    labels = {n.id: n.label for n in snap.flow.nodes}
    edges = {(labels[e.source], labels[e.target]): e.messages for e in snap.flow.edges}
    assert edges == {("produce", "jobs"): 12, ("jobs", "work"): 12, ("work", "done"): 12}
    jobs_entry, _ = _channel(snap, "jobs")
    assert [(e.label, e.messages) for e in jobs_entry.senders] == [("produce", 12)]


def test_misuse_and_double_instrumentation() -> None:
    with pytest.raises(TypeError, match=r"needs an asyncio.Queue.*list"):
        asyncflow.instrument_queue([])  # type: ignore[type-var]
    q: asyncio.Queue[int] = asyncio.Queue()
    with pytest.raises(TypeError, match="name"):
        asyncflow.instrument_queue(q, name=5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="log_messages"):
        asyncflow.instrument_queue(q, log_messages="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="log_messages"):
        asyncflow.instrument_queues(log_messages=1)  # type: ignore[arg-type]
    with asyncflow.profile("twice", format="none") as prof:
        asyncflow.instrument_queue(q, name="once")
        asyncflow.instrument_queue(q, name="twice")
        q.put_nowait(1)
        q.get_nowait()
        snap = prof.snapshot()
    assert snap.channels is not None
    # One channel, counted once; a name given again renames it (as a program does when it
    # names a queue that `asyncflow run` instrumented already).
    entry, _ = _channel(snap, "twice")
    assert (entry.sent_count, entry.received_count) == (1, 1)
    assert [c for c in snap.channels.channels if c.label == "once"] == []


async def test_instrument_queues_labels_new_queues_by_where_they_were_made() -> None:
    with asyncflow.profile("whole", format="none") as prof:
        with asyncflow.instrument_queues():
            made: asyncio.Queue[int] = asyncio.Queue()
            lifo: asyncio.LifoQueue[int] = asyncio.LifoQueue()
            # A nested call (the program's own, under `asyncflow run`) shares the mode, and
            # undoing it leaves the mode of the handle still in use on.
            inner = asyncflow.instrument_queues()
            assert inner.active
            inner.undo()
            inner.undo()
            assert not inner.active
            still: asyncio.PriorityQueue[int] = asyncio.PriorityQueue()
        after: asyncio.Queue[int] = asyncio.Queue()
        for q in (made, lifo, still, after):
            q.put_nowait(1)
            q.get_nowait()
        snap = prof.snapshot()
    assert snap.channels is not None
    labels = {c.label: c for c in snap.channels.channels}
    mine = [label for label in labels if label.startswith("test_queues.py:")]
    assert len(mine) == 3
    assert {labels[label].kind for label in mine} == {
        "asyncio.Queue",
        "asyncio.LifoQueue",
        "asyncio.PriorityQueue",
    }
    assert all(labels[label].sent_count == 1 for label in mine)
    assert asyncio.Queue.__init__ is not None and "_asyncflow_channel" not in vars(after)


@asyncflow.future(name="feeder")
async def _feed(q: asyncio.Queue[int], n: int, clock: FakeClock, step: int) -> None:
    for i in range(n):
        q.put_nowait(i)
        clock.advance(step)


@asyncflow.future(name="drainer")
async def _drain(q: asyncio.Queue[int], n: int, clock: FakeClock, step: int) -> list[int]:
    out = []
    for _ in range(n):
        out.append(q.get_nowait())
        clock.advance(step)
    return out


async def test_sampling_times_one_in_n_and_keeps_every_count_exact(
    fake_clock: FakeClock,
) -> None:
    with asyncflow.profile("sampled", format="none", sampling=4) as prof:
        q: asyncio.Queue[int] = asyncflow.instrument_queue(
            asyncio.Queue(), name="s", log_messages=True
        )
        await asyncio.create_task(_feed(q, 101, fake_clock, 10))
        got = await asyncio.create_task(_drain(q, 101, fake_clock, 10))
        snap = prof.snapshot()
    assert got == list(range(101))
    entry, logs = _channel(snap, "s")
    assert (entry.sent_count, entry.received_count, entry.unpaired_count) == (101, 101, 0)
    assert (entry.sampling_interval, entry.timed_count) == (4, 26)  # msg_ids 1, 5, 9 ... 101
    assert [e.msg_id for e in reversed(logs.sent_logs)] == list(range(1, 102, 4))
    # Every message waits 101 steps of 10 ns: put i at 10 i, taken at 1010 + 10 i.
    assert {e.delay_ns for e in logs.received_logs} == {1010}
    assert all(str((e.msg_id or 0) - 1) == e.message for e in logs.received_logs)
    # Edges add up to the exact counts although only one message in four was attributed.
    assert [(e.label, e.messages) for e in entry.senders] == [("feeder", 101)]
    assert [(e.label, e.messages) for e in entry.receivers] == [("drainer", 101)]


async def test_adaptive_sampling_times_all_of_a_quiet_channel_and_less_of_a_busy_one(
    fake_clock: FakeClock,
) -> None:
    with asyncflow.profile("auto", format="none", sampling="auto") as prof:
        quiet: asyncio.Queue[int] = asyncflow.instrument_queue(asyncio.Queue(), name="quiet")
        busy: asyncio.Queue[int] = asyncflow.instrument_queue(asyncio.Queue(), name="busy")
        await asyncio.create_task(_feed(quiet, 50, fake_clock, 2_000_000))  # every 2 ms
        await asyncio.create_task(_drain(quiet, 50, fake_clock, 0))
        await asyncio.create_task(_feed(busy, 5_000, fake_clock, 100))  # every 100 ns
        await asyncio.create_task(_drain(busy, 5_000, fake_clock, 0))
        snap = prof.snapshot()
    quiet_entry, _ = _channel(snap, "quiet")
    busy_entry, _ = _channel(snap, "busy")
    assert (quiet_entry.sampling_interval, quiet_entry.timed_count) == (1, 50)
    assert busy_entry.sampling_interval > 1
    assert 1 < busy_entry.timed_count < 5_000 // 16
    assert (busy_entry.sent_count, busy_entry.received_count) == (5_000, 5_000)
    assert sum(e.messages for e in busy_entry.senders) == 5_000
    assert sum(e.messages for e in busy_entry.receivers) == 5_000
    assert busy_entry.max_queue_size == 5_000


@pytest.mark.parametrize("make", KINDS)
@pytest.mark.parametrize("nowait", [False, True])
async def test_a_put_with_a_getter_waiting_is_received_by_the_getter(
    fake_clock: FakeClock, make: QueueFactory, nowait: bool
) -> None:
    """asyncio hands nothing over: a put with a getter waiting stores the item and wakes the
    getter, whose get takes it. The receive is the consumer's, timed when it takes the item."""
    label = f"put-to-getter-{make.__name__}-{nowait}"
    with asyncflow.profile(label, format="none", sampling=1) as prof:
        q = asyncflow.instrument_queue(make(0), name=label)
        got: list[int] = []

        @asyncflow.future(name=f"{label}-consumer")
        async def consumer() -> None:
            for _ in range(4):
                got.append(await q.get())

        @asyncflow.future(name=f"{label}-producer")
        async def producer() -> None:
            for i in range(4):
                while not q._getters:  # type: ignore[attr-defined]
                    await asyncio.sleep(0)
                if nowait:
                    q.put_nowait(i)
                else:
                    await q.put(i)
                fake_clock.advance(700)  # before the consumer runs again

        async with asyncio.timeout(5):
            await asyncio.gather(asyncio.create_task(consumer()), asyncio.create_task(producer()))
        assert got == [0, 1, 2, 3]
        snap = prof.snapshot()
    ids = {f.label: f.id for f in snap.futures.futures}
    entry, logs = _channel(snap, label)
    assert (entry.sent_count, entry.received_count) == (4, 4)
    assert {e.future_id for e in logs.sent_logs} == {ids[f"{label}-producer"]}
    assert {e.future_id for e in logs.received_logs} == {ids[f"{label}-consumer"]}
    assert [e.delay_ns for e in logs.received_logs] == [700] * 4


async def test_a_queue_freed_with_unread_items_counts_them_as_lost() -> None:
    with asyncflow.profile("lost", format="none") as prof:
        q: asyncio.Queue[int] = asyncflow.instrument_queue(asyncio.Queue(), name="dropped")
        for i in range(2_000):
            q.put_nowait(i)
        assert q.get_nowait() == 0
        before = prof.snapshot()
        del q
        gc.collect()
        after = prof.snapshot()
    entry, _ = _channel(before, "dropped")
    assert (entry.queue_size, entry.lost_count, entry.state) == (1_999, 0, "active")
    entry, _ = _channel(after, "dropped")
    assert (entry.sent_count, entry.received_count, entry.max_queue_size) == (2_000, 1, 2_000)
    assert (entry.queue_size, entry.lost_count, entry.state) == (0, 1_999, "closed")
    assert "0/2000, 1,999 lost" in render(after, "table", (50.0,), 10)  # the exit report says so


async def test_queues_made_on_one_line_get_labels_of_their_own() -> None:
    with asyncflow.profile("one-line", format="none") as prof:
        with asyncflow.instrument_queues():
            raw, out = asyncio.Queue[int](10), asyncio.Queue[int](5)
            alone: asyncio.Queue[int] = asyncio.Queue()
            again = [asyncio.Queue[int]() for _ in range(3)]
        snap = prof.snapshot()
    assert snap.channels is not None
    by_type = {c.label: c.channel_type for c in snap.channels.channels}
    line, text = _line_of("raw, out = asyncio.Queue[int](10)")
    first, second = text.index("asyncio.Queue[int](10)"), text.index("asyncio.Queue[int](5)")
    assert by_type[f"test_queues.py:{line}:{first + 1}"] == "bounded[10]"
    assert by_type[f"test_queues.py:{line}:{second + 1}"] == "bounded[5]"
    assert by_type[f"test_queues.py:{line + 1}"] == "unbounded"  # one call: no column needed
    # queues made at one place share its label, however many are made there
    made_there = [
        c for c in snap.channels.channels if c.label.startswith(f"test_queues.py:{line + 2}")
    ]
    assert len(made_there) == 3 and len({c.label for c in made_there}) == 1
    del raw, out, alone, again


def _line_of(code: str) -> tuple[int, str]:
    """The number and text of the line of this file whose code starts with ``code``."""
    with open(__file__) as source:
        return next((n, text) for n, text in enumerate(source, 1) if text.lstrip().startswith(code))


async def test_a_queue_whose_maxsize_is_not_a_number_gets_a_clear_error() -> None:
    bad: asyncio.Queue[int] = asyncio.Queue("x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"maxsize='x' \(str\)"):
        asyncflow.instrument_queue(bad)
    errors = _session.errors.count
    with asyncflow.profile("bad-maxsize", format="none") as prof:
        with asyncflow.instrument_queues():
            made: asyncio.Queue[int] = asyncio.Queue("y")  # type: ignore[arg-type]
        snap = prof.snapshot()
    assert made.maxsize == "y"  # type: ignore[comparison-overlap]  # untouched: fails at its first put
    with pytest.raises(TypeError):
        made.put_nowait(1)
    assert _session.errors.count == errors
    assert snap.channels is not None
    line, _ = _line_of('made: asyncio.Queue[int] = asyncio.Queue("y")')
    assert [c for c in snap.channels.channels if c.label == f"test_queues.py:{line}"] == []


def test_threads_instrumenting_one_queue_at_once_register_it_once() -> None:
    queues = [asyncio.Queue[int]() for _ in range(1_000)]
    barrier = threading.Barrier(4)

    def instrument_all() -> None:
        barrier.wait(10)
        for q in queues:
            asyncflow.instrument_queue(q)

    interval = sys.getswitchinterval()
    with asyncflow.profile("threads", format="none") as prof:
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
    mine = {f"Queue@{id(q):x}" for q in queues}
    assert sorted(c.label for c in snap.channels.channels if c.label in mine) == sorted(mine)


class _Interrupting:
    def __repr__(self) -> str:
        raise KeyboardInterrupt


async def test_a_keyboard_interrupt_in_a_logged_repr_reaches_the_program() -> None:
    # Ctrl-C while asyncflow ran the program's repr() is the program's: counted, and raised
    # (issue 24, item 10; it was once swallowed, and a program without asyncio.run never saw it)
    with asyncflow.profile("repr", format="none") as prof:
        q: asyncio.Queue[Any] = asyncflow.instrument_queue(
            asyncio.Queue(), name="r", log_messages=True
        )
        errors = prof.snapshot().status.internal_errors
        item = _Interrupting()
        with pytest.raises(KeyboardInterrupt):
            q.put_nowait(item)  # queued, and counted: the interrupt came as it was logged
        assert q.qsize() == 1
        with pytest.raises(KeyboardInterrupt):
            q.get_nowait()
        assert q.empty()
        snap = prof.snapshot()
    channel, _ = _channel(snap, "r")
    assert (channel.sent_count, channel.received_count) == (1, 1)
    assert snap.status.internal_errors == errors + 2


@pytest.mark.parametrize("make", KINDS, ids=lambda k: k.__name__)
async def test_a_queue_whose_storage_is_replaced_keeps_working(make: QueueFactory) -> None:
    # `q._queue = collections.deque()` is a common way to empty a queue: the next put must go
    # into the new storage, and a get waiting on the empty queue must then take it (the hooks
    # once appended to the deque they were made with, and the get waited for ever).
    with asyncflow.profile("replaced", format="none") as prof:
        q = asyncflow.instrument_queue(make(0), name=f"r-{make.__name__}", log_messages=True)
        for i in range(3):
            q.put_nowait(i)
        q._queue = type(q._queue)()  # type: ignore[attr-defined]
        assert q.empty()
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                got: list[int] = []

                async def consume() -> None:
                    got.append(await q.get())

                tg.start_soon(consume)
                await asyncio.sleep(0)  # the consumer waits on the empty queue
                q.put_nowait(10)
            assert got == [10]
            q._queue = type(q._queue)([20, 21])  # type: ignore[attr-defined]  # replaced, not empty
            assert sorted([await q.get(), await q.get()]) == [20, 21]
            q.put_nowait(30)
            assert await q.get() == 30
        snap = prof.snapshot()
    entry, logs = _channel(snap, f"r-{make.__name__}")
    # counts exact (three items vanished, two were never put), and whatever is paired is paired
    # with the right put
    assert (entry.sent_count, entry.received_count, entry.queue_size) == (5, 4, 0)
    sent = {e.msg_id: e.message for e in logs.sent_logs}
    assert logs.received_logs and all(sent[e.msg_id] == e.message for e in logs.received_logs)


class _Pipeline:
    """Stages joined by queues made in its own __init__, as programs often make them."""

    def __init__(self) -> None:
        self.raw: asyncio.Queue[int] = asyncio.Queue()
        self.parsed: asyncio.Queue[int] = asyncio.Queue(10)
        self.out: asyncio.PriorityQueue[int] = asyncio.PriorityQueue()


class _Jobs(asyncio.Queue[int]):
    def __init__(self) -> None:
        super().__init__(5)


async def test_queues_made_in_a_class_init_are_labelled_by_their_own_lines() -> None:
    # Each is named by the line that made it (all three once shared the line calling
    # _Pipeline()); a queue subclass's own __init__ is no part of its label, as for locks.
    with asyncflow.instrument_queues():
        pipeline = _Pipeline()
        line = sys._getframe().f_lineno + 1
        jobs = _Jobs()
    labels = [
        getattr(q, "_asyncflow_channel").label  # noqa: B009
        for q in (pipeline.raw, pipeline.parsed, pipeline.out, jobs)
    ]
    made = [_line_of(f"self.{name}: asyncio.")[0] for name in ("raw", "parsed", "out")]
    assert labels == [*(f"test_queues.py:{n}" for n in made), f"test_queues.py:{line}"]
