"""Event-loop health, watched from the profiler's thread: lag, the running call, blocked loops.

Every half of the block threshold (50 ms by default) the monitor posts a heartbeat callback to
each instrumented loop that is running, unless the last one has not run yet
(``call_soon_threadsafe``: the only work it adds to a loop), and posts one as soon as a running
loop is registered, so that a block at the very start of a loop is measured whole. The delay
between posting and running is the loop's lag. A loop that blocked for ``block_min`` in the
last ``WATCHFUL_NS`` gets one every quarter of the threshold (25 ms), so that its short blocks,
which repeat, are all seen: each posting wakes the profiler's thread, and a wake costs the
program more than the work it does. It ticks more often (every half ``block_min``,
10 ms by default) to look at a late loop while it is still late: half ``block_min`` after each
posting, and every half ``block_min`` while a heartbeat is in flight (see ``LoopMonitor.plan``);
a look after a posting whose heartbeat has run by then does not wake the profiler's thread.

While a heartbeat is overdue by half the block threshold or more, the monitor looks at the loop
thread's stack every tick (``sys._current_frames()``), *while* the loop is late:

- The loop is back in its selector's ``select()``: no code is blocking it. Its heartbeat woke it,
  but its thread has not had the CPU or the GIL since. Late by the threshold, that is a *late
  wake-up*, counted apart and never blamed on code.
- Code is running: the innermost tracked call being polled (named in the thread's slot, see
  ``running_calls``) and the innermost line name what blocks the loop. One of them blocking
  for at least the threshold is an *episode*. When the running call or the blocking line
  changes and the new one lasts the threshold too, the first episode ends where the second
  begins; a shorter change stays part of the episode it interrupts.

An episode ends when the heartbeat finally runs, when the poll it blames is seen to be over, or
when the loop is seen waiting in its selector again (with callbacks ready, at two looks in a row:
the first can catch it passing through on its way to the heartbeat). A tracked poll that is over
ended when the hot path measured it, and its episode ends there, as its line's block does.

Blocks that matter are often shorter than an episode: a 40 ms ``time.sleep`` in every request
never reaches a 100 ms threshold, yet it costs the loop seconds. So the monitor ticks often
enough, and looks at a loop late by half of the lower ``block_min_ns`` (20 ms by default), to
see such blocks while they last. Each look notes the program's own line on the stack (the
innermost frame outside the standard library, installed packages and asyncflow); each *block*
(one poll of a tracked call, or a stretch of untracked code, named after the line its looks saw
most often) that lasted ``block_min_ns`` is added to its line's total: count, sum and longest,
ranked by the sum. A tracked poll's length is the hot path's own (exact); untracked code's runs
from the heartbeat's posting (or the end of the block before) to the heartbeat, a lower bound.
At most ``MAX_BLOCK_LINES`` lines are kept per loop; a new line pushes out the one that lost the
least time, and blocks at lines not kept are counted.

The loop thread's CPU clock is read at the first look at a block and when it ends (on Linux,
from the profiler's thread, by the thread's kernel id; at the heartbeat, on the loop's own
thread), and its state at each look (``/proc``: running or waiting for a core, or asleep), so
that each block and episode says whether the thread computed: ``cpu`` (on the CPU at least half
of the time, or runnable at most looks: on a machine short of cores a computing thread waits
for one) or ``blocking`` (a sleep, blocking I/O, a lock). Where another thread's CPU clock
cannot be read (macOS, Windows) the kind is unknown (None).

Nothing here runs on the hot path; the heartbeat is the only code that runs on the user's loop.
"""

from __future__ import annotations

import asyncio
import bisect
import importlib
import linecache
import os
import selectors
import sys
import threading
import time
import traceback
import types
from collections import deque
from types import CodeType, FrameType
from typing import Any

from asyncflow import _forksafe, clock, stats
from asyncflow.instrumentation import _session, futures, loops, routes
from asyncflow.instrumentation.every_loop import TrioRun
from asyncflow.instrumentation.futures import CallRecord
from asyncflow.instrumentation.loops import LoopRecord, loop_registry
from asyncflow.model.threads import _cpu_clock
from asyncflow.model.waits import is_asyncflow_file, is_library_file

__all__ = [
    "BLOCK_MIN_NS",
    "CPU_SHARE",
    "MAX_BLOCK_LINES",
    "MAX_EPISODES",
    "MAX_WORST",
    "BlockLine",
    "Episode",
    "LoopMonitor",
    "LoopState",
    "Sample",
    "block_kind",
    "own_line",
    "running_calls",
    "sample_loop",
    "waiting_in_selector",
]

#: Blocked-loop episodes kept per loop, the newest; older ones are only counted.
MAX_EPISODES = 32
#: ... and the longest finished ones, whenever they happened.
MAX_WORST = 10
#: Frames kept of a blocked loop's stack, innermost first.
STACK_LIMIT = 40
#: States of loops that are gone (garbage collected) still listed, the most recent.
MAX_GONE = 16
#: A block of the loop this long is counted on its line's total (when the block threshold is
#: lower, that threshold); blocks that are shorter are left to the lag percentiles.
BLOCK_MIN_NS = 20_000_000
#: Blocking lines kept per loop; a new line pushes out the one that lost the least time.
MAX_BLOCK_LINES = 32
#: A block whose thread was on the CPU for at least this share of it was computing.
CPU_SHARE = 0.5
#: Looks at a block that read its thread's state (running or asleep): enough to tell.
MAX_STATE_READS = 8
#: After a block of ``block_min`` or longer is counted on its line, the loop is posted to every
#: quarter of the threshold for this long, instead of every half.
WATCHFUL_NS = 10_000_000_000


