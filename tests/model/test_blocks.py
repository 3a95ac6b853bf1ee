"""Blocks that matter: each line's blocks of the loop, however short of an episode, summed and
ranked by the time they cost; and whether the loop's thread computed or waited meanwhile.

The programs here block their loop on purpose (``time.sleep`` on the loop's thread, or a loop
of arithmetic, is the planted problem); the monitor's bookkeeping is tested on the fake clock.
"""

from __future__ import annotations

import asyncio
import linecache
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

import asyncflow
from asyncflow import clock
from asyncflow.clock import FakeClock
from asyncflow.config import resolve_options
from asyncflow.instrumentation import loops
from asyncflow.model import monitor
from asyncflow.model.monitor import MAX_BLOCK_LINES, LoopMonitor, LoopState, Sample
from asyncflow.render import report, top
from asyncflow.schema import SCHEMA, LoopDocument, LoopEntry, Snapshot
from asyncflow.views import documents as views
from asyncflow.views import lints
from tests.support.commands import asyncflow_cmd, run_example, write

MS = 1_000_000
THRESHOLD_NS = 100 * MS

linux = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="another thread's CPU clock is read on Linux"
)


# -- a service whose every request blocks 40 ms: below the threshold, named at exit ----------

SERVICE = """\
import asyncio, time

async def handle(i):
    await asyncio.sleep(0)
    time.sleep(0.04)  # a synchronous client, on the loop
    return i

async def main():
    for i in range(50):
        await handle(i)
        await asyncio.sleep(0.002)

asyncio.run(main())
"""


def test_a_short_block_in_every_request_is_named_by_its_line_with_its_total(
    tmp_path: Path,
) -> None:
    script = write(tmp_path / "service.py", SERVICE)
    done = asyncflow_cmd("run", str(script), env={"ASYNCFLOW_PORT": "0"})
    assert done.returncode == 0, done.stderr
    # The warning names the line, how often it blocked, and the time lost in all.
    (flat,) = [w for w in warnings_of(done.stderr) if "service.py:5" in w]
    count = int(flat.split("blocked the event loop ")[1].split(" times")[0])
    assert 30 <= count <= 50, flat  # each request's block, but the odd one the monitor missed
    assert "s in all" in flat and "time.sleep(0.04)" in flat
    # The loop section lists the line with its total, first.
    rows = [line for line in done.stderr.splitlines() if line.startswith("  loop 1 lost ")]
    assert "service.py:5 (handle)" in rows[0] and f" {count}x" in rows[0]


def test_blocking_lines_example_ranks_every_requests_line_above_the_start_up_block() -> None:
    done = run_example("blocking_lines.py", "--requests", "30")
    assert "served 30 requests" in done.stdout
    lost = [line for line in done.stderr.splitlines() if line.startswith("  loop 1 lost ")]
    # 30 x 40 ms at the request's line, one 300 ms block at start-up: the request's line first
    assert "blocking_lines.py:27 (handle)" in lost[0] and "blocking (" in lost[0]
    first, *rest = warnings_of(done.stderr)
    assert first.startswith("ERROR `handle` blocked the event loop ") and "little CPU" in first
    # (the start-up block comes before the profiler's thread may have ticked: under heavy load
    # it can be missed, never ranked first)
    if len(lost) > 1:
        assert "blocking_lines.py:21 (load_config) 1x, longest " in lost[1]
        assert rest[0].startswith("WARNING Untracked code in load_config blocked the event loop")


def warnings_of(report_text: str) -> list[str]:
    """The table report's warnings, each on one line (tag, sentence and hint)."""
    found: list[str] = []
    for line in report_text.splitlines():
        if line.startswith(("  WARNING ", "  ERROR ", "  INFO ", "  (")):
            found.append(" ".join(line.split()))
        elif found and line.startswith(" " * 11) and line.strip():
            found[-1] += " " + line.strip()
        elif found and not line.strip():
            break
    return found


