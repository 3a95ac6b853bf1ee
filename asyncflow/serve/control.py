"""The control channel of an armed process: a Unix socket only its user can reach.

An armed process (``asyncflow run --armed``, ``asyncflow.arm()``) listens on
``<pid>.sock`` in the registry's directory (``$XDG_RUNTIME_DIR/asyncflow``, else
``asyncflow-<uid>`` under the temporary directory: mode 0700, this user's alone; the socket
itself is 0600) with one thread blocked in ``accept()``: nothing else runs until a client
connects. ``asyncflow attach``, ``detach`` and ``dump`` connect, send one JSON request (a
line) and read one JSON answer; the listener answers each with the handler the front door
registered for its command, on its own thread.

Both ends check who is at the other end with the kernel's word (``SO_PEERCRED``, on Linux):
the listener serves only its own user, and the client talks only to the process it named (a
stale socket whose pid now belongs to another process is not trusted). Elsewhere the 0700
directory is the guard.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat
import struct
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import orjson

from asyncflow.errors import AsyncflowError
from asyncflow.instrumentation import _session
from asyncflow.serve import registry

__all__ = [
    "ControlError",
    "Handler",
    "Listener",
    "NotArmedError",
    "request",
    "socket_path",
]

logger = logging.getLogger("asyncflow")

#: a command's handler: the request (a JSON object) -> the answer (a JSON object)
Handler = Callable[[dict[str, Any]], dict[str, Any]]
#: the largest request read (a command and a few options)
MAX_REQUEST = 64 * 1024
#: the largest answer read (a dump of 10,000 tasks is a few MB)
MAX_ANSWER = 256 * 1024 * 1024
#: how long the listener waits for a connected client's request, in seconds
REQUEST_TIMEOUT = 5.0
#: how long the listener gives a client to read its answer, in seconds
ANSWER_TIMEOUT = 60.0
#: the longest path of a Unix socket (``sun_path`` holds 108 bytes on Linux, 104 elsewhere)
_MAX_PATH = 100
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


class ControlError(AsyncflowError):
    """A control request that cannot be made: no such process, another user's, a refusal."""


class NotArmedError(ControlError):
    """The process runs, but listens on no control socket (it is not armed)."""


def socket_path(pid: int) -> Path:
    """Where process ``pid`` listens when it is armed."""
    return registry.directory() / f"{pid}.sock"


def _peer(sock: socket.socket) -> tuple[int, int] | None:
    """(pid, uid) of the process at the other end, where the kernel says it; else None."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return None
    pid, uid, _ = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, option, _PEERCRED.size))
    return pid, uid


def _read_line(conn: socket.socket, most: int) -> bytes:
    """Bytes up to a newline or the end, at most ``most`` (more: ValueError)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = conn.recv(65536)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
        if size > most:
            raise ValueError(f"more than {most} bytes")
        if b"\n" in chunk:
            break
    return b"".join(chunks).split(b"\n", 1)[0]


