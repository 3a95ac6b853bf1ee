"""Every ``ASYNCFLOW_*`` environment variable is read here, and every option is validated here.

Precedence: an explicit argument, then the environment variable, then the default below. An
explicit ``None`` is an argument like any other: it means the option's default, whatever the
environment says (``port=None``: no endpoint at all).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Protocol

__all__ = [
    "DEFAULT_BLOCK_THRESHOLD",
    "DEFAULT_FORMAT",
    "DEFAULT_HOST",
    "DEFAULT_LIMIT",
    "DEFAULT_PERCENTILES",
    "DEFAULT_PORT",
    "DEFAULT_RECENT_LOGS",
    "DEFAULT_TRACE_EVENTS",
    "FORMATS",
    "MAX_BLOCK_THRESHOLD",
    "MAX_DURATION",
    "MAX_PERCENTILES",
    "MAX_SAMPLING",
    "MIN_BLOCK_THRESHOLD",
    "OPTIONS",
    "Option",
    "Options",
    "Reporter",
    "check_type",
    "disabled",
    "no_extensions",
    "otel_exporters",
    "resolve_options",
    "runtime_dir",
]

DEFAULT_PERCENTILES: tuple[float, ...] = (50.0, 95.0, 99.0)
DEFAULT_LIMIT = 15
DEFAULT_FORMAT = "table"
DEFAULT_RECENT_LOGS = 50
FORMATS = ("table", "json", "json-pretty", "none")
MAX_RECENT_LOGS = 100_000
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 6780
DEFAULT_BLOCK_THRESHOLD = 0.1
#: events the trace recorder keeps (the newest), and the most ``trace_events`` may ask for
DEFAULT_TRACE_EVENTS = 100_000
MAX_TRACE_EVENTS = 10_000_000
#: the recording's size budget, in megabytes (``record_budget``)
DEFAULT_RECORD_BUDGET = 5.0
MIN_RECORD_BUDGET = 0.05
MAX_RECORD_BUDGET = 100_000.0
#: the block threshold's bounds, in seconds: finer than the loop monitor can see is noise, and
#: longer than an hour is no threshold at all
MIN_BLOCK_THRESHOLD = 0.001
MAX_BLOCK_THRESHOLD = 3600.0
#: blocks of the loop this long (or the block threshold, if lower) are summed per line
DEFAULT_BLOCK_MIN = 0.02
#: the longest ``duration``, in seconds (a year): beyond it timers lose their meaning
MAX_DURATION = 31_536_000.0
#: the most percentiles one profile reports
MAX_PERCENTILES = 32
MAX_SAMPLING = 65_536
#: the longest host name (RFC 1035 allows 253 characters) or token accepted
_MAX_NAME = 255
_MAX_TOKEN = 4096

#: The warnings' thresholds that ``warn=`` may set, and what each takes: ``seconds`` (> 0, at
#: most an hour), ``share`` (a fraction in (0, 1]) or ``count`` (a whole number >= 1). The
#: defaults and meanings are those of ``asyncflow.views.lints.Thresholds``.
WARN_THRESHOLDS = {
    "long_poll": "seconds",
    "block_total": "seconds",
    "cpu_poll": "seconds",
    "cpu_share": "share",
    "cpu_wall_share": "share",
    "blocked_share": "share",
    "loop_wait_share": "share",
    "starved_share": "share",
    "min_wait": "seconds",
    "unread_messages": "count",
    "cancel_share": "share",
    "cancel_min": "count",
    "executor_min_jobs": "count",
    "leak_min_live": "count",
    "leak_finish_share": "share",
    "contention_min_waits": "count",
    "growth_min_depth": "count",
    "growth_min_delay": "seconds",
    "busy_wait_polls": "count",
    "busy_wait_gap": "seconds",
    "tail_ratio": "count",
    "tail_min_calls": "count",
    "tail_min": "seconds",
    "tail_min_gathers": "count",
    "tail_lag_factor": "count",
    "path_ratio": "count",
    "path_min_messages": "count",
    "path_min": "seconds",
    "storm_ratio": "count",
    "storm_min_signals": "count",
}
#: The warnings' kinds, which ``warn="no-KIND"`` silences (docs/warnings.md lists each; a test
#: checks both against the lints), in the lints' order: the order of the warnings of one
#: severity in every document.
WARNING_KINDS = (
    "loop-blocked",
    "long-poll",
    "off-cpu-poll",
    "cpu-bound",
    "never-awaited",
    "channel-unread",
    "messages-lost",
    "bottleneck",
    "starved",
    "cancellation-storm",
    "cancellation-swallowed",
    "task-leak",
    "executor-saturated",
    "lock-contention",
    "permits-leaked",
    "event-never-set",
    "dead-consumer",
    "dead-producer",
    "never-retrieved",
    "task-dropped",
    "unbounded-growth",
    "busy-wait",
    "tail-latency",
    "slow-path",
    "wakeup-storm",
    "deadlock",
    "lock-held-by-waiter",
)
_DISABLE = "ASYNCFLOW_DISABLE"
_NO_EXTENSIONS = "ASYNCFLOW_NO_EXTENSIONS"
_RUNTIME_DIR = "ASYNCFLOW_RUNTIME_DIR"
_ENDPOINT_PROCESS = "ASYNCFLOW_ENDPOINT_PROCESS"
_HAND_OVER = "ASYNCFLOW_GIL_HAND_OVER"


class Reporter(Protocol):
    """Replaces the built-in report formats: receives the final snapshot when the profiler stops."""

    def report(self, snapshot: Any, /) -> None: ...


def check_type(
    api: str, option: str, value: object, expected: type, optional: bool = False
) -> None:
    """Refuse an instrumentation option of the wrong type, naming the call and the option.

    Raises:
        TypeError: e.g. ``asyncflow.stream(log_items=...) must be a bool, got 'yes'``.
    """
    if value is None and optional:
        return
    if expected is bool:
        ok = isinstance(value, bool)
    else:  # True is an int, but never a name or a size
        ok = isinstance(value, expected) and not isinstance(value, bool)
    if not ok:
        raise TypeError(
            f"asyncflow.{api}({option}=...) must be a {expected.__name__}, got {value!r}"
        )


def disabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``ASYNCFLOW_DISABLE`` asks for instrumentation to be left out entirely (any
    value but an empty one, ``0``, ``false``, ``no`` or ``off``: one that is not clear
    disables, never the other way round)."""
    value = (os.environ if environ is None else environ).get(_DISABLE, "").strip().lower()
    return value not in ("", "0", "false", "no", "off")