def _selector_codes() -> frozenset[CodeType]:
    """The code of every stdlib selector's (and proactor's) wait for I/O."""
    found: list[Any] = [
        cls.__dict__.get("select")
        for cls in vars(selectors).values()
        if isinstance(cls, type) and issubclass(cls, selectors.BaseSelector)
    ]
    if sys.platform == "win32":  # pragma: no cover - the proactor loop's wait
        from asyncio import windows_events

        found += [getattr(windows_events.IocpProactor, name, None) for name in ("select", "_poll")]
    return frozenset(f.__code__ for f in found if isinstance(f, types.FunctionType))


_SELECTOR_CODES = _selector_codes()


def running_calls(thread: int) -> tuple[FrameType | None, CallRecord | None, CallRecord | None]:
    """The thread's innermost frame, and the innermost and outermost tracked calls running on it.

    Reads another thread's stack, and the slot where that thread's polls name the calls they
    run (on both paths), so this costs the recorders nothing.
    """
    if not thread:
        return None, None, None
    inner, outer = futures.running_on_thread(thread)
    # Not bound to a local: looking at its own thread, this frame would be the top one, and
    # name itself (a cycle holding every frame under it until the cyclic GC runs).
    return sys._current_frames().get(thread), inner, outer


def waiting_in_selector(top: FrameType | None, loop: object, thread: int) -> bool:
    """Whether ``top`` (the innermost frame of ``thread``) is ``loop`` waiting for I/O.

    True only for the loop's own wait, in ``_run_once``: code that calls a selector itself (a
    synchronous client, ``subprocess``) is code blocking the loop. The ``_run_once`` is the
    loop's when it is its class's and the loop runs on that thread (one loop runs on a thread
    at a time); never told by reading the frame's ``f_locals``, which on 3.11 and 3.12 stores a
    snapshot of the locals of a running frame on it, keeping what it holds alive.
    """
    frame = top
    if frame is not None and loops.in_compiled_loop(frame, thread):
        return True  # uvloop in its own compiled code: no frame of the program's runs there
    waits = getattr(loop, "wait_codes", None)  # a trio run names its own wait for I/O
    if isinstance(waits, frozenset):
        return frame is not None and frame.f_code in waits
    if frame is None or frame.f_code not in _SELECTOR_CODES:
        return False
    while frame is not None and frame.f_code in _SELECTOR_CODES:
        frame = frame.f_back
    if frame is None or getattr(loop, "_thread_id", None) != thread:
        return False
    code = frame.f_code
    return any(
        getattr(cls.__dict__.get("_run_once"), "__code__", None) is code
        for cls in type(loop).__mro__
    )


def extract_stack(top: FrameType | None) -> list[tuple[str, int, str, str | None]]:
    """``(file, line, function, source line)`` for each frame from ``top`` outwards."""
    if top is None:
        return []
    summary = traceback.StackSummary.extract(traceback.walk_stack(top), limit=STACK_LIMIT)
    return [(f.filename, f.lineno or 0, f.name, f.line or None) for f in summary]


def block_kind(cpu_ns: int, wall_ns: int, runnable: int = 0, looks: int = 0) -> str | None:
    """``cpu`` when the thread computed at least ``CPU_SHARE`` of ``wall_ns``, or was seen
    runnable at most of the ``looks`` that read its state (on a machine short of cores, a
    computing thread waits for a core a good part of the time: it still wants the CPU), else
    ``blocking``; None when no CPU time was measured (``wall_ns`` 0)."""
    if wall_ns <= 0:
        return None
    computing = cpu_ns >= CPU_SHARE * wall_ns or 2 * runnable > looks > 0
    return "cpu" if computing else "blocking"


#: A line of code: its file, its line number and its function.
LineKey = tuple[str, int, str]


#: the import system's frames (a module being found, loaded, compiled or run by an import):
#: its frozen bootstrap, and the importlib package around it (``importlib.import_module``)
_IMPORTLIB = ("<frozen importlib.", os.path.dirname(importlib.__file__) + os.sep)


def importing(top: FrameType | None) -> bool:
    """Whether a stack is inside an import: a module loaded (its body run, its code compiled)
    by an ``import`` statement or ``importlib.import_module``."""
    frame = top
    while frame is not None:
        if frame.f_code.co_filename.startswith(_IMPORTLIB):
            return True
        frame = frame.f_back
    return False


def own_line(top: FrameType | None) -> LineKey | None:
    """The program's own line in a stack: the innermost frame outside the standard library,
    installed packages and asyncflow, else the line that made the outermost import on it (a
    module the program's server imports from the loop: ``importlib.import_module`` in
    uvicorn's importer, not the import system's own frames), else the innermost library frame
    that is not asyncflow's or a console script's (a library's line is still the best name
    there is), else the innermost; None for no stack."""
    frame = top
    library = None  # the innermost library frame that is not asyncflow's or a launcher's
    importer = None  # the frame that made the outermost import seen so far
    while frame is not None:
        code = frame.f_code
        if not is_library_file(code.co_filename):
            return code.co_filename, frame.f_lineno or 0, code.co_name
        outer = frame.f_back
        if (
            outer is not None
            and code.co_filename.startswith(_IMPORTLIB)
            and not outer.f_code.co_filename.startswith(_IMPORTLIB)
            and not is_asyncflow_file(outer.f_code.co_filename)
        ):
            importer = outer
        if library is None and not is_asyncflow_file(code.co_filename):
            library = frame
        frame = outer
    frame = importer or library or top
    if frame is None:
        return None
    return frame.f_code.co_filename, frame.f_lineno or 0, frame.f_code.co_name