class Listener:
    """The armed process's end: a thread that answers each request with its command's handler.

    Args:
        handlers: command name -> handler; an unknown command is answered with an error.
    """

    def __init__(self, handlers: Mapping[str, Handler]) -> None:
        self.handlers = dict(handlers)
        self.pid = os.getpid()
        self.path = socket_path(self.pid)
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Listen (the socket made 0600 in the private directory) and start the thread.

        Raises:
            AsyncflowError: the directory is not this user's alone, or the socket cannot be made.
        """
        folder = registry.private_directory(create=True)
        if folder is None:
            raise AsyncflowError(
                f"cannot arm: {registry.directory()} is not a directory of this user's alone "
                "(mode 0700); set ASYNCFLOW_RUNTIME_DIR to one"
            )
        if len(os.fsencode(self.path)) > _MAX_PATH:
            raise AsyncflowError(
                f"cannot arm: the control socket's path {str(self.path)!r} is too long for a "
                "Unix socket; set ASYNCFLOW_RUNTIME_DIR to a shorter directory"
            )
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)  # a socket of a gone process that had this pid
            sock.bind(str(self.path))
            os.chmod(self.path, stat.S_IRUSR | stat.S_IWUSR)  # 0600 (the directory is 0700)
            sock.listen(8)
        except OSError as exc:
            sock.close()
            raise AsyncflowError(f"cannot arm: cannot listen on {self.path}: {exc}") from None
        self._sock = sock
        self._thread = threading.Thread(target=self._serve, name="asyncflow-control", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop listening and remove the socket (in the process that made it); idempotent."""
        sock, self._sock = self._sock, None
        if sock is None:
            return
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept()
        sock.close()
        if os.getpid() == self.pid:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(REQUEST_TIMEOUT)

    def forsake(self) -> None:
        """In a forked child: close the inherited socket, leave the parent's file alone."""
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    def _serve(self) -> None:
        while True:
            sock = self._sock
            if sock is None:
                return
            try:
                conn, _ = sock.accept()
            except OSError:
                return  # closed: stop() was called
            try:
                with conn:
                    self._answer(conn)
            except Exception as exc:  # a client that went away: the listener goes on
                logger.debug("asyncflow: a control request failed: %r", exc)

    def _answer(self, conn: socket.socket) -> None:
        peer = _peer(conn)
        if peer is not None and peer[1] != os.getuid():
            return  # another user's process (the 0700 directory should have kept it out)
        conn.settimeout(REQUEST_TIMEOUT)
        try:
            message = orjson.loads(_read_line(conn, MAX_REQUEST))
            command = message["command"] if isinstance(message, dict) else None
        except (ValueError, KeyError):
            command = message = None
        handler = self.handlers.get(command) if isinstance(command, str) else None
        if handler is None or not isinstance(message, dict):
            answer: dict[str, Any] = {"ok": False, "error": f"unknown request {command!r}"}
        else:
            try:
                answer = {"ok": True, **handler(message)}
            except AsyncflowError as exc:
                answer = {"ok": False, "error": str(exc)}
            except Exception as exc:  # the program goes on; the client hears what failed
                _session.internal_error(f"answering {command!r} on the control socket", exc)
                answer = {"ok": False, "error": f"{command} failed in the process: {exc!r}"}
        conn.settimeout(ANSWER_TIMEOUT)  # a client that stops reading does not keep it
        conn.sendall(orjson.dumps(answer) + b"\n")


def _check_process(pid: int) -> None:
    if not 0 < pid <= 2**31 - 1:
        raise ControlError(f"{pid} is not a process id")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        raise ControlError(f"no process has pid {pid}") from None
    except PermissionError:
        raise ControlError(
            f"process {pid} belongs to another user: asyncflow acts only on your own processes"
        ) from None


def _not_armed(pid: int, why: str) -> NotArmedError:
    return NotArmedError(
        f"process {pid} is not armed ({why}): start it with 'asyncflow run --armed ...' or "
        "call asyncflow.arm() in it"
    )


def request(pid: int, command: str, timeout: float, **fields: Any) -> dict[str, Any]:
    """Send ``command`` (with ``fields``) to armed process ``pid``; its answer.

    Raises:
        ControlError: no such process, another user's, not armed (:class:`NotArmedError`),
            not answering within ``timeout``, or the process refused (its reason).
    """
    _check_process(pid)
    path = socket_path(pid)
    try:
        status = os.lstat(path)
    except FileNotFoundError:
        raise _not_armed(pid, f"no control socket at {path}") from None
    if not stat.S_ISSOCK(status.st_mode) or status.st_uid != os.getuid():
        raise ControlError(f"{path} is not a control socket of yours: refusing to use it")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(str(path))
        except (ConnectionRefusedError, FileNotFoundError):
            raise _not_armed(pid, "its control socket is left over from an earlier run") from None
        except OSError as exc:
            raise ControlError(f"cannot reach process {pid} at {path}: {exc}") from None
        peer = _peer(sock)
        if peer is not None and (peer[0] != pid or peer[1] != os.getuid()):
            raise _not_armed(pid, f"{path} is served by process {peer[0]}, not by it")
        try:
            sock.sendall(orjson.dumps({"command": command, **fields}) + b"\n")
            raw = _read_line(sock, MAX_ANSWER)
        except TimeoutError:
            raise ControlError(
                f"process {pid} did not answer {command!r} in {timeout:g} s"
            ) from None
        except (OSError, ValueError) as exc:
            raise ControlError(
                f"process {pid} broke off its answer to {command!r}: {exc}"
            ) from None
    try:
        answer = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise ControlError(f"process {pid} did not answer {command!r} in JSON") from None
    if not isinstance(answer, dict):
        raise ControlError(f"process {pid} answered {command!r} with something else than JSON")
    if not answer.get("ok"):
        raise ControlError(f"process {pid}: {answer.get('error', 'refused')}")
    return answer
