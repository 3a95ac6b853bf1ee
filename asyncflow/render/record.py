"""Recordings: the documents over a run, compressed and bounded (``record=``), and read back.

A recording is written on the profiler's thread, never on the program's loop: every
``RECORD_INTERVAL_NS`` at most (less often when its cost would pass 1/``COST_SHARE`` of the
process's CPU time plus ``IDLE_SHARE`` of the wall-clock time, so that a busy program, or one on
a loaded machine, pays a bounded share for it), at a collector tick, the snapshot is built and
each of its sections that changed since the last one written is appended, as one line of JSON,
to a zlib stream that is flushed to the file after every line: the file is readable up to its
last whole line whenever the program dies.
The last line is the final snapshot, written at stop.

The file is a text header line (``asyncflow-recording {"version": 1, ...}``) and then the
compressed lines. Each line is ``{"t": ns since the start, "s": {section: document}}``, plus
``"final": true`` on the end state; a section left out did not change, unless it is named in
the line's ``"thin"`` list (left out to save room: its last value is older than the moment).

The budget (``record_budget``, in megabytes) bounds the file: as more of it is used, the big
sections (``BIG``: the logs, tasks, graph and threads) are written less often, then not at all,
then the ticks themselves thin out, and once only the reserve for the end state is left no
tick is written; the end state keeps its big sections only if they fit. Detail goes before
time, and the end state is always there.
"""

from __future__ import annotations

import bisect
import errno
import os
import stat
import time
import zlib
from dataclasses import dataclass, field, fields
from typing import IO, TYPE_CHECKING, Any

import orjson

from asyncflow import clock, schema
from asyncflow._version import __version__
from asyncflow.errors import AsyncflowError, BadInputError, say
from asyncflow.instrumentation import _session

if TYPE_CHECKING:
    from asyncflow.model.collector import Collector

__all__ = [
    "BIG",
    "COST_SHARE",
    "FIRST_WALK",
    "IDLE_SHARE",
    "MAGIC",
    "READ_SHARE",
    "RECORD_INTERVAL_NS",
    "TICK_LOGS",
    "VERSION",
    "Frame",
    "Recorder",
    "Recording",
    "RecordingError",
    "is_recording",
    "read_recording",
]

#: the first bytes of every recording; the header's JSON follows on the same line
MAGIC = b"asyncflow-recording "
#: the format written; a reader refuses a newer one
VERSION = 1
#: a tick is recorded this often at most (0.1 s)
RECORD_INTERVAL_NS = 100_000_000
#: the recording's CPU time stays under the process's CPU time over this...
COST_SHARE = 20
#: ... plus this share of the wall-clock time (what an idle program's moments cost)
IDLE_SHARE = 0.01
#: the sections thinned first: the biggest, and the least needed to read a moment back
BIG = frozenset(
    {"future_logs", "channel_logs", "stream_logs", "resource_logs", "tasks", "graph", "threads"}
)
#: the sections a moment may take from the reading of the tasks before it
_READ = frozenset({"tasks", "graph"})
#: the tasks are read again for a moment once their last reading took at most this share of
#: the time since (1%: the endpoint's rule for what a document may cost the program)
READ_SHARE = 0.01
#: tasks the first moment's reading walks at most (later ones: ``wait_views.WALK_MOST``)
FIRST_WALK = 1_000
#: the newest entries of each log a tick records (the end state records them all)
TICK_LOGS = 10
#: the share of the budget kept for the end state
_RESERVE = 0.1
#: what the end state keeps when even its small sections do not fit in the budget
_MINIMAL = ("status", "warnings", "channels", "loop")
_SECTIONS = tuple(f.name for f in fields(schema.Snapshot) if f.name != "schema")


class RecordingError(BadInputError):
    """A file that is not a recording this asyncflow can read; the message says why."""