def _cpu_of(native_id: int) -> int | None:
    """Another thread's CPU time in nanoseconds (Linux, by its kernel id), else None."""
    return _cpu_clock(native_id) if native_id and _LINUX else None


def _runnable(native_id: int) -> bool | None:
    """Whether another thread is running or waiting for a core now (Linux: its state in
    ``/proc``, ``R``), rather than asleep in a system call; None where that cannot be read."""
    if not native_id or not _LINUX:
        return None
    try:
        with open(f"/proc/self/task/{native_id}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    end = raw.rfind(b")")
    return raw[end + 2 : end + 3] == b"R" if end > 0 else None


def _own_cpu() -> int:
    """The calling thread's CPU time: the heartbeat reads its loop thread's this way."""
    return time.thread_time_ns()


_LINUX = sys.platform.startswith("linux")


class BlockLine:
    """One line's blocks of a loop, each at least the loop's ``block_min_ns``: how many, how
    long in all and at most, and the CPU the loop's thread used over the part measured."""

    __slots__ = (
        "code",
        "count",
        "cpu_ns",
        "cpu_wall_ns",
        "file",
        "function",
        "future_id",
        "imports",
        "label",
        "last_ns",
        "line",
        "looks",
        "max_ns",
        "route",
        "runnable",
        "total_ns",
    )

    def __init__(self, key: LineKey, code: str | None) -> None:
        self.file, self.line, self.function = key
        #: its source line, read once when it was first seen
        self.code = code
        self.count = 0
        self.total_ns = 0
        self.max_ns = 0
        #: CPU time the loop's thread used over ``cpu_wall_ns`` of its blocks
        self.cpu_ns = 0
        self.cpu_wall_ns = 0
        #: looks that read the thread's state, and those that saw it runnable
        self.looks = 0
        self.runnable = 0
        #: its blocks that were imports (most of their looks saw the import system run)
        self.imports = 0
        #: the innermost tracked call's future at its latest block (None: untracked code)
        self.future_id: int | None = None
        self.label: str | None = None
        #: the route of the request its latest block served (None: none, or not routed)
        self.route: str | None = None
        #: when its latest block ended
        self.last_ns = 0

    @property
    def kind(self) -> str | None:
        """``import`` when most of its blocks were imports, else ``cpu`` or ``blocking``."""
        if 2 * self.imports > self.count:
            return "import"
        return block_kind(self.cpu_ns, self.cpu_wall_ns, self.runnable, self.looks)


class _Block:
    """The block a late loop's looks see now, not yet ended: one poll of a tracked call, or a
    stretch of untracked code, named after the line its looks saw most often."""

    __slots__ = (
        "busy",
        "call",
        "codes",
        "cpu0",
        "cpu_at",
        "imports",
        "label",
        "looks",
        "poll_start",
        "polls",
        "route",
        "runnable",
        "since",
        "states",
    )

    def __init__(self, sample: Sample, since: int, cpu: int | None, now: int) -> None:
        #: the outermost tracked call (the task's step), its poll, and its figures before it
        call = self.call = sample.outer
        self.poll_start = sample.outer_start
        self.polls = call.polls if call is not None else 0
        self.busy = call.busy if call is not None else 0
        inner = sample.inner
        #: the innermost tracked call's future, id and label
        self.label = (inner.future.id, inner.future.label) if inner is not None else None
        #: the route of the request the task serves, if a web framework routed it
        self.route = routes.route_of(call)
        self.since = since
        #: the loop thread's CPU clock at the first look, and when it was read
        self.cpu0 = cpu
        self.cpu_at = now
        #: looks that saw each line (a CPU-bound poll is seen at several), and their source
        self.looks: dict[LineKey, int] = {}
        self.codes: dict[LineKey, str | None] = {}
        #: looks that read the thread's state, and those that saw it runnable
        self.states = 0
        self.runnable = 0
        #: looks that saw the import system run
        self.imports = 0

    def same_poll(self, sample: Sample) -> bool:
        """Whether ``sample`` sees the poll (or the untracked code) this block is part of."""
        return self.call is sample.outer and self.poll_start == sample.outer_start

    def saw(
        self, key: LineKey, code: str | None, runnable: bool | None, imports: bool = False
    ) -> None:
        self.looks[key] = self.looks.get(key, 0) + 1
        self.imports += imports
        if code is not None:
            self.codes.setdefault(key, code)
        if runnable is not None:
            self.states += 1
            self.runnable += runnable

    def line(self) -> LineKey:
        """The program's own line seen most often, else the line seen most often (the first
        seen of those seen as often): a handler that computes, then returns to the server that
        writes its access log in the same poll, is named by its own line, not by the log's."""
        own = [key for key in self.looks if not is_library_file(key[0])]
        return max(own or self.looks, key=self.looks.__getitem__)

    def end(self, now: int) -> int:
        """When it ended: a tracked poll that is over ended when the hot path measured it
        (its length; with later short polls of the call in between, their sum), else ``now``."""
        call = self.call
        if call is None or not self.poll_start or call.start == self.poll_start:
            return now
        length = call.last if call.polls - self.polls == 1 else call.busy - self.busy
        return min(now, max(self.since, self.poll_start + length))


#: What blocks a loop at one look: the innermost tracked call's id and poll start, then the
#: innermost frame's file, function (its first line) and line.
Key = tuple[int, int, str, int, int]


