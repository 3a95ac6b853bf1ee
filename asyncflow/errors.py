"""The exceptions asyncflow raises for misuse of its own API."""

import sys

__all__ = ["TRACE_OFF", "AsyncflowError", "BadInputError", "PortInUseError", "say"]

#: why there is no trace to give (the profiler's ``trace()``, the endpoint's ``/trace``)
TRACE_OFF = (
    "no trace is recorded: start the profiler with trace=True (or trace='file.json'), "
    "ASYNCFLOW_TRACE=1, or asyncflow run --trace FILE"
)


class AsyncflowError(RuntimeError):
    """Raised when asyncflow is used in a way it cannot honour (e.g. a second profiler)."""


class BadInputError(AsyncflowError):
    """A file given to asyncflow that it cannot read (a damaged recording, say): a command
    says why in one line and exits 2, as for any bad input."""


class PortInUseError(AsyncflowError):
    """The endpoint's port was chosen explicitly and another program listens on it.

    A taken port nobody chose (the default) is no error: the endpoint serves on a free one.

    Attributes:
        host: the address the endpoint was to bind.
        port: the port that is taken.
        source: who chose it: ``"port"`` (an argument), ``"ASYNCFLOW_PORT"``, or a command-line
            flag such as ``"--port"``.
    """

    def __init__(self, host: str, port: int, source: str) -> None:
        self.host = host
        self.port = port
        self.source = source
        super().__init__(self.said_as(source))

    def said_as(self, source: str) -> str:
        """The message, naming ``source`` as the way to choose another port."""
        if source.startswith("ASYNCFLOW_"):
            advice = f"set {source} to another port (0 picks a free one)"
        elif source.startswith("-"):
            advice = f"pass another {source} ({source} 0 picks a free one)"
        else:
            advice = f"pass another {source}= ({source}=0 picks a free one)"
        return f"port {self.port} on {self.host} is already in use; {advice}"


def say(line: str) -> None:
    """Write ``line`` to stderr in one write. The processes of one program share their stderr,
    and ``print()`` writes a line's text and its end apart: with ``PYTHONUNBUFFERED`` set, a
    worker's line landed between another's text and its end, and two lines read as one."""
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (AttributeError, OSError, ValueError):  # no stderr, or closed: nobody to tell
        pass