class Recorder:
    """Writes one profile's recording; ticked by the collector on the profiler's thread."""

    def __init__(self, collector: Collector, path: str, budget_mb: float) -> None:
        self.collector = collector
        self.path = path
        self.budget = int(budget_mb * 1_000_000)
        self._file: IO[bytes] | None = None
        #: (device, inode) of the file: a program that closes every descriptor it inherited
        #: (a daemon's os.closerange) closes this one too, and its next file takes the number
        self._identity: tuple[int, int] | None = None
        self._zip = zlib.compressobj(6)
        #: each section's JSON as last written
        self._last: dict[str, bytes] = {}
        #: bytes written to the file so far
        self.used = 0
        self.ticks = 0
        #: ticks written with every section that changed, and thinned (big sections left out)
        self.thinned = 0
        self.interval_ns = RECORD_INTERVAL_NS
        self._next_ns = 0
        #: the profiler thread's CPU time spent recording, and the process's CPU time at start
        self.spent_ns = 0
        self._cpu_start_ns = time.process_time_ns()
        self._failed = False
        #: no more ticks: only the end state's reserve is left
        self.full = False
        #: the tasks and the wait-for graph as read lately, when (the collector's clock), and
        #: what reading and building them took (the loops' slices and this thread's CPU)
        self._tasks_graph: tuple[schema.TasksDocument, schema.GraphDocument] | None = None
        self._tasks_at_ns = 0
        self._tasks_cost_ns = 0
        #: readings of the tasks made (a moment between them reuses the last one), and what
        #: they took in all (the loops' slices and this thread's CPU; apart from ``spent_ns``)
        self.readings = 0
        self.read_ns = 0
        self._read_here_ns = 0  # (of which this thread's CPU)

    def open(self) -> None:
        """Create the file and write its header (in ``start()``: a bad path fails there)."""
        start_ns = self.collector.session.start_ns
        header = {
            "version": VERSION,
            "asyncflow": __version__,
            "schema": schema.SCHEMA,
            "name": self.collector.options.name,
            "pid": os.getpid(),
            "start_ns": start_ns,
            "started_at": time.time() - (clock.now_ns() - start_ns) / 1e9,
            "interval_ns": self.interval_ns,
            "budget": self.budget,
        }
        try:
            self._file = open(self.path, "wb")  # noqa: SIM115  # closed by finish()
            st = os.fstat(self._file.fileno())
            self._identity = (st.st_dev, st.st_ino)
            self._put(MAGIC + orjson.dumps(header) + b"\n")
        except OSError as exc:
            raise AsyncflowError(
                f"record={self.path!r}: cannot write the recording: {exc.strerror or exc}"
            ) from None

    def attach(self) -> None:
        """Record from the collector's next tick on."""
        self.collector.on_tick("recording", self.tick)

    def _share(self) -> float:
        """How much of the budget (less the end state's reserve) is used, 0 to 1."""
        return self.used / max(1, self.budget * (1 - _RESERVE))

    def tick(self, now: int) -> None:
        """At a collector tick: record the documents if the interval has passed."""
        if self._file is None or self._failed or self.full or now < self._next_ns:
            return
        # what the recording may have cost by now: its CPU time, which the program shares the
        # GIL with, against the process's CPU time (the program's work, whatever else the
        # machine runs) and, for a program that mostly waits, the time gone by
        worked = time.process_time_ns() - self._cpu_start_ns
        allowed = worked / COST_SHARE + (now - self.collector.session.start_ns) * IDLE_SHARE
        if self.spent_ns > allowed:
            return
        share = self._share()
        began, read_before = time.thread_time_ns(), self._read_here_ns
        try:
            snapshot, older = self._snapshot(now)
            # Detail before time: the big sections every tick, then every 5th, then never;
            # past half the ticks themselves thin out, and stop where the reserve begins.
            big = share < 0.25 or (share < 0.5 and self.ticks % 5 == 0)
            written = dict(self._last)
            line = self._line(now, snapshot, big=big, final=False, older=older)
            if share >= 0.5 and not self._fits(line, self.budget * (1 - _RESERVE) - self.used):
                self._last, self.full = written, True
                return
            self._put(self._pack(line))
            self.ticks += 1
            self.thinned += not big
        except _Lost:
            self._lose()
            return
        except Exception as exc:
            self._failed = True  # turned off once; the program never sees it
            _session.internal_error("recording", exc)
            return
        # (the reading of the tasks is held to its own share: READ_SHARE)
        self.spent_ns += time.thread_time_ns() - began - (self._read_here_ns - read_before)
        slower = 1 if share < 0.5 else 2 if share < 0.75 else 4
        self.interval_ns = RECORD_INTERVAL_NS * slower
        self._next_ns = now + self.interval_ns

    def _snapshot(self, now: int) -> tuple[schema.Snapshot, bool]:
        """The documents at this moment, and whether its tasks and graph are older: those
        read lately serve the moments after them until reading them again fits in
        ``READ_SHARE`` of the time since (reading 10,000 tasks and building their graph takes
        some 0.3 s, the GIL held and the program's loop running the walk's slices: read at
        every moment, a program of many tasks lost a sixth of its loop's turns). The first
        reading walks at most ``FIRST_WALK`` tasks: what one costs is not known yet."""
        from asyncflow.views import documents as views
        from asyncflow.views import wait_views

        held = self._tasks_graph
        if held is not None and (now - self._tasks_at_ns) * READ_SHARE < self._tasks_cost_ns:
            snapshot = views.snapshot(self.collector, logs_limit=TICK_LOGS, tasks_graph=held)
            return snapshot, True
        began = time.thread_time_ns()
        responsive = wait_views.responsive_loops(self.collector.monitor, now)
        most = FIRST_WALK if held is None else wait_views.WALK_MOST
        reading = wait_views.read_tasks(responsive, most=most)
        loops_ns = reading.spent_ns - (time.thread_time_ns() - began)  # (its slices)
        snapshot = views.snapshot(self.collector, logs_limit=TICK_LOGS, reading=reading)
        self.readings += 1
        tasks, graph = snapshot.tasks, snapshot.graph
        self._tasks_graph = (tasks, graph) if tasks is not None and graph is not None else None
        self._tasks_at_ns = now
        mine = time.thread_time_ns() - began
        self._tasks_cost_ns = max(0, loops_ns) + mine
        self.read_ns += self._tasks_cost_ns
        self._read_here_ns += mine
        return snapshot, False

    def finish(self, final: schema.Snapshot) -> None:
        """Write the end state and close the file (the profiler stops; idempotent)."""
        file = self._file
        if file is None:
            return
        try:
            if not self._failed:
                now = clock.now_ns()
                # As much of the end state as fits: every section, or all but the big ones,
                # or the minimal ones, or (a budget too small for any) its moment alone.
                written = dict(self._last)
                for keep in (None, "small", _MINIMAL, ()):
                    self._last = dict(written)
                    line = self._line(now, final, big=keep is None, final=True, only=keep)
                    if self._fits(line, self.budget - self.used) or keep == ():
                        break
                self._put(self._pack(line))
                self._put(self._zip.flush(zlib.Z_FINISH))
        except _Lost:
            self._lose()
            return
        except Exception as exc:
            _session.internal_error("recording", exc)
        finally:
            if self._file is not None:
                self._file = None
                try:
                    file.close()
                except OSError as exc:
                    _session.internal_error("recording", exc)

    def close(self) -> None:
        """Close the file without an end state (``start()`` gave up)."""
        if not self._kept():
            self._lose()
            return
        file, self._file = self._file, None
        if file is not None:
            file.close()

    def _line(
        self,
        now: int,
        snapshot: schema.Snapshot,
        *,
        big: bool,
        final: bool,
        only: tuple[str, ...] | str | None = None,
        older: bool = False,
    ) -> bytes:
        """One line: the sections that changed since they were last written (of ``only``'s,
        if it is a tuple); with ``older``, the tasks and the graph are as read before the
        moment, and named so (thin, as the budget's are)."""
        parts, thin = [], []
        for name in _SECTIONS:
            if (
                (name in BIG and not big)
                or (isinstance(only, tuple) and name not in only)
                or (older and name in _READ)
            ):
                thin.append(b'"%s"' % name.encode())
                continue
            data = schema.dumps(getattr(snapshot, name))
            if self._last.get(name) == data:
                continue
            self._last[name] = data
            parts.append(b'"%s":%s' % (name.encode(), data))
        t = now - self.collector.session.start_ns
        end = b',"final":true' if final else b""
        if thin:  # left out to save room: the reader knows these are older than the moment
            end += b',"thin":[%s]' % b",".join(thin)
        return b'{"t":%d%s,"s":{%s}}\n' % (t, end, b",".join(parts))

    def _fits(self, line: bytes, room: float) -> bool:
        """Whether ``line`` would add at most ``room`` bytes to the file: plainly so when it
        is that short uncompressed (deflate adds 5 bytes a 16 kB block at most), else measured by
        compressing it on a copy of the stream."""
        if len(line) + len(line) // 1000 + 64 <= room:
            return True
        trial = self._zip.copy()
        return len(trial.compress(line)) + len(trial.flush(zlib.Z_SYNC_FLUSH)) <= room

    def _pack(self, line: bytes) -> bytes:
        # A sync flush per line: the file is whole up to here, whatever happens next.
        return self._zip.compress(line) + self._zip.flush(zlib.Z_SYNC_FLUSH)

    def _put(self, data: bytes) -> None:
        assert self._file is not None
        if not self._kept():
            raise _Lost(self.path)
        self._file.write(data)
        self._file.flush()
        self.used += len(data)

    def _kept(self) -> bool:
        """Whether the file's descriptor is still the file's (a system call a write)."""
        file = self._file
        try:
            st = os.fstat(file.fileno()) if file is not None else None
        except (OSError, ValueError):
            return False
        return st is not None and (st.st_dev, st.st_ino) == self._identity

    def _lose(self) -> None:
        """The program closed the file's descriptor: the recording ends where it is (whole up
        to its last line). The file object is kept, never closed: its number may be the
        program's own file now."""
        file, self._file = self._file, None
        self._failed = True
        if file is not None:
            _LOST.append(file)
            say(
                f"asyncflow: the program closed the recording's file descriptor: {self.path} "
                "ends at its last tick"
            )


