"""Every ``ASYNCFLOW_*`` environment variable is read here, and every option is validated here.

Precedence: an explicit argument, then the environment variable, then the default below. An
explicit ``None`` is an argument like any other: it means the option's default, whatever the
environment says (``port=None``: no endpoint at all).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
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
#: the block threshold's bounds, in seconds: finer than the loop monitor can see is noise, and
#: longer than an hour is no threshold at all
MIN_BLOCK_THRESHOLD = 0.001
MAX_BLOCK_THRESHOLD = 3600.0
#: the longest ``duration``, in seconds (a year): beyond it timers lose their meaning
MAX_DURATION = 31_536_000.0
#: the most percentiles one profile reports
MAX_PERCENTILES = 32
MAX_SAMPLING = 65_536
#: the longest host name (RFC 1035 allows 253 characters) or token accepted
_MAX_NAME = 255
_MAX_TOKEN = 4096

_ENV = {
    "percentiles": "ASYNCFLOW_PERCENTILES",
    "limit": "ASYNCFLOW_LIMIT",
    "format": "ASYNCFLOW_FORMAT",
    "output": "ASYNCFLOW_OUTPUT",
    "recent_logs": "ASYNCFLOW_RECENT_LOGS",
    "duration": "ASYNCFLOW_DURATION",
    "host": "ASYNCFLOW_HOST",
    "port": "ASYNCFLOW_PORT",
    "token": "ASYNCFLOW_TOKEN",
    "block_threshold": "ASYNCFLOW_BLOCK_THRESHOLD",
    "trace": "ASYNCFLOW_TRACE",
    "trace_events": "ASYNCFLOW_TRACE_EVENTS",
    "sampling": "ASYNCFLOW_SAMPLING",
    "allowed_hosts": "ASYNCFLOW_ALLOWED_HOSTS",
    "warn": "ASYNCFLOW_WARN",
    "otel": "ASYNCFLOW_OTEL",
    "include": "ASYNCFLOW_INCLUDE",
    "exclude": "ASYNCFLOW_EXCLUDE",
    "cpu": "ASYNCFLOW_CPU",
    "allocations": "ASYNCFLOW_ALLOCATIONS",
}

#: The warnings' thresholds that ``warn=`` may set, and what each takes: ``seconds`` (> 0, at
#: most an hour), ``share`` (a fraction in (0, 1]) or ``count`` (a whole number >= 1). The
#: defaults and meanings are those of ``asyncflow.views.lints.Thresholds``.
WARN_THRESHOLDS = {
    "long_poll": "seconds",
    "cpu_share": "share",
    "cpu_wall_share": "share",
    "blocked_share": "share",
    "starved_share": "share",
    "min_wait": "seconds",
    "unread_messages": "count",
    "cancel_share": "share",
    "cancel_min": "count",
    "executor_min_jobs": "count",
    "leak_min_live": "count",
    "leak_finish_share": "share",
    "contention_min_waits": "count",
}
_DISABLE = "ASYNCFLOW_DISABLE"
_NO_EXTENSIONS = "ASYNCFLOW_NO_EXTENSIONS"
_RUNTIME_DIR = "ASYNCFLOW_RUNTIME_DIR"
_ENDPOINT_PROCESS = "ASYNCFLOW_ENDPOINT_PROCESS"


class Reporter(Protocol):
    """Replaces the built-in report formats: receives the final snapshot when the profiler stops."""

    def report(self, snapshot: Any, /) -> None: ...


@dataclass(frozen=True, slots=True)
class Options:
    """A profiler's resolved options."""

    #: the profiler's name, shown in every report and status document
    name: str
    #: percentiles reported for poll and call durations, each in (0, 100]
    percentiles: tuple[float, ...] = DEFAULT_PERCENTILES
    #: rows in each table of the table report (not the loops'); 0 means all
    limit: int = DEFAULT_LIMIT
    #: exit report format: one of ``FORMATS``
    format: str = DEFAULT_FORMAT
    #: where the exit report goes: a file, "-" for standard output, None for the default (standard
    #: error for the table, standard output for JSON)
    output: str | None = None
    #: finished calls kept per future for its log
    recent_logs: int = DEFAULT_RECENT_LOGS
    #: replaces the built-in formats when set
    reporter: Reporter | None = None
    #: stop and report after this many seconds; None means run until stopped
    duration: float | None = None
    #: the address the endpoint binds to; anything but loopback needs a ``token``
    host: str = DEFAULT_HOST
    #: the endpoint's port; 0 picks a free one, None serves no endpoint at all
    port: int | None = DEFAULT_PORT
    #: who chose ``port``: ``"port"`` (an argument), ``"ASYNCFLOW_PORT"``, or None for the
    #: default, which gives way to a free port when it is taken
    port_source: str | None = None
    #: when set, every request must carry ``Authorization: Bearer <token>``
    token: str | None = None
    #: a poll (one step of a task) running longer than this many seconds is a blocked loop
    block_threshold: float = DEFAULT_BLOCK_THRESHOLD
    #: record a trace (polls, blocked loops, queue depths, loop lag, message flows) for
    #: Perfetto, served at ``/trace``
    trace: bool = False
    #: where the trace is written when the profiler stops; None: only served
    trace_output: str | None = None
    #: the trace recorder's ring: it keeps the newest this many events
    trace_events: int = DEFAULT_TRACE_EVENTS
    #: time one message (or stream item) in this many; 0 ("auto") adapts to each one's rate.
    #: Counts are exact either way.
    sampling: int = 0
    #: more host names the endpoint answers to (``Host``), beside loopback and ``host``; "*": any
    allowed_hosts: tuple[str, ...] = ()
    #: warning thresholds that differ from the defaults, as (name, value) pairs; see
    #: ``WARN_THRESHOLDS``
    warn: tuple[tuple[str, float], ...] = ()
    #: live reporters fed each collector tick on the profiler's thread
    #: (``asyncflow.render.reporters``)
    reporters: tuple[Any, ...] = ()
    #: export the figures as OpenTelemetry metrics (the ``otel`` extra; ``OTEL_*`` configure it)
    otel: bool = False
    #: whole-program mode tracks only tasks whose coroutine's module or qualified name matches
    #: one of these patterns (empty: every task); see ``asyncflow.filtering``
    include: tuple[str, ...] = ()
    #: ... and never those matching one of these (exclude wins over include)
    exclude: tuple[str, ...] = ()
    #: measure each poll's CPU time (the polling thread's CPU clock: a system call per poll)
    cpu: bool = False
    #: measure each poll's allocations through ``tracemalloc`` (slows the whole program);
    #: ``"blocks"`` also counts the net blocks each poll left in use (slower still)
    allocations: bool | str = False


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
    """Whether ``ASYNCFLOW_DISABLE`` asks for instrumentation to be left out entirely."""
    value = (os.environ if environ is None else environ).get(_DISABLE, "").strip().lower()
    return value not in ("", "0", "false", "no", "off")


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


