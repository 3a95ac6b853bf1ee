"""The endpoint process: serves a profiled program's endpoint over HTTP, beside the program.

Started by :class:`asyncflow.serve.server.Server` as soon as it listens, as
``python -P asyncflow/serve/_endpoint.py CONTROL LISTENING...``, through an intermediate that
exits at once (``server._DETACH``), so that it is no child of the program, in a session of its own.
CONTROL is its end of a socket pair to the program, LISTENING the sockets the program bound.
It asks the program for the documents its cache does not hold, and exits when the program
closes its end (the program stopped its profiler, or exited, however it ended). Ctrl-C in a
terminal is the program's business, not its.

Run as a script, not with ``-m``, so that the ``asyncflow`` package's ``__init__`` (the profiler,
the options table, the hot path) never runs here: the time before its first answer is Python's
start and aiohttp's import, little more.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import traceback

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Serve until the program closes the control socket; then exit at once."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    args = sys.argv[1:] if argv is None else argv
    control = socket.socket(fileno=int(args[0]))
    listening = [socket.socket(fileno=int(fd)) for fd in args[1:]]
    _bare_package()
    from asyncflow.serve._http import serve_in_child

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(serve_in_child(control, listening))
    except BaseException:
        # Its standard error is a file the program reads and quotes on its logger when this
        # process dies before serving: say why there.
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    # Nothing here is worth a clean shutdown: connections die with the process.
    os._exit(0)


def _bare_package() -> None:
    """Make ``asyncflow``'s modules importable without its ``__init__``: the endpoint imports
    its own modules and the foundation, none of what the front door brings."""
    if "asyncflow" in sys.modules:  # imported as a module (tests): nothing to spare
        return
    import importlib.util

    spec = importlib.util.find_spec("asyncflow")
    if spec is not None and spec.submodule_search_locations is not None:
        sys.modules["asyncflow"] = importlib.util.module_from_spec(spec)
    # else: the import below says what is missing, on the standard error the program quotes


if __name__ == "__main__":
    raise SystemExit(main())