class _Lost(Exception):
    """The recording's descriptor is no longer its file's (the program closed it)."""


#: files whose descriptors the program closed: kept, never closed, since closing one would
#: close the number the program's own file took
_LOST: list[IO[bytes]] = []


@dataclass(frozen=True, slots=True)
class Frame:
    """One moment of a recording: its time and every section as it was then."""

    #: seconds since the profile started
    t: float
    #: every section recorded so far, as decoded JSON (the last value written of each)
    sections: dict[str, Any]
    #: the end state, written when the profiler stopped
    final: bool = False
    #: the sections older than the moment (thinned by the budget): when each was last recorded
    stale: dict[str, float] = field(default_factory=dict)


@dataclass(slots=True)
class Recording:
    """A recording read back (see :func:`read_recording`)."""

    path: str
    #: the header: version, asyncflow, schema, name, pid, start_ns, started_at, budget
    header: dict[str, Any]
    frames: list[Frame]
    #: what was odd about the file (a cut tail, no end state), one sentence each
    notes: list[str] = field(default_factory=list)

    @property
    def duration(self) -> float:
        """Seconds from the start to the last moment recorded."""
        return self.frames[-1].t

    def index_at(self, seconds: float) -> int:
        """The frame of the moment ``seconds`` after the start: the last one at or before it
        (the first, before the first tick). A time within a nanosecond of a moment's is that
        moment's: a replay's tick lands on it by adding the gap to the moment before, and
        ``a + (b - a)`` may round to just under ``b``."""
        times = [f.t for f in self.frames]
        return max(0, bisect.bisect_right(times, seconds + 1e-9) - 1)

    def snapshot(self, index: int = -1, since: int | None = None) -> schema.Snapshot:
        """The documents at frame ``index``; with ``since``, the warnings are every one that
        held at any frame from ``since`` to ``index`` (each at its latest).

        Raises:
            RecordingError: the recorded sections do not make a snapshot this asyncflow reads.
        """
        frame = self.frames[index]
        data = dict(frame.sections)
        data["schema"] = schema.SCHEMA
        if since is not None:
            seen: dict[tuple[Any, ...], Any] = {}
            stop = index % len(self.frames)
            for each in self.frames[since : stop + 1]:
                for w in self._warnings(each):
                    seen[_finding(w)] = w
            data["warnings"] = list(seen.values())
        try:
            return schema.load(schema.Snapshot, data, ignore_unknown=True)
        except schema.DocumentError as exc:
            raise RecordingError(
                f"{self.path!r}: a recorded document does not read: {exc}"
            ) from None

    def _warnings(self, frame: Frame) -> list[Any]:
        """A moment's findings, as recorded.

        Raises:
            RecordingError: they are not a list (the file was made or changed by hand).
        """
        found = frame.sections.get("warnings") or []
        if not isinstance(found, list):
            raise RecordingError(
                f"{self.path!r}: a recorded document does not read: Snapshot.warnings: "
                f"expected a list, got {type(found).__name__}"
            )
        return found

    def findings_start(self) -> list[int]:
        """The frames where a finding begins (it did not hold at the frame before)."""
        starts = []
        held: set[tuple[Any, ...]] = set()
        for i, frame in enumerate(self.frames):
            now = {_finding(w) for w in self._warnings(frame)}
            if now - held:
                starts.append(i)
            held = now
        return starts


