"""Two runs compared: which figures of which future, channel, stream, resource or executor
changed beyond noise, what appeared or went away, and which findings did.

A pure function of two :class:`~asyncflow.schema.Snapshot` documents (a saved snapshot, a
``json`` exit report, or a recording's state at one moment), so that ``asyncflow diff`` can gate
a pull request on the figures of a run before and after it.

Entries are matched by what stays the same from one run to the next (a future's label and
``module:qualname``; a channel's, stream's, resource's or executor's label and kind), never by
ids, which are handed out in the order things happen. Entries that share a key in one run (the
locks made on one line, each lock's own row) are summed into one; their percentiles, which
cannot be summed, are then left out.

Noise, as :class:`DiffOptions` defines it: a figure has changed when it moved by at least
``threshold`` times (up or down) AND by at least an absolute floor (``min_time_ns`` for a
percentile of durations, ``min_count`` for a count, and for a total of time such as busy the
larger of ``min_total_ns`` and ``min_share`` of the longer run's wall time, a total being
compared less its longest poll, wait or job: "trimmed"); a percentile is
compared only when both runs measured it over at least ``min_samples`` samples, half as many
of them at or above it (at the default 20: p50 needs 20 samples, p95 200, p99 1000); maxima,
one sample each, are never compared. A run whose event loop was late (a machine too busy:
its loop lag's p95 above the floor) raises the floor of a percentile to that lateness, and
the comparison says so in a caution.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

from asyncflow.schema import (
    ChannelEntry,
    ExecutorEntry,
    FutureEntry,
    ResourceEntry,
    Snapshot,
    StreamEntry,
    WarningEntry,
)

__all__ = [
    "DIFF_FORMAT",
    "Diff",
    "DiffOptions",
    "EntryChange",
    "FigureChange",
    "FindingChange",
    "RunInfo",
    "diff",
]

#: Bumped by any change that breaks a field of the :class:`Diff` document.
DIFF_FORMAT = 1

Unit = Literal["ns", "count"]
#: which way is worse: ``higher`` (a duration, an error count) or neither (the workload's size)
Worse = Literal["higher", "neither"]
Verdict = Literal["worse", "better", "changed"]


@dataclass(frozen=True, slots=True)
class DiffOptions:
    """What counts as a change, and as a regression that fails the comparison.

    Raises:
        ValueError: an option out of its range, named.
    """

    #: a figure changed when the larger of its two values is at least this many times the
    #: smaller (1.25: by 25%)...
    threshold: float = 1.25
    #: ...and a percentile of durations moved by at least this much
    min_time_ns: int = 1_000_000
    #: ...or a total of time (busy, waits, blocked) by at least this much: a poll during
    #: which the interpreter ran another thread (the profiler's, at its exit report) counts
    #: up to its switch interval (5 ms) more, once in a while
    min_total_ns: int = 10_000_000
    #: ...or a count by at least this many
    min_count: int = 5
    #: ...and by at least this share of the longer run's wall time (0.01: 1%): a busy time
    #: varies with the machine's load
    min_share: float = 0.01
    #: samples each run needs behind a percentile (calls, polls, messages, waits, jobs), and
    #: half as many at or above it
    min_samples: int = 20
    #: a figure that got worse by more than this many times fails the comparison; ``inf``: none
    fail_over: float = 2.0

    def __post_init__(self) -> None:
        for name in ("min_time_ns", "min_total_ns", "min_count", "min_samples"):
            if getattr(self, name) > _MOST:  # (a document's whole numbers are 64-bit)
                raise ValueError(f"{name}={getattr(self, name)!r}: expected at most {_MOST}")
        if not (math.isfinite(self.threshold) and self.threshold > 1.0):
            raise ValueError(f"threshold={self.threshold!r}: expected a ratio above 1, e.g. 1.25")
        if self.min_time_ns < 0:
            raise ValueError(f"min_time_ns={self.min_time_ns!r}: expected nanoseconds >= 0")
        if not 0.0 <= self.min_share < 1.0:
            raise ValueError(f"min_share={self.min_share!r}: expected a fraction from 0 to 1")
        if self.min_total_ns < 0:
            raise ValueError(f"min_total_ns={self.min_total_ns!r}: expected nanoseconds >= 0")
        if self.min_count < 1:
            raise ValueError(f"min_count={self.min_count!r}: expected a count >= 1")
        if self.min_samples < 1:
            raise ValueError(f"min_samples={self.min_samples!r}: expected a count >= 1")
        if not self.fail_over >= 1.0:  # also refuses nan
            raise ValueError(f"fail_over={self.fail_over!r}: expected a ratio >= 1, e.g. 1.5")


#: the largest whole number an option may be: the comparison's document holds it (64 bits)
_MOST = 2**63 - 1


@dataclass(frozen=True, slots=True)
class RunInfo:
    """Which run a side of the comparison is."""

    #: the profile's name
    name: str
    #: the asyncflow version that wrote it
    version: str
    python: str
    #: how long the profiler had run when the document was taken
    uptime_ns: int
    #: how late its event loops ran their callbacks, at p95 (the latest loop's), None when
    #: not measured: a loop late by milliseconds (a machine too busy) makes every duration
    #: of that run longer
    loop_lag_p95_ns: int | None = None


@dataclass(frozen=True, slots=True)
class FigureChange:
    """One figure of one entry that changed beyond noise."""

    #: ``future``, ``channel``, ``stream``, ``resource`` or ``executor``
    kind: str
    #: its label
    name: str
    #: what tells it from others of that label: a future's ``module:qualname``, the kind of a
    #: channel, stream, resource or executor
    detail: str
    #: ``call p50``, ``busy``, ``time in queue p95``, ``waits``...
    figure: str
    #: ``ns`` or ``count``
    unit: str
    base: int
    new: int
    #: ``new / base``; None when ``base`` is 0
    ratio: float | None
    #: ``worse`` or ``better`` (a duration, an error count), ``changed`` (the workload's size)
    verdict: str
    #: worse by more than ``fail_over``: this figure fails the comparison
    failed: bool


@dataclass(frozen=True, slots=True)
class EntryChange:
    """A future, channel, stream, resource or executor in one run only."""

    kind: str
    name: str
    detail: str
    #: what it did in the run it is in: calls, messages sent, items, acquisitions or jobs
    count: int


@dataclass(frozen=True, slots=True)
class FindingChange:
    """A finding (warning) in one run only, matched by its kind and its subject."""

    kind: str
    severity: str
    #: ``future``, ``channel``... and the subject's label
    subject_kind: str
    subject: str
    message: str


@dataclass(frozen=True, slots=True)
class Diff:
    """``asyncflow diff BASE NEW``: what changed from one run to the other."""

    #: :data:`DIFF_FORMAT`
    format: int
    base: RunInfo
    new: RunInfo
    #: the noise thresholds and ``fail_over`` the comparison used
    options: DiffOptions
    #: the figures that changed beyond noise: the worst regression first, then the other
    #: regressions, improvements and changes of the workload, each by how far it moved
    changes: list[FigureChange]
    #: entries only in the new run
    appeared: list[EntryChange]
    #: entries only in the base run
    vanished: list[EntryChange]
    findings_appeared: list[FindingChange]
    findings_vanished: list[FindingChange]
    #: entries in both runs, compared
    compared: int = 0
    #: percentiles left out for too few samples in either run (see :class:`DiffOptions`)
    percentiles_skipped: int = 0
    #: whether any figure got worse by more than ``fail_over``
    failed: bool = False
    #: the failing figures' names, worst first: ``future `step`: call p50 4.02x``
    failures: list[str] = field(default_factory=list)
    #: what makes the comparison less sure, one sentence each (a run whose loop was late)
    cautions: list[str] = field(default_factory=list)


@dataclass(slots=True)
class _Figure:
    name: str
    unit: Unit
    worse: Worse
    #: a sum or count (summed over entries sharing a key), else a percentile
    value: int | None
    #: the samples behind a percentile, and its quantile (None: a sum or count)
    samples: int = 0
    q: float | None = None


@dataclass(slots=True)
class _Entry:
    kind: str
    name: str
    detail: str
    count: int
    figures: dict[str, _Figure]
    merged: int = 1


def _q(key: str) -> float | None:
    try:
        return float(key.removeprefix("p"))
    except ValueError:
        return None


def _percentiles(figures: list[_Figure], name: str, values: dict[str, int], samples: int) -> None:
    for key, value in values.items():
        q = _q(key)
        if q is not None:
            figures.append(_Figure(f"{name} {key}", "ns", "higher", value, samples, q))


def _total(name: str, value: int, worse: Worse = "higher") -> _Figure:
    return _Figure(name, "ns", worse, value)


def _trimmed(name: str, total: int, longest: int) -> _Figure:
    """A total of time less its longest poll, wait or job: one poll during which the
    interpreter ran another thread (the profiler's start or exit report) can take 10 ms
    longer, once in a run, and a total over a few short polls would read as many times worse."""
    return _Figure(f"{name} (trimmed)", "ns", "higher", max(0, total - longest))


def _count(name: str, value: int, worse: Worse = "neither") -> _Figure:
    return _Figure(name, "count", worse, value)


def _future(f: FutureEntry) -> _Entry:
    figures = [
        _count("calls", f.call_count),
        _count("polls", f.total_polls),
        _count("raised", f.outcomes.raised, "higher"),
        _count("cancelled", f.outcomes.cancelled),
        _trimmed("busy", f.busy_ns, f.max_poll_duration_ns),
    ]
    finished = f.outcomes.returned + f.outcomes.raised + f.outcomes.cancelled + f.outcomes.closed
    _percentiles(figures, "call", f.call_duration_ns, finished)
    _percentiles(figures, "poll", f.poll_duration_ns, f.total_polls)
    return _Entry("future", f.label, f.source, f.call_count, {x.name: x for x in figures})


def _channel(c: ChannelEntry) -> _Entry:
    figures = [
        _count("sent", c.sent_count),
        _count("received", c.received_count),
        _count("lost", c.lost_count, "higher"),
        _total("producers blocked", c.producers_blocked_ns),
        _total("consumers starved", c.consumers_starved_ns, "neither"),
    ]
    _percentiles(figures, "time in queue", c.delay_ns, c.timed_count)
    return _Entry("channel", c.label, c.kind, c.sent_count, {x.name: x for x in figures})


def _stream(s: StreamEntry) -> _Entry:
    figures = [
        _count("items", s.items_yielded),
        _trimmed("total wait", s.total_wait_ns, s.max_wait_ns),
    ]
    _percentiles(figures, "wait", s.wait_ns, s.timed_count)
    return _Entry("stream", s.label, s.source, s.items_yielded, {x.name: x for x in figures})


def _resource(r: ResourceEntry) -> _Entry:
    figures = [
        _count("acquisitions", r.acquisitions),
        _count("contended", r.contended_acquisitions, "higher"),
        _count("failed waits", r.failed_waits, "higher"),
        _trimmed("total wait", r.total_wait_ns, r.max_wait_ns),
        _trimmed("total hold", r.total_hold_ns, r.max_hold_ns),
    ]
    _percentiles(figures, "wait", r.wait_ns, r.waits)
    _percentiles(figures, "hold", r.hold_ns, r.timed_holds)
    count = r.acquisitions or r.waits
    return _Entry("resource", r.label, r.kind, count, {x.name: x for x in figures})


def _executor(e: ExecutorEntry) -> _Entry:
    figures = [
        _count("jobs", e.submitted),
        _count("raised", e.raised, "higher"),
        _trimmed("time queued", e.total_queued_ns, e.max_queued_ns),
        _trimmed("time running", e.total_run_ns, e.max_run_ns),
    ]
    _percentiles(figures, "queued", e.queued_ns, e.completed)
    _percentiles(figures, "run", e.run_ns, e.completed)
    return _Entry("executor", e.label, e.kind, e.submitted, {x.name: x for x in figures})


def _entries(snapshot: Snapshot) -> dict[tuple[str, str, str], _Entry]:
    """Every entry of a run by its stable key; entries sharing one are summed."""
    made: list[_Entry] = [_future(f) for f in snapshot.futures.futures]
    if snapshot.channels is not None:
        made += [_channel(c) for c in snapshot.channels.channels]
    if snapshot.streams is not None:
        made += [_stream(s) for s in snapshot.streams.streams]
    if snapshot.resources is not None:
        made += [_resource(r) for r in snapshot.resources.resources]
    if snapshot.executors is not None:
        made += [_executor(e) for e in snapshot.executors.executors]
    keyed: dict[tuple[str, str, str], _Entry] = {}
    for entry in made:
        key = (entry.kind, entry.name, entry.detail)
        held = keyed.get(key)
        if held is None:
            keyed[key] = entry
        else:
            _merge(held, entry)
    return keyed


def _merge(into: _Entry, other: _Entry) -> None:
    into.merged += 1
    into.count += other.count
    for name, figure in other.figures.items():
        mine = into.figures.get(name)
        if (
            mine is None or figure.q is not None or mine.q is not None
        ):  # a percentile of a sum is not known
            into.figures.pop(name, None)
            continue
        mine.value = (mine.value or 0) + (figure.value or 0)


@dataclass(frozen=True, slots=True)
class _Floors:
    """The least step of a figure that is not noise, by what it is."""

    count: int
    #: a percentile of durations: the floor, or the runs' loop lateness if larger
    percentile: float
    #: a total of time
    total: float

    def of(self, figure: _Figure) -> float:
        if figure.unit == "count":
            return self.count
        return self.percentile if figure.q is not None else self.total


def _enough(figure: _Figure, options: DiffOptions) -> bool:
    """Whether a percentile rests on enough samples to be compared (a sum always does)."""
    if figure.q is None:
        return True
    tail = figure.samples * (100.0 - figure.q) / 100.0
    return figure.samples >= options.min_samples and tail >= options.min_samples / 2


def _compare(
    base: _Entry, new: _Entry, options: DiffOptions, floors: _Floors
) -> tuple[list[FigureChange], int]:
    """The figures of one entry that changed beyond noise, and the percentiles skipped."""
    changes: list[FigureChange] = []
    skipped = 0
    for name, b in base.figures.items():
        n = new.figures.get(name)
        if n is None or b.value is None or n.value is None:
            continue
        if not (_enough(b, options) and _enough(n, options)):
            skipped += 1
            continue
        low, high = sorted((b.value, n.value))
        if high - low < floors.of(b) or high < low * options.threshold:
            continue  # noise: too small a step, or too small a ratio
        ratio = n.value / b.value if b.value else None
        if b.worse == "neither":
            verdict: Verdict = "changed"
        else:
            verdict = "worse" if n.value > b.value else "better"
        failed = verdict == "worse" and (ratio is None or ratio > options.fail_over)
        changes.append(
            FigureChange(
                kind=new.kind,
                name=new.name,
                detail=new.detail,
                figure=name,
                unit=b.unit,
                base=b.value,
                new=n.value,
                ratio=ratio,
                verdict=verdict,
                failed=failed,
            )
        )
    return changes, skipped


_ORDER = {"worse": 0, "better": 1, "changed": 2}


def _rank(change: FigureChange) -> tuple[int, float]:
    """Worst regression first; then improvements and other changes, each by how far."""
    if change.ratio is None:
        far = math.inf
    else:
        far = max(change.ratio, 1 / change.ratio) if change.ratio else math.inf
    return (_ORDER[change.verdict], -far)


def _entry_change(entry: _Entry) -> EntryChange:
    return EntryChange(entry.kind, entry.name, entry.detail, entry.count)


def _by_size(entry: EntryChange) -> tuple[int, str, str]:
    return (-entry.count, entry.kind, entry.name)


def _findings(warnings: list[WarningEntry]) -> dict[tuple[str, str, str], WarningEntry]:
    found: dict[tuple[str, str, str], WarningEntry] = {}
    for w in warnings:
        found.setdefault((w.kind, w.subject.kind, w.subject.label), w)
    return found


def _finding_change(w: WarningEntry) -> FindingChange:
    return FindingChange(w.kind, w.severity, w.subject.kind, w.subject.label, w.message)


def _run(snapshot: Snapshot) -> RunInfo:
    s = snapshot.status
    lags = (
        [x.lag_ns["p95"] for x in snapshot.loop.loops if "p95" in x.lag_ns] if snapshot.loop else []
    )
    return RunInfo(s.name, s.version, s.python, s.uptime_ns, max(lags) if lags else None)


def _cautions(base: RunInfo, new: RunInfo, options: DiffOptions) -> Iterator[str]:
    """A run whose event loop was late by more than a percentile's floor: its durations are
    that much longer too, whatever the program did."""
    for side, run in (("base", base), ("new", new)):
        lag = run.loop_lag_p95_ns
        if lag is not None and lag >= options.min_time_ns:
            yield (
                f"the {side} run's event loop was late by {lag / 1e6:.3g} ms at p95 (a machine "
                "too busy?): its durations are longer by as much, and a percentile must move "
                "by more to count"
            )


_Key = tuple[str, str, str]
#: what in a label changes from run to run: a line number where the object was created
#: (``app.py:39``), when the code above it changed; an address (the default executor's label
#: names its loop's: ``(_UnixSelectorEventLoop 0x7f183c4759d0)``)
_LOOSE = re.compile(r"(?<=\.py):\d+|\b0x[0-9a-fA-F]+\b")


def _pairs(before: dict[_Key, _Entry], after: dict[_Key, _Entry]) -> Iterator[tuple[_Key, _Key]]:
    """The entries of both runs that are one thing: by key, else by key without what changes
    from run to run (a line number, an address), where that names one entry on each side."""
    for key in before:
        if key in after:
            yield key, key
    loose: dict[_Key, tuple[list[_Key], list[_Key]]] = {}
    for side, (one, other) in enumerate(((before, after), (after, before))):
        for key in one:
            if key not in other:
                kind, name, detail = key
                loose.setdefault((kind, _LOOSE.sub("", name), detail), ([], []))[side].append(key)
    for was, now in loose.values():
        if len(was) == 1 and len(now) == 1:
            yield was[0], now[0]


def _failure_name(change: FigureChange) -> str:
    """A failing figure in a few words: ``future `step`: call p50 4.02x``."""
    ratio = "from 0" if change.ratio is None else f"{change.ratio:.2f}x"
    return f"{change.kind} `{change.name}`: {change.figure} {ratio}"


def diff(base: Snapshot, new: Snapshot, options: DiffOptions | None = None) -> Diff:
    """Compare two runs.

    Args:
        base: the run compared against (the main branch's, yesterday's).
        new: the run under judgement.
        options: what counts as noise and as a failure; the defaults when None.

    Returns:
        The figures that changed beyond noise (the worst regression first), the entries and
        findings in one run only, and whether any figure got worse by more than
        ``options.fail_over``.
    """
    options = options or DiffOptions()
    before, after = _entries(base), _entries(new)
    changes: list[FigureChange] = []
    skipped = 0
    base_run, new_run = _run(base), _run(new)
    lag = max(base_run.loop_lag_p95_ns or 0, new_run.loop_lag_p95_ns or 0)
    wall_ns = max(base.status.uptime_ns, new.status.uptime_ns)
    floors = _Floors(
        count=options.min_count,
        percentile=max(options.min_time_ns, lag),
        total=max(options.min_total_ns, options.min_share * wall_ns),
    )
    paired = list(_pairs(before, after))
    for was, now in paired:
        found, left_out = _compare(before[was], after[now], options, floors)
        changes += found
        skipped += left_out
    gone = before.keys() - {was for was, _ in paired}
    came = after.keys() - {now for _, now in paired}
    changes.sort(key=_rank)
    held, holds = _findings(base.warnings), _findings(new.warnings)
    failures = [_failure_name(c) for c in changes if c.failed]
    return Diff(
        format=DIFF_FORMAT,
        base=base_run,
        new=new_run,
        options=options,
        changes=changes,
        appeared=sorted((_entry_change(after[k]) for k in came), key=_by_size),
        vanished=sorted((_entry_change(before[k]) for k in gone), key=_by_size),
        findings_appeared=[_finding_change(w) for k, w in holds.items() if k not in held],
        findings_vanished=[_finding_change(w) for k, w in held.items() if k not in holds],
        compared=len(paired),
        percentiles_skipped=skipped,
        failed=bool(failures),
        failures=failures,
        cautions=list(_cautions(base_run, new_run, options)),
    )
