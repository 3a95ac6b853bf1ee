"""asyncflow: a data-flow profiler for asyncio.

Track coroutines with ``@asyncflow.future`` (or every task with ``asyncflow.instrument_tasks()``),
run the program under ``asyncflow.profile(...)``, and read the report at exit or the snapshot
at any time.
"""

from typing import TYPE_CHECKING

from asyncflow import _startup  # noqa: F401  (first: it notes what was loaded before asyncflow)
from asyncflow._version import __version__ as __version__
from asyncflow.config import Options as Options
from asyncflow.config import Reporter as Reporter
from asyncflow.errors import AsyncflowError as AsyncflowError
from asyncflow.instrumentation.futures import TaskInstrumentation as TaskInstrumentation
from asyncflow.instrumentation.futures import future as future
from asyncflow.instrumentation.futures import instrument as instrument
from asyncflow.instrumentation.futures import instrument_tasks as instrument_tasks
from asyncflow.profiler import Profiler as Profiler
from asyncflow.profiler import active_profiler as active_profiler
from asyncflow.profiler import profile as profile
from asyncflow.profiler import start as start
from asyncflow.profiler import stop as stop

if TYPE_CHECKING:  # imported when first used: see __getattr__
    from asyncflow._armed import arm as arm
    from asyncflow.instrumentation.coroutines import NeverAwaitedTracking as NeverAwaitedTracking
    from asyncflow.instrumentation.coroutines import track_never_awaited as track_never_awaited
    from asyncflow.instrumentation.executors import (
        ExecutorInstrumentation as ExecutorInstrumentation,
    )
    from asyncflow.instrumentation.executors import instrument_executors as instrument_executors
    from asyncflow.instrumentation.lineage import derive as derive
    from asyncflow.instrumentation.memory import (
        instrument_memory_stream as instrument_memory_stream,
    )
    from asyncflow.instrumentation.queues import QueueInstrumentation as QueueInstrumentation
    from asyncflow.instrumentation.queues import instrument_queue as instrument_queue
    from asyncflow.instrumentation.queues import instrument_queues as instrument_queues
    from asyncflow.instrumentation.recording import Recorder as Recorder
    from asyncflow.instrumentation.resources import LockInstrumentation as LockInstrumentation
    from asyncflow.instrumentation.resources import instrument_lock as instrument_lock
    from asyncflow.instrumentation.resources import instrument_locks as instrument_locks
    from asyncflow.instrumentation.streams import stream as stream
    from asyncflow.instrumentation.timing import measure as measure
    from asyncflow.instrumentation.timing import measure_block as measure_block
    from asyncflow.instrumentation.values import counter as counter
    from asyncflow.instrumentation.values import gauge as gauge
    from asyncflow.instrumentation.values import histogram as histogram
    from asyncflow.instrumentation.values import value as value
    from asyncflow.schema import Snapshot as Snapshot

#: names imported only when first used, so that ``import asyncflow`` stays light for a program
#: that only instruments (the documents' module alone costs more than the rest together), and
#: loads only what tracking coroutines needs: each kind of instrumentation loads its module
#: (and what it needs) when the program first asks for it, or when a profiler starts
_LAZY = {
    "NeverAwaitedTracking": "asyncflow.instrumentation.coroutines",
    "track_never_awaited": "asyncflow.instrumentation.coroutines",
    "ExecutorInstrumentation": "asyncflow.instrumentation.executors",
    "instrument_executors": "asyncflow.instrumentation.executors",
    "instrument_memory_stream": "asyncflow.instrumentation.memory",
    "derive": "asyncflow.instrumentation.lineage",
    "QueueInstrumentation": "asyncflow.instrumentation.queues",
    "instrument_queue": "asyncflow.instrumentation.queues",
    "instrument_queues": "asyncflow.instrumentation.queues",
    "LockInstrumentation": "asyncflow.instrumentation.resources",
    "instrument_lock": "asyncflow.instrumentation.resources",
    "instrument_locks": "asyncflow.instrumentation.resources",
    "stream": "asyncflow.instrumentation.streams",
    "Snapshot": "asyncflow.schema",
    # armed mode (issue 30): the control socket's listener, loaded only by a process that arms
    "arm": "asyncflow._armed",
    # function timing, the program's own metrics, the recording interface (issue 16); the
    # modules are named apart from the functions, so that importing one never shadows these
    "Recorder": "asyncflow.instrumentation.recording",
    "measure": "asyncflow.instrumentation.timing",
    "measure_block": "asyncflow.instrumentation.timing",
    "counter": "asyncflow.instrumentation.values",
    "gauge": "asyncflow.instrumentation.values",
    "histogram": "asyncflow.instrumentation.values",
    "value": "asyncflow.instrumentation.values",
}

__all__ = [
    "AsyncflowError",
    "ExecutorInstrumentation",
    "LockInstrumentation",
    "NeverAwaitedTracking",
    "Options",
    "Profiler",
    "QueueInstrumentation",
    "Recorder",
    "Reporter",
    "Snapshot",
    "TaskInstrumentation",
    "__version__",
    "active_profiler",
    "arm",
    "counter",
    "derive",
    "future",
    "gauge",
    "histogram",
    "instrument",
    "instrument_executors",
    "instrument_lock",
    "instrument_locks",
    "instrument_memory_stream",
    "instrument_queue",
    "instrument_queues",
    "instrument_tasks",
    "measure",
    "measure_block",
    "profile",
    "start",
    "stop",
    "stream",
    "track_never_awaited",
    "value",
]


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'asyncflow' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # asked once: a plain attribute from then on
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
