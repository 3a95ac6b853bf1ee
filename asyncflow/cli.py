"""The ``asyncflow`` command: ``run`` a program profiled (or armed); ``ps``; ``attach``, ``detach``
and ``dump`` an armed process; ``top``; ``snapshot``; ``report``; ``replay``; ``diff``; ``mcp``.

Every mistake a user can make here (a missing program, a bad option, an unreachable endpoint,
a file that is not a snapshot) ends in one line on standard error and a non-zero exit code,
never in a traceback from asyncflow itself. A program run under ``asyncflow run`` ends as it
would under ``python``: its exit code, its traceback, and death by SIGINT or SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.machinery
import importlib.util
import os
import runpy
import socket
import sys
import threading
import traceback
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, NoReturn

import orjson

from asyncflow import _startup, config, schema
from asyncflow._children import report_on_sigterm, say
from asyncflow._version import __version__
from asyncflow.errors import AsyncflowError, BadInputError, PortInUseError
from asyncflow.render.diff import DiffInputError, add_diff_command, read_document
from asyncflow.serve import client

if TYPE_CHECKING:
    from asyncflow.render.record import Recording

__all__ = ["DEFAULT_URL", "main"]

DEFAULT_URL = f"http://{config.DEFAULT_HOST}:{config.DEFAULT_PORT}"
_URL_HELP = (
    "the endpoint [the profiler running on this machine, if only one runs (see 'asyncflow ps'); "
    f"else {DEFAULT_URL}]"
)
#: Exit codes: the program's own when it runs; these when asyncflow cannot get that far.
USAGE = 2
FAILED = 1


class _Usage(Exception):
    """A mistake on the command line or in its inputs: one line, exit code 2.

    ``prog`` is the command it is said by (``asyncflow run``); None: the one being run.
    """

    def __init__(self, message: str, prog: str | None = None) -> None:
        super().__init__(message)
        self.prog = prog


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _Usage(f"{message} (see '{self.prog} --help')", self.prog)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="asyncflow",
        description="A data-flow profiler for asyncio programs.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"asyncflow {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    run = commands.add_parser(
        "run",
        # no abbreviations: a program's own argument ("--b") must never be taken for one of
        # run's options, nor refused as an ambiguous prefix of two of them
        allow_abbrev=False,
        help="run a Python program with every task and queue profiled",
        description=(
            "Run a program as 'python script.py' (or 'python -m module') would, with the "
            "profiler started, every task on every event loop tracked and every asyncio queue "
            "instrumented. Options go before the program; everything after it is the "
            "program's own arguments. Defaults are in brackets; each option can also be set by "
            "its ASYNCFLOW_* environment variable (ASYNCFLOW_TOKEN sets the endpoint's token)."
        ),
    )
    run.add_argument("-m", dest="module", metavar="MODULE", help="run a module, as python -m")
    run.add_argument(
        "--name",
        help="the profile's name [the name the program gives its own profile, else the script "
        "or module name]",
    )
    for option in config.OPTIONS:  # every option's flag, from the options' table
        if option.flag is None:
            continue
        if option.kind == "switch":
            run.add_argument(
                option.flag, dest=option.name, action="store_true", help=option.flag_help
            )
        else:
            run.add_argument(
                option.flag,
                dest=option.name,
                default=None,
                action="append" if option.kind == "append" else "store",
                metavar=option.metavar,
                choices=option.choices,
                help=option.flag_help,
            )
    run.add_argument(
        "--no-queues", action="store_true", help="leave the program's asyncio queues alone"
    )
    run.add_argument(
        "--no-memory-streams",
        action="store_true",
        help="leave the program's anyio memory object streams alone",
    )
    run.add_argument(
        "--no-executors",
        action="store_true",
        help="leave run_in_executor, asyncio.to_thread and anyio's worker threads alone",
    )
    run.add_argument(
        "--no-locks",
        action="store_true",
        help="leave the program's locks, semaphores, conditions, events and barriers alone",
    )
    run.add_argument(
        "--no-never-awaited",
        action="store_true",
        help="do not count coroutines the program creates and never awaits",
    )
    run.add_argument(
        "--armed",
        action="store_true",
        help="record nothing until 'asyncflow attach PID' (the other options apply then): "
        "the program runs at its plain cost, listed by 'asyncflow ps' as armed",
    )
    run.add_argument("program", nargs=argparse.REMAINDER, help="script.py [args...], or args of -m")
    run.set_defaults(handler=_run)

    top = commands.add_parser(
        "top",
        help="live view of a running profiler",
        description="A live terminal view of a running profiler's endpoint. Keys: f futures, "
        "c channels, s streams, l loops, o sort, enter logs of the selected row, p pause, "
        "q quit.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    top.add_argument("url", nargs="?", default=argparse.SUPPRESS, help=_URL_HELP)
    top.add_argument("--token", default=None, help="bearer token [$ASYNCFLOW_TOKEN]")
    top.add_argument("--interval", type=float, default=0.5, help="seconds between refreshes")
    top.set_defaults(handler=_top)

    snap = commands.add_parser(
        "snapshot",
        help="save every document of a running profiler to a JSON file",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    snap.add_argument("url", nargs="?", default=argparse.SUPPRESS, help=_URL_HELP)
    snap.add_argument("-o", "--output", required=True, help="the file to write (- for stdout)")
    snap.add_argument("--token", default=None, help="bearer token [$ASYNCFLOW_TOKEN]")
    snap.set_defaults(handler=_snapshot)

    trace = commands.add_parser(
        "trace",
        help="save a running profiler's trace to a file for Perfetto",
        description="Save the trace a running profiler records (started with trace=..., "
        "ASYNCFLOW_TRACE or 'asyncflow run --trace') as a Chrome trace event JSON file: open it "
        "at https://ui.perfetto.dev or in chrome://tracing.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    trace.add_argument("url", nargs="?", default=argparse.SUPPRESS, help=_URL_HELP)
    trace.add_argument("-o", "--output", required=True, help="the file to write (- for stdout)")
    trace.add_argument("--token", default=None, help="bearer token [$ASYNCFLOW_TOKEN]")
    trace.set_defaults(handler=_trace)

    ps = commands.add_parser(
        "ps",
        help="list the profilers running on this machine",
        description="List the profilers with an endpoint that run on this machine for this user "
        "(each registers itself while it runs): pid, the parent's pid for a worker process "
        "profiled under its parent's 'asyncflow run' (listed after it), name, endpoint URL, "
        "whether it needs a token, how long it has run, and its command line.",
    )
    ps.add_argument("--json", action="store_true", help="print a JSON array instead of a table")
    ps.set_defaults(handler=_ps)

    report = commands.add_parser(
        "report",
        help="render a saved snapshot, a json exit report or a recording as the table report",
        description="Render a snapshot file (asyncflow snapshot), a json exit report, or a "
        "recording (asyncflow run --record) as the report: a recording's end state, or the "
        "moment --at gives.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    report.add_argument(
        "file", help="a file written by 'asyncflow snapshot', format=json or --record"
    )
    moment = report.add_mutually_exclusive_group()
    moment.add_argument(
        "--at",
        type=_seconds,
        default=None,
        metavar="SECONDS",
        help="a recording as it was this many seconds after the start [its end]",
    )
    moment.add_argument(
        "--between",
        type=_seconds,
        nargs=2,
        default=None,
        metavar=("A", "B"),
        help="a recording as it was at B, with every finding that held from A to B",
    )
    report.add_argument(
        "--format", default="table", choices=("table", "json", "json-pretty"), help="output"
    )
    report.add_argument("--limit", default=None, help="rows shown in each table; 0 for all [15]")
    report.add_argument("--percentiles", default=None, help="percentiles shown [50,95,99]")
    report.set_defaults(handler=_report)

    replay = commands.add_parser(
        "replay",
        help="top over a recording, with time controls",
        description="The live view (asyncflow top) over a recording made with 'asyncflow run "
        "--record FILE' or record=FILE. Keys: space play or pause, right/left step one moment, "
        "n/N the next/previous moment a finding begins, home/end the first/last moment, and "
        "top's own keys.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    replay.add_argument("file", help="a recording")
    replay.add_argument(
        "--at", type=_seconds, default=0.0, metavar="SECONDS", help="start at this moment"
    )
    replay.add_argument(
        "--speed", type=_speed, default=1.0, help="seconds of the recording per second played"
    )
    replay.add_argument(
        "--web",
        action="store_true",
        help="serve the web page over the recording on 127.0.0.1 (a free port, printed) "
        "instead of the terminal view; Ctrl-C stops it",
    )
    replay.set_defaults(handler=_replay)
    attach = commands.add_parser(
        "attach",
        help="profile an armed process from now on, and print its endpoint",
        description="Turn profiling on in a process of yours that runs armed ('asyncflow run "
        "--armed', or asyncflow.arm()): every task, queue, primitive and executor job it makes "
        "from now on is tracked, the tasks it has already are listed with what they wait on, and "
        "its endpoint serves on 127.0.0.1 (printed). 'asyncflow detach PID' turns it off.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    attach.add_argument("pid", type=_pid, help="the armed process")
    attach.add_argument(
        "--port",
        type=_port,
        default=None,
        help="the endpoint's port (0: a free one) [the armed options', else 6780 or a free one]",
    )
    attach.add_argument(
        "--remote-exec",
        action="store_true",
        help="arm the process first through sys.remote_exec (Python 3.14+ only; untested here)",
    )
    attach.set_defaults(handler=_attach)

    detach = commands.add_parser(
        "detach",
        help="stop profiling an attached process, and print its report",
        description="Turn profiling off in a process 'asyncflow attach' attached: the "
        "profiler stops, whole-program tracking is taken back, and the process runs armed "
        "again. The session's report is printed on standard output.",
    )
    detach.add_argument("pid", type=_pid, help="the attached process")
    detach.set_defaults(handler=_detach)

    dump = commands.add_parser(
        "dump",
        help="print every task of an armed or attached process and what it waits on",
        description="Read every task of a process of yours that runs armed or attached, once: "
        "what each one runs, where it waits and on what, then the waiting tasks with who holds "
        "or can release what they wait on (deadlocks first).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    dump.add_argument("pid", type=_pid, help="the armed or attached process")
    dump.add_argument("--format", default="text", choices=("text", "json"), help="output")
    dump.add_argument(
        "--limit", type=_limit, default=0, help="tasks listed, and groups of waiting tasks; 0: all"
    )
    dump.set_defaults(handler=_dump)
    add_diff_command(commands)
    # listed here for 'asyncflow --help'; main() hands 'asyncflow mcp ...' to the server's own
    # parser before this one parses, so its import (the SDK, aiohttp) is paid only by it
    commands.add_parser(
        "mcp",
        add_help=False,
        help="serve profilers and saved runs to a coding agent over MCP (stdio)",
    )
    return parser


def _pid(text: str) -> int:
    """A process id: a whole number > 0 (argparse says the error)."""
    if not config.is_whole_number(text) or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a process id (a whole number > 0)")
    return int(text)


def _port(text: str) -> int:
    if not config.is_whole_number(text) or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a port from 0 to 65535")
    return int(text)


def _limit(text: str) -> int:
    if not config.is_whole_number(text):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number >= 0")
    return int(text)


def _seconds(text: str) -> float:
    """A moment of a recording: seconds >= 0 (argparse says the error)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not seconds (a number >= 0)") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not seconds (a number >= 0)")
    return value


