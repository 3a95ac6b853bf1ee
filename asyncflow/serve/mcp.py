"""``asyncflow mcp``: an MCP server over stdio whose tools read asyncflow's documents for an agent.

A coding agent (Claude Code, or any client of the Model Context Protocol) starts it as a
child process and calls its tools: the running profilers, a profiler's status, its warnings,
futures, channels, tasks and what they wait on, resources, executors, the event loops' blocked
episodes, and a diff of two runs. Each tool reads a *source*: a running profiler by the PID of
its process (found in the registry ``asyncflow ps`` reads) or by its endpoint's URL, or a
saved snapshot, ``json`` exit report or recording (its end state), read as ``asyncflow
report`` reads them. Answers are short text (:mod:`asyncflow.render.brief`), at most
``limit`` entries a list, saying how many were left out. A source that cannot be read is the
tool's error, in one sentence; the server goes on.

The SDK (``mcp``, 2 or newer) is an optional extra: without it :func:`main` says how to
install it and returns 2. Nothing but the protocol is written to standard output.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import re
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from asyncflow import config, schema
from asyncflow._version import __version__
from asyncflow.render import brief, record
from asyncflow.render.diff import DiffInputError, read_document, render_diff
from asyncflow.render.dump import DumpDocument, render_dump
from asyncflow.render.report import format_duration, printable
from asyncflow.serve import client, control, registry
from asyncflow.serve.server import is_loopback
from asyncflow.views.diff import diff as compare

__all__ = [
    "DEFAULT_LIMIT",
    "INSTALL",
    "MAX_CHARS",
    "MAX_LIMIT",
    "SourceError",
    "Tools",
    "add_arguments",
    "bounded",
    "find_session_registry",
    "main",
    "run",
]

logger = logging.getLogger("asyncflow")

#: how to install what ``asyncflow mcp`` needs (the SDK, as the ``mcp`` extra)
INSTALL = "pip install '.[mcp]' in asyncflow's checkout, or pip install 'mcp>=2'"
#: entries a list shows when the call asks for no ``limit``, and the most it may ask for
DEFAULT_LIMIT = 20
MAX_LIMIT = 200
#: seconds to wait for a document, and for a whole snapshot (the diff of a live source)
_TIMEOUT = 10.0
_SNAPSHOT_TIMEOUT = 30.0
#: the largest answer read from an endpoint (a snapshot of 100,000 tasks is some 60 MiB)
_MAX_BYTES = 256 << 20
#: the longest answer a tool gives (some 8,000 tokens); a longer one is cut at a line
MAX_CHARS = 32_000
#: saved files kept read (a recording takes a while to read: a second call reuses it)
_FILES_KEPT = 4

_D = TypeVar("_D")


class SourceError(ValueError):
    """A source a tool cannot read (no such process, nothing answering, not a snapshot); the
    message, one sentence naming the source, is the tool's error."""


@dataclass(frozen=True, slots=True)
class _Live:
    """A running profiler's endpoint."""

    url: str
    #: how the answers name it: ``pid 123 (shop) at http://127.0.0.1:6780``
    said: str


_SOURCE = (
    "`source` is a running profiler, by the PID of its process (the profilers tool lists "
    "them) or its endpoint's URL (http://127.0.0.1:6780), or the path of a file saved by "
    "'asyncflow snapshot', a json exit report or a recording (its end state; FILE@SECONDS: "
    "the moment that many seconds into it); empty: the "
    "server's --source, else the one profiler running here."
)
_LIMIT = f"`limit` (1 to {MAX_LIMIT}) bounds each list; the answer says how many were left out."


