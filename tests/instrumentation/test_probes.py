"""The per-poll probe seam, on both hot paths: what a probe sees, and that it never breaks a call.

Each test runs with the pure-Python wrapper (the reference) and, where it is built, the
compiled one, on a fake clock, and asserts exactly what ``begin`` and ``end`` were given.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import sys
import threading
from collections.abc import Coroutine, Iterator
from typing import Any

import pytest

import asyncflow
from asyncflow.clock import FakeClock
from asyncflow.instrumentation import _session, futures, probes
from asyncflow.instrumentation.futures import FutureRecord, call_field

IMPLS = [pytest.param(futures.InstrumentedCoroutinePy, id="python")]
if futures._speedups is not None:
    IMPLS.append(pytest.param(futures._speedups.InstrumentedCoroutine, id="compiled"))


class Recorder:
    """A probe that writes down every call it gets."""

    def __init__(self, clock: FakeClock | None = None) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.clock = clock

    def begin(self, record: Any) -> Any:
        task = probes.current_task()
        self.events.append(("begin", record.future.label, record.polls, task))
        if self.clock is not None:
            self.clock.advance(1_000)  # a probe's own cost is outside the poll's duration
        return ("token", record.call_id)

    def end(self, record: Any, token: Any, t0_ns: int, dt_ns: int, outcome: str) -> None:
        assert token == ("token", record.call_id)
        self.events.append(("end", record.future.label, t0_ns, dt_ns, outcome, record.last))
        if self.clock is not None:
            self.clock.advance(1_000)


@pytest.fixture
def clock() -> Iterator[FakeClock]:
    fake = FakeClock()
    previous = asyncflow.clock.set_clock(fake)
    yield fake
    asyncflow.clock.set_clock(previous)


@pytest.fixture
def recorder(clock: FakeClock) -> Iterator[Recorder]:
    rec = Recorder(clock)
    assert probes.set_poll_probe(rec) is None
    try:
        yield rec
    finally:
        probes.set_poll_probe(None)
    assert probes.poll_probe() is None


def _future(label: str) -> FutureRecord:
    return FutureRecord(label, f"m:{label}", "m.py", 1, False, "decorator")


@pytest.mark.parametrize("impl", IMPLS)
def test_a_probe_sees_every_poll_with_its_start_duration_and_outcome(
    impl: Any, clock: FakeClock, recorder: Recorder
) -> None:
    outer_f, inner_f = _future("outer"), _future("inner")
    tasks: list[Any] = []

    async def inner() -> int:
        clock.advance(30)
        await asyncio.sleep(0)
        clock.advance(40)
        return 7

    async def outer() -> int:
        clock.advance(5)
        value: int = await impl(inner(), inner_f)
        clock.advance(6)
        return value

    async def main() -> int:
        with asyncflow.profile("probe", format="none"):
            task = asyncio.create_task(impl(outer(), outer_f))
            tasks.append(task)
            value: int = await task
            return value

    start = clock()
    assert asyncio.run(main()) == 7
    task = tasks[0]
    ev = recorder.events
    # begin(outer), begin(inner), end(inner), end(outer): suspended; then the second polls
    assert [e[:2] for e in ev] == [
        ("begin", "outer"),
        ("begin", "inner"),
        ("end", "inner"),
        ("end", "outer"),
        ("begin", "outer"),
        ("begin", "inner"),
        ("end", "inner"),
        ("end", "outer"),
    ]
    assert all(e[3] is task for e in ev if e[0] == "begin")  # the task that polls
    assert [e[2] for e in ev if e[0] == "begin"] == [0, 0, 1, 1]  # polls before this one
    # (t0 from the start, dt, outcome, record.last): each begin and end costs 1,000 ns of fake
    # time, which is in no poll's duration but the outer one's around an inner pair
    assert [(e[2] - start, *e[3:]) for e in ev if e[0] == "end"] == [
        (2_005, 30, "suspended", 30),
        (1_000, 2_035, "suspended", 2_035),
        (6_035, 40, "returned", 40),
        (5_035, 2_046, "returned", 2_046),
    ]


@pytest.mark.parametrize("impl", IMPLS)
def test_outcomes_of_raise_cancel_and_throw(impl: Any, recorder: Recorder) -> None:
    f = _future("f")

    async def fails() -> None:
        await asyncio.sleep(0)
        raise LookupError("no")

    async def hangs() -> None:
        await asyncio.Event().wait()

    async def main() -> None:
        with asyncflow.profile("probe", format="none"):
            with pytest.raises(LookupError):
                await impl(fails(), f)
            task = asyncio.create_task(impl(hangs(), f))
            await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            w = impl(hangs(), f)
            w.send(None)
            with pytest.raises(KeyError):
                w.throw(KeyError("k"))
            with pytest.raises(StopIteration):
                impl(_returns(), f).send(None)
            w = impl(hangs(), f)
            w.send(None)
            w.close()  # not a poll: nothing for the probe

    async def _returns() -> int:
        return 1

    asyncio.run(main())
    outcomes = [e[4] for e in recorder.events if e[0] == "end"]
    assert outcomes == [
        "suspended",
        "raised",
        "suspended",
        "cancelled",
        "suspended",
        "raised",
        "returned",
        "suspended",
    ]


@pytest.mark.parametrize("impl", IMPLS)
def test_a_failing_probe_is_removed_and_the_program_never_sees_it(
    impl: Any, caplog: pytest.LogCaptureFixture
) -> None:
    class Fails:
        def __init__(self, where: str) -> None:
            self.where = where
            self.calls = 0

        def begin(self, record: Any) -> Any:
            self.calls += 1
            if self.where == "begin":
                raise RuntimeError("probe begin failed")
            return None

        def end(self, record: Any, token: Any, t0: int, dt: int, outcome: str) -> None:
            self.calls += 1
            if self.where == "end":
                raise RuntimeError("probe end failed")

    f = _future("f")

    async def work() -> int:
        await asyncio.sleep(0)
        return 3

    async def main(probe: Fails) -> list[int]:
        with asyncflow.profile("probe", format="none"):
            probes.set_poll_probe(probe)
            try:
                return [await impl(work(), f), await impl(work(), f)]
            finally:
                probes.set_poll_probe(None)

    for where in ("begin", "end"):
        errors = _session.errors.count
        _session.errors.logged.discard("a poll probe (removed)")  # logged once per process
        probe = Fails(where)
        with caplog.at_level(logging.ERROR, logger="asyncflow"):
            assert asyncio.run(main(probe)) == [3, 3]
        assert probe.calls == (1 if where == "begin" else 2)  # removed after its first failure
        assert _session.errors.count == errors + 1
        assert f"a poll probe (removed): RuntimeError: probe {where} failed" in caplog.text
        assert probes.poll_probe() is None
        caplog.clear()


@pytest.mark.parametrize("impl", IMPLS)
def test_a_probe_replaced_during_a_poll_gets_the_end_of_what_it_began(
    impl: Any, recorder: Recorder
) -> None:
    second = Recorder()
    f = _future("f")

    async def swaps() -> None:
        probes.set_poll_probe(second)
        await asyncio.sleep(0)

    async def main() -> None:
        with asyncflow.profile("probe", format="none"):
            await impl(swaps(), f)

    asyncio.run(main())
    assert [e[0] for e in recorder.events] == ["begin", "end"]
    assert [(e[0], e[-2] if e[0] == "end" else None) for e in second.events] == [
        ("begin", None),
        ("end", "returned"),
    ]


@pytest.mark.parametrize("impl", IMPLS)
def test_probe_data_is_the_probes_own_slot(impl: Any) -> None:
    class Counts:
        def begin(self, record: Any) -> None:
            if call_field(record, "probe_data") is None:
                record.probe_data = []

        def end(self, record: Any, token: Any, t0: int, dt: int, outcome: str) -> None:
            record.probe_data.append(outcome)

    f = _future("f")
    records: list[Any] = []

    async def work() -> None:
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    async def main() -> None:
        with asyncflow.profile("probe", format="none"):
            w = impl(work(), f)
            records.append(w._r)
            assert call_field(w._r, "probe_data") is None
            await w

    previous = probes.set_poll_probe(Counts())
    try:
        asyncio.run(main())
    finally:
        probes.set_poll_probe(previous)
    assert records[0].probe_data == ["suspended", "suspended", "returned"]


def test_a_bad_probe_is_refused() -> None:
    with pytest.raises(TypeError, match=r"probe=.*begin"):
        probes.set_poll_probe(object())  # type: ignore[arg-type]
    assert probes.poll_probe() is None


def test_the_same_polls_on_both_paths(clock: FakeClock) -> None:
    if futures._speedups is None:
        pytest.skip("the compiled hot path is not built here")

    def run(impl: Any) -> list[tuple[Any, ...]]:
        rec = Recorder(clock)
        f, g = _future("f"), _future("g")

        async def leaf(n: int) -> int:
            for _ in range(n):
                clock.advance(11)
                await asyncio.sleep(0)
            if n == 2:
                raise ValueError(n)
            return n

        async def node() -> int:
            total = 0
            for n in range(4):
                with contextlib.suppress(ValueError):
                    total += await impl(leaf(n), g)
            return total

        async def main() -> int:
            with asyncflow.profile("probe", format="none"):
                probes.set_poll_probe(rec)
                try:
                    return await asyncio.gather(impl(node(), f), impl(node(), f))  # type: ignore[return-value]
                finally:
                    probes.set_poll_probe(None)

        origin = clock()
        asyncio.run(main())
        return [
            (e[0], e[1], e[2] - origin, *e[3:]) if e[0] == "end" else (e[0], e[1], e[2])
            for e in rec.events
        ]

    assert run(futures._speedups.InstrumentedCoroutine) == run(futures.InstrumentedCoroutinePy)


@pytest.mark.parametrize("impl", IMPLS)
def test_a_probe_keeps_no_reference(impl: Any) -> None:
    token = object()

    class Holds:
        def begin(self, record: Any) -> Any:
            return token

        def end(self, record: Any, tok: Any, t0: int, dt: int, outcome: str) -> None:
            assert tok is token

    f = _future("f")

    async def work() -> None:
        await asyncio.sleep(0)

    async def hangs() -> None:
        await asyncio.Event().wait()

    async def main() -> None:
        for _ in range(200):
            await impl(work(), f)
            task = asyncio.create_task(impl(hangs(), f))
            await asyncio.sleep(0)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    with asyncflow.profile("probe", format="none") as prof:
        previous = probes.set_poll_probe(Holds())
        try:
            before = sys.getrefcount(token)
            asyncio.run(main())
            prof.snapshot()
            gc.collect()
            assert sys.getrefcount(token) == before
        finally:
            probes.set_poll_probe(previous)


def test_polls_on_another_thread_are_seen_there() -> None:
    seen: list[int] = []

    class Threads:
        def begin(self, record: Any) -> None:
            seen.append(threading.get_ident())

        def end(self, record: Any, token: Any, t0: int, dt: int, outcome: str) -> None:
            pass

    @asyncflow.future
    async def work() -> None:
        await asyncio.sleep(0)

    def coro() -> Coroutine[Any, Any, None]:
        return work()

    with asyncflow.profile("probe", format="none"):
        previous = probes.set_poll_probe(Threads())
        try:
            thread = threading.Thread(target=asyncio.run, args=(coro(),))
            thread.start()
            thread.join(30)
        finally:
            probes.set_poll_probe(previous)
    assert seen and set(seen) == {thread.ident}