def _finding(w: Any) -> tuple[Any, ...]:
    """A finding's identity across moments: its kind and what it is about."""
    subject = w.get("subject") if isinstance(w, dict) else None
    kind = w.get("kind") if isinstance(w, dict) else None
    return (kind, orjson.dumps(subject, option=orjson.OPT_SORT_KEYS))


def is_recording(path: str) -> bool:
    """Whether ``path`` starts as a recording does (False when it cannot be read)."""
    try:
        with open(path, "rb") as file:
            return file.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


def read_regular(path: str) -> bytes:
    """A regular file's bytes. Raises OSError for anything else: a device or a FIFO may never
    end (``/dev/zero``), and would be read into memory until there is none."""
    with open(path, "rb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        return file.read()


def read_recording(path: str) -> Recording:
    """Read a recording; a cut tail (the program was killed mid-write) is left out, with a note.

    Raises:
        RecordingError: the file cannot be read, is not a recording, or is of a newer format.
    """
    try:
        raw = read_regular(path)
    except OSError as exc:
        raise RecordingError(f"cannot read {path!r}: {exc.strerror or exc}") from None
    head, newline, body = raw.partition(b"\n")
    if not head.startswith(MAGIC) or not newline:
        raise RecordingError(f"{path!r} is not an asyncflow recording (written by record=)")
    try:
        header = orjson.loads(head[len(MAGIC) :])
        version = header["version"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        raise RecordingError(f"{path!r}: the recording's header does not read") from None
    if not isinstance(version, int) or version > VERSION:
        raise RecordingError(
            f"{path!r} is a recording of format {version}, written by asyncflow "
            f"{header.get('asyncflow', '?')}; this asyncflow ({__version__}) reads format "
            f"{VERSION} and older: upgrade asyncflow to read it"
        )
    notes: list[str] = []
    unzip = zlib.decompressobj()
    chunks: list[bytes] = []
    step = 1 << 16
    try:
        for i in range(0, len(body), step):
            chunks.append(unzip.decompress(body[i : i + step]))
    except zlib.error:
        notes.append("the recording is damaged past some point: what precedes it is read")
    lines = b"".join(chunks).split(b"\n")
    if lines[-1]:
        notes.append(
            "the recording ends mid-write (the program was killed?): its last, partial "
            "moment is left out"
        )
    frames: list[Frame] = []
    sections: dict[str, Any] = {}
    fresh: dict[str, float] = {}  # when each section was last known current
    for line in lines[:-1]:
        try:
            entry = orjson.loads(line)
            t, thin = entry["t"] / 1e9, set(entry.get("thin") or ())
            sections = {**sections, **entry["s"]}
            fresh.update((name, t) for name in _SECTIONS if name not in thin)
            stale = {name: fresh[name] for name in thin if name in fresh}
            frames.append(Frame(t, sections, bool(entry.get("final")), stale))
        except (orjson.JSONDecodeError, KeyError, TypeError):
            notes.append("a damaged moment of the recording is left out")
    if not frames:
        if any("damaged" in note for note in notes):  # (not cut mid-write: changed)
            raise RecordingError(f"{path!r} is damaged: not one of its moments reads")
        raise RecordingError(f"{path!r} holds no moment yet: the program stopped at its start?")
    if not frames[-1].final:
        notes.append(
            f"the recording has no end state (the program was killed?): its end is the last "
            f"moment recorded, at {frames[-1].t:.2f} s"
        )
    return Recording(path, header, frames, notes)