class Tools:
    """The tools' implementations, each returning the text of its answer.

    Args:
        token: the endpoints' bearer token, if they need one.
        default: the source a call that names none reads; None: the one profiler running.
    """

    def __init__(self, token: str | None = None, default: str | None = None) -> None:
        self.token = token
        self.default = default
        self._files: OrderedDict[tuple[str, int, int], schema.Snapshot | record.Recording] = (
            OrderedDict()
        )
        self._files_lock = threading.Lock()

    # -- the tools ----------------------------------------------------------------------------

    def profilers(self) -> str:
        """The profilers running on this machine for this user (as 'asyncflow ps' lists
        them): each one's PID, name, endpoint URL, whether it needs a token, how long it has
        run and its command. Use a PID or URL as another tool's `source`."""
        running = registry.entries()
        if not running:
            return f"no profiler is running here ({registry.directory()})\n"
        now = time.time()
        lines = []
        for e in running:
            where = e.url or "armed: no endpoint until 'asyncflow attach PID'"
            extra = ", needs a token" if e.token else ""
            extra += f", worker of pid {e.parent}" if e.parent is not None else ""
            up = format_duration(int(max(0.0, now - e.started) * 1e9))
            command = " ".join(e.argv)
            lines.append(f"pid {e.pid} {e.name}: {where}{extra}, up {up}: {command}")
        return printable("\n".join(lines)) + "\n"

    def status(self, source: str = "") -> str:
        """Whose profiler it is (name, pid, Python, asyncflow's version), how long it has
        run, how many futures, calls, channels and streams it tracks, and whether it dropped
        events or met internal errors (an answer to trust less)."""
        where = self._source(source)
        if isinstance(where, _Live):
            doc = self._get(where, "/profiler_status", schema.ProfilerStatus)
            return brief.status(doc, where.said)
        return brief.status(self._file(where).status, where)

    def warnings(self, source: str = "", limit: int = DEFAULT_LIMIT) -> str:
        """asyncflow's diagnoses of the program: deadlocks, a blocked event loop and the line
        that blocked it, bottleneck and starved stages, contended locks, saturated executors,
        leaked tasks, swallowed cancellations and more. Each says what is wrong about which
        entry, what to do (hint), and the evidence; those that hold now come first, most
        severe first. Start here."""
        limit = _limit(limit)
        where = self._source(source)
        if isinstance(where, _Live):
            doc = self._get(where, "/warnings", schema.WarningsDocument)
            return brief.warnings(doc.warnings, limit)
        return brief.warnings(self._file(where).warnings, limit)

    def futures(self, source: str = "", limit: int = DEFAULT_LIMIT) -> str:
        """The tracked coroutine functions (futures), most busy first: calls and how they
        ended (returned, raised, cancelled), calls live now, busy time (holding the event
        loop) and idle time (waiting), the percentiles of a poll and of a whole call, the
        exception types raised, and where each is defined."""
        limit = _limit(limit)
        doc = self._document(source, "/futures", limit, schema.FuturesDocument, "futures")
        return brief.futures(doc or schema.FuturesDocument(schema.SCHEMA, 0, 0, 0, []), limit)

    def channels(self, source: str = "", limit: int = DEFAULT_LIMIT) -> str:
        """The queues and memory streams (channels), most messages first: messages sent and
        received, depth now and at most, how long a message stayed in it, how long producers
        were blocked on a full one and consumers starved on an empty one, and which futures
        send into and receive from each."""
        limit = _limit(limit)
        doc = self._document(source, "/channels", limit, schema.ChannelsDocument, "channels")
        return brief.channels(doc or schema.ChannelsDocument(schema.SCHEMA, 0, 0, 0, []), limit)

    def streams(self, source: str = "", limit: int = DEFAULT_LIMIT) -> str:
        """The tracked async iterators and async generators (streams), most items first:
        iterations and how they ended, items yielded, how long the consumer waited for an
        item (a slow producer) and spent between items (a slow consumer)."""
        limit = _limit(limit)
        doc = self._document(source, "/streams", limit, schema.StreamsDocument, "streams")
        return brief.streams(doc or schema.StreamsDocument(schema.SCHEMA, 0, 0, 0, []), limit)

    def tasks(self, source: str = "", limit: int = DEFAULT_LIMIT) -> str:
        """The live tasks and what each waits on: first the stuck ones (a deadlock's first),
        each with where it waits, on what, and who holds or can release that; then the tasks
        grouped by where they wait and on what; then one line per task (state, age, the line
        of the program's own code it is suspended at, what it waits on). For a hang. An armed
        process (not attached) is read as 'asyncflow dump PID' reads it."""
        limit = _limit(limit)
        armed = self._armed(source)
        if armed is not None:
            return self._dump(armed, limit)
        where = self._source(source)
        if isinstance(where, _Live):
            doc = self._get(where, f"/tasks?limit={limit}", schema.TasksDocument)
            graph: schema.GraphDocument | None = self._get(where, "/graph", schema.GraphDocument)
        else:
            snapshot = self._file(where)
            if snapshot.tasks is None:
                return f"{where} holds no tasks' document\n"
            doc, graph = snapshot.tasks, snapshot.graph
        return brief.tasks(doc, graph, limit)

    def resources(self, source: str = "", limit: int = DEFAULT_LIMIT) -> str:
        """The locks, semaphores, conditions, events, barriers and capacity limiters, most
        waited on first: acquisitions and how many had to wait, the waits' total, p99 and
        maximum, the holds, the tasks waiting now and who holds each one now, for how long."""
        limit = _limit(limit)
        doc = self._document(source, "/resources", limit, schema.ResourcesDocument, "resources")
        return brief.resources(doc or schema.ResourcesDocument(schema.SCHEMA, 0, 0, 0, []), limit)

    def executors(self, source: str = "", limit: int = DEFAULT_LIMIT) -> str:
        """The thread and process pools that run_in_executor and to_thread used, busiest
        first: workers, jobs queued and running now, the time jobs waited for a worker
        against the time they ran, and which functions the jobs ran."""
        limit = _limit(limit)
        doc = self._document(source, "/executors", None, schema.ExecutorsDocument, "executors")
        return brief.executors(doc or schema.ExecutorsDocument(schema.SCHEMA, []), limit)

    def loop(self, source: str = "", limit: int = 5) -> str:
        """Each event loop's health: its lag (how late a callback runs), how often a step
        blocked it beyond the threshold, the lines that blocked it most, and its worst and
        latest blocked episodes, each with the call, the line and its code."""
        limit = _limit(limit)
        where = self._source(source)
        if isinstance(where, _Live):
            doc = self._get(where, "/loop", schema.LoopDocument)
        else:
            loop = self._file(where).loop
            if loop is None:
                return f"{where} holds no event loop's document\n"
            doc = loop
        return brief.loop(doc, limit)

    def diff(self, base: str, new: str, limit: int = DEFAULT_LIMIT) -> str:
        """Two runs compared (as 'asyncflow diff' does): per future, channel, stream,
        resource and executor, matched by label, the figures that changed beyond noise, worst
        regression first, the entries and warnings in one run only, and a verdict (FAILED
        when a figure got more than 2x worse). `base` and `new` are sources as for the other
        tools: saved files, or a running profiler's state now."""
        limit = _limit(limit)
        before, after = self._snapshot(base), self._snapshot(new)
        result = compare(before, after)
        shown = replace(result, changes=result.changes[:limit])
        text = render_diff(shown, "table", base, new)
        more = brief.left_out(len(shown.changes), len(result.changes), "changed figures", limit)
        return text + "".join(line + "\n" for line in more)

    # -- sources ------------------------------------------------------------------------------

    def _document(
        self, source: str, route: str, limit: int | None, document: type[_D], section: str
    ) -> _D | None:
        """A list's document: the endpoint's ``route`` (its first ``limit`` entries), or the
        saved file's ``section`` of its snapshot (None when the file has none)."""
        where = self._source(source)
        if isinstance(where, _Live):
            query = "" if limit is None else f"?limit={limit}"
            return self._get(where, route + query, document)
        found: _D | None = getattr(self._file(where), section)
        return found

    def _armed(self, source: str) -> registry.Entry | None:
        """The registry's entry of the armed process ``source`` names by PID, if it does."""
        given = source.strip() or self.default or ""
        if not given.isdecimal():
            return None
        pid = int(given)
        return next((e for e in registry.entries() if e.pid == pid and not e.url), None)

    def _dump(self, entry: registry.Entry, limit: int) -> str:
        """An armed process's tasks, as 'asyncflow dump PID' reads them: walked in the process
        on its control thread, which attaches nothing."""
        try:
            answer = control.request(entry.pid, "dump", _SNAPSHOT_TIMEOUT)
            document = schema.load(DumpDocument, answer.get("dump"), ignore_unknown=True)
        except control.ControlError as exc:
            raise SourceError(str(exc)) from None
        except schema.DocumentError as exc:
            raise SourceError(
                f"pid {entry.pid} answered something that is not a dump: {exc}"
            ) from None
        said = (
            f"pid {entry.pid} ({entry.name}) is armed: its tasks as 'asyncflow dump "
            f"{entry.pid}' reads them ('asyncflow attach {entry.pid}' turns on the other tools)"
        )
        return said + "\n" + render_dump(document, limit)

    def _source(self, source: str) -> _Live | str:
        """A live endpoint, or the path of a saved file."""
        given = source.strip() or self.default
        if not given:
            return self._only_one()
        if given.isdecimal():
            return self._by_pid(int(given))
        if given.startswith(("http://", "https://")):
            parsed = urllib.parse.urlsplit(given)
            if not parsed.hostname:
                raise SourceError(f"{given!r} is not an endpoint URL (e.g. http://127.0.0.1:6780)")
            url = given.rstrip("/")
            return _Live(url, url)
        path = os.path.expanduser(given)
        if not os.path.exists(_moment(path)[0]):
            raise SourceError(
                f"{given!r} is no PID, no endpoint URL (http://...) and no file: give the PID "
                "of a profiled process (the profilers tool lists them), its endpoint's URL, or "
                "a snapshot, json report or recording file"
            )
        return path

    def _only_one(self) -> _Live:
        every = registry.entries()
        running = [e for e in every if e.url]
        if len(running) == 1:
            return self._live(running[0])
        if not running:
            armed = [f"pid {e.pid} ({e.name})" for e in every if not e.url]
            raise SourceError(
                "no source given, and no profiler is running here"
                + (
                    f" ({', '.join(armed[:3])} {'is' if len(armed) == 1 else 'are'} armed: "
                    "'asyncflow attach PID' turns one on)"
                    if armed
                    else ""
                )
                + ": give the PID of a profiled process, an endpoint's URL, or a saved "
                "snapshot, report or recording"
            )
        listed = ", ".join(f"pid {e.pid} ({e.name})" for e in running[:5])
        more = f" and {len(running) - 5} more" if len(running) > 5 else ""
        raise SourceError(
            f"no source given, and {len(running)} profilers run here: {listed}{more}; "
            "give one's PID as the source"
        )

    def _by_pid(self, pid: int) -> _Live:
        if pid <= 0:
            raise SourceError(f"no process has pid {pid}")
        for entry in registry.entries():
            if entry.pid != pid:
                continue
            if not entry.url:
                raise SourceError(
                    f"pid {pid} ({entry.name}) is armed and serves no endpoint yet: "
                    f"'asyncflow attach {pid}' turns its profiler on"
                )
            return self._live(entry)
        try:
            os.kill(pid, 0)
            alive = True
        except PermissionError:
            alive = True
        except (OSError, OverflowError):
            alive = False
        if not alive:
            raise SourceError(f"no process has pid {pid}")
        raise SourceError(
            f"pid {pid} runs no asyncflow profiler with an endpoint that this user can see "
            "(the profilers tool lists those that do)"
        )

    def _live(self, entry: registry.Entry) -> _Live:
        return _Live(entry.url.rstrip("/"), f"pid {entry.pid} ({entry.name}) at {entry.url}")

    def _trusted(self, url: str) -> bool:
        """Whether the token may go to ``url``: an endpoint on this machine, or on the host of
        the ``--source`` the server was started with. A URL that the agent names (and that a
        page it read may have put in its mind) never gets it elsewhere."""
        host = urllib.parse.urlsplit(url).hostname or ""
        if is_loopback(host):
            return True
        given = self.default or ""
        return given.startswith(("http://", "https://")) and (
            urllib.parse.urlsplit(given).hostname == host
        )

    def _fetch(self, where: _Live, path: str, timeout: float) -> Any:
        sent = bool(self.token) and self._trusted(where.url)
        token = self.token if sent else None
        try:
            return client.get_json(where.url, path, token, timeout, _MAX_BYTES, where.said)
        except client.FetchError as error:
            hint = ""
            if error.refused:
                hint = ": has the profiler stopped? (the profilers tool lists those running)"
            elif error.status == 401 and sent:
                hint = ": the token asyncflow mcp was given is not this endpoint's"
            elif error.status == 401 and self.token:
                hint = (
                    ": its token is sent only to this machine's endpoints and to the host of "
                    "asyncflow mcp's --source"
                )
            elif error.status == 401:
                hint = (
                    ": its endpoint needs a token (start asyncflow mcp with --token, or with "
                    "ASYNCFLOW_TOKEN set)"
                )
            raise SourceError(f"{error}{hint}") from None

    def _get(self, where: _Live, path: str, document: type[_D]) -> _D:
        data = self._fetch(where, path, _TIMEOUT)
        try:
            return schema.load(document, data, ignore_unknown=True)
        except schema.DocumentError as exc:
            raise SourceError(
                f"{where.said}: {path} answered something that is not asyncflow's "
                f"{document.__name__}: {exc}"
            ) from None

    def _file(self, where: str) -> schema.Snapshot:
        """A saved file's snapshot (a recording's at the moment ``where`` names after an ``@``,
        else its end state); each file is read once while it does not change."""
        path, at = _moment(where)
        saved = self._read(path)
        if isinstance(saved, schema.Snapshot):
            if at is not None:
                raise SourceError(
                    f"{where!r}: {path!r} is not a recording, which alone has moments (record "
                    "one with 'asyncflow run --record FILE')"
                )
            return saved
        try:
            return saved.snapshot(-1 if at is None else saved.index_at(at))
        except record.RecordingError as exc:
            raise SourceError(str(exc)) from None

    def _read(self, path: str) -> schema.Snapshot | record.Recording:
        try:
            st = os.stat(path)
        except OSError as exc:
            raise SourceError(f"cannot read {path!r}: {exc.strerror or exc}") from None
        key = (os.path.realpath(path), st.st_mtime_ns, st.st_size)
        with self._files_lock:
            kept = self._files.get(key)
            if kept is not None:
                self._files.move_to_end(key)
                return kept
        if Path(path).is_dir():
            raise SourceError(f"{path!r} is a directory, not a snapshot, report or recording")
        saved: schema.Snapshot | record.Recording
        try:
            saved = (
                record.read_recording(path) if record.is_recording(path) else read_document(path)
            )
        except (DiffInputError, record.RecordingError) as exc:
            raise SourceError(str(exc)) from None
        with self._files_lock:
            self._files[key] = saved
            while len(self._files) > _FILES_KEPT:
                self._files.popitem(last=False)
        return saved

    def _snapshot(self, source: str) -> schema.Snapshot:
        where = self._source(source)
        if not isinstance(where, _Live):
            return self._file(where)
        data = self._fetch(where, "/snapshot", _SNAPSHOT_TIMEOUT)
        try:
            return schema.load(schema.Snapshot, data, ignore_unknown=True)
        except schema.DocumentError as exc:
            raise SourceError(f"{where.said}: /snapshot is not a snapshot: {exc}") from None

    def listed(self) -> list[tuple[Callable[..., str], str]]:
        """Each tool and its description, in the order ``tools/list`` gives them."""
        tools: list[tuple[Callable[..., str], str]] = [
            (self.profilers, self.profilers.__doc__ or "")
        ]
        for tool in (
            self.status,
            self.warnings,
            self.futures,
            self.channels,
            self.streams,
            self.tasks,
            self.resources,
            self.executors,
            self.loop,
        ):
            said = " ".join((tool.__doc__ or "").split())
            limit = f" {_LIMIT}" if tool is not self.status else ""
            tools.append((tool, f"{said} {_SOURCE}{limit}"))
        said = " ".join((self.diff.__doc__ or "").split())
        tools.append((self.diff, f"{said} {_LIMIT}"))
        return [(tool, " ".join(text.split())) for tool, text in tools]