class Sample:
    """One look at a late loop's thread."""

    __slots__ = ("idle", "inner", "inner_start", "key", "outer", "outer_start", "top")

    def __init__(
        self,
        top: FrameType | None,
        inner: CallRecord | None,
        outer: CallRecord | None,
        idle: bool,
    ) -> None:
        #: the innermost frame (dropped as soon as the stack is extracted)
        self.top = top
        #: the loop is waiting in its selector: no code is running on it
        self.idle = idle
        self.inner = inner
        self.outer = outer
        # Poll starts are read once: the loop's thread moves on while we look.
        self.inner_start = inner.start if inner is not None else 0
        self.outer_start = outer.start if outer is not None else 0
        code = top.f_code if top is not None else None
        self.key: Key = (
            inner.call_id if inner is not None else 0,
            self.inner_start,
            code.co_filename if code is not None else "",
            code.co_firstlineno if code is not None else 0,
            top.f_lineno if top is not None and top.f_lineno is not None else 0,
        )


def sample_loop(thread: int, loop: object) -> Sample:
    """Look at what ``loop``'s thread is doing now (an empty look when the thread is unknown)."""
    top, inner, outer = running_calls(thread)
    return Sample(top, inner, outer, waiting_in_selector(top, loop, thread))


class Episode:
    """One blocked-loop episode; ``blocked_ns`` grows while it is ``ongoing``.

    Before it has lasted the threshold it is only a candidate (``id`` 0), kept by its loop
    state but not yet published nor counted.
    """

    __slots__ = (
        "blocked_ns",
        "call",
        "cpu0",
        "cpu_at",
        "cpu_ns",
        "cpu_wall_ns",
        "id",
        "key",
        "looks",
        "ongoing",
        "poll_start",
        "polls",
        "route",
        "runnable",
        "since",
        "stack",
        "task",
    )

    def __init__(self, sample: Sample, since: int, now: int, task: str | None) -> None:
        self.id = 0
        self.since = since
        self.blocked_ns = max(0, now - since)
        self.ongoing = True
        #: the innermost tracked call running, and the start of the poll that was running
        call = self.call = sample.inner
        self.poll_start = sample.inner_start
        #: the call's polls that had ended then (its poll then is the next); -1: not known
        #: (that poll was over before they were read)
        self.polls = call.polls if call is not None else 0
        if call is not None and call.start != self.poll_start:
            self.polls = -1
        self.key = sample.key
        #: looks in a row that saw ``key``
        self.looks = 1
        self.task = task
        #: the route of the request the task serves, if a web framework routed it
        self.route = routes.route_of(sample.outer)
        self.stack = extract_stack(sample.top)
        #: the loop thread's CPU clock when first seen (and when read), and the CPU time it
        #: used over ``cpu_wall_ns`` of the episode (0 and 0 when it could not be read)
        self.cpu0: int | None = None
        self.cpu_at = now
        self.cpu_ns = 0
        self.cpu_wall_ns = 0
        #: looks that read the thread's state, and those that saw it runnable
        self.runnable = [0, 0]

    @property
    def kind(self) -> str | None:
        return block_kind(self.cpu_ns, self.cpu_wall_ns, self.runnable[1], self.runnable[0])

    def same_function(self, key: Key) -> bool:
        """Whether ``key`` is another line of the same function, in the same poll."""
        return key[:4] == self.key[:4]

    def adopt(self, other: Episode) -> None:
        """Take the line and stack of a later look at the same poll."""
        self.key, self.stack, self.looks = other.key, other.stack, 1

    def poll_over(self) -> bool:
        """The poll this episode blames has ended (a poll is one uninterrupted step)."""
        call = self.call
        return call is not None and call.start != self.poll_start

    def poll_end(self) -> int | None:
        """When the poll this episode blames ended, as the hot path measured it (its start
        and length), if it is over and the call was polled once since (else not known here:
        a look or the heartbeat bounds it)."""
        call = self.call
        if call is None or not self.poll_start or call.start == self.poll_start:
            return None
        polls = call.polls
        length = call.last
        if self.polls < 0 or polls - self.polls != 1 or call.polls != polls:  # (it moves on)
            return None
        return self.poll_start + length


