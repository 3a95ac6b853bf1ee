"""The endpoint process: serves a profiled program's endpoint over HTTP, beside the program.

Started by :class:`asyncflow.serve.server.Server` at the first connection, as
``python -m asyncflow.serve._endpoint CONTROL LISTENING...``, through an intermediate that exits at
once (``server._DETACH``), so that it is no child of the program, in a session of its own.
CONTROL is its end of a socket pair to the program, LISTENING the sockets the program bound.
It asks the program for the documents its cache does not hold, and exits when the program
closes its end (the program stopped its profiler, or exited, however it ended). Ctrl-C in a
terminal is the program's business, not its.
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


if __name__ == "__main__":
    raise SystemExit(main())