def _moment(where: str) -> tuple[str, float | None]:
    """A file source's path, and the moment of a recording it names: ``run.afrec@0.6`` is
    0.6 s into ``run.afrec`` (a file whose own name ends so is that file)."""
    if os.path.exists(where):
        return where, None
    named = re.fullmatch(r"(.+)@(\d+(?:\.\d*)?)", where)
    if named is None or not os.path.exists(named[1]):
        return where, None
    return named[1], float(named[2])


def bounded(text: str, most: int = MAX_CHARS) -> str:
    """``text`` cut at its last line break within ``most`` characters, saying so, when it is
    longer (a list's entries can be long: labels, messages and routes are the program's)."""
    if len(text) <= most:
        return text
    cut = text.rfind("\n", 0, most) + 1 or most
    return (
        text[:cut]
        + f"(answer cut at {cut:,} of {len(text):,} characters: ask with a smaller limit)\n"
    )


def _limit(limit: int) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise SourceError(f"limit={limit!r}: expected a whole number from 1 to {MAX_LIMIT}")
    return limit


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``asyncflow mcp``'s options to ``parser`` (the CLI's subcommand, or :func:`main`'s
    own); :func:`run` takes what it parses."""
    parser.add_argument(
        "--source",
        metavar="SOURCE",
        help="what a tool reads when its call names no source: a PID, an endpoint URL, or a "
        "snapshot, json report or recording file [the one profiler running here]",
    )
    parser.add_argument(
        "--token",
        help="the endpoints' token, when they need one [$ASYNCFLOW_TOKEN]",
    )


def _server(tools: Tools) -> Any:
    """The SDK's server with every tool registered; ImportError when the SDK is missing."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp.types import ToolAnnotations

    server = MCPServer(
        "asyncflow",
        version=__version__,
        instructions=(
            "asyncflow profiles asyncio programs. Start with the warnings tool: it names what "
            "is wrong (a deadlock, a blocked loop, a bottleneck) and about which entry; then "
            "read that entry's tool (tasks for a hang, loop for a blocked loop, channels or "
            "futures for a slow stage). Sources are PIDs (the profilers tool lists them), "
            "endpoint URLs, or saved snapshot, report or recording files."
        ),
        log_level="WARNING",
    )
    read_only = ToolAnnotations(read_only_hint=True)

    def answer(tool: Callable[..., str]) -> Callable[..., str]:
        @functools.wraps(tool)
        def call(*args: Any, **kwargs: Any) -> str:
            try:
                return bounded(tool(*args, **kwargs))
            except SourceError as exc:
                raise ToolError(str(exc)) from None
            except Exception as exc:  # a bug of ours: the call fails, the server goes on
                logger.exception("asyncflow mcp: the %s tool failed", tool.__name__)
                raise ToolError(
                    f"asyncflow mcp failed in {tool.__name__}: {type(exc).__name__}: {exc}"
                ) from None

        return call

    for tool, description in tools.listed():
        server.add_tool(
            answer(tool),
            name=tool.__name__,
            description=description,
            annotations=read_only,
            structured_output=False,
        )
    return server


