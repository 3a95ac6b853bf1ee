"""repr() of a logged result, message or item: a failure is counted, and an interrupt arrives.

asyncflow calls ``repr()`` on the program's values only when asked (``log_result``,
``log_messages``, ``log_items``). A repr that fails is logged as ``<repr() failed: ...>`` and
counted in ``internal_errors``; a Ctrl-C (KeyboardInterrupt) or an exit raised while it runs is
the program's: it reaches the program, as it would have without asyncflow. The loops here are
driven with ``run_until_complete``, as a program that does not use ``asyncio.run`` does (there,
Ctrl-C raises KeyboardInterrupt wherever the main thread is).
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator, Iterator

import pytest

import asyncflow


class Hostile:
    """A value whose repr() raises ``exc``."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __repr__(self) -> str:
        raise self.exc


def _errors(prof: asyncflow.Profiler) -> int:
    return prof.snapshot().status.internal_errors


@pytest.fixture(autouse=True)
def _exceptions_let_go(request: pytest.FixtureRequest) -> Iterator[None]:
    """The parametrized exceptions live as long as the session: once raised, their tracebacks
    held this test's frames and loop, which the next tests' profilers then listed among their
    loops (a second loop in /loop, a stale loop's events in a trace)."""
    yield
    callspec = getattr(request.node, "callspec", None)
    exc = callspec.params.get("exc") if callspec is not None else None
    if isinstance(exc, BaseException):
        exc.__traceback__ = exc.__context__ = None
    gc.collect()


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    try:
        yield loop
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())  # one interrupted mid-iteration
        loop.close()


@asyncflow.future(name="returns a hostile value", log_result=True)
async def _returns(value: object) -> object:
    await asyncio.sleep(0)
    return value


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), SystemExit(3)], ids=type)
def test_an_interrupt_in_the_repr_of_a_logged_result_reaches_the_program(
    loop: asyncio.AbstractEventLoop, exc: BaseException
) -> None:
    with asyncflow.profile("repr", format="none") as prof:
        before = _errors(prof)
        with pytest.raises(type(exc)):
            loop.run_until_complete(_returns(Hostile(exc)))
        assert _errors(prof) == before + 1
        # the call is recorded whole all the same: it returned, and its result could not be read
        snapshot = prof.snapshot()
        entry = next(f for f in snapshot.futures.futures if f.label == "returns a hostile value")
        assert entry.outcomes.returned == 1
        logs = next(log for log in snapshot.future_logs if log.future_id == entry.id)
        assert [c.result for c in logs.calls] == [f"<repr() failed: {type(exc).__name__}>"]


def test_a_failing_repr_of_a_logged_result_is_counted(loop: asyncio.AbstractEventLoop) -> None:
    value = Hostile(ValueError("no repr"))
    with asyncflow.profile("repr", format="none") as prof:
        before = _errors(prof)
        assert loop.run_until_complete(_returns(value)) is value
        assert _errors(prof) == before + 1


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), ValueError("no repr")], ids=type)
def test_the_repr_of_a_logged_message(loop: asyncio.AbstractEventLoop, exc: BaseException) -> None:
    async def put() -> None:
        q: asyncio.Queue[object] = asyncflow.instrument_queue(asyncio.Queue(), log_messages=True)
        await q.put(Hostile(exc))

    with asyncflow.profile("repr", format="none") as prof:
        before = _errors(prof)
        if isinstance(exc, Exception):
            loop.run_until_complete(put())
        else:
            with pytest.raises(type(exc)):
                loop.run_until_complete(put())
        assert _errors(prof) == before + 1


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), ValueError("no repr")], ids=type)
def test_the_repr_of_a_logged_stream_item(
    loop: asyncio.AbstractEventLoop, exc: BaseException
) -> None:
    @asyncflow.stream(name="hostile items", log_items=True)
    async def items() -> AsyncIterator[object]:
        yield Hostile(exc)

    async def read() -> None:
        async for _ in items():
            pass

    with asyncflow.profile("repr", format="none") as prof:
        before = _errors(prof)
        if isinstance(exc, Exception):
            loop.run_until_complete(read())
        else:
            with pytest.raises(type(exc)):
                loop.run_until_complete(read())
        assert _errors(prof) == before + 1