class LoopState:
    """What the monitor knows of one loop in this session. Shared by two threads: the heartbeat
    runs on the loop's thread, ticks on the profiler's, so every change is made under ``lock``."""

    def __init__(
        self, record: LoopRecord, threshold_ns: int = 100_000_000, block_min_ns: int | None = None
    ) -> None:
        self.record = record
        self.threshold_ns = threshold_ns
        #: blocks at least this long are counted on their line
        self.block_min_ns = (
            min(BLOCK_MIN_NS, threshold_ns) if block_min_ns is None else block_min_ns
        )
        self.lock = _forksafe.lock(self)
        self.lag_hist = stats.new_histogram()
        self.lag_max = 0
        self.lag_last = 0
        self.heartbeats = 0
        self.pending = 0  # when the heartbeat in flight was posted; 0 when none is
        self.token = 0  # the heartbeat in flight; a stale one (loop stopped meanwhile) is ignored
        #: the newest episodes, newest first
        self.episodes: deque[Episode] = deque(maxlen=MAX_EPISODES)
        #: the longest finished episodes, longest first
        self.worst: list[Episode] = []
        self.episode_count = 0
        self.ongoing: Episode | None = None
        #: something else blocking since the ongoing episode, not yet for the threshold
        self.candidate: Episode | None = None
        #: when the late loop was last looked at (0: not yet, for the heartbeat in flight)
        self.last_seen = 0
        #: where the ongoing episode ends if the loop, seen in its selector with callbacks
        #: ready to run, is still there at the next look (0: not seen so)
        self.idle_from = 0
        #: heartbeats late by the threshold while the loop waited in its selector
        self.late_wakeups = 0
        self.starved = False  # the heartbeat in flight was counted as a late wake-up
        #: until when heartbeats are posted every quarter of the threshold (see ``WATCHFUL_NS``)
        self.watchful_until = 0
        self.closed = False
        #: each line's blocks of at least ``block_min_ns``, at most ``MAX_BLOCK_LINES`` lines
        self.lines: dict[LineKey, BlockLine] = {}
        #: blocks counted on lines no longer kept (pushed out, or never let in), and their time
        self.lines_evicted = 0
        self.evicted_ns = 0
        #: the block seen now, and when the last one ended
        self.block: _Block | None = None
        self.block_end = 0
        #: the loop thread's kernel id (for its CPU clock), and the thread ident it is of
        self.native_id = 0
        self.native_of = 0
        #: when the last heartbeat was posted
        self.posted_at = 0
        #: the loop thread's CPU clock at the look or heartbeat being folded in (None where it
        #: cannot be read), and when it was read
        self.cpu: int | None = None
        self.cpu_at = 0

    def loop(self) -> asyncio.AbstractEventLoop | None:
        return self.record.loop()

    def lag_now(self, now: int) -> int:
        """The lag of the heartbeat in flight if it is late already, else the last measured."""
        pending = self.pending
        return max(self.lag_last, now - pending) if pending else self.lag_last

    def beat(self, token: int) -> None:
        """The heartbeat: runs on the loop's own thread."""
        now = clock.now_ns()
        # Read here, on the loop's thread, only when a block or an episode is open: its end.
        open_ = self.block is not None or self.ongoing is not None or self.candidate is not None
        cpu = _own_cpu() if open_ else None
        with self.lock:
            if token != self.token or not self.pending:
                return
            lag = max(0, now - self.pending)
            self.pending = 0
            _landed()
            self.heartbeats += 1
            self.lag_last = lag
            if lag > self.lag_max:
                self.lag_max = lag
            stats.record(self.lag_hist, lag)
            self.end_episode(now, cpu)
        self.record.on_thread()

    def end_episode(self, now: int, cpu: int | None = None) -> None:
        """The loop ran its callbacks again (or is gone): end what was blocking it (under lock).

        A candidate that has lasted the threshold by now is an episode of its own (if it would
        split the ongoing one, once it was seen twice, as in :meth:`look`). ``cpu`` is the loop
        thread's CPU clock now, if it was read.
        """
        self.cpu, self.cpu_at = cpu, now
        self.end_block(now)
        ongoing, candidate = self.ongoing, self.candidate
        self.ongoing = self.candidate = None
        self.last_seen = 0
        self.idle_from = 0
        self.starved = False
        if (
            candidate is not None
            and now - candidate.since >= self.threshold_ns
            and (ongoing is None or candidate.looks >= 2)
        ):
            if ongoing is not None:
                self._close(ongoing, candidate.since)
            self._publish(candidate)
            ongoing = candidate
        if ongoing is not None:
            self._close(ongoing, now)

    def look(
        self,
        sample: Sample,
        fresh: Episode | None,
        pending: int,
        now: int,
        cpu: int | None = None,
        ready: bool = False,
    ) -> None:
        """Fold one look at the late loop into its episodes (under lock).

        ``fresh`` is a candidate made from ``sample`` (its stack read outside the lock) when the
        sample matches neither the ongoing episode nor the candidate; ``cpu`` the loop thread's
        CPU clock at this look, if it was read; ``ready`` whether the loop, seen in its
        selector, has callbacks ready to run (the heartbeat among them).
        """
        self.cpu, self.cpu_at = cpu, now
        ongoing, candidate = self.ongoing, self.candidate
        floor, self.last_seen = self.last_seen, now
        if sample.idle:
            # Waiting for I/O: whatever blocked before has returned; the loop now waits for
            # its thread to get the CPU or the GIL. Not a block, and nobody's fault.
            if not self.starved and now - pending >= self.threshold_ns:
                self.starved = True
                self.late_wakeups += 1
            if ongoing is not None and ready and not self.idle_from:
                # ... or it passes through its selector on the way to the callbacks it has
                # ready, the heartbeat among them, which ends the episode where the block
                # ended: a block that ends just before a look is not cut short there. Still
                # here at the next look, its thread waits for a core: ended where last seen.
                self.idle_from = floor or now
                return
            if ongoing is not None:
                self._close(ongoing, self.idle_from or floor or now)
            self.ongoing = self.candidate = None
            self.idle_from = 0
            return
        self.idle_from = 0
        key = sample.key
        if ongoing is not None:
            ongoing.blocked_ns = max(ongoing.blocked_ns, now - ongoing.since)
            if key == ongoing.key:
                ongoing.looks += 1
                self.candidate = None  # a change shorter than the threshold stays part of it
                return
            if ongoing.looks == 1 and candidate is None and ongoing.same_function(key) and fresh:
                # Seen once, perhaps at a passing line (a function's first): the function's
                # next line names the block better. Not a change of what blocks.
                ongoing.adopt(fresh)
                return
        # Something else blocks the loop now. It began when the poll running now did if that
        # was after the last look, else (the change came between two looks) at the last look.
        if sample.outer_start > floor:
            since = sample.outer_start
        elif sample.inner_start > floor:
            since = sample.inner_start
        else:
            since = floor or pending
        if ongoing is not None and ongoing.poll_over():
            # The blamed poll has returned: its episode ended before what runs now began.
            self._close(ongoing, max(ongoing.since, since))
            ongoing = self.ongoing = None
        if candidate is not None and candidate.key == key:
            candidate.looks += 1
        elif fresh is None:  # cannot happen: the caller saw this same state
            return
        else:
            if candidate is not None and candidate.key[:2] == key[:2]:
                # The same poll (or untracked code) at another line: the change began when the
                # candidate did. Lines that keep changing then add up, and reach the threshold.
                since = candidate.since
            candidate = self.candidate = fresh
            candidate.since = since
        if now - candidate.since < self.threshold_ns:
            return
        if ongoing is not None:
            if candidate.looks < 2:
                return  # to split an episode, a change must be seen twice in a row
            self._close(ongoing, candidate.since)
        self.candidate = None
        self.ongoing = candidate
        candidate.blocked_ns = now - candidate.since
        self._publish(candidate)

    def _publish(self, episode: Episode) -> None:
        self.episode_count += 1
        episode.id = self.episode_count
        self.episodes.appendleft(episode)

    def _close(self, episode: Episode, end: int) -> None:
        """End ``episode`` at ``end``: where its blamed poll ended if that is known (a look
        before it bounds it from below, the heartbeat or a look after it from above; the
        line's block reads the same poll's end)."""
        exact = episode.poll_end()
        if exact is not None and exact >= episode.since:
            end = exact
        episode.blocked_ns = max(0, end - episode.since)
        episode.ongoing = False
        if self.cpu is not None and episode.cpu0 is not None and self.cpu_at > episode.cpu_at:
            episode.cpu_ns = max(0, self.cpu - episode.cpu0)
            episode.cpu_wall_ns = self.cpu_at - episode.cpu_at
        worst = self.worst
        if len(worst) < MAX_WORST or episode.blocked_ns > worst[-1].blocked_ns:
            bisect.insort(worst, episode, key=lambda e: -e.blocked_ns)
            del worst[MAX_WORST:]

    def see_block(
        self,
        sample: Sample,
        key: LineKey | None,
        code: str | None,
        pending: int,
        now: int,
        cpu: int | None = None,
        runnable: bool | None = None,
        imports: bool = False,
    ) -> None:
        """Fold one look at the late loop (by ``block_min_ns / 2`` or more) into its blocks
        (under lock): ``key`` is the program's own line on the stack, ``code`` its source if
        that line is new here; ``cpu`` and ``runnable`` the thread's CPU clock and state;
        ``imports`` whether the stack was inside an import."""
        self.cpu, self.cpu_at = cpu, now
        block = self.block
        if sample.idle or key is None:
            self.end_block(now)
            return
        if block is not None and not block.same_poll(sample):
            self.end_block(now)  # another poll runs now: the one seen before is over
            block = None
        if block is None:
            # A tracked poll began when it began; untracked code, when the heartbeat was posted
            # or the block before it ended, whichever came last (a lower bound).
            tracked = sample.outer is not None and sample.outer_start
            since = sample.outer_start if tracked else max(pending, self.block_end)
            block = self.block = _Block(sample, since, cpu, now)
        block.saw(key, code, runnable, imports)

    def end_block(self, now: int) -> None:
        """The block seen is over (under lock): add it to its line if it lasted ``block_min_ns``."""
        block, self.block = self.block, None
        if block is None:
            return
        end = self.block_end = block.end(now)
        length = end - block.since
        if length < self.block_min_ns:
            return
        self.watchful_until = end + WATCHFUL_NS  # short blocks repeat: see each one from now
        key = block.line()
        lines = self.lines
        line = lines.get(key)
        if line is None:
            if len(lines) >= MAX_BLOCK_LINES:
                least = min(lines.values(), key=lambda entry: entry.total_ns)
                if least.total_ns >= length:  # lost less than any line kept: counted apart
                    self.lines_evicted += 1
                    self.evicted_ns += length
                    return
                del lines[least.file, least.line, least.function]
                self.lines_evicted += least.count
                self.evicted_ns += least.total_ns
            line = lines[key] = BlockLine(key, block.codes.get(key))
        line.count += 1
        line.total_ns += length
        line.max_ns = max(line.max_ns, length)
        line.last_ns = end
        if block.label is not None:
            line.future_id, line.label = block.label
        line.route = block.route
        line.looks += block.states
        line.runnable += block.runnable
        line.imports += 2 * block.imports > sum(block.looks.values())
        cpu = self.cpu
        if cpu is not None and block.cpu0 is not None and self.cpu_at > block.cpu_at:
            line.cpu_ns += max(0, cpu - block.cpu0)
            line.cpu_wall_ns += self.cpu_at - block.cpu_at

    def blocking_lines(self) -> list[BlockLine]:
        """The lines kept, the most time lost first (under lock)."""
        return sorted(self.lines.values(), key=lambda entry: (-entry.total_ns, -entry.count))