def disabled_because(environ: Mapping[str, str] | None = None) -> str:
    """``asyncflow is disabled (ASYNCFLOW_DISABLE=...)``, with the value it was given."""
    value = (os.environ if environ is None else environ).get(_DISABLE, "").strip()
    unclear = value.lower() not in ("1", "true", "yes", "on")
    said = f"{_DISABLE}={value!r}, not 0/false/no/off" if unclear else f"{_DISABLE}={value}"
    return f"asyncflow is disabled ({said})"


def no_extensions(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``ASYNCFLOW_NO_EXTENSIONS`` asks for the pure-Python hot path even where the
    compiled one is built (read once, when ``asyncflow`` is imported)."""
    value = (os.environ if environ is None else environ).get(_NO_EXTENSIONS, "").strip().lower()
    return value not in ("", "0", "false", "no", "off")


def endpoint_process(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the endpoint's HTTP is served from a helper process (the default), not on the
    profiler's thread (``ASYNCFLOW_ENDPOINT_PROCESS=0``: where starting a process is unwelcome,
    at the cost of slowing the program while clients poll)."""
    value = (os.environ if environ is None else environ).get(_ENDPOINT_PROCESS, "").strip().lower()
    return value not in ("0", "false", "no", "off")


def gil_hand_over(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the program's threads hand the GIL over to the profiler's thread when it wakes
    for work (the default: from any loop on the compiled path, at a tracked call's poll on the
    pure-Python one; ``ASYNCFLOW_GIL_HAND_OVER=0`` leaves the GIL's own turns, under which a
    loop that keeps yielding can starve the endpoint's answers)."""
    value = (os.environ if environ is None else environ).get(_HAND_OVER, "").strip().lower()
    return value not in ("0", "false", "no", "off")


def runtime_dir(environ: Mapping[str, str] | None = None) -> str | None:
    """``ASYNCFLOW_RUNTIME_DIR``: where running profilers register themselves for
    ``asyncflow ps``, instead of ``$XDG_RUNTIME_DIR/asyncflow`` or the temporary directory."""
    value = (os.environ if environ is None else environ).get(_RUNTIME_DIR, "").strip()
    return value or None


def _percentiles(value: object, source: str) -> tuple[float, ...]:
    if isinstance(value, str):
        parts = [p.strip() for p in value.split(",") if p.strip()]
        try:
            items: list[float] = [float(p) for p in parts]
        except ValueError:
            raise ValueError(
                f"{source}={value!r}: percentiles are numbers in (0, 100], e.g. '50,95,99'"
            ) from None
    elif isinstance(value, Iterable):
        items = []
        for p in value:
            if isinstance(p, bool) or not isinstance(p, int | float):
                raise ValueError(f"{source}: percentiles are numbers in (0, 100], got {p!r}")
            if not (0 < p <= 100):  # compared before float(): a huge int cannot overflow here
                raise ValueError(f"{source}: percentile {_shown(p)} is outside (0, 100]")
            items.append(float(p))
            if len(items) > MAX_PERCENTILES:
                break
    else:
        raise ValueError(f"{source}: percentiles are a list of numbers in (0, 100], got {value!r}")
    if not items:
        raise ValueError(f"{source}: give at least one percentile in (0, 100]")
    for p in items:
        if not (0 < p <= 100):  # also refuses nan, which compares false with everything
            raise ValueError(f"{source}: percentile {p:g} is outside (0, 100]")
    unique = sorted(set(items))
    if len(unique) > MAX_PERCENTILES:
        raise ValueError(f"{source}: at most {MAX_PERCENTILES} percentiles, got more")
    return tuple(unique)


def _shown(value: object, at_most: int = 40) -> str:
    """A value fit to quote in a message, however long it is."""
    text = repr(value)
    if len(text) <= at_most:
        return text
    return f"{text[:at_most]}... ({len(text)} characters)"


def _int(value: object, source: str, low: int, high: int, meaning: str) -> int:
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:  # also a number of more digits than int() reads
            raise ValueError(f"{source}={_shown(value)}: expected {meaning}") from None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{source}={_shown(value)}: expected {meaning}")
    return value


def _duration(value: object, source: str) -> float | None:
    if value is None:
        return None
    return _seconds(value, source, MAX_DURATION, f"a finite number > 0, at most {MAX_DURATION:.0f}")


def _block_min(value: object, source: str) -> float:
    low, high = MIN_BLOCK_THRESHOLD, MAX_BLOCK_THRESHOLD
    return _seconds(value, source, high, f"a finite number from {low:g} to {high:g}", low)


def _block_threshold(value: object, source: str) -> float:
    low, high = MIN_BLOCK_THRESHOLD, MAX_BLOCK_THRESHOLD
    return _seconds(value, source, high, f"a finite number from {low:g} to {high:g}", low)


def _seconds(
    value: object, source: str, high: float, meaning: str, low: float | None = None
) -> float:
    """Seconds: a number > 0 (or >= ``low``) and <= ``high``; bounded, so that nothing
    computed from it later (nanoseconds, timer deadlines) can overflow."""
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise ValueError(f"{source}={_shown(value)}: expected seconds, {meaning}") from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{source}={_shown(value)}: expected seconds, {meaning}")
    # Compared, never converted first: float(10**400) would raise OverflowError; nan fails all.
    ok = value >= low if low is not None else value > 0
    if not (ok and value <= high):
        raise ValueError(f"{source}={_shown(value)}: expected seconds, {meaning}")
    return float(value)


def _warn(value: object, source: str) -> tuple[tuple[str, float | str], ...]:
    """``"long_poll=0.05,no-starved,ignore:httpcore.*"`` (or a mapping): thresholds of the
    warnings, kinds silenced (``("no", kind)``) and modules ignored (``("ignore", pattern)``)."""
    if isinstance(value, str):
        pairs: list[tuple[str, object]] = []
        for part in value.split(","):
            part = part.strip()
            if not part:
                continue
            if part.startswith(("no-", "ignore:")):
                key, _, rest = part.partition(":" if part.startswith("ignore:") else "-")
                pairs.append((key, rest.strip()))
                continue
            key, sep, number = part.partition("=")
            if not sep:
                raise ValueError(
                    f"{source}={_shown(value)}: expected name=value thresholds, no-KIND or "
                    f"ignore:MODULE, separated by commas, such as long_poll=0.05,no-starved; "
                    f"names: {', '.join(WARN_THRESHOLDS)}"
                )
            pairs.append((key.strip(), number.strip()))
    elif isinstance(value, Mapping):
        pairs = []
        for key, raw in value.items():
            listed = key in ("no", "ignore") and not isinstance(raw, str)
            if listed and isinstance(raw, Iterable):
                pairs.extend((key, item) for item in raw)
            else:
                pairs.append((key, raw))
    else:
        raise ValueError(
            f"{source}={_shown(value)}: expected a mapping or 'name=value,...' of thresholds"
        )
    out: dict[str, float] = {}
    quiet: list[tuple[str, str]] = []
    for key, raw in pairs:
        if key == "no":
            if raw not in WARNING_KINDS:
                raise ValueError(
                    f"{source}: no-{raw}: unknown warning kind; known: {', '.join(WARNING_KINDS)}"
                )
            quiet.append(("no", str(raw)))
            continue
        if key == "ignore":
            from asyncflow.filtering import parse_patterns

            if isinstance(raw, str) and not raw.strip():
                raise ValueError(
                    f"{source}: ignore: names no module; give one, such as ignore:httpcore"
                )
            quiet.extend(("ignore", p) for p in parse_patterns(raw, f"{source}[ignore]"))
            continue
        kind = WARN_THRESHOLDS.get(key) if isinstance(key, str) else None
        if kind is None:
            raise ValueError(
                f"{source}: unknown warning threshold {key!r}; known: {', '.join(WARN_THRESHOLDS)}"
            )
        where = f"{source}[{key}]"
        if kind == "seconds":
            out[key] = _seconds(raw, where, 3600.0, "a finite number > 0, at most 3600")
        elif kind == "share":
            out[key] = _seconds(raw, where, 1.0, "a fraction > 0, at most 1")
        else:
            out[key] = float(_int(raw, where, 1, 1_000_000_000, "a whole number >= 1"))
    return (*sorted(out.items()), *dict.fromkeys(quiet))


def is_whole_number(text: str) -> bool:
    """Whether ``text`` is a whole number in ASCII digits, as a pid, a port or a file named by
    a pid is (``str.isdigit`` also takes ``²``, which ``int`` refuses)."""
    return text.isascii() and text.isdigit()


def _format(value: object, source: str) -> str:
    if value not in FORMATS:
        raise ValueError(f"{source}={value!r}: expected one of {', '.join(FORMATS)}")
    return str(value)


def _output(value: object, source: str) -> str | None:
    """A path the report can be written to at exit, checked now: at exit it is too late to say.

    The directory must exist and be writable, the name must be one the file system takes, and
    an existing file must be writable; the file itself is neither created nor truncated here.
    A relative path is made absolute now: a program that changes directory (a daemon, a
    service that ``chdir``s to its data) still gets its report where it was asked for.
    """
    if value is None or value == "":
        return None
    if value == "-":  # standard output
        return value
    if not isinstance(value, str | os.PathLike):
        raise ValueError(
            f"{source}={_shown(value)}: expected a file path, '-' for standard output, or None "
            "for the format's own stream"
        )
    path = os.fspath(value)
    if not isinstance(path, str):
        raise ValueError(f"{source}={_shown(value)}: expected a text file path")
    if "\x00" in path:
        raise ValueError(f"{source}={_shown(path)}: a file path cannot contain a NUL character")
    try:
        name = os.fsencode(os.path.basename(path))
    except UnicodeError:
        raise ValueError(f"{source}={_shown(path)}: not a path this file system can name") from None
    if len(name) > 255:  # NAME_MAX on every common file system
        raise ValueError(f"{source}={_shown(path)}: the file name is too long (255 bytes at most)")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise ValueError(f"{source}={path!r}: the directory {parent!r} does not exist")
    if os.path.isdir(path):
        raise ValueError(f"{source}={path!r}: is a directory; give a file path")
    if not os.access(parent if not os.path.exists(path) else path, os.W_OK):
        raise ValueError(f"{source}={path!r}: cannot be written (permission denied)")
    return os.path.abspath(path)


def _host(value: object, source: str) -> str:
    host = value.strip() if isinstance(value, str) else ""
    if not host or len(host) > _MAX_NAME or not host.isprintable() or " " in host:
        raise ValueError(f"{source}={_shown(value)}: expected a host name or IP address to bind to")
    return host


def _trace(value: object, source: str) -> tuple[bool, str | None]:
    """``trace=``: True (record, serve at /trace), False, or the file written at exit."""
    if isinstance(value, bool):
        return value, None
    if isinstance(value, str):
        word = value.strip().lower()
        if word in ("1", "true", "yes", "on"):
            return True, None
        if word in ("0", "false", "no", "off"):
            return False, None
    elif not isinstance(value, os.PathLike):
        raise ValueError(
            f"{source}={_shown(value)}: expected True, False, or the trace file's path"
        )
    return True, _output(value, source)


def _record(value: object, source: str) -> str | None:
    """``record=``: the recording's file (checked now, as the report's is), or None."""
    if isinstance(value, str) and value.strip().lower() in ("0", "false", "no", "off"):
        return None
    if isinstance(value, bool) or not isinstance(value, str | os.PathLike) or value == "-":
        raise ValueError(f"{source}={_shown(value)}: expected the recording's file path")
    return _output(value, source)


def _record_budget(value: object, source: str) -> float:
    low, high = MIN_RECORD_BUDGET, MAX_RECORD_BUDGET
    said = f"{source}={_shown(value)}: expected megabytes, a number from {low:g} to {high:g}"
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise ValueError(said) from None
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise ValueError(said)  # nan fails the comparison too
    return float(value)


def _port(value: object, source: str) -> int | None:
    if isinstance(value, str) and value.strip().lower() in ("off", "none"):
        return None
    return _int(value, source, 0, 65535, "a port from 0 to 65535 (0 picks a free one), or 'off'")


def _sampling(value: object, source: str) -> int:
    if isinstance(value, str) and value.strip().lower() == "auto":
        return 0
    return _int(
        value, source, 1, MAX_SAMPLING, f"'auto', or a whole number from 1 to {MAX_SAMPLING}"
    )


def _token(value: object, source: str) -> str | None:
    if value is None:
        return None
    # What a client can put in an Authorization header: visible ASCII only.
    if (
        not isinstance(value, str)
        or not 0 < len(value) <= _MAX_TOKEN
        or not all("!" <= c <= "~" for c in value)
    ):
        raise ValueError(
            f"{source}: expected a non-empty token without spaces, in printable ASCII "
            f"(at most {_MAX_TOKEN} characters)"
        )
    return value


def _allowed_hosts(value: object, source: str) -> tuple[str, ...]:
    names = value.split(",") if isinstance(value, str) else value
    if not isinstance(names, Iterable) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"{source}={value!r}: expected host names, e.g. 'myhost,10.0.0.5'")
    hosts = tuple(n.strip().lower() for n in names if n.strip())
    for host in hosts:
        bare = host.strip("[]")  # an IPv6 address has colons; a host name with a port has one
        if any(c.isspace() or c in "/?#@" for c in bare) or bare.count(":") == 1:
            raise ValueError(f"{source}: {host!r} is not a host name (no scheme, port or path)")
    return hosts


def _live_reporters(value: object, source: str) -> tuple[Any, ...]:
    """``reporters=``: a list of objects with a ``tick(tick)`` method
    (asyncflow.render.reporters)."""
    if isinstance(value, str | bytes) or not isinstance(value, list | tuple):
        raise ValueError(
            f"{source}={_shown(value)}: expected a list of live reporters (objects with a "
            "tick(tick) method)"
        )
    for item in value:
        if not callable(getattr(item, "tick", None)):
            raise ValueError(f"{source}: {_shown(item)} is not a live reporter: it has no tick()")
    return tuple(value)


def _switch(value: object, source: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        word = value.strip().lower()
        if word in ("1", "true", "yes", "on"):
            return True
        if word in ("0", "false", "no", "off"):
            return False
    raise ValueError(f"{source}={_shown(value)}: expected true or false (1/0, yes/no, on/off)")


def otel_exporters(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """``OTEL_METRICS_EXPORTER`` (the OpenTelemetry standard): the metric exporters asyncflow's
    own meter provider uses, ``otlp`` by default; ``none`` means none."""
    value = (os.environ if environ is None else environ).get("OTEL_METRICS_EXPORTER", "")
    names = tuple(n.strip().lower() for n in value.split(",") if n.strip()) or ("otlp",)
    return () if names == ("none",) else names


def _reporter(value: object, source: str) -> Reporter | None:
    if value is None:
        return None
    if not callable(getattr(value, "report", None)):
        raise ValueError(f"{source}={value!r}: expected an object with a report(snapshot) method")
    return value  # type: ignore[return-value]


def _limit(value: object, source: str) -> int:
    return _int(value, source, 0, 1_000_000, "a whole number >= 0 (0 shows every row)")


def _recent_logs(value: object, source: str) -> int:
    return _int(value, source, 0, MAX_RECENT_LOGS, f"a whole number from 0 to {MAX_RECENT_LOGS}")


def _trace_events(value: object, source: str) -> int:
    return _int(value, source, 1, MAX_TRACE_EVENTS, f"a whole number from 1 to {MAX_TRACE_EVENTS}")


def _patterns(value: object, source: str) -> tuple[str, ...]:
    from asyncflow.filtering import parse_patterns

    return parse_patterns(value, source)


def _allocations(value: object, source: str) -> bool | str:
    if isinstance(value, str) and value.strip() == "blocks":
        return "blocks"
    try:
        return _switch(value, source)
    except ValueError:
        raise ValueError(
            f"{source}={_shown(value)}: expected true, false or blocks (1/0, yes/no, on/off)"
        ) from None


@dataclass(frozen=True, slots=True)
class Option:
    """One option of ``profile()``/``start()``: how it is checked, its variable, its
    ``asyncflow run`` flag and its row of docs/profiler.md's options table."""

    #: checks a value (an argument, a flag's or a variable's text) and returns the field's;
    #: called with the value and where it came from (the option's or the variable's name)
    parse: Callable[[object, str], Any]
    #: the default, as the docs' table shows it
    default: str
    #: what it does, as the docs' table says it (markdown)
    help: str
    #: the ``ASYNCFLOW_*`` variable that sets it; None: only code can (it takes objects)
    env: str | None = None
    #: an example of the variable's text, shown beside it in the docs
    example: str = ""
    #: ``asyncflow run``'s flag (``--`` and the name with dashes); None: run has none
    flag: str | None = None
    #: the flag's ``--help`` text, its default in brackets
    flag_help: str = ""
    #: the flag's value's name in ``--help`` (argparse's default: the name in capitals)
    metavar: str | None = None
    #: ``value`` (the flag takes one), ``switch`` (the flag turns it on) or ``append``
    #: (repeatable, the values joined with commas)
    kind: str = "value"
    #: the values the flag accepts, if it names them
    choices: tuple[str, ...] | None = None
    #: the ``Options`` fields ``parse`` sets (it then returns one value for each)
    fields: tuple[str, ...] = ()
    #: the keyword argument: the name of the ``Options`` field declared with it
    name: str = ""

    @property
    def meta(self) -> dict[str, Option]:
        """The metadata of the ``Options`` field that is this option."""
        return {"option": self}


@dataclass(frozen=True, slots=True)
class Options:
    """A profiler's resolved options."""

    #: the profiler's name, shown in every report and status document
    name: str
    #: percentiles reported for poll and call durations, each in (0, 100]
    percentiles: tuple[float, ...] = field(
        default=DEFAULT_PERCENTILES,
        metadata=Option(
            _percentiles,
            "50, 95, 99",
            "percentiles reported, each in (0, 100]",
            env="ASYNCFLOW_PERCENTILES",
            example="50,95,99",
            flag="--percentiles",
            flag_help="percentiles reported [50,95,99]",
        ).meta,
    )
    #: rows in each table of the table report (not the loops'); 0 means all
    limit: int = field(
        default=DEFAULT_LIMIT,
        metadata=Option(
            _limit,
            str(DEFAULT_LIMIT),
            "rows in each table of the table report (every loop is listed); 0 shows all",
            env="ASYNCFLOW_LIMIT",
            flag="--limit",
            flag_help=f"rows in each table of the report; 0 for all [{DEFAULT_LIMIT}]",
        ).meta,
    )
    #: exit report format: one of ``FORMATS``
    format: str = field(
        default=DEFAULT_FORMAT,
        metadata=Option(
            _format,
            f"`{DEFAULT_FORMAT}`",
            "`table`, `json`, `json-pretty` or `none`",
            env="ASYNCFLOW_FORMAT",
            flag="--format",
            flag_help=f"exit report format [{DEFAULT_FORMAT}]",
            choices=FORMATS,
        ).meta,
    )
    #: where the exit report goes: a file, "-" for standard output, None for the default (standard
    #: error for the table, standard output for JSON)
    output: str | None = field(
        default=None,
        metadata=Option(
            _output,
            "standard error for `table`, standard output for `json` and `json-pretty`",
            "file the exit report is written to; `-` is standard output. asyncflow writes "
            "nothing else on standard output, so a JSON report there is a clean document as long "
            "as the program prints nothing",
            env="ASYNCFLOW_OUTPUT",
            flag="--output",
            flag_help="file for the exit report, '-' for standard output (where asyncflow writes "
            "nothing else) [standard error for the table, standard output for json and "
            "json-pretty]",
            metavar="FILE",
        ).meta,
    )
    #: finished calls kept per future for its log
    recent_logs: int = field(
        default=DEFAULT_RECENT_LOGS,
        metadata=Option(
            _recent_logs,
            str(DEFAULT_RECENT_LOGS),
            "finished calls kept per future for its log (unfinished calls are always listed)",
            env="ASYNCFLOW_RECENT_LOGS",
        ).meta,
    )
    #: replaces the built-in formats when set
    reporter: Reporter | None = field(
        default=None,
        metadata=Option(
            _reporter,
            "none",
            "an object with `report(snapshot)`; replaces the built-in formats",
        ).meta,
    )
    #: stop and report after this many seconds; None means run until stopped
    duration: float | None = field(
        default=None,
        metadata=Option(
            _duration,
            "none",
            f"stop and report after this many seconds, at most {MAX_DURATION:,.0f} (profile a "
            "server for a fixed window)",
            env="ASYNCFLOW_DURATION",
            flag="--duration",
            flag_help="stop profiling after SECONDS [never]",
        ).meta,
    )
    #: the address the endpoint binds to; anything but loopback needs a ``token``
    host: str = field(
        default=DEFAULT_HOST,
        metadata=Option(
            _host,
            f"`{DEFAULT_HOST}`",
            "address the endpoint binds to; anything but loopback needs a `token`",
            env="ASYNCFLOW_HOST",
            flag="--host",
            flag_help=f"endpoint address [{DEFAULT_HOST}]",
        ).meta,
    )
    #: the endpoint's port; 0 picks a free one, None serves no endpoint at all
    port: int | None = field(
        default=DEFAULT_PORT,
        metadata=Option(
            _port,
            str(DEFAULT_PORT),
            "the endpoint's port; `0` picks a free one; `None` (or `off`) serves no endpoint. A "
            "taken default gives way to a free port; a taken chosen one is an error (see [The "
            "endpoint](endpoint.md#the-endpoint))",
            env="ASYNCFLOW_PORT",
            flag="--port",
            flag_help=f"endpoint port; 0 picks a free one, 'off' serves none [{DEFAULT_PORT}]",
        ).meta,
    )
    #: who chose ``port``: ``"port"`` (an argument), ``"ASYNCFLOW_PORT"``, or None for the
    #: default, which gives way to a free port when it is taken
    port_source: str | None = None
    #: when set, every request must carry ``Authorization: Bearer <token>``
    token: str | None = field(
        default=None,
        metadata=Option(
            _token,
            "none",
            "every request must then carry `Authorization: Bearer <token>` (visible ASCII)",
            env="ASYNCFLOW_TOKEN",
        ).meta,
    )
    #: a poll (one step of a task) running longer than this many seconds is a blocked loop
    block_threshold: float = field(
        default=DEFAULT_BLOCK_THRESHOLD,
        metadata=Option(
            _block_threshold,
            f"{DEFAULT_BLOCK_THRESHOLD:g}",
            "seconds a loop may go without running callbacks before it counts as blocked, from "
            f"{MIN_BLOCK_THRESHOLD:g} to {MAX_BLOCK_THRESHOLD:g}",
            env="ASYNCFLOW_BLOCK_THRESHOLD",
            flag="--block-threshold",
            flag_help="a task step running longer than this blocks the loop, from "
            f"{MIN_BLOCK_THRESHOLD:g} to {MAX_BLOCK_THRESHOLD:g} [{DEFAULT_BLOCK_THRESHOLD:g}]",
            metavar="SECONDS",
        ).meta,
    )
    #: a block of the loop this long (or ``block_threshold``, if lower) is summed on its line
    block_min: float = field(
        default=DEFAULT_BLOCK_MIN,
        metadata=Option(
            _block_min,
            f"{DEFAULT_BLOCK_MIN:g}",
            "seconds a loop must go without running callbacks for the block to count on its "
            "line's total (`blocking_lines` in `/loop`; at most `block_threshold`), from "
            f"{MIN_BLOCK_THRESHOLD:g} to {MAX_BLOCK_THRESHOLD:g}",
            env="ASYNCFLOW_BLOCK_MIN",
            flag="--block-min",
            flag_help="blocks of the loop this long are summed per line, however short of "
            f"--block-threshold [{DEFAULT_BLOCK_MIN:g}]",
            metavar="SECONDS",
        ).meta,
    )
    #: record a trace (polls, blocked loops, queue depths, loop lag, message flows) for
    #: Perfetto, served at ``/trace``
    trace: bool = field(
        default=False,
        metadata=Option(
            _trace,
            "off",
            "record a trace for Perfetto: `True` (served at `/trace`, `prof.trace()`), or a file "
            "path it is also written to at exit (`1`/`on` in the variable for no file); see "
            "[Traces for Perfetto](traces.md#traces-for-perfetto)",
            env="ASYNCFLOW_TRACE",
            flag="--trace",
            flag_help="record a trace (polls, blocked loops, queue depths, loop lag, message "
            "flows) and write it to FILE at exit, for ui.perfetto.dev or chrome://tracing [off]",
            metavar="FILE",
            fields=("trace", "trace_output"),
        ).meta,
    )
    #: where the trace is written when the profiler stops; None: only served
    trace_output: str | None = None
    #: the trace recorder's ring: it keeps the newest this many events
    trace_events: int = field(
        default=DEFAULT_TRACE_EVENTS,
        metadata=Option(
            _trace_events,
            str(DEFAULT_TRACE_EVENTS),
            f"the trace keeps the newest this many events, from 1 to {MAX_TRACE_EVENTS:,}",
            env="ASYNCFLOW_TRACE_EVENTS",
            flag="--trace-events",
            flag_help=f"the trace keeps the newest N events [{DEFAULT_TRACE_EVENTS}]",
            metavar="N",
        ).meta,
    )
    #: time one message (or stream item) in this many; 0 ("auto") adapts to each one's rate.
    #: Counts are exact either way.
    sampling: int = field(
        default=0,
        metadata=Option(
            _sampling,
            "`auto`",
            "time one message or stream item in N (`1`: all); `auto` times every one while a "
            "channel or stream is quiet and about a thousand a second of a busy one. Counts are "
            "exact either way",
            env="ASYNCFLOW_SAMPLING",
            flag="--sampling",
            flag_help="time one message or item in N, or 'auto' [auto]",
        ).meta,
    )
    #: more host names the endpoint answers to (``Host``), beside loopback and ``host``; "*": any
    allowed_hosts: tuple[str, ...] = field(
        default=(),
        metadata=Option(
            _allowed_hosts,
            "none",
            "more names the endpoint answers to (`Host`) beside loopback and `host`; `*` for "
            "any, with a token only (see [The endpoint](endpoint.md#the-endpoint))",
            env="ASYNCFLOW_ALLOWED_HOSTS",
        ).meta,
    )
    #: warning thresholds that differ from the defaults, as (name, value) pairs (see
    #: ``WARN_THRESHOLDS``), then the kinds silenced, ``("no", kind)``, and the modules
    #: ignored, ``("ignore", pattern)``
    warn: tuple[tuple[str, float | str], ...] = field(
        default=(),
        metadata=Option(
            _warn,
            "none",
            "warning thresholds that differ from the defaults (`name=value`), kinds silenced "
            "(`no-KIND`) and modules whose warnings are left out (`ignore:PATTERN`), separated "
            "by commas, or a mapping (see [Silencing](warnings.md#silencing-a-kind-or-a-module))",
            env="ASYNCFLOW_WARN",
            example="long_poll=0.05,no-starved,ignore:httpcore",
            flag="--warn",
            flag_help="warning thresholds that differ from the defaults, kinds silenced and "
            "modules ignored, e.g. long_poll=0.05,no-starved,ignore:httpcore (see "
            "docs/warnings.md)",
            metavar="NAME=VALUE|no-KIND|ignore:MODULE,...",
        ).meta,
    )
    #: live reporters fed each collector tick on the profiler's thread
    #: (``asyncflow.render.reporters``)
    reporters: tuple[Any, ...] = field(
        default=(),
        metadata=Option(
            _live_reporters,
            "none",
            "live reporters, each with `tick(tick)`, fed every collector tick (see [live "
            "reporters](exporters.md#prometheus-opentelemetry-and-live-reporters))",
        ).meta,
    )
    #: export the figures as OpenTelemetry metrics (the ``otel`` extra; ``OTEL_*`` configure it)
    otel: bool = field(
        default=False,
        metadata=Option(
            _switch,
            "off",
            "export the figures as OpenTelemetry metrics, configured by the `OTEL_*` variables "
            "(the `otel` extra)",
            env="ASYNCFLOW_OTEL",
            flag="--otel",
            flag_help="export the figures as OpenTelemetry metrics, configured by the OTEL_* "
            "variables (needs the 'otel' extra) [$ASYNCFLOW_OTEL]",
            kind="switch",
        ).meta,
    )
    #: Prometheus and OpenTelemetry write a series per object (an ``id`` label) instead of one
    #: per creation site
    metric_ids: bool = field(
        default=False,
        metadata=Option(
            _switch,
            "off",
            "`/metrics` and the OpenTelemetry export write a series per object, an `id` label "
            "telling apart those created at one line, instead of one per creation site (see "
            "[Exporters](exporters.md#one-series-per-creation-site))",
            env="ASYNCFLOW_METRIC_IDS",
        ).meta,
    )
    #: whole-program mode tracks only tasks whose coroutine's module or qualified name matches
    #: one of these patterns (empty: every task); see ``asyncflow.filtering``
    include: tuple[str, ...] = field(
        default=(),
        metadata=Option(
            _patterns,
            "every task",
            "whole-program mode tracks only tasks whose coroutine's module or qualified name "
            "matches one of these patterns (see [Focusing on your own "
            "code](cli.md#focusing-on-your-own-code---include-and---exclude))",
            env="ASYNCFLOW_INCLUDE",
            example="myapp.*,worker",
            flag="--include",
            flag_help="track only tasks whose coroutine's module or qualified name matches, e.g. "
            "'myapp.*' (repeatable, or comma-separated) [every task; $ASYNCFLOW_INCLUDE]",
            metavar="PATTERN",
            kind="append",
        ).meta,
    )
    #: ... and never those matching one of these (exclude wins over include)
    exclude: tuple[str, ...] = field(
        default=(),
        metadata=Option(
            _patterns,
            "none",
            "... and never those matching one of these; exclude wins over include",
            env="ASYNCFLOW_EXCLUDE",
            flag="--exclude",
            flag_help="never track tasks whose coroutine's module or qualified name matches, "
            "e.g. 'aiohttp' or 'aiohttp.*' (repeatable; wins over --include) [$ASYNCFLOW_EXCLUDE]",
            metavar="PATTERN",
            kind="append",
        ).meta,
    )
    #: under ``asyncflow run``, leave the program's own coroutine functions alone: only its
    #: tasks are futures (``asyncflow.instrumentation.own_code``)
    no_own_code: bool = field(
        default=False,
        metadata=Option(
            _switch,
            "off",
            "under `asyncflow run`, leave the program's own coroutine functions alone; otherwise "
            "each one of the program's own code (not the standard library's or an installed "
            "package's) is a future, as if decorated with `@asyncflow.future`, so that a route "
            "handler is a row, and `include`/`exclude` choose among them (see [A row per "
            "route](services.md#a-row-per-route))",
            env="ASYNCFLOW_NO_OWN_CODE",
            flag="--no-own-code",
            flag_help="leave the program's own coroutine functions alone (only its tasks are "
            "futures); each one is tracked as @asyncflow.future would otherwise "
            "[$ASYNCFLOW_NO_OWN_CODE]",
            kind="switch",
        ).meta,
    )
    #: under ``asyncflow run``, leave requests in the server's request task: no future per
    #: route (``asyncflow.instrumentation.routes``)
    no_routes: bool = field(
        default=False,
        metadata=Option(
            _switch,
            "off",
            "under `asyncflow run`, leave each request in its server's request task; otherwise "
            "a request routed by Starlette (FastAPI) or aiohttp is a call of its route's "
            "future, labelled by its method and path template (`GET /orders/{order_id}`; see "
            "[A row per route](services.md#a-row-per-route))",
            env="ASYNCFLOW_NO_ROUTES",
            flag="--no-routes",
            flag_help="leave each request in its server's request task; a request routed by "
            "Starlette, FastAPI or aiohttp is a call of its route's future otherwise "
            "[$ASYNCFLOW_NO_ROUTES]",
            kind="switch",
        ).meta,
    )
    #: measure each poll's CPU time (the polling thread's CPU clock: a system call per poll)
    cpu: bool = field(
        default=False,
        metadata=Option(
            _switch,
            "off",
            "measure each poll's CPU time beside its busy time (see [Threads, CPU time and "
            "allocations](threads.md#threads-cpu-time-and-allocations))",
            env="ASYNCFLOW_CPU",
            flag="--cpu",
            flag_help="measure each poll's CPU time beside its busy time (two system calls per "
            "poll) [$ASYNCFLOW_CPU]",
            kind="switch",
        ).meta,
    )
    #: measure each poll's allocations through ``tracemalloc`` (slows the whole program);
    #: ``"blocks"`` also counts the net blocks each poll left in use (slower still)
    allocations: bool | str = field(
        default=False,
        metadata=Option(
            _allocations,
            "off",
            "measure each poll's allocations through `tracemalloc`, which slows the whole "
            'program; `"blocks"` also counts the net blocks each poll left in use',
            env="ASYNCFLOW_ALLOCATIONS",
            flag="--allocations",
            flag_help="measure each poll's allocations through tracemalloc (slows the whole "
            "program) [$ASYNCFLOW_ALLOCATIONS]",
            kind="switch",
        ).meta,
    )
    #: under ``asyncflow run``, leave the processes the program starts unprofiled
    #: (``asyncflow._children``)
    no_children: bool = field(
        default=False,
        metadata=Option(
            _switch,
            "off",
            "under `asyncflow run`, leave the processes the program starts unprofiled "
            "(multiprocessing's, uvicorn's and gunicorn's workers, forks): only the program's own "
            "process is (see [Worker processes](services.md#worker-processes))",
            env="ASYNCFLOW_NO_CHILDREN",
            flag="--no-children",
            flag_help="leave the processes the program starts (multiprocessing, forked or "
            "spawned workers) unprofiled; each is profiled on its own otherwise "
            "[$ASYNCFLOW_NO_CHILDREN]",
            kind="switch",
        ).meta,
    )
    #: record the documents over time to this file (``asyncflow.render.record``); None: off
    record: str | None = field(
        default=None,
        metadata=Option(
            _record,
            "off",
            "record the documents over time to this file, compressed and bounded by "
            "`record_budget`, for `asyncflow report FILE --at SECONDS` and `asyncflow replay "
            "FILE` (see [Recordings](record.md#recordings))",
            env="ASYNCFLOW_RECORD",
            example="run.afrec",
            flag="--record",
            flag_help="record the documents over time to FILE, for 'asyncflow report FILE "
            "--at SECONDS' and 'asyncflow replay FILE' [off]",
            metavar="FILE",
        ).meta,
    )
    #: the recording's size budget in megabytes: detail is thinned, then time, to stay under it
    record_budget: float = field(
        default=DEFAULT_RECORD_BUDGET,
        metadata=Option(
            _record_budget,
            f"{DEFAULT_RECORD_BUDGET:g}",
            "the recording's size budget in megabytes, from "
            f"{MIN_RECORD_BUDGET:g} to {MAX_RECORD_BUDGET:g}: past shares of it the big "
            "sections (logs, tasks, graph, threads) are thinned, then ticks, and the file "
            "stays under it",
            env="ASYNCFLOW_RECORD_BUDGET",
            flag="--record-budget",
            flag_help="the recording's size budget in megabytes [5]",
            metavar="MB",
        ).meta,
    )


#: Every option, in the order of ``Options``' fields and of docs/profiler.md's table
#: (tests/test_options_table.py checks the table against it). An option is one field of
#: ``Options`` with ``metadata=Option(...).meta``: its check, variable, flag and docs row follow.
OPTIONS: tuple[Option, ...] = tuple(
    replace(f.metadata["option"], name=f.name) for f in fields(Options) if "option" in f.metadata
)
#: each option's variable, by option
_ENV = {option.name: option.env for option in OPTIONS if option.env is not None}


def resolve_options(
    name: str, given: Mapping[str, Any], environ: Mapping[str, str] | None = None
) -> Options:
    """Options from explicit arguments, then ``ASYNCFLOW_*`` variables, then defaults.

    An argument given as None is the option's default, whatever the variable says (``port``'s
    None serves no endpoint).

    Args:
        name: the profiler's name.
        given: the keyword arguments passed to ``profile()``/``start()``.
        environ: the environment to read (``os.environ`` by default).

    Raises:
        ValueError: an option or variable has a bad value; the message names it and says what
            is accepted.
        TypeError: an unknown option was passed.
    """
    env = os.environ if environ is None else environ
    known = {option.name for option in OPTIONS}
    unknown = sorted(set(given) - known)
    if unknown:
        raise TypeError(
            f"unknown asyncflow option(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"name={name!r}: expected a non-empty string naming the profiled program")

    chosen: dict[str, Any] = {}
    for option in OPTIONS:
        # The value to parse and where it came from. An explicit None wins over the variable
        # (as every argument does) and asks for the default.
        if option.name in given:
            value, source = given[option.name], option.name
        elif option.env is not None and env.get(option.env, "").strip():
            value, source = env[option.env], option.env
        else:
            value, source = None, None
        if option.name == "port":  # None serves no endpoint, and who chose the port is kept
            if source is not None:
                chosen["port"] = None if value is None else option.parse(value, source)
                chosen["port_source"] = None if value is None else source
            else:
                chosen["port"] = DEFAULT_PORT  # read now: tests point it at a taken port
        elif value is not None and source is not None:
            parsed = option.parse(value, source)
            if option.fields:
                chosen.update(zip(option.fields, parsed, strict=True))
            else:
                chosen[option.name] = parsed
    return Options(name=name, **chosen)
