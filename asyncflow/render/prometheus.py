"""The figures in the Prometheus text exposition format (version 0.0.4): ``GET /metrics``.

A renderer of :class:`asyncflow.render.reporters.Figures`: the values are the JSON documents'
values, durations in seconds, percentiles as summaries (``quantile`` label). Every series is
labelled by what it is about: ``label`` and ``location`` (``file:line``) for futures, streams and
resources; ``label`` and ``kind`` for channels and executors; ``label`` and ``thread`` for loops.
Measured functions (``@asyncflow.measure``) carry ``label``, ``kind`` and ``location``; the
program's own counters, gauges, histograms and value logs one ``name`` label each, in four fixed
families (``asyncflow_user_*``), so that no name of the program's can make the text invalid.
Series are per creation site, not per object: the entries that share every label (the locks a
connection pool creates at one line, one per connection, live and gone) are one series, their
points merged (counts and times summed, maxima and percentiles the largest), so that the series
of a scrape do not come and go with short-lived objects. Cardinality is that of the program's
lines, bounded. ``ids=True`` (``metric_ids``) writes one series per entry instead, an ``id``
label telling apart the second and later.

:class:`TextfileReporter` writes the same text to a file every few seconds, for
node_exporter's textfile collector: a live reporter, for programs that serve no endpoint.
"""

from __future__ import annotations

import math
import os
from typing import Any

from asyncflow.render.metrics import METRICS, Pairs, Subject, points_of, series
from asyncflow.render.reporters import Figures, Tick
from asyncflow.schema import fit_text

__all__ = ["CONTENT_TYPE", "FAMILIES", "TextfileReporter", "render"]

#: what ``GET /metrics`` answers with
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: every metric family, derived from :data:`asyncflow.render.metrics.METRICS`: name -> (type, help)
FAMILIES: dict[str, tuple[str, str]] = {
    m.prometheus: (m.type, m.help) for m in METRICS if m.prometheus is not None
}


def render(figures: Figures, *, ids: bool = False) -> str:
    """The figures as Prometheus text (every family, even empty, with its HELP and TYPE): a
    series per creation site, or per object with ``ids``."""
    labelled: dict[int, list[tuple[list[Any], str]]] = {}  # each subject's series, labelled once
    lines: list[str] = []
    for metric in METRICS:
        name, points = metric.prometheus, metric.points
        if name is None or points is None:
            continue
        lines.append(f"# HELP {name} {_help(metric.help)}")
        lines.append(f"# TYPE {name} {metric.type}")
        subject = metric.subject
        entries = labelled.get(id(subject))
        if entries is None:
            entries = labelled[id(subject)] = _labelled(subject, figures, ids)
        for members, labels in entries:
            for suffix, extra, value in points_of(metric, members):
                if extra:
                    more = _labels(extra)
                    sample_labels = f"{labels},{more}" if labels else more
                else:
                    sample_labels = labels
                if sample_labels:
                    lines.append(f"{name}{suffix}{{{sample_labels}}} {_value(value)}")
                else:
                    lines.append(f"{name}{suffix} {_value(value)}")
    lines.append("")
    return "\n".join(lines)


def _help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape(value: str) -> str:
    # Every label value is written here: a lone surrogate (a file name that is not UTF-8)
    # becomes its escape first, whose backslash is then escaped as any other.
    value = fit_text(value)
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(pairs: Pairs) -> str:
    return ",".join(f'{key}="{_escape(value)}"' for key, value in pairs)


def _value(value: float | int) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def _labelled(subject: Subject, figures: Figures, ids: bool) -> list[tuple[list[Any], str]]:
    """Each series' entries, with its labels written out."""
    return [(members, _labels(pairs)) for pairs, members in series(subject, figures, ids)]


class TextfileReporter:
    """A live reporter that writes the Prometheus text to ``path`` every ``interval`` seconds
    (and once more when the profiler stops), atomically: for node_exporter's textfile collector
    (``--collector.textfile.directory``; the file name must end in ``.prom``).

    Args:
        path: the file to write; its directory must exist.
        interval: seconds between writes, at least the collector's tick (0.05).
        ids: a series per object (``id`` label) instead of per creation site.

    Raises:
        ValueError: a bad ``path`` or ``interval``.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, interval: float = 15.0, ids: bool = False
    ) -> None:
        text = os.fspath(path)
        if not isinstance(text, str) or not text:
            raise ValueError(f"path={path!r}: expected a file path")
        if not os.path.isdir(os.path.dirname(os.path.abspath(text))):
            raise ValueError(f"path={text!r}: its directory does not exist")
        if (
            isinstance(interval, bool)
            or not isinstance(interval, int | float)
            or not 0.05 <= interval <= 86_400
        ):
            raise ValueError(f"interval={interval!r}: expected seconds from 0.05 to 86400")
        self.path = text
        self.ids = ids
        self.interval_ns = round(interval * 1e9)
        self._next_ns = 0
        #: files written so far
        self.writes = 0

    def tick(self, tick: Tick, /) -> None:
        if tick.now_ns < self._next_ns:
            return
        self._next_ns = tick.now_ns + self.interval_ns
        self._write(tick.figures())

    def close(self, final: Figures, /) -> None:
        self._write(final)

    def _write(self, figures: Figures) -> None:
        partial = f"{self.path}.{os.getpid()}.tmp"
        with open(partial, "w", encoding="utf-8") as out:
            out.write(render(figures, ids=self.ids))
        os.replace(partial, self.path)  # never a half-written file for the collector to read
        self.writes += 1
