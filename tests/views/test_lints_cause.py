"""One finding per cause: a line that blocks the loop is one warning, carrying what the
blocked-loop, long-poll, off-cpu-poll and cpu-bound lints each know of it; and it is called CPU
work only where the loop's thread computed."""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import time
from pathlib import Path

import anyio
import pytest

import asyncflow
from asyncflow import schema
from asyncflow.views import lints
from asyncflow.views.lints import Documents, Finding, Thresholds

MS = 1_000_000


def sleepy_lookup() -> None:
    time.sleep(0.3)  # the planted blocking call


@asyncflow.future(name="ping")
async def ping() -> None:
    await asyncio.sleep(0)


async def until_watched(prof: asyncflow.Profiler) -> None:
    """The loop is watched from its first tracked call, and looked at once the profiler's
    thread ticks."""
    await ping()
    with anyio.fail_after(10):
        while not [e for e in monitored(prof) if e.heartbeats >= 2]:
            await asyncio.sleep(0.005)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the thread's CPU clock")
def test_one_blocking_line_is_one_warning_not_four() -> None:
    @asyncflow.future(name="handler")
    async def handler() -> None:
        await asyncio.sleep(0)
        sleepy_lookup()

    async def main() -> None:
        await until_watched(prof)
        for _ in range(3):
            await handler()
            await ping()

    # cpu=True as well: the off-cpu-poll lint has its figures too
    with asyncflow.profile("cause", format="none", port=None, cpu=True) as prof:
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(main())
        finally:
            loop.close()
        warnings = [w for w in prof.snapshot().warnings if w.severity != "info"]
    about = [w for w in warnings if "handler" in w.message or w.subject.label == "handler"]
    assert [(w.kind, w.subject.kind) for w in about] == [("loop-blocked", "line")], [
        (w.kind, w.message) for w in warnings
    ]
    (warning,) = about
    assert warning.subject.label == f"test_lints_cause.py:{line_of_sleep()}"
    assert "blocked the event loop 3 times" in warning.message
    assert "little CPU" in warning.message and "CPU work" not in warning.message
    assert "asyncio.to_thread" in warning.hint
    # the facts of the lints it stands for
    assert warning.evidence["blocks"] == 3 and warning.evidence["max_poll_ns"] >= 300 * MS
    assert warning.evidence["busy_ns"] >= 900 * MS  # cpu-bound's figure, of the same cause


def monitored(prof: asyncflow.Profiler) -> list[schema.LoopEntry]:
    loop = prof.snapshot().loop
    return loop.loops if loop is not None else []


def line_of_sleep() -> int:
    return sleepy_lookup.__code__.co_firstlineno + 1


# -- on documents -----------------------------------------------------------------------------


def future(
    fid: int, label: str, busy_ns: int, max_poll_ns: int, cpu: schema.PollCpu | None = None
) -> schema.FutureEntry:
    return schema.FutureEntry(
        id=fid,
        label=label,
        source=f"app:{label}",
        location=schema.Location("app.py", 10 * fid),
        tracked_by="decorator",
        call_count=10,
        calls=schema.CallStates(0, 0, 0, 0, 10),
        outcomes=schema.Outcomes(10, 0, 0, 0, 0),
        cancellations=schema.Cancellations(0, 0, 0, 0),
        total_polls=20,
        busy_ns=busy_ns,
        idle_ns=0,
        max_poll_duration_ns=max_poll_ns,
        poll_duration_ns={},
        call_duration_ns={},
        live_series=[],
        cpu=cpu,
    )


def blocking_line(
    kind: str | None, cpu_ns: int | None, total_ns: int = 900 * MS
) -> schema.BlockedLine:
    return schema.BlockedLine(
        file="/srv/app.py",
        line=12,
        function="handler",
        code="lookup()",
        count=3,
        total_ns=total_ns,
        max_ns=total_ns // 3,
        last_ns=0,
        cpu_ns=cpu_ns,
        cpu_wall_ns=total_ns if cpu_ns is not None else 0,
        kind=kind,
        future_id=1,
        label="handler",
    )


