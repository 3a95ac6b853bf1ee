"""``asyncflow diff BASE NEW``: two saved runs compared, as a table for people or JSON for CI.

The comparison itself is :func:`asyncflow.views.diff.diff`; this module reads the two files
(snapshots, ``json`` exit reports or recordings' end states), renders the result and declares
the command, which the CLI adds with :func:`add_diff_command`. Exit status: 0, or 1 when a
figure got worse by more than ``--fail-over``, or 2 for a bad input (one line on standard
error).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from typing import TypeVar

import orjson

from asyncflow import schema
from asyncflow.render import record
from asyncflow.render.report import counted, format_duration, printable
from asyncflow.views.diff import Diff, DiffOptions, EntryChange, FigureChange, diff

__all__ = [
    "DiffInputError",
    "add_diff_command",
    "read_document",
    "render_diff",
    "run_diff",
]

_P = TypeVar("_P", bound=argparse.ArgumentParser)

#: exit statuses: no figure failed; a figure got worse by more than --fail-over; a bad input
PASSED, FAILED, USAGE = 0, 1, 2

#: what an entry's count counts, by its kind
_COUNTS = {
    "future": ("call", None),
    "channel": ("message sent", "messages sent"),
    "stream": ("item", None),
    "resource": ("acquisition", None),
    "executor": ("job", None),
}


class DiffInputError(ValueError):
    """A file ``asyncflow diff`` cannot compare (missing, not a snapshot, a newer schema)."""


def read_document(path: str, *, ignore_unknown: bool = True) -> schema.Snapshot:
    """A snapshot file or ``json`` exit report, as a :class:`~asyncflow.schema.Snapshot`; a
    recording (``--record``) as its end state.

    Fields a newer asyncflow added (of the same schema number) are left out: they are
    compatible, and the comparison does not need them. With ``ignore_unknown=False`` (the
    report, which shows what it reads) such a field is an error that names it.

    Raises:
        DiffInputError: the file cannot be read, is not JSON, is not a snapshot, or has a
            newer schema; the message names the file and says which.
    """
    if record.is_recording(path):
        try:
            return record.read_recording(path).snapshot()
        except record.RecordingError as exc:
            raise DiffInputError(str(exc)) from None
    try:
        raw = record.read_regular(path)
    except OSError as exc:
        raise DiffInputError(f"cannot read {path!r}: {exc.strerror or exc}") from None
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        try:
            raw.decode()
        except UnicodeDecodeError as bad:  # (orjson says "str is not valid UTF-8: surrogates")
            where = f"byte {raw[bad.start]:#04x} at offset {bad.start}"
            raise DiffInputError(f"{path!r} is not JSON: it is not UTF-8 text ({where})") from None
        raise DiffInputError(f"{path!r} is not JSON: {exc}") from None
    number = data.get("schema") if isinstance(data, dict) else None
    if number is not None and number != schema.SCHEMA:
        newer = isinstance(number, int) and number > schema.SCHEMA
        raise DiffInputError(
            f"{path!r} has schema {number!r}; this asyncflow reads schema {schema.SCHEMA}"
            + (" (a newer asyncflow wrote it: read it with that one)" if newer else "")
        )
    try:
        return schema.load(schema.Snapshot, data, ignore_unknown=ignore_unknown)
    except schema.DocumentError as exc:
        raise DiffInputError(f"{path!r} is not an asyncflow snapshot: {exc}") from None


def _value(unit: str, value: int) -> str:
    return format_duration(value) if unit == "ns" else f"{value:,}"


def _change(c: FigureChange) -> str:
    moved = "from 0" if c.ratio is None else f"{c.ratio:.2f}x"
    return f"{moved} {c.verdict}" + (" FAIL" if c.failed else "")


def _rows(rows: list[list[str]]) -> list[str]:
    """Aligned columns: names and words to the left, figures to the right."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    left = {0, 1, 2}
    return [
        "  ".join(
            cell.ljust(w) if i in left else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]


def _entry(e: EntryChange) -> str:
    noun, plural = _COUNTS.get(e.kind, ("event", None))
    return f"  {e.kind} `{e.name}` ({e.detail}): {counted(e.count, noun, plural)}"


def _run_line(side: str, path: str, d: Diff) -> str:
    run = d.base if side == "base" else d.new
    took = format_duration(run.uptime_ns)
    return f"{side}: {path} ({run.name}, {took}, asyncflow {run.version}, Python {run.python})"


def _render_table(d: Diff, base: str = "BASE", new: str = "NEW") -> str:
    """A diff as text: the runs, the changed figures (worst regression first), the entries
    and findings in one run only, and the verdict on its last line.

    Args:
        d: the comparison.
        base: what to call the base run (its file's name).
        new: what to call the new run.
    """
    o = d.options
    lines = [
        _run_line("base", base, d),
        _run_line("new", new, d),
        f"noise: a change under {o.threshold:g}x, or under {format_duration(o.min_time_ns)} "
        f"(a percentile), {format_duration(o.min_total_ns)} and {o.min_share:.0%} of the run "
        f"(a total of time) or {o.min_count} "
        f"(a count); a percentile of fewer than {o.min_samples} samples, or {o.min_samples / 2:g} "
        "at or above it, is left out",
        "",
    ]
    compared = counted(d.compared, "entry", "entries")
    skipped = (
        f", {counted(d.percentiles_skipped, 'percentile')} left out for too few samples"
        if d.percentiles_skipped
        else ""
    )
    if d.changes:
        rows = [["kind", "name", "figure", "base", "new", "change"]]
        rows += [
            [c.kind, c.name, c.figure, _value(c.unit, c.base), _value(c.unit, c.new), _change(c)]
            for c in d.changes
        ]
        lines += [f"{counted(len(d.changes), 'figure')} changed ({compared} compared{skipped}):"]
        lines += ["  " + row for row in _rows(rows)]
    else:
        lines += [f"no figure changed beyond noise ({compared} compared{skipped})"]
    for title, entries in (("only in new", d.appeared), ("only in base", d.vanished)):
        if entries:
            lines += ["", f"{title}:", *(_entry(e) for e in entries)]
    for title, findings in (
        ("findings only in new", d.findings_appeared),
        ("findings only in base", d.findings_vanished),
    ):
        if findings:
            lines += ["", f"{title}:"]
            lines += [
                f"  {f.severity} {f.kind}: {f.subject_kind} `{f.subject}`: {f.message}"
                for f in findings
            ]
    over = f"{o.fail_over:g}x"
    lines.append("")
    lines += [f"caution: {caution}" for caution in d.cautions]
    if d.failed:
        lines.append(
            f"FAILED: {counted(len(d.failures), 'figure')} got worse by more than {over}: "
            + "; ".join(d.failures)
        )
    elif not math.isfinite(o.fail_over):
        lines.append("passed: with --fail-over inf, no figure fails the comparison")
    else:
        lines.append(f"passed: no figure got worse by more than {over}")
    return "\n".join(lines) + "\n"


def render_diff(d: Diff, format: str, base: str = "BASE", new: str = "NEW") -> str:
    """A diff as ``table`` text, or as its JSON document (``json``, ``json-pretty``).

    Raises:
        ValueError: an unknown format.
    """
    if format == "table":
        return printable(_render_table(d, base, new))
    if format in ("json", "json-pretty"):
        return schema.dumps(d, pretty=format == "json-pretty").decode() + "\n"
    raise ValueError(f"format={format!r}: expected table, json or json-pretty")


def run_diff(
    args: argparse.Namespace, read: Callable[[str], schema.Snapshot] = read_document
) -> int:
    """The ``asyncflow diff`` command's handler: compare, print, and say by the exit status
    whether a figure got worse by more than ``--fail-over``.

    Args:
        args: the parsed arguments (see :func:`add_diff_command`).
        read: how a file becomes a snapshot; a ``ValueError`` it raises is a bad input.

    Returns:
        0, 1 when a figure failed, 2 (with one line on standard error) for a bad input.
    """
    try:
        options = _options(args)
        before, after = read(args.base), read(args.new)
    except ValueError as exc:
        print(f"asyncflow diff: error: {exc}", file=sys.stderr)
        return USAGE
    result = diff(before, after, options)
    sys.stdout.write(render_diff(result, args.format, args.base, args.new))
    return FAILED if result.failed else PASSED


#: the most milliseconds (a document's nanoseconds are 64-bit) and the largest count an option takes
_MOST_MS = 9e12
_MOST_COUNT = 2**63 - 1


def _options(args: argparse.Namespace) -> DiffOptions:
    """The command's flags as options; a bad one raises ValueError naming the flag."""
    if not 0 <= args.min_share < 100:
        raise ValueError(f"--min-share {args.min_share:g}: expected a percentage from 0 to 100")
    for flag, value in (("--min-time", args.min_time), ("--min-total", args.min_total)):
        if not 0 <= value <= _MOST_MS:
            raise ValueError(f"{flag} {value:g}: expected milliseconds from 0 to {_MOST_MS:g}")
    for flag, count in (("--min-count", args.min_count), ("--min-samples", args.min_samples)):
        if count > _MOST_COUNT:
            raise ValueError(f"{flag} {count}: expected at most {_MOST_COUNT}")
    try:
        return DiffOptions(
            threshold=args.threshold,
            min_time_ns=round(args.min_time * 1_000_000),
            min_total_ns=round(args.min_total * 1_000_000),
            min_count=args.min_count,
            min_share=args.min_share / 100,
            min_samples=args.min_samples,
            fail_over=args.fail_over,
        )
    except ValueError as exc:  # the option's name as the user gave it: its flag
        name, _, rest = str(exc).partition("=")
        raise ValueError(f"--{name.replace('_', '-')} {rest}") from None


def add_diff_command(commands: argparse._SubParsersAction[_P]) -> None:
    """Add ``asyncflow diff`` to the CLI's subcommands, with :func:`run_diff` as its handler
    (set as ``handler``, as the CLI's other commands are). The command's parser is of the
    subcommands' ``parser_class``, so that its usage errors are said as theirs are."""
    defaults = DiffOptions()
    command = commands.add_parser(
        "diff",
        help="compare two saved runs (snapshots, json exit reports, recordings); exit 1 on a "
        "regression",
        description=(
            "Compare two runs saved by 'asyncflow snapshot', as a json exit report or as a "
            "recording (its end state): per "
            "future, channel, stream, resource and executor (matched by label, not id), the "
            "figures that changed beyond noise, worst regression first, and the entries and "
            "findings in one run only. Exit status 1 when a figure (a duration, an error count) "
            "got worse by more than --fail-over times; 2 for a bad input."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    command.add_argument("base", help="the run compared against (e.g. the main branch's)")
    command.add_argument("new", help="the run under judgement")
    command.add_argument(
        "--format", default="table", choices=("table", "json", "json-pretty"), help="output"
    )
    for flag, kind, default, metavar, said in (
        ("--fail-over", float, defaults.fail_over, "RATIO",
         "exit 1 when a figure got worse by more than this many times (inf: never)"),
        ("--threshold", float, defaults.threshold, "RATIO",
         "noise: a figure changed only when it moved by at least this ratio"),
        ("--min-time", float, defaults.min_time_ns / 1e6, "MS",
         "noise: ...and a percentile of durations by at least this many milliseconds"),
        ("--min-total", float, defaults.min_total_ns / 1e6, "MS",
         "noise: ...or a total of time (busy, waits) by at least this many milliseconds"),
        ("--min-share", float, defaults.min_share * 100, "PERCENT",
         "noise: ...and by at least this share of the run's wall time"),
        ("--min-count", int, defaults.min_count, "N",
         "noise: ...or a count by at least this many"),
        ("--min-samples", int, defaults.min_samples, "N",
         "a percentile of fewer samples in either run (or half as many at or above it) is "
         "not compared"),
    ):  # fmt: skip
        command.add_argument(flag, type=kind, default=default, metavar=metavar, help=said)
    command.set_defaults(handler=run_diff)