#: where a login session's runtime directory is (systemd's ``$XDG_RUNTIME_DIR``), by user id
_SESSION_RUNTIME = "/run/user/{uid}"


def find_session_registry() -> str | None:
    """Point the registry at the login session's runtime directory when the environment lost
    it: an agent's client may start its servers with a few variables only (the MCP SDK's own
    client passes ``HOME``, ``PATH``, ``USER`` and little else), while the profilers started
    from a terminal registered under ``$XDG_RUNTIME_DIR/asyncflow``. Nothing changes when
    either variable is set, or when no such directory holds a registry.

    Returns:
        The ``XDG_RUNTIME_DIR`` set, or None.
    """
    if os.environ.get("XDG_RUNTIME_DIR") or config.runtime_dir() or not hasattr(os, "getuid"):
        return None
    session = _SESSION_RUNTIME.format(uid=os.getuid())
    if not os.path.isdir(os.path.join(session, "asyncflow")):
        return None
    os.environ["XDG_RUNTIME_DIR"] = session
    return session


def run(args: argparse.Namespace) -> int:
    """Serve the tools over stdio until the client closes standard input.

    Returns:
        0 when the client went away, 2 (said on standard error) when the SDK is missing.
    """
    find_session_registry()
    tools = Tools(
        token=args.token or os.environ.get("ASYNCFLOW_TOKEN") or None, default=args.source
    )
    try:
        server = _server(tools)
    except ImportError as exc:
        print(
            f"asyncflow mcp: error: it needs the MCP SDK, mcp 2 or newer "
            f"({'cannot import ' + exc.name if exc.name else exc}): {INSTALL}",
            file=sys.stderr,
        )
        return 2
    server.run("stdio")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``asyncflow mcp [--source SOURCE] [--token TOKEN]`` (also ``python -m
    asyncflow.serve.mcp``).

    Returns:
        The exit status: 0 when the client closed the connection, 2 for a usage error or a
        missing SDK.
    """
    parser = argparse.ArgumentParser(
        prog="asyncflow mcp",
        description="An MCP server over stdio whose tools read asyncflow's profilers (by PID "
        "or URL) and saved runs, for coding agents: register it with your agent's client.",
    )
    add_arguments(parser)
    return run(parser.parse_args(None if argv is None else list(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