def loop_with(*lines: schema.BlockedLine, episodes: int = 3) -> schema.LoopEntry:
    episode = schema.BlockedEpisode(
        id=1,
        started_ns=0,
        blocked_ns=300 * MS,
        ongoing=False,
        task="Task-1",
        call=schema.RunningCall(1, "handler", 5, 0, 300 * MS),
        stack=[schema.StackFrame("/srv/app.py", 12, "handler", "lookup()")],
    )
    return schema.LoopEntry(
        id=1,
        label="asyncio.unix_events._UnixSelectorEventLoop",
        thread="MainThread",
        state="running",
        lag_now_ns=0,
        lag_ns={},
        max_lag_ns=300 * MS,
        heartbeats=10,
        tasks_alive=2,
        running=None,
        blocked=False,
        blocked_count=episodes,
        episodes=[episode] if episodes else [],
        blocking_lines=list(lines),
    )


def evaluate(loop: schema.LoopEntry | None, *futures: schema.FutureEntry) -> list[Finding]:
    docs = Documents(0, 1_000 * MS, futures=futures, loops=[loop] if loop is not None else [])
    return [f for f in lints.evaluate(docs, Thresholds()) if f.severity != "info"]


def test_a_blocked_loop_a_long_poll_off_cpu_and_cpu_bound_on_one_line_are_one_finding() -> None:
    off_cpu = schema.PollCpu(3, 900 * MS, 6 * MS, 894 * MS, 2 * MS, 300 * MS, 2 * MS, 5)
    findings = evaluate(
        loop_with(blocking_line("blocking", 6 * MS)),
        future(1, "handler", 900 * MS, 300 * MS, off_cpu),
        future(2, "ping", 1 * MS, 1 * MS),
    )
    assert [(f.kind, f.subject.kind, f.subject.label) for f in findings] == [
        ("loop-blocked", "line", "app.py:12")
    ]
    (finding,) = findings
    assert finding.message == (
        "`handler` blocked the event loop 3 times at app.py:12 (`lookup()`), 900 ms in all (the "
        "longest 300 ms), using little CPU (1% of it): a blocking call (a sleep, blocking I/O, a "
        "lock) on the loop"  # (its busy time is the line's 900 ms: not said twice)
    )
    assert finding.evidence == {
        "loop_id": 1,
        "blocks": 3,
        "total_ns": 900 * MS,
        "longest_ns": 300 * MS,
        "cpu_ns": 6 * MS,
        "cpu_wall_ns": 900 * MS,
        "max_poll_ns": 300 * MS,
        "busy_ns": 900 * MS,
    }


def test_a_line_whose_thread_computed_is_cpu_work() -> None:
    (finding,) = evaluate(
        loop_with(blocking_line("cpu", 880 * MS)),
        future(1, "handler", 900 * MS, 300 * MS),
        future(2, "ping", 1 * MS, 1 * MS),
    )
    assert "computing (98% of it on the CPU): CPU work on the loop" in finding.message
    assert "executor" in finding.hint


def test_busy_time_spent_blocking_is_not_called_cpu_work() -> None:
    # Its blocks are too few to name (50 ms in all), yet they say the thread was asleep: the
    # busy time of `handler` is not CPU work, and nothing else proves a cause.
    findings = evaluate(
        loop_with(blocking_line("blocking", 1 * MS, total_ns=60 * MS), episodes=0),
        future(1, "handler", 900 * MS, 20 * MS),
        future(2, "ping", 1 * MS, 1 * MS),
    )
    assert [f.kind for f in findings] == []


