"""Running profilers on this machine: one small file per process, so ``asyncflow ps`` finds them.

Each profiler that serves an endpoint writes ``<pid>.json`` into a per-user runtime directory
(``$XDG_RUNTIME_DIR/asyncflow``, else ``asyncflow-<uid>`` under the temporary directory, mode
0700; ``ASYNCFLOW_RUNTIME_DIR`` overrides both). The file says what a client needs to find the
endpoint (pid, name, command line, URL, start time, whether a token is needed) and never the
token itself; a worker process of a profiled program (see :mod:`asyncflow._children`) also
names its parent's pid and its role there. It is written atomically (a temporary file renamed
over it), removed when the profiler stops, and recognised as stale when its process is gone or
its pid now belongs to another process (the process's start time, where the platform gives it,
no longer matches): listing then removes it. A forked child never removes its parent's file.

An armed process (see :mod:`asyncflow.serve.control`) registers too, with no URL and
``armed`` set, and listens on ``<pid>.sock`` beside its file; a socket whose process is gone is
removed on the way as well.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from asyncflow import config, schema
from asyncflow.errors import say

__all__ = [
    "Entry",
    "Registration",
    "directory",
    "entries",
    "private_directory",
    "register",
    "unusable",
]

logger = logging.getLogger("asyncflow")
#: the layout of a registry file; a file of another version is ignored (and left alone)
_VERSION = 1
#: the largest registry file read: anything bigger is no file of ours
_MAX_BYTES = 64 * 1024
#: this process's pid and when it first registered: the files written again (at attach, at
#: detach, at a rename) keep that time, or ``asyncflow ps`` would count it up from the last
_first: tuple[int, float] | None = None


@dataclass(frozen=True, slots=True)
class Entry:
    """One running profiler, as its registry file describes it."""

    #: the profiled process
    pid: int
    #: the profiler's name (``asyncflow.profile(name)``, or the script under ``asyncflow run``)
    name: str
    #: the process's command line (``sys.orig_argv``)
    argv: tuple[str, ...]
    #: the endpoint's address, e.g. ``http://127.0.0.1:6780``
    url: str
    #: when this process first registered (armed, or its first profiler started), in
    #: seconds since the epoch
    started: float
    #: whether every request needs ``Authorization: Bearer <token>``
    token: bool
    #: the process's start time as the platform counts it (Linux: clock ticks after boot);
    #: None where it cannot be read
    process_start: int | None
    #: a worker process of a profiled program: its parent's pid (None: no parent profiled)
    parent: int | None = None
    #: ... and its role there (``process-1``, ``fork-2``), which ends its ``name``
    role: str | None = None
    #: armed, not attached (``asyncflow run --armed``, ``asyncflow.arm()``): it serves no
    #: endpoint (``url`` is empty) until ``asyncflow attach PID``
    armed: bool = False


def directory() -> Path:
    """The registry's directory (not created here)."""
    override = config.runtime_dir()
    if override is not None:
        return Path(override)
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if runtime and os.path.isabs(runtime) and os.path.isdir(runtime):
        return Path(runtime) / "asyncflow"
    uid = os.getuid() if hasattr(os, "getuid") else os.getlogin()
    return Path(tempfile.gettempdir()) / f"asyncflow-{uid}"


def private_directory(create: bool) -> Path | None:
    """The registry's directory if it is this user's and no one else's (created, mode 0700, when
    ``create``), else None: a directory someone else owns or can write is never trusted."""
    path = directory()
    if create:
        try:
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            logger.debug("asyncflow: cannot create the registry %s: %r", path, exc)
            return None
    why = unusable(path)
    if why is not None:
        logger.debug("asyncflow: the registry %s %s: unused", path, why)
        return None
    return path


def unusable(path: Path) -> str | None:
    """Why ``path`` cannot be the registry (``is not a directory``...), or None when it can be
    (or does not exist yet: it is made at the first registration)."""
    try:
        status = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    if not stat.S_ISDIR(status.st_mode):
        return "is not a directory"
    if hasattr(os, "getuid") and status.st_uid != os.getuid():
        return "is another user's"
    if status.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return "can be written by other users"
    return None


def process_start(pid: int) -> int | None:
    """When process ``pid`` started, as the platform counts it, or None where it cannot say.

    On Linux, field 22 of ``/proc/<pid>/stat`` (clock ticks after boot): together with the pid
    it names one process, so a pid reused by another process is told apart.
    """
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces or parentheses itself.
    fields = raw[raw.rfind(b")") + 2 :].split()
    try:
        return int(fields[19])  # field 22, counted from field 3
    except (IndexError, ValueError):
        return None


#: the largest process id any system gives (Linux's pid_max limit is 2**22)
MAX_PID = 2**31 - 1


def _alive(pid: int) -> bool:
    if not 0 < pid <= MAX_PID:  # (a stray file's name: no process has it)
        return False
    if sys.platform == "win32":  # os.kill(pid, 0) would end the process there
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    except OSError:
        return False
    return True