def _speed(text: str) -> float:
    value = _seconds(text)
    if not 0.01 <= value <= 1000:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a speed from 0.01 to 1000")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``asyncflow`` command; returns the exit code.

    Raises:
        KeyboardInterrupt: the program run by ``asyncflow run`` was interrupted; its traceback
            and the report are printed already, and the interpreter, letting it through, ends
            the process by SIGINT as it ends an interrupted program.
    """
    parser = _parser()
    prog = parser.prog
    try:
        argv = list(sys.argv[1:] if argv is None else argv)
        if argv[:1] == ["mcp"]:
            from asyncflow.serve import mcp

            return mcp.main(argv[1:])
        argv, module_args = _split_at_module(parser, argv)
        args, unknown = parser.parse_known_args(argv)
        if module_args is not None:  # everything after "-m MODULE" is the module's own
            args.program = module_args
        if args.command is not None:
            prog = f"{parser.prog} {args.command}"
        if unknown:  # said by the subcommand, whose help lists what it takes
            raise _Usage(f"unrecognized arguments: {' '.join(unknown)} (see '{prog} --help')")
        if args.command is None:
            parser.print_help(sys.stderr)
            return USAGE
        handler: Callable[[argparse.Namespace], int] = args.handler
        return handler(args)
    except (_Usage, AsyncflowError) as exc:
        said_by = exc.prog if isinstance(exc, _Usage) and exc.prog else prog
        print(f"{said_by}: error: {exc}", file=sys.stderr)
        return USAGE if isinstance(exc, _Usage | BadInputError) else FAILED


# -- asyncflow run -----------------------------------------------------------------------------


def _split_at_module(
    parser: argparse.ArgumentParser, argv: list[str]
) -> tuple[list[str], list[str] | None]:
    """``run [options] -m MODULE ARGS``: the arguments up to the module's name, and the
    module's own arguments (None when there is no ``-m`` among run's options).

    As ``python -m``, everything after the module's name is the module's: ``asyncflow run -m
    uvicorn --port 8000 app:app`` must not set asyncflow's ``--port``, nor refuse gunicorn's
    ``-k``. run's options are walked as argparse reads them (an option that takes a value takes
    the next word); a script's name ends them, as does ``--``.
    """
    if "run" not in argv:
        return argv, None
    start = argv.index("run") + 1
    if any(not word.startswith("-") for word in argv[: start - 1]):
        return argv, None  # "run" is not the command here
    takes_value = _options_taking_a_value(parser)
    i = start
    while i < len(argv):
        word = argv[i]
        if word == "--" or not word.startswith("-"):
            return argv, None
        if word == "-m":
            return argv[: i + 2], argv[i + 2 :]
        if word.startswith("-m") and not word.startswith("--"):
            return argv[: i + 1], argv[i + 1 :]
        i += 2 if word in takes_value else 1
    return argv, None


def _options_taking_a_value(parser: argparse.ArgumentParser) -> set[str]:
    """The option strings of ``run`` that take a value in the next word."""
    for action in parser._actions:  # the subcommands' choices hold each command's parser
        if isinstance(action, argparse._SubParsersAction):
            run: argparse.ArgumentParser = action.choices["run"]
            return {
                option
                for each in run._actions
                if each.option_strings and each.nargs != 0
                for option in each.option_strings
            }
    return set()


def _run(args: argparse.Namespace) -> int:
    program: list[str] = list(args.program)
    if args.module is None and program[:1] == [
        "-m"
    ]:  # "run [options] -m module ..." after REMAINDER
        if len(program) < 2:
            raise _Usage("-m needs a module name")
        args.module, program = program[1], program[2:]
    if args.module is not None:
        target, argv0 = args.module, args.module
        _program_path(None)  # before the lookup: python -m finds modules in the current directory
        spec = _find_module(args.module)
        if spec.submodule_search_locations is not None:  # a package: python -m runs its __main__
            _find_module(f"{args.module}.__main__", package=args.module)
        program_file = spec.origin
        name = args.name or args.module
    else:
        if program[:1] == ["--"]:  # "run [options] -- script.py": the options end there
            program = program[1:]
        if not program:
            raise _Usage("give a script to run (asyncflow run script.py [args...]) or -m module")
        target, program = program[0], program[1:]
        path = Path(target)
        if path.is_dir() and not (path / "__main__.py").is_file():
            raise _Usage(f"{target!r} is a directory with no __main__.py to run")
        if not path.is_file() and not path.is_dir():
            raise _Usage(f"no such file: {target!r}")
        argv0 = target
        name = args.name or path.stem
        _program_path(target)
        program_file = target
    _outputs_apart(args, program_file)
    run: Callable[[], object]
    if args.module is not None:
        run = functools.partial(runpy.run_module, target, run_name="__main__", alter_sys=True)
    else:
        run = functools.partial(_run_script, target)
    return _profiled(args, name, target, run, [argv0, *program])


def _find_module(module: str, package: str | None = None) -> importlib.machinery.ModuleSpec:
    """``module``'s spec, as ``python -m`` looks it up (a package it is in is imported, and may
    fail: that is the program's error, said in one line). ``package``: the package whose
    ``__main__`` this is."""
    try:
        spec = importlib.util.find_spec(module)
    except Exception as exc:  # (the package's own __init__ raised)
        raise _Usage(f"cannot import module {module!r}: {type(exc).__name__}: {exc}") from None
    if spec is None and package is not None:
        raise _Usage(f"no module named {module!r}: {package!r} is a package and cannot be run")
    if spec is None:
        raise _Usage(f"no module named {module!r}")
    return spec


def _outputs_apart(args: argparse.Namespace, program: str | None) -> None:
    """Refuse, before anything is written, an output file (``--output``, ``--trace``,
    ``--record``) that is the program itself or another output's: the recording is made as the
    program starts and would truncate the script, and two outputs would overwrite each other."""
    given = args.output not in (None, "", "-")
    if given and (args.format or os.environ.get("ASYNCFLOW_FORMAT", "")).lower() == "none":
        raise _Usage(f"--output {args.output!r} with --format none: nothing would be written")
    taken: dict[str, str] = {}
    if program is not None and os.path.exists(program):
        taken[os.path.realpath(program)] = "the program itself"
    words = ("", "-", "1", "true", "yes", "on", "0", "false", "no", "off")  # no file named
    for flag, value in (
        ("--trace", args.trace),
        ("--output", args.output),
        ("--record", args.record),
    ):
        if not isinstance(value, str) or value.strip().lower() in words:
            continue
        real = os.path.realpath(value)
        if real in taken:
            raise _Usage(f"{flag} {value!r} is {taken[real]}: give each output a file of its own")
        taken[real] = f"{flag}'s file"


def _profiled(
    args: argparse.Namespace,
    name: str,
    target: str,
    run: Callable[[], object],
    argv: list[str] | None,
) -> int:
    """``run()`` the program (``target``, a script or ``args.module``) profiled as a whole:
    the body of ``asyncflow run``, also run by the processes the program starts (see
    :mod:`asyncflow._children`), with ``argv`` None there (a worker's is set already)."""
    import asyncflow
    from asyncflow import _children
    from asyncflow.instrumentation.every_loop import track_every_loop
    from asyncflow.instrumentation.memory import instrument_memory_streams
    from asyncflow.instrumentation.own_code import track_own_code

    options: dict[str, object] = {}
    for option in config.OPTIONS:  # the flags given, as profile()'s arguments
        if option.flag is None:
            continue
        value = getattr(args, option.name)
        if option.kind == "switch":
            value = True if value else None  # not given: the variable may still turn it on
        elif option.kind == "append":
            value = ",".join(value) if value else None
        if value is not None:
            options[option.name] = value
    if getattr(args, "armed", False):
        return _armed_run(args, name, target, run, argv, options)
    try:
        profiler = asyncflow.profile(name, **options)
    except (ValueError, TypeError) as exc:
        raise _Usage(_flagged(str(exc), options)) from None
    _check_host(profiler.options, "--host" if args.host is not None else "ASYNCFLOW_HOST")
    profiler.hosting = True  # the program's own asyncflow.profile() joins this one
    profiler.adopts_name = args.name is None  # and names the profile, unless --name did
    profiler.child_of = getattr(args, "child_of", None)  # a worker: its parent's pid, its role
    try:
        profiler.start()
    except PortInUseError as exc:
        raise AsyncflowError(exc.said_as("--port" if args.port else exc.source)) from None
    if config.disabled():  # start() started nothing: say so, and run the program as it is
        say(f"{config.disabled_because()}: {name!r} runs without profiling")
    else:
        say(f"asyncflow: profiling {name!r}; endpoint: {profiler.url or 'not served'}")
    every_loop = track_every_loop(
        executors=not args.no_executors, by_route=not profiler.options.no_routes
    )
    queues = None if args.no_queues else asyncflow.instrument_queues()
    streams = None if args.no_memory_streams else instrument_memory_streams()
    never_awaited = None if args.no_never_awaited else asyncflow.track_never_awaited()
    locks = None if args.no_locks else asyncflow.instrument_locks()
    own = None if profiler.options.no_own_code else track_own_code(target, args.module)
    children = _children.follow(profiler, args, target, _profiled)
    undo_sigterm = report_on_sigterm(profiler.stop, note=argv is not None)  # (the parent)
    if argv is not None:
        sys.argv = argv
    shadowed = _shadowed_by_the_program() if argv is not None else []  # (said by the parent)
    if shadowed:
        files, one = ", ".join(file for _, file in shadowed), len(shadowed) == 1
        names = ", ".join(name for name, _ in shadowed)
        say(
            f"asyncflow: the program's {files} would replace the standard library's {names} "
            f"run plainly, but asyncflow loaded the standard library's first: `import` gets "
            f"{'that one' if one else 'those'} here (rename the program's "
            f"{'module' if one else 'modules'} to run it under asyncflow)"
        )
    try:
        code, interrupted = _run_program(run)
    finally:
        undo_sigterm()
        every_loop.undo()
        if queues is not None:
            queues.undo()
        if streams is not None:
            streams.undo()
        if locks is not None:
            locks.undo()
        if own is not None:
            own.undo()
        profiler.stop()
        children.undo()  # after the report: where the children's reports went
        if never_awaited is not None:
            never_awaited.undo()
    if interrupted is not None:
        _exit_as_interrupted(interrupted)
    return code


def _run_program(run: Callable[[], object]) -> tuple[int, BaseException | None]:
    """Run the program as the interpreter would: its exit code, and the KeyboardInterrupt
    that ended it (to end the process with), if one did; its uncaught exception printed."""
    try:
        run()
    except SystemExit as exc:
        return _exit_code(exc.code), None
    except BaseException as exc:
        _print_program_error(exc)
        # exactly the type the interpreter checks
        return FAILED, exc if type(exc) is KeyboardInterrupt else None
    return 0, None


def _armed_run(
    args: argparse.Namespace,
    name: str,
    target: str,
    run: Callable[[], object],
    argv: list[str] | None,
    options: dict[str, object],
) -> int:
    """``asyncflow run --armed``: the program runs armed (see :mod:`asyncflow._armed`), with
    the options given kept for the profiler ``asyncflow attach`` starts."""
    from asyncflow import _armed

    parts = _armed.Parts(
        executors=not args.no_executors,
        queues=not args.no_queues,
        memory_streams=not args.no_memory_streams,
        locks=not args.no_locks,
        never_awaited=not args.no_never_awaited,
        program=(target, args.module),  # whose modules imported after an attach are tracked
    )
    try:
        _armed.arm(name, _parts=parts, **options)
    except (ValueError, TypeError) as exc:
        raise _Usage(_flagged(str(exc), options)) from None
    if config.disabled():
        say(f"{config.disabled_because()}: {name!r} runs without profiling")
    else:
        say(
            f"asyncflow: {name!r} runs armed (pid {os.getpid()}): 'asyncflow attach "
            f"{os.getpid()}' profiles it"
        )
    # SIGTERM while attached: the report first, as under 'asyncflow run' (armed: the socket
    # and the registry file are taken away, then it dies by SIGTERM as before)
    undo_sigterm = report_on_sigterm(_armed.disarm)
    if argv is not None:
        sys.argv = argv
    try:
        code, interrupted = _run_program(run)
    finally:
        undo_sigterm()
        _armed.disarm()
    if interrupted is not None:
        _exit_as_interrupted(interrupted)
    return code


def _run_script(script: str) -> None:
    """Run a script as ``python script`` runs it, in a ``__main__`` module of its own.

    Python (3.9+) makes ``__file__`` and the code's file name absolute by joining the path as
    given to the current directory, without normalising it or resolving symlinks, and keeps
    ``sys.argv[0]`` as given: a script that changes directory still finds the files beside it.
    ``runpy.run_path`` would keep the path as given (and set ``sys.argv[0]`` to what it runs),
    so only a zip file or directory, which Python runs through the import system too, goes
    there.
    """
    import builtins
    import io
    import pkgutil
    import types
    from importlib.machinery import SourceFileLoader, SourcelessFileLoader

    from asyncflow.instrumentation.own_code import compile_source

    if pkgutil.get_importer(script) is not None:
        runpy.run_path(script, run_name="__main__")
        return
    path = script if os.path.isabs(script) else os.path.join(os.getcwd(), script)
    with io.open_code(path) as file:
        code = pkgutil.read_code(file)  # a .pyc, as python runs one
    loader: SourceFileLoader | SourcelessFileLoader
    if code is None:
        with io.open_code(path) as file:
            # dont_inherit: this module's own __future__ imports are no part of the program
            code = compile_source(file.read(), path)  # (the own-code decorators added, if on)
        loader = SourceFileLoader("__main__", path)
    else:
        loader = SourcelessFileLoader("__main__", path)
    main = types.ModuleType("__main__")
    main.__dict__.update(
        __file__=path,
        __cached__=None,
        __loader__=loader,
        __package__=None,
        __spec__=None,
        __builtins__=builtins,
    )
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = main
    try:
        exec(code, main.__dict__)
    finally:
        if saved is None:
            sys.modules.pop("__main__", None)
        else:
            sys.modules["__main__"] = saved


def _shadowed_by_the_program() -> list[tuple[str, str]]:
    """The standard library's modules that a module in the program's directory (first on
    ``sys.path``) would replace when run plainly, but that asyncflow loaded before it ran:
    ``import http`` gets the standard library's ``http`` then, not the program's ``http.py``."""
    if sys.flags.safe_path or not sys.path:
        return []
    entry = sys.path[0]
    try:
        files = os.listdir(entry)
    except OSError:
        return []
    found = []
    for file in files:
        name = file.removesuffix(".py")
        if name == file and not os.path.isfile(os.path.join(entry, file, "__init__.py")):
            continue
        if (
            name in sys.stdlib_module_names
            and name not in _startup.MODULES_BEFORE
            and name in sys.modules
        ):
            where = getattr(sys.modules[name], "__file__", None) or ""
            if (
                os.path.dirname(os.path.dirname(where) if where.endswith("__init__.py") else where)
                != entry
            ):
                found.append((name, file if file.endswith(".py") else f"{file}/"))
    return sorted(found)


def _program_path(script: str | None) -> None:
    """Put first on ``sys.path`` what ``python`` puts there for the program.

    That is the script's directory (symlinks resolved), or the current directory for ``-m``;
    nothing under ``python -P``/``-I``. It replaces the entry put there for asyncflow itself
    (the directory of the ``asyncflow`` script, or the current one for ``python -m asyncflow``),
    which ``python script.py`` would not have.
    """
    if sys.flags.safe_path:
        return
    entry = os.getcwd() if script is None else os.path.dirname(os.path.realpath(script))
    if sys.path:
        sys.path[0] = entry
    else:
        sys.path.append(entry)


def _flagged(message: str, given: Mapping[str, object]) -> str:
    """An option's error as the command line says it: ``port='x': ...`` -> ``--port 'x': ...``.

    Messages about values from ``ASYNCFLOW_*`` variables already name the variable.
    """
    for option in given:
        flag = "--" + option.replace("_", "-")
        if message.startswith(f"{option}="):
            return f"{flag} {message[len(option) + 1 :]}"
        if message.startswith(f"{option}:"):
            return flag + message[len(option) :]
    return message


def _is_address(host: str) -> bool:
    """Whether ``host``, all digits and dots, is an IPv4 address the system takes (``127.1``
    is ``127.0.0.1`` to it, as to ``ping``)."""
    try:
        socket.inet_aton(host)
    except OSError:
        return False
    return True


def _check_host(options: config.Options, source: str) -> None:
    """Refuse, as a bad option, a host the endpoint cannot serve on, before the program starts.

    Args:
        options: the resolved options.
        source: where the host came from, for the message (``--host`` or ``ASYNCFLOW_HOST``).
    """
    if options.port is None:
        return
    from asyncflow.serve.server import is_loopback

    said = f"{source} {options.host}" if source.startswith("--") else f"{source}={options.host}"
    if options.host.replace(".", "").isdigit() and not _is_address(options.host):
        raise _Usage(f"{said}: not an IPv4 address (numbers, not a name, and none past 255)")
    if options.token is None and not is_loopback(options.host):
        raise _Usage(
            f"{said} serves other machines too: set ASYNCFLOW_TOKEN to a secret every request "
            "must present, or serve on 127.0.0.1"
        )
    try:
        addresses = socket.getaddrinfo(
            options.host, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except (OSError, UnicodeError) as exc:
        raise _Usage(f"{said}: cannot serve there: {_reason(exc)}") from None
    for family, kind, proto, _, address in addresses:
        # Bind every address the endpoint would (port 0: nothing is taken for long).
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.bind(address)
        except OSError as exc:
            raise _Usage(
                f"{said}: cannot serve there: {_reason(exc)} (is it an address of this machine?)"
            ) from None


def _reason(exc: BaseException) -> str:
    strerror = exc.strerror if isinstance(exc, OSError) else None
    return str(strerror or exc)


def _exit_as_interrupted(interrupted: BaseException) -> NoReturn:
    """Let the program's KeyboardInterrupt reach the interpreter, which then ends the process
    as it ends an interrupted program: after its usual shutdown (threads joined, ``atexit``,
    streams flushed), by SIGINT, so that a shell sees 130 and a script loop stops too. Its
    traceback is printed already: the interpreter's own printing is skipped once.
    """
    hook = sys.excepthook

    def printed_already(
        typ: type[BaseException], value: BaseException, tb: TracebackType | None
    ) -> None:
        sys.excepthook = hook
        if value is not interrupted:
            hook(typ, value, tb)

    sys.excepthook = printed_already
    raise interrupted


def _exit_code(code: object) -> int:
    """What the interpreter makes of ``sys.exit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _print_program_error(exc: BaseException) -> None:
    """The program's uncaught exception, printed as Python prints it: through ``sys.excepthook``
    (the program's own, if it set one), without asyncflow's and runpy's frames."""
    tb = exc.__traceback__
    here = {__file__, runpy.__file__, "<frozen runpy>"}
    while tb is not None and tb.tb_frame.f_code.co_filename in here:
        tb = tb.tb_next
    exc.__traceback__ = tb
    hook = getattr(sys, "excepthook", None)
    try:
        if hook is None:
            raise RuntimeError("lost sys.excepthook")
        hook(type(exc), exc, tb)
    except BaseException as failure:  # as Python does when the hook itself fails
        print("Error in sys.excepthook:", file=sys.stderr)
        traceback.print_exception(failure)
        print("\nOriginal exception was:", file=sys.stderr)
        traceback.print_exception(type(exc), exc, tb)


# -- asyncflow snapshot / report ---------------------------------------------------------------


def _check_url(url: str) -> None:
    if not url.startswith(("http://", "https://")):
        raise _Usage(f"{url!r} is not an endpoint URL; give one like {DEFAULT_URL}")
    try:  # a host and port that parse: 'http://[::1' or ':abc' is said here, in one line
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018  (raises for a port that is not one)
    except ValueError as exc:
        raise _Usage(
            f"{url!r} is not an endpoint URL ({exc}); give one like {DEFAULT_URL}"
        ) from None
    if not parts.hostname:
        raise _Usage(f"{url!r} names no host; give one like {DEFAULT_URL}")


def fetch(url: str, path: str, token: str | None, timeout: float = 10.0) -> Any:
    """GET a document from an endpoint; raises AsyncflowError with a one-line reason."""
    _check_url(url)
    if token is not None and any(c in token for c in "\r\n\x00"):
        raise _Usage("the token holds a line break or a NUL character: no header can carry it")
    try:
        return client.get_json(url, path, token, timeout)
    except client.FetchError as exc:
        if exc.refused:
            raise _Unanswered(
                f"nothing answers at {url}: is the profiler running, with its endpoint there?"
            ) from None
        raise


class _Unanswered(AsyncflowError):
    """Nothing listens at the endpoint's address (the connection was refused)."""


def _fetch_picked(args: argparse.Namespace, command: str, path: str, timeout: float) -> Any:
    """``path`` from the endpoint given, else from the one :func:`_pick_url` picks; with none
    given and none registered, nothing answering is said to be no profiler running."""
    given = getattr(args, "url", None) is not None
    args.url = _pick_url(args, command)
    try:
        return fetch(args.url, path, _token(args), timeout=timeout)
    except _Unanswered:
        if given:
            raise
        from asyncflow.serve import registry

        if registry.entries():
            raise
        raise AsyncflowError(
            f"no profiler is running here ('asyncflow ps' lists none, and nothing answers at "
            f"{args.url}): start one, e.g. with 'asyncflow run script.py', or give its URL"
        ) from None


def _token(args: argparse.Namespace) -> str | None:
    token: str | None = args.token or os.environ.get("ASYNCFLOW_TOKEN") or None
    return token


def _snapshot(args: argparse.Namespace) -> int:
    document = _fetch_picked(args, "snapshot", "/snapshot", timeout=10.0)
    try:
        schema.load(schema.Snapshot, document)
    except schema.DocumentError as exc:
        raise AsyncflowError(
            f"{args.url} answered something that is not a snapshot: {exc}"
        ) from None
    _write_document(args.output, document)
    from asyncflow.render.report import counted

    futures = counted(document["futures"]["total"], "future")
    print(f"asyncflow: saved {futures} from {args.url} to {args.output}", file=sys.stderr)
    return 0


def _write_document(output: str, document: object) -> None:
    """Write a fetched document to ``output``, or to standard output for ``-`` (as ``run
    --output -`` does)."""
    data = orjson.dumps(document)
    try:
        if output == "-":
            sys.stdout.buffer.write(data + b"\n")
            sys.stdout.flush()
        else:
            Path(output).write_bytes(data)
    except OSError as exc:
        raise _Usage(f"cannot write {output!r}: {exc.strerror or exc}") from None


def _trace(args: argparse.Namespace) -> int:
    document = _fetch_picked(args, "trace", "/trace", timeout=60.0)
    if not isinstance(document, dict) or not isinstance(document.get("traceEvents"), list):
        raise AsyncflowError(f"{args.url} answered something that is not a trace")
    _write_document(args.output, document)
    meta = document.get("metadata", {}).get("asyncflow", {})
    from asyncflow.render.report import counted

    events = counted(len(document["traceEvents"]), "trace event")
    print(
        f"asyncflow: saved {events} ({meta.get('dropped', 0)} dropped) from "
        f"{args.url} to {args.output}; open it at https://ui.perfetto.dev",
        file=sys.stderr,
    )
    return 0


def read_snapshot(path: str) -> schema.Snapshot:
    """A snapshot file (or a ``json`` exit report) as a :class:`~asyncflow.schema.Snapshot`."""
    try:
        return read_document(path, ignore_unknown=False)
    except DiffInputError as exc:
        raise _Usage(str(exc)) from None


def _report(args: argparse.Namespace) -> int:
    from asyncflow.render.report import render

    given = {
        k: v
        for k, v in {"limit": args.limit, "percentiles": args.percentiles}.items()
        if v is not None
    }
    try:
        options = config.resolve_options("report", given, {})
    except ValueError as exc:
        raise _Usage(_flagged(str(exc), given)) from None
    snapshot = _read_moment(args)
    held = _held_percentiles(snapshot)
    percentiles = options.percentiles
    if not args.percentiles:
        percentiles = held or percentiles
    elif held and not set(percentiles) <= set(held):
        # A snapshot keeps percentiles, not histograms: others cannot be computed from it.
        listed = [f"p{q:g}" for q in held]
        names = listed[0] if len(listed) == 1 else f"{', '.join(listed[:-1])} and {listed[-1]}"
        raise _Usage(
            f"--percentiles {args.percentiles}: {args.file!r} holds {names} only (a profile "
            "keeps the percentiles it was started with: percentiles= or ASYNCFLOW_PERCENTILES)"
        )
    sys.stdout.write(render(snapshot, args.format, percentiles, options.limit))
    return 0


def _read_moment(args: argparse.Namespace) -> schema.Snapshot:
    """The snapshot ``report`` renders: the file's, or a recording's at the moment asked."""
    from asyncflow.render import record

    if not record.is_recording(args.file):
        if args.at is not None or args.between is not None:
            flag = "--at" if args.at is not None else "--between"
            raise _Usage(
                f"{flag}: {args.file!r} is not a recording, which alone has moments (record one "
                "with 'asyncflow run --record FILE' or record=FILE)"
            )
        return read_snapshot(args.file)
    recording = _read_recording(args.file)
    since = None
    if args.between is not None:
        start, end = args.between
        if start > end:
            raise _Usage(f"--between {start:g} {end:g}: A must not be after B")
        since, index = recording.index_at(start), recording.index_at(end)
    elif args.at is not None:
        index = recording.index_at(args.at)
    else:
        index = len(recording.frames) - 1
    frame = recording.frames[index]
    asked = args.between[1] if args.between is not None else args.at
    if asked is not None and asked > recording.duration:
        print(
            f"asyncflow: {args.file}: {asked:g} s is past the recording's end "
            f"({recording.duration:.2f} s): its end state is shown",
            file=sys.stderr,
        )
    if frame.stale:
        oldest = min(frame.stale.values())
        names = ", ".join(sorted(frame.stale))
        print(
            f"asyncflow: {args.file}: {names} as recorded at {oldest:.2f} s or later (left out "
            "of later moments to keep the recording within its budget)",
            file=sys.stderr,
        )
    what = "the end state" if frame.final else f"the moment at {frame.t:.2f} s"
    if since is not None:
        what += f", with the findings from {recording.frames[since].t:.2f} s"
    print(
        f"asyncflow: {args.file}: {what} (of {recording.duration:.2f} s recorded)",
        file=sys.stderr,
    )
    return recording.snapshot(index, since)


def _read_recording(path: str) -> Recording:
    """A recording read, what was odd about it said on standard error."""
    from asyncflow.render import record

    recording = record.read_recording(path)
    for note in recording.notes:
        print(f"asyncflow: {path}: {note}", file=sys.stderr)
    return recording


def _held_percentiles(snapshot: schema.Snapshot) -> tuple[float, ...]:
    """The percentiles a snapshot's futures were recorded with, in order."""
    keys: set[str] = set()
    for entry in snapshot.futures.futures:
        keys.update(entry.poll_duration_ns, entry.call_duration_ns)
    held: set[float] = set()
    for key in keys:
        try:
            held.add(float(key.removeprefix("p")))
        except ValueError:
            continue
    return tuple(sorted(held))


# -- asyncflow ps, and finding the endpoint when no URL is given -------------------------------


def _age(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"


def _ps_table(running: Sequence[Any], numbered: bool = False) -> str:
    import shlex
    import time

    now = time.time()
    rows: list[list[str]] = [["#"] if numbered else []]
    rows[0] += ["PID", "PARENT", "NAME", "URL", "TOKEN", "UP", "COMMAND"]
    for number, entry in enumerate(running, 1):
        rows.append([str(number)] if numbered else [])
        rows[-1] += [
            str(entry.pid),
            "-" if entry.parent is None else str(entry.parent),
            entry.name,
            entry.url or "(armed)",
            "yes" if entry.token else "no",
            _age(now - entry.started),
            shlex.join(entry.argv),
        ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = [
        "  ".join([*(cell.ljust(w) for cell, w in zip(row, widths, strict=False)), row[-1]])
        for row in rows
    ]
    return "\n".join(line.rstrip() for line in lines) + "\n"


def _families(running: Sequence[Any]) -> list[Any]:
    """``running`` (oldest first) with each worker process right after its parent."""
    listed = {entry.pid for entry in running}
    children: dict[int, list[Any]] = {}
    for entry in running:
        if entry.parent in listed:
            children.setdefault(entry.parent, []).append(entry)
    ordered: list[Any] = []

    def add(entry: Any) -> None:
        ordered.append(entry)
        for child in children.pop(entry.pid, []):
            add(child)

    for entry in running:
        if entry.parent not in listed:
            add(entry)
    return ordered


def _ps(args: argparse.Namespace) -> int:
    from asyncflow.serve import registry

    running = _families(registry.entries())
    if args.json:
        sys.stdout.write(orjson.dumps(running, option=orjson.OPT_INDENT_2).decode() + "\n")
    elif running:
        sys.stdout.write(_ps_table(running))
    else:
        folder = registry.directory()
        why = registry.unusable(folder)
        if why is not None:  # profilers run, but none registers there
            raise _Usage(
                f"the registry {str(folder)!r} {why}: no profiler is listed there; set "
                "ASYNCFLOW_RUNTIME_DIR to a directory of your own (mode 0700)"
            )
        print(f"asyncflow: no profiler is running here ({folder})", file=sys.stderr)
    return 0


def _pick_url(args: argparse.Namespace, command: str) -> str:
    """The URL given, else that of the one profiler running here, else (none running) the
    default; several running: the user picks one, or (not at a terminal) is told to give one."""
    url: str | None = getattr(args, "url", None)
    if url is not None:
        return url
    from asyncflow.serve import registry

    running = _families([e for e in registry.entries() if not e.armed])  # armed: no endpoint
    if not running:
        return DEFAULT_URL
    if len(running) == 1:
        return str(running[0].url)
    if not (sys.stdin.isatty() and sys.stderr.isatty()):
        listed = ", ".join(f"{e.name} (pid {e.pid}) at {e.url}" for e in running[:5])
        more = f" and {len(running) - 5} more" if len(running) > 5 else ""
        raise _Usage(
            f"{len(running)} profilers run here: {listed}{more}; give one's URL "
            f"(asyncflow {command} URL; 'asyncflow ps' lists them)"
        )
    sys.stderr.write(f"{len(running)} profilers run here:\n" + _ps_table(running, numbered=True))
    try:
        answer = input(f"which one? [1-{len(running)}] ").strip()
    except (EOFError, KeyboardInterrupt):
        raise _Usage("no profiler chosen") from None
    if not config.is_whole_number(answer) or not 1 <= int(answer) <= len(running):
        raise _Usage(f"{answer!r} is not a number from 1 to {len(running)}")
    return str(running[int(answer) - 1].url)


# -- asyncflow attach / detach / dump ----------------------------------------------------------

#: how long attach, detach and dump wait for the process's answer (a profiler's start is
#: given 10 s; a dump of 10,000 tasks takes about a second)
CONTROL_TIMEOUT = 30.0


def _control(pid: int, command: str, **fields: Any) -> dict[str, Any]:
    """``command`` sent to armed process ``pid``; an error of the request is a usage error
    (exit 2), said in one line."""
    from asyncflow.serve import control

    try:
        return control.request(pid, command, CONTROL_TIMEOUT, **fields)
    except control.ControlError as exc:
        raise _Usage(str(exc)) from None


def _attach(args: argparse.Namespace) -> int:
    from asyncflow.render.report import counted

    if args.remote_exec:
        _remote_arm(args.pid)
    answer = _control(args.pid, "attach", port=args.port)
    url = answer.get("url")
    if answer.get("already"):
        print(
            f"asyncflow: {answer.get('name')!r} (pid {args.pid}) is attached already",
            file=sys.stderr,
        )
    else:
        blocked = int(answer.get("blocked") or 0)
        late = f"; {counted(blocked, 'loop')} blocked, adopted when it next runs" if blocked else ""
        print(
            f"asyncflow: attached to {answer.get('name')!r} (pid {args.pid}): "
            f"{counted(int(answer.get('tasks') or 0), 'live task')} adopted{late}; "
            f"'asyncflow detach {args.pid}' stops it",
            file=sys.stderr,
        )
    print(url or "no endpoint (the armed options say port off)", flush=True)
    return 0


def _detach(args: argparse.Namespace) -> int:
    answer = _control(args.pid, "detach")
    sys.stdout.write(str(answer.get("report") or ""))
    print(f"asyncflow: detached from pid {args.pid}: it runs armed again", file=sys.stderr)
    return 0


def _dump(args: argparse.Namespace) -> int:
    from asyncflow.render.dump import DumpDocument, render_dump

    answer = _control(args.pid, "dump")
    document = answer.get("dump")
    if args.format == "json":
        sys.stdout.write(orjson.dumps(document, option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0
    try:
        dump = schema.load(DumpDocument, document, ignore_unknown=True)
    except schema.DocumentError as exc:
        raise AsyncflowError(
            f"pid {args.pid} answered something that is not a dump: {exc}"
        ) from None
    sys.stdout.write(render_dump(dump, args.limit))
    return 0


#: what ``attach --remote-exec`` runs in the process: arm it (from its main thread, at its next
#: safe point), with asyncflow imported from where this one is
_REMOTE_SCRIPT = """\
import sys
if {path!r} not in sys.path:
    sys.path.append({path!r})
import asyncflow
asyncflow.arm()
"""
#: how long ``--remote-exec`` waits for the process to arm itself, in seconds
REMOTE_ARM_TIMEOUT = 10.0


def _remote_arm(pid: int) -> None:
    """Arm process ``pid`` through ``sys.remote_exec`` (PEP 768, Python 3.14+), unless it is
    armed already; wait until its control socket answers.

    Untested here (no Python 3.14 in this environment): the process must run Python 3.14+
    that allows remote debugging, with asyncflow importable, and this user must be allowed to
    trace it (ptrace scope).
    """
    from asyncflow.serve import control

    remote_exec = getattr(sys, "remote_exec", None)
    if remote_exec is None:
        raise _Usage(
            f"--remote-exec needs Python 3.14 or newer (sys.remote_exec, PEP 768); this is "
            f"{sys.version_info.major}.{sys.version_info.minor}: start the process armed "
            "instead ('asyncflow run --armed', or asyncflow.arm())"
        )
    try:
        _control_probe(pid)
        return  # armed already
    except control.NotArmedError:
        pass
    import tempfile
    import time

    from asyncflow.serve import registry

    folder = registry.private_directory(create=True)
    if folder is None:
        raise _Usage(f"{registry.directory()} is not a directory of yours alone (mode 0700)")
    package = str(Path(__file__).resolve().parent.parent)
    fd, script = tempfile.mkstemp(prefix=f".arm-{pid}.", suffix=".py", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(_REMOTE_SCRIPT.format(path=package))
        try:
            remote_exec(pid, script)
        except (OSError, RuntimeError, ValueError) as exc:
            raise _Usage(f"sys.remote_exec({pid}) failed: {exc}") from None
        deadline = time.monotonic() + REMOTE_ARM_TIMEOUT
        while True:  # the script runs at the process's next safe point: poll its socket
            try:
                _control_probe(pid)
                return
            except control.NotArmedError:
                if time.monotonic() > deadline:
                    raise _Usage(
                        f"process {pid} did not arm itself within {REMOTE_ARM_TIMEOUT:g} s of "
                        "sys.remote_exec (is asyncflow importable there?)"
                    ) from None
                time.sleep(0.05)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(script)


def _control_probe(pid: int) -> None:
    """Raise NotArmedError unless ``pid`` answers on its control socket."""
    from asyncflow.serve import control

    try:
        control.request(pid, "status", CONTROL_TIMEOUT)
    except control.NotArmedError:
        raise
    except control.ControlError as exc:
        raise _Usage(str(exc)) from None


# -- asyncflow top -----------------------------------------------------------------------------


def _top(args: argparse.Namespace) -> int:
    try:
        from asyncflow.render.top import TopApp
    except ImportError as exc:
        raise _needs_textual("the live view", exc) from None
    args.url = _pick_url(args, "top")
    _check_url(args.url)
    if not args.interval > 0:
        raise _Usage(f"--interval {args.interval}: expected seconds, a number > 0")
    TopApp(args.url, _token(args), args.interval).run()
    return 0


def _needs_textual(what: str, exc: ImportError) -> AsyncflowError:
    """The error for a view that cannot import textual (or rich, which it imports first:
    either way textual is to install), or something else it needs."""
    broken = exc.name is not None and exc.name.split(".")[0] not in ("textual", "rich")
    return AsyncflowError(
        f"{what} needs textual"
        + (f" and cannot import {exc.name}" if broken else ", which is not installed")
        + ": pip install '.[top]' in asyncflow's checkout, or pip install 'textual>=0.80'"
    )


# -- asyncflow replay --------------------------------------------------------------------------


def _replay(args: argparse.Namespace) -> int:

    recording = _read_recording(args.file)
    if args.web:
        return _replay_web(args.file, args.at)
    try:
        from asyncflow.render.replay import ReplayApp
    except ImportError as exc:
        raise _needs_textual("replay", exc) from None
    ReplayApp(recording, at=args.at, speed=args.speed).run()
    return 0


def _replay_web(path: str, at: float) -> int:
    """Serve the web page over the recording at ``path`` until Ctrl-C."""
    from asyncflow.render import web

    with open(path, "rb") as file:
        server, url = web.serve_recording(file.read())
    print(f"asyncflow: the recording {path} at {url}{f'&at={at:g}' if at else ''}", flush=True)
    print("asyncflow: Ctrl-C stops it", file=sys.stderr, flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