def test_block_min_is_an_option_and_at_most_the_block_threshold() -> None:
    assert resolve_options("svc", {}, environ={}).block_min == 0.02
    env = {"ASYNCFLOW_BLOCK_MIN": "0.01"}
    assert resolve_options("svc", {}, environ=env).block_min == 0.01
    with pytest.raises(ValueError, match=r"block_min=0\.0: expected seconds, a finite number"):
        resolve_options("svc", {"block_min": 0.0}, environ={})
    with asyncflow.profile("svc", format="none", port=None, block_threshold=0.01) as prof:
        assert prof.snapshot().loop is not None
        loop_doc = prof.snapshot().loop
    assert loop_doc is not None and loop_doc.block_min_ns == 10 * MS  # the lower of the two


# -- the monitor's bookkeeping, on fake time and fake looks ---------------------------------


class FakeLoop:
    def __init__(self) -> None:
        self.posted: list[Any] = []

    def is_running(self) -> bool:
        return True

    def is_closed(self) -> bool:
        return False

    def call_soon_threadsafe(self, callback: Any, *args: object) -> None:
        self.posted.append((callback, args))


class Harness:
    """A monitor watching a fake loop, whose thread's CPU clock the test sets."""

    def __init__(self, fake_clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
        self.clock = fake_clock
        self.loop = FakeLoop()
        self.monitor = LoopMonitor(THRESHOLD_NS)
        self.monitor.post_every_ns = self.monitor.post_calm_ns = 0  # post the next at once
        record = loops.LoopRecord(self.loop, id(self.loop))  # type: ignore[arg-type]
        self.state = self.monitor.state_of(record)
        self.sample = Sample(None, None, None, False)
        self.line: monitor.LineKey | None = None
        self.cpu = 0
        monkeypatch.setattr(monitor, "sample_loop", lambda thread, loop: self.sample)
        monkeypatch.setattr(monitor, "own_line", lambda top: self.line)
        monkeypatch.setattr(monitor, "_cpu_of", lambda native: self.cpu)
        monkeypatch.setattr(monitor, "_own_cpu", lambda: self.cpu)
        self.runnable = False
        monkeypatch.setattr(monitor, "_runnable", lambda native: self.runnable)
        monkeypatch.setattr(linecache, "getline", lambda file, line: f"code of {file}\n")
        self.calls = 0

    def tick(self) -> None:
        self.monitor._check(self.state)

    def beat(self) -> None:
        """The loop runs its heartbeat, and the monitor posts the next one."""
        ((callback, args),) = self.loop.posted
        self.loop.posted.clear()
        callback(*args)
        self.tick()

    def block(
        self, file: str, ms: int, cpu_ms: int = 0, tracked: bool = False, after_ms: int = 0
    ) -> None:
        """The loop blocks ``ms`` at ``file``'s line (a tracked call's poll, which began 5 ms
        before the heartbeat, or untracked code), its thread computing ``cpu_ms`` of it; the
        monitor looks every 10 ms. Its heartbeat runs ``after_ms`` after the block ended, the
        thread waiting for a core meanwhile, in its selector (looked at every 10 ms too)."""
        start = clock.now_ns()
        self.runnable = 2 * cpu_ms > ms  # the thread's state at each look
        if tracked:
            self.calls += 1
            future = types.SimpleNamespace(id=7, label="handle")
            call: Any = types.SimpleNamespace(
                call_id=self.calls, start=start - 5 * MS, polls=0, busy=0, last=0, future=future
            )
            self.sample = Sample(None, call, call, False)
        else:
            self.sample = Sample(None, None, None, False)
        self.line = (file, 1, file.removesuffix(".py"))
        for _ in range(ms // 10):
            self.clock.advance(10 * MS)
            self.cpu += cpu_ms * MS // (ms // 10)
            self.tick()
        self.clock.advance(ms % 10 * MS)
        if tracked:  # the poll returns: the hot path measured it
            call.start, call.polls, call.last = 0, 1, ms * MS + 5 * MS
            call.busy = call.last
        self.sample = Sample(None, None, None, True)
        for _ in range(after_ms // 10):
            self.clock.advance(10 * MS)
            self.tick()
        self.clock.advance(after_ms % 10 * MS)
        self.beat()


@pytest.fixture
def harness(fake_clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    h = Harness(fake_clock, monkeypatch)
    h.tick()  # posts the first heartbeat
    h.beat()
    yield h
    h.monitor.stop()


def lines(state: LoopState) -> list[tuple[str, int, int, int]]:
    """(file, count, total ms, longest ms), the most time lost first."""
    return [
        (line.file, line.count, line.total_ns // MS, line.max_ns // MS)
        for line in state.blocking_lines()
    ]


def test_a_repeated_short_block_outranks_a_long_one_off(harness: Harness) -> None:
    harness.block("startup.py", 600)
    for _ in range(149):
        harness.block("handler.py", 40, tracked=True)
    assert lines(harness.state) == [("handler.py", 149, 149 * 45, 45), ("startup.py", 1, 600, 600)]
    assert harness.state.episode_count == 1  # only the one-off reached the threshold
    entry = views.loop_entry(harness.state, clock.now_ns(), 0, (50.0,))
    assert [line.file for line in entry.blocking_lines] == ["handler.py", "startup.py"]
    first = entry.blocking_lines[0]
    assert (first.label, first.future_id, first.code) == ("handle", 7, "code of handler.py")
    # The report's loop section and the warnings rank them the same way.
    rows = [line for line in report._episodes(entry) if " lost " in line]
    assert "handler.py:1" in rows[0] and "149x" in rows[0] and "startup.py:1" in rows[1]
    # ... and so does top's loop view
    shown = top._episode_lines(LoopDocument(SCHEMA, THRESHOLD_NS, [entry]))
    assert (
        shown[0]
        == f"loop {entry.id} blocked 149x, 6.71s in all, at handler.py:1 (handler), longest 45ms, "
        "blocking"
    )
    docs = lints.Documents(clock.now_ns(), 10_000 * MS, loops=[entry])
    blocked = [f for f in lints.evaluate(docs, lints.Thresholds()) if f.kind == "loop-blocked"]
    assert [f.subject.label for f in blocked][:2] == ["handler.py:1", "startup.py:1"]
    assert blocked[0].severity == "error"  # 6.7 s lost in all
    assert blocked[0].evidence["total_ns"] == 149 * 45 * MS


def test_a_block_shorter_than_the_minimum_is_not_counted(harness: Harness) -> None:
    harness.block("quick.py", 10)
    harness.block("quick.py", 10, tracked=True)
    assert lines(harness.state) == []


def test_the_lines_kept_are_bounded_and_the_least_costly_go(harness: Harness) -> None:
    for i in range(MAX_BLOCK_LINES):
        harness.block(f"line{i}.py", 30 + 10 * i)
    harness.block("late.py", 400)  # costs more than the cheapest line: it takes its place
    harness.block("cheap.py", 20)  # costs less than every line kept: only counted
    kept = lines(harness.state)
    assert len(kept) == MAX_BLOCK_LINES and kept[0] == ("late.py", 1, 400, 400)
    assert "line0.py" not in [k[0] for k in kept] and "cheap.py" not in [k[0] for k in kept]
    assert (harness.state.lines_evicted, harness.state.evicted_ns) == (2, 50 * MS)


def test_a_block_is_cpu_or_blocking_by_the_threads_cpu_clock(harness: Harness) -> None:
    harness.block("sleep.py", 300, cpu_ms=3)
    harness.block("compute.py", 300, cpu_ms=290)
    kinds = {line.file: line.kind for line in harness.state.blocking_lines()}
    assert kinds == {"sleep.py": "blocking", "compute.py": "cpu"}
    assert [e.kind for e in harness.state.episodes] == ["cpu", "blocking"]  # newest first


# -- real blocks: a sleep is blocking, a loop of arithmetic is CPU --------------------------


def loop_entries(prof: asyncflow.Profiler) -> list[LoopEntry]:
    loop = prof.snapshot().loop
    return loop.loops if loop is not None else []


def sleep_a_while() -> None:
    time.sleep(0.3)  # the planted blocking call


def compute_a_while() -> int:
    total, end = 0, time.perf_counter() + 0.3
    while time.perf_counter() < end:  # the planted CPU work
        total += 1
    return total


@linux
@pytest.mark.slow  # (two 0.3 s blocks, watched by a monitor that a loaded machine delays)
def test_a_sleep_is_blocking_and_arithmetic_is_cpu() -> None:
    @asyncflow.future(name="sleeper")
    async def sleeper() -> None:
        sleep_a_while()

    @asyncflow.future(name="cruncher")
    async def cruncher() -> None:
        compute_a_while()

    async def main() -> None:
        with asyncflow.instrument_tasks(), anyio.fail_after(10):
            # the loop is watched from now, and looked at once the profiler's thread ticks
            while not [e for e in loop_entries(prof) if e.heartbeats >= 2]:
                await asyncio.sleep(0.005)
        await sleeper()
        await asyncio.sleep(0.05)
        await cruncher()
        await asyncio.sleep(0.05)

    with asyncflow.profile("kinds", format="none", port=None) as prof:
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(main())
        finally:
            loop.close()
        snap: Snapshot = prof.snapshot()
    assert snap.loop is not None
    (entry,) = [e for e in snap.loop.loops if e.blocking_lines]
    kinds = {line.function: (line.kind, line.label) for line in entry.blocking_lines}
    # (one line each: a CPU-bound poll's looks are one block, named after one of its lines;
    # the test's own snapshots, taken on the loop, can block it too on a loaded machine)
    kinds.pop("loop_entries", None)
    lines = [
        (b.function, b.kind, b.count, b.total_ns, b.cpu_ns, b.cpu_wall_ns)
        for b in entry.blocking_lines
    ]
    assert kinds == {
        "sleep_a_while": ("blocking", "sleeper"),
        "compute_a_while": ("cpu", "cruncher"),
    }, lines
    episodes = {e.call.label: e.kind for e in entry.episodes if e.call is not None}
    seen = [(e.call and e.call.label, e.kind, e.blocked_ns, e.stack[:1]) for e in entry.episodes]
    assert episodes == {"sleeper": "blocking", "cruncher": "cpu"}, seen
    by_line = {w.subject.label: w for w in snap.warnings}
    sleeping = by_line[f"test_blocks.py:{sleep_a_while.__code__.co_firstlineno + 1}"]
    first = compute_a_while.__code__.co_firstlineno
    # (named after the line of its loop seen most often: the test or the addition)
    (computing,) = [
        by_line[f"test_blocks.py:{first + n}"]
        for n in (2, 3)
        if f"test_blocks.py:{first + n}" in by_line
    ]
    assert "little CPU" in sleeping.message and "CPU work" not in sleeping.message
    assert "asyncio.to_thread" in sleeping.hint
    assert "CPU work on the loop" in computing.message and "executor" in computing.hint
    assert not [w for w in snap.warnings if w.kind == "cpu-bound"]


def test_a_counted_block_has_its_loop_posted_to_every_quarter_of_the_threshold(
    harness: Harness,
) -> None:
    # A healthy loop's heartbeat comes every half of the threshold; once a block of block_min
    # is counted, every quarter for WATCHFUL_NS, so that the blocks after it are all seen
    # (``LoopMonitor.every``: tests/model/test_monitor_ticks.py).
    state = harness.state
    harness.block("handler.py", 10)  # looked at (late by 10 ms), but shorter than block_min
    assert state.watchful_until == 0 and not lines(state)
    harness.block("handler.py", 40, tracked=True)
    assert lines(state) == [("handler.py", 1, 45, 45)]
    assert state.watchful_until == clock.now_ns() + monitor.WATCHFUL_NS


@pytest.mark.parametrize(("ms", "after_ms"), [(200, 0), (200, 7), (195, 0), (195, 25)])
def test_an_episode_blamed_on_a_tracked_poll_ends_where_that_poll_did(
    harness: Harness, ms: int, after_ms: int
) -> None:
    """A tracked poll's end is known exactly (the hot path measured it): its episode ends
    there, as its line's block does, wherever the monitor's looks or the heartbeat fall after
    it. (They read "lost 200 ms" on the line and "blocked 190 ms" on the episode, from the last
    look before the poll returned, or more from a heartbeat late behind it.)"""
    harness.block("legacy.py", ms, tracked=True, after_ms=after_ms)
    assert lines(harness.state) == [("legacy.py", 1, ms + 5, ms + 5)]
    (episode,) = harness.state.episodes
    assert episode.blocked_ns == (ms + 5) * MS