def _stale(entry: Entry) -> bool:
    """Whether ``entry``'s process is gone, or its pid belongs to another process now."""
    if not _alive(entry.pid):
        return True
    if entry.process_start is None:
        return False
    now = process_start(entry.pid)
    return now is not None and now != entry.process_start


class Registration:
    """The registry file of this process's profiler; :meth:`remove` deletes it (only in the
    process that wrote it: a forked child's removal does nothing)."""

    def __init__(self, path: Path, pid: int) -> None:
        self.path = path
        self.pid = pid

    def remove(self) -> None:
        """Delete the file; idempotent, and never raises."""
        if os.getpid() != self.pid:
            return  # a forked child: the file is its parent's
        try:
            self.path.unlink(missing_ok=True)
        except OSError as exc:
            logger.debug("asyncflow: cannot remove %s: %r", self.path, exc)


def register(
    name: str,
    url: str,
    token: bool,
    child_of: tuple[int, str] | None = None,
    armed: bool = False,
) -> Registration | None:
    """Write this process's registry file; None when it cannot be written (said on the
    ``asyncflow`` logger at debug level: profiling goes on without it). ``child_of`` is a
    worker process's parent pid and role; ``armed``, a process armed and not attached (its
    ``url`` empty). Written again, the file keeps the time this process first registered."""
    global _first
    try:
        folder = private_directory(create=True)
        if folder is None:
            why = unusable(directory())
            if why is not None and config.runtime_dir() is not None:  # asked for: say it
                say(
                    f"asyncflow: not listed by 'asyncflow ps': ASYNCFLOW_RUNTIME_DIR "
                    f"{str(directory())!r} {why}"
                )
            return None
        pid = os.getpid()
        if _first is None or _first[0] != pid:  # a forked child registers anew
            _first = (pid, time.time())
        document: dict[str, Any] = {
            "version": _VERSION,
            "pid": pid,
            "name": name,
            "argv": list(getattr(sys, "orig_argv", sys.argv)),
            "url": url,
            "started": _first[1],
            "token": token,
            "process_start": process_start(pid),
            "parent": None if child_of is None else child_of[0],
            "role": None if child_of is None else child_of[1],
            "armed": armed,
        }
        path = folder / f"{pid}.json"
        fd, scratch = tempfile.mkstemp(prefix=f".{pid}.", suffix=".tmp", dir=folder)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(schema.dumps(document))  # a name or argv not UTF-8 escaped
            os.replace(scratch, path)  # readers see the whole file or none
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(scratch)
            raise
        _sweep(folder)
        return Registration(path, pid)
    except Exception as exc:  # profiling goes on without a registry entry
        logger.debug("asyncflow: cannot register this profiler: %r", exc)
        return None


def _read(path: Path) -> Entry | None:
    try:
        with path.open("rb") as file:
            raw = file.read(_MAX_BYTES + 1)
    except OSError:
        return None
    if len(raw) > _MAX_BYTES:
        return None
    try:
        data = orjson.loads(raw)
        if not isinstance(data, dict) or data.get("version") != _VERSION:
            return None
        pid, name, argv, url = data["pid"], data["name"], data["argv"], data["url"]
        started, token, start = data["started"], data["token"], data.get("process_start")
        parent, role = data.get("parent"), data.get("role")  # absent: written before workers
        armed = data.get("armed", False)  # absent: written before armed mode
        ok = (
            isinstance(pid, int)
            and not isinstance(pid, bool)
            and isinstance(name, str)
            and isinstance(argv, list)
            and all(isinstance(a, str) for a in argv)
            and isinstance(url, str)
            and isinstance(started, int | float)
            and isinstance(token, bool)
            and (start is None or (isinstance(start, int) and not isinstance(start, bool)))
            and (parent is None or (isinstance(parent, int) and not isinstance(parent, bool)))
            and (role is None or isinstance(role, str))
            and isinstance(armed, bool)
        )
    except (orjson.JSONDecodeError, KeyError):
        return None
    if not ok or path.name != f"{pid}.json":
        return None
    return Entry(pid, name, tuple(argv), url, float(started), token, start, parent, role, armed)


def _sweep(folder: Path) -> list[Entry]:
    """The live entries in ``folder``, oldest first; stale files are removed on the way, and
    files that are not entries are left alone."""
    live: list[Entry] = []
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return live
    for name in names:
        pid = name[:-5]
        if name.endswith(".sock") and config.is_whole_number(pid) and not _alive(int(pid)):
            with contextlib.suppress(OSError):
                os.unlink(folder / name)  # an armed process's, gone without removing it
            continue
        if not name.endswith(".json") or name.startswith("."):
            continue
        path = folder / name
        entry = _read(path)
        if entry is None:
            continue
        if _stale(entry):
            with contextlib.suppress(OSError):
                path.unlink()
            continue
        live.append(entry)
    live.sort(key=lambda e: (e.started, e.pid))
    return live


def entries() -> list[Entry]:
    """The profilers running on this machine for this user, oldest first (stale files are
    removed on the way)."""
    folder = private_directory(create=False)
    return [] if folder is None else _sweep(folder)