class LoopMonitor:
    """Owns the loops' states; everything but the heartbeat (and the first heartbeat of a loop
    registered on its own thread) runs on the profiler's thread."""

    def __init__(self, threshold_ns: int, block_min_ns: int | None = None) -> None:
        self.threshold_ns = threshold_ns
        #: blocks this long are counted per line
        self.block_min_ns = (
            min(BLOCK_MIN_NS, threshold_ns) if block_min_ns is None else block_min_ns
        )
        #: seconds between ticks: fine enough to catch a block soon after the threshold, and to
        #: look at a block of ``block_min_ns`` before it ends
        finest = min(threshold_ns / 4, self.block_min_ns / 2)
        self.interval = min(0.05, max(0.005, finest / 1e9))
        #: ... but a heartbeat is posted at most every half of the threshold (between 5 and 50
        #: ms): one is then always posted during a block of ``block_min`` + that, and looked at
        #: by a later tick while it lasts, without waking the loop every tick ...
        self.post_calm_ns = round(min(0.05, max(0.005, threshold_ns / 2e9)) * 1e9)
        #: ... and every quarter of it to a loop that blocked lately (``WATCHFUL_NS``): then every
        #: block of ``block_min`` + that is seen
        self.post_every_ns = min(
            self.post_calm_ns, round(min(0.05, max(0.005, threshold_ns / 4e9)) * 1e9)
        )
        self.states: dict[int, LoopState] = {}
        #: set once the monitor has ticked: from then on a block is looked at while it lasts (a
        #: block before, while the profiler's thread starts, is seen only from the first tick)
        self.ticking = threading.Event()
        self._lock = _forksafe.lock(self)  # states are added from the threads that register loops
        # Hear of each loop as it is registered: a profiler is starting, and this is its monitor.
        loops.on_register = self._registered
        _in_flight(0)  # (an earlier monitor's heartbeats were given up as it stopped)

    def state_of(self, record: LoopRecord) -> LoopState:
        """The loop's state, made on first sight."""
        with self._lock:
            state = self.states.get(record.id)
            if state is None:
                state = self.states[record.id] = LoopState(
                    record, self.threshold_ns, self.block_min_ns
                )
            return state

    def _registered(self, record: LoopRecord) -> None:
        """A loop was registered, or its thread became known: runs on the registering thread.

        Posting the first heartbeat now, not at the next tick, measures a block that begins
        right away (``time.sleep`` first thing in ``main``) from its start.
        """
        if _session.active is None:
            return  # no profiler listens (this monitor's has not started, or has stopped)
        loop = record.loop()
        if loop is None or loop.is_closed() or not loop.is_running():
            return  # not running yet: watched from its first tracked poll, or the next tick
        self._post(self.state_of(record), loop, clock.now_ns(), at_once=True)

    def tick(self) -> None:
        """Post heartbeats, and detect blocked loops; called every ``interval``."""
        alive = set()
        for record in loop_registry():
            alive.add(record.id)
            self._check(self.state_of(record))
        with self._lock:
            gone = [s for i, s in self.states.items() if i not in alive]
        for state in gone:
            state.closed = True
            with state.lock:
                if state.pending:  # (its loop is gone: its heartbeat will never run)
                    state.token += 1
                    state.pending = 0
                    _landed()
                state.end_episode(clock.now_ns())  # (its thread's CPU clock is not read)
        if len(gone) > MAX_GONE:
            with self._lock:
                for state in gone[:-MAX_GONE]:
                    del self.states[state.record.id]

    def _post(
        self, state: LoopState, loop: asyncio.AbstractEventLoop, now: int, at_once: bool = False
    ) -> None:
        """Post a heartbeat unless one is in flight, or (unless ``at_once``) the last one was
        posted less than ``every(state)`` ago."""
        with state.lock:
            if state.pending or (not at_once and now - state.posted_at < self.every(state, now)):
                return
            state.token += 1
            state.pending = state.posted_at = now
            token = state.token
            _posted()  # (before it can run: each one counted in flight is taken off once)
        try:
            loop.call_soon_threadsafe(state.beat, token)
        except RuntimeError:  # closed between the check and the call
            with state.lock:
                if state.token == token and state.pending:
                    state.pending = 0
                    _landed()

    def _check(self, state: LoopState) -> None:
        loop = state.loop()
        now = clock.now_ns()
        if loop is None or loop.is_closed() or not loop.is_running():
            with state.lock:
                state.closed = loop is None or loop.is_closed()
                if state.pending:  # its heartbeat will run whenever the loop runs again: not lag
                    state.token += 1
                    state.pending = 0
                    _landed()  # (given up: it is no longer in flight)
                state.end_episode(now)
            return
        state.closed = False
        self._post(state, loop, now)
        pending = state.pending
        if not pending or now - pending < state.block_min_ns // 2:
            return  # on time (a poll longer than the threshold keeps the heartbeat waiting)
        # Late: look at the loop thread's stack now, while the loop is still late. Looking from
        # half the threshold on catches a poll that blocks just over it between two ticks.
        thread = _thread_of(state.record, loop)
        sample = sample_loop(thread, loop)
        # (asyncio's queue of callbacks ready to run; uvloop's and trio's are not readable)
        ready = sample.idle and bool(getattr(loop, "_ready", None))
        if state.native_of != thread:
            state.native_of, state.native_id = thread, _native_id(thread)
        key = code = None
        imports = False
        if not sample.idle:
            key = own_line(sample.top)
            imports = importing(sample.top)
            if key is not None and key not in state.lines:  # its source, read once: no lock
                code = linecache.getline(key[0], key[1]).strip() or None
        episode = now - pending >= self.threshold_ns // 2
        block, ongoing, candidate = state.block, state.ongoing, state.candidate  # re-checked
        fresh = None
        if (
            episode
            and not sample.idle
            and all(e is None or e.key != sample.key for e in (ongoing, candidate))
        ):
            # (reads the stack: no lock)
            fresh = Episode(sample, pending, now, _task_name(loop, sample.top))
        # The thread's CPU clock is read where a block or an episode may begin or end, and its
        # state at a block's first looks (enough to tell): each read is a system call or two.
        new = block is None or not block.same_poll(sample)
        if sample.idle:
            ends = block is not None or ongoing is not None or candidate is not None
        else:
            ends = new or fresh is not None or ongoing is not None or candidate is not None
        cpu = _cpu_of(state.native_id) if ends else None
        if fresh is not None:
            fresh.cpu0 = cpu
        reads = MAX_STATE_READS - (0 if new or block is None else block.states)
        runnable = _runnable(state.native_id) if not sample.idle and reads > 0 else None
        sample.top = None  # hold no frame longer than needed
        with state.lock:
            if state.pending != pending:
                return  # the loop answered meanwhile: it was slow, but is not late now
            state.see_block(sample, key, code, pending, now, cpu, runnable, imports)
            if episode:
                state.look(sample, fresh, pending, now, cpu, ready)
                seen = state.candidate or state.ongoing  # what this look was folded into
                if runnable is not None and seen is not None:
                    seen.runnable[0] += 1
                    seen.runnable[1] += runnable

    def every(self, state: LoopState, now: int) -> int:
        """How long after its last heartbeat the next is posted to ``state``'s loop."""
        return self.post_every_ns if now < state.watchful_until else self.post_calm_ns

    def pause(self) -> float:
        """Seconds to the next tick (see :meth:`plan`)."""
        return self.plan()[0]

    def plan(self) -> tuple[float, float | None]:
        """Seconds to the next tick: ``interval`` while a heartbeat is in flight (a late one is
        looked at while the loop is late), else until the next heartbeat is due.

        The second item, given when the next tick is such a look, is when the tick after it
        would be if no heartbeat were in flight by then: where the profiler's loop can tell
        (``_ProfilerLoop.look_later``), the thread waits on to it without waking when every
        heartbeat has run meanwhile, as nearly all do.

        A tick with no heartbeat in flight and none due does nothing, and each tick takes the
        GIL from the program's thread: a monitor ticking at 20 Hz instead of 100 Hz cost a
        busy aiohttp service about 8% less CPU a request (5 pairs), far more than the ticks'
        own work. The looks are as they were: ``interval`` after each posting, and every
        ``interval`` while one is late. An idle program's profiler thread, its loop watched,
        wakes 19 times a second with a heartbeat every 50 ms (38 with one every 25 ms, as
        before ``WATCHFUL_NS``; 107 with a tick every 10 ms; 98 before the looks waited on).
        """
        now = clock.now_ns()
        pause = self.post_calm_ns
        with self._lock:
            states = list(self.states.values())
        in_flight = 0
        for state in states:
            if state.closed:
                continue
            if state.pending:
                in_flight += 1
            pause = min(pause, state.posted_at + self.every(state, now) - now)
        # (a sleep may end a little early: the heartbeat is then due, not a tick later)
        due = max(self.interval, pause / 1e9 + 0.001)
        return (self.interval, due) if in_flight else (due, None)

    async def run(self) -> None:
        """Tick forever; cancelled when the profiler stops."""
        look_later = getattr(asyncio.get_running_loop(), "look_later", None)
        while True:
            pause, then = self.interval, None
            try:
                self.tick()
                pause, then = self.plan()
            except Exception as exc:  # observing never breaks the program, nor the profiler
                _session.internal_error("watching event loops", exc)
            self.ticking.set()
            if then is not None and look_later is not None:
                await look_later(pause, then)
            else:
                await asyncio.sleep(pause)

    def stop(self) -> None:
        """Stop hearing of new loops, disown heartbeats still in flight, and end ongoing
        episodes where they are now."""
        if loops.on_register == self._registered:
            loops.on_register = None
        now = clock.now_ns()
        with self._lock:
            states = list(self.states.values())
        for state in states:
            cpu = _cpu_of(state.native_id)
            with state.lock:
                state.token += 1
                if state.pending:
                    state.pending = 0
                    _landed()
                state.end_episode(now, cpu)