def _warn(value: object, source: str) -> tuple[tuple[str, float], ...]:
    """``"long_poll=0.05,blocked_share=0.5"`` (or a mapping): thresholds of the warnings."""
    if isinstance(value, str):
        pairs: list[tuple[str, object]] = []
        for part in value.split(","):
            if not part.strip():
                continue
            key, sep, number = part.partition("=")
            if not sep:
                raise ValueError(
                    f"{source}={_shown(value)}: expected name=value pairs separated by commas, "
                    f"such as long_poll=0.05; names: {', '.join(WARN_THRESHOLDS)}"
                )
            pairs.append((key.strip(), number.strip()))
    elif isinstance(value, Mapping):
        pairs = list(value.items())
    else:
        raise ValueError(
            f"{source}={_shown(value)}: expected a mapping or 'name=value,...' of thresholds"
        )
    out: dict[str, float] = {}
    for key, raw in pairs:
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
    return tuple(sorted(out.items()))


def _format(value: object, source: str) -> str:
    if value not in FORMATS:
        raise ValueError(f"{source}={value!r}: expected one of {', '.join(FORMATS)}")
    return str(value)


def _output(value: object, source: str) -> str | None:
    """A path the report can be written to at exit, checked now: at exit it is too late to say.

    The directory must exist and be writable, the name must be one the file system takes, and
    an existing file must be writable; the file itself is neither created nor truncated here.
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
    return path


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
    known = {
        "percentiles",
        "limit",
        "format",
        "output",
        "recent_logs",
        "reporter",
        "duration",
        "host",
        "port",
        "token",
        "block_threshold",
        "trace",
        "trace_events",
        "sampling",
        "allowed_hosts",
        "warn",
        "reporters",
        "otel",
        "include",
        "exclude",
        "cpu",
        "allocations",
    }
    unknown = sorted(set(given) - known)
    if unknown:
        raise TypeError(
            f"unknown asyncflow option(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"name={name!r}: expected a non-empty string naming the profiled program")

    def pick(option: str) -> tuple[object, str] | None:
        """The value to parse and where it came from; None: the default. An explicit None
        wins over the variable (as every argument does) and asks for the default."""
        if option in given:
            value = given[option]
            return None if value is None else (value, option)
        var = _ENV.get(option)
        if var is not None and env.get(var, "").strip():
            return env[var], var
        return None

    fields: dict[str, Any] = {}
    if (p := pick("percentiles")) is not None:
        fields["percentiles"] = _percentiles(*p)
    if (p := pick("limit")) is not None:
        fields["limit"] = _int(*p, 0, 1_000_000, "a whole number >= 0 (0 shows every row)")
    if (p := pick("format")) is not None:
        fields["format"] = _format(*p)
    if (p := pick("output")) is not None:
        fields["output"] = _output(*p)
    if (p := pick("recent_logs")) is not None:
        fields["recent_logs"] = _int(
            *p, 0, MAX_RECENT_LOGS, f"a whole number from 0 to {MAX_RECENT_LOGS}"
        )
    if (p := pick("duration")) is not None:
        fields["duration"] = _duration(*p)
    if (p := pick("host")) is not None:
        fields["host"] = _host(*p)
    if given.get("port", 0) is None:
        fields["port"] = None  # port=None: serve no endpoint
    elif (p := pick("port")) is not None:
        fields["port"], fields["port_source"] = _port(*p), p[1]
    else:
        fields["port"] = DEFAULT_PORT  # read now, so that tests can point it at a taken port
    if (p := pick("token")) is not None:
        fields["token"] = _token(*p)
    if (p := pick("block_threshold")) is not None:
        fields["block_threshold"] = _block_threshold(*p)
    if (p := pick("trace")) is not None:
        fields["trace"], fields["trace_output"] = _trace(*p)
    if (p := pick("trace_events")) is not None:
        fields["trace_events"] = _int(
            *p, 1, MAX_TRACE_EVENTS, f"a whole number from 1 to {MAX_TRACE_EVENTS}"
        )
    if (p := pick("sampling")) is not None:
        fields["sampling"] = _sampling(*p)
    if (p := pick("allowed_hosts")) is not None:
        fields["allowed_hosts"] = _allowed_hosts(*p)
    if (p := pick("warn")) is not None:
        fields["warn"] = _warn(*p)
    if given.get("reporters") is not None:
        fields["reporters"] = _live_reporters(given["reporters"], "reporters")
    if (p := pick("otel")) is not None:
        fields["otel"] = _switch(*p)
    for option in ("include", "exclude"):
        if (p := pick(option)) is not None:
            from asyncflow.filtering import parse_patterns

            fields[option] = parse_patterns(*p)
    for option in ("cpu", "allocations"):
        if (p := pick(option)) is not None:
            if option == "allocations" and isinstance(p[0], str) and p[0].strip() == "blocks":
                fields[option] = "blocks"
            elif option == "allocations":
                try:
                    fields[option] = _switch(*p)
                except ValueError:
                    raise ValueError(
                        f"{p[1]}={_shown(p[0])}: expected true, false or blocks "
                        "(1/0, yes/no, on/off)"
                    ) from None
            else:
                fields[option] = _switch(*p)
    if given.get("reporter") is not None:
        fields["reporter"] = _reporter(given["reporter"], "reporter")
    return Options(name=name, **fields)