def test_a_long_poll_and_cpu_bound_of_one_future_are_one_finding() -> None:
    # No blocking line (a recording without them, or a poll the monitor did not see): the
    # future is the cause, and its long poll says its share of the busy time.
    (finding,) = evaluate(None, future(1, "render", 250 * MS, 250 * MS), future(2, "ping", 1, 1))
    assert (finding.kind, finding.subject.label) == ("long-poll", "render")
    assert finding.message == (
        "A poll of `render` (app.py:10) ran 250 ms without yielding to the event loop; it holds "
        "the loop 100% of all busy time (250 ms over 10 calls)"
    )


def test_a_repeated_line_outranks_a_one_off_start_up_block() -> None:
    startup = schema.BlockedLine(
        "/srv/app.py", 3, "main", "warm()", 1, 600 * MS, 600 * MS, 0, None, 0, None, None, None
    )
    handler = blocking_line("blocking", 60 * MS, total_ns=149 * 40 * MS)
    findings = evaluate(loop_with(handler, startup, episodes=0))
    assert [(f.subject.label, f.severity) for f in findings] == [
        ("app.py:12", "error"),  # 5.96 s lost in all
        ("app.py:3", "warning"),
    ]
    assert findings[1].message == (
        "Untracked code in main blocked the event loop once at app.py:3 (`warm()`), for 600 ms: "
        "every other task waited meanwhile"
    )


def test_a_tail_that_a_timeout_cut_is_no_slow_tail() -> None:
    # A crawler's fetches: most take a few ms, and one in four hits the program's timeout. Its
    # p99 is that timeout, which the program chose: no slow-tail warning (the README's crawler
    # got one in one run of three). The same spread with no timeout is a slow tail.
    slow = dataclasses.replace(
        future(1, "fetch", 50 * MS, 1 * MS),
        call_count=120,
        outcomes=schema.Outcomes(120, 0, 0, 0, 0),
        call_duration_ns={"p50": 8 * MS, "p95": 90 * MS, "p99": 118 * MS},
    )
    docs = Documents(now_ns=1000 * MS, elapsed_ns=1000 * MS, futures=[slow])
    assert [f.kind for f in lints.tail_latency(docs, Thresholds())] == ["tail-latency"]
    cut = dataclasses.replace(
        slow,
        outcomes=schema.Outcomes(90, 0, 30, 0, 0),
        cancellations=schema.Cancellations(30, 0, 0, 100 * MS),
    )
    docs = Documents(now_ns=1000 * MS, elapsed_ns=1000 * MS, futures=[cut])
    assert list(lints.tail_latency(docs, Thresholds())) == []


_HEAVY_MODULE = """\
import time

time.sleep(0.25)  # a table built when the module is first imported
TABLE = {"ready": True}
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the thread's CPU clock")
def test_a_module_imported_on_first_use_is_named_as_an_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A handler imports a slow module of the program's the first time it runs: the block is
    the import (the stack was inside the import system), named by the module's own line that
    was running, advised to import at start-up, not to move CPU work to an executor; it
    blocked once, the first call that needed it, so it is info."""
    (tmp_path / "af_heavy_tables.py").write_text(_HEAVY_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))

    @asyncflow.future(name="lookup")
    async def lookup() -> bool:
        await asyncio.sleep(0)
        import af_heavy_tables  # type: ignore[import-not-found]  # (the lazy import planted)

        return bool(af_heavy_tables.TABLE["ready"])

    async def main() -> None:
        await until_watched(prof)
        for _ in range(3):
            assert await lookup()

    with asyncflow.profile("lazy import", format="none", port=None) as prof:
        asyncio.run(main())
        loops = monitored(prof)
        warnings = [w for w in prof.snapshot().warnings if w.kind == "loop-blocked"]
    sys.modules.pop("af_heavy_tables", None)
    (line,) = [b for loop in loops for b in loop.blocking_lines if b.label == "lookup"]
    assert (line.kind, line.count, line.line) == ("import", 1, 3), line
    assert line.file.endswith("af_heavy_tables.py")
    (found,) = warnings
    assert found.severity == "info" and "importing a module" in found.message, found
    assert "import it at start-up" in found.hint and "executor" not in found.hint