def _ignore(*_: object) -> None:
    pass


#: the compiled path's count of heartbeats in flight, which the profiler thread's wait reads
#: without the GIL (see ``LoopMonitor.plan``): none as a monitor starts, one more as each is
#: posted (by any thread), one off as each runs or is given up
_in_flight = getattr(futures._speedups, "heartbeats_in_flight", _ignore)
_posted = getattr(futures._speedups, "heartbeat_posted", _ignore)
_landed = getattr(futures._speedups, "heartbeat_landed", _ignore)


def _thread_of(record: LoopRecord, loop: asyncio.AbstractEventLoop) -> int:
    """The thread running ``loop`` now: asyncio's own note of it, else the last one seen."""
    thread = getattr(loop, "_thread_id", None)  # BaseEventLoop sets it while it runs
    if not isinstance(thread, int) or not thread:
        return record.thread
    if thread != record.thread:
        record.thread = thread
        record.thread_name = next((t.name for t in threading.enumerate() if t.ident == thread), "")
    return thread


def _native_id(thread: int) -> int:
    """The kernel's id of the thread whose ident is ``thread`` (0 when it is not found)."""
    return next((t.native_id or 0 for t in threading.enumerate() if t.ident == thread), 0)


def _task_name(loop: asyncio.AbstractEventLoop, top: FrameType | None) -> str | None:
    """The name of the task running on ``loop`` (whose thread's innermost frame is ``top``):
    asyncio's current task, or the one a trio run finds by its frames."""
    try:
        if isinstance(loop, TrioRun):  # trio's current task is its own thread's to read
            return loop.task_name(top)
        task: Any = asyncio.current_task(loop)
    except Exception:
        return None
    return task.get_name() if task is not None else None
