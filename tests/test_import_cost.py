"""``import asyncflow`` stays light: what a program that only instruments never loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from asyncflow import stats
from tests.support.commands import asyncflow_cmd

#: loaded only when a profiler serves, reports or exports, never by ``import asyncflow``
HEAVY = (
    "aiohttp",
    "anyio",
    "orjson",
    "sortedcontainers",
    "yarl",
    "multidict",
    "opentelemetry",
    "asyncflow.serve.server",
    "asyncflow.views.documents",
    "asyncflow.schema",
    "asyncflow.model.collector",
    "asyncflow.render.report",
    "asyncflow.cli",
)

_PROBE = """
import json, sys
{code}
print(json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)))
"""


def _loaded_after(code: str, **env: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE.format(code=code, heavy=HEAVY)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
        check=True,
    ).stdout
    loaded: list[str] = json.loads(out.splitlines()[-1])
    return loaded


@pytest.mark.parametrize("no_extensions", ["0", "1"], ids=["compiled", "pure Python"])
def test_import_asyncflow_loads_nothing_heavy(no_extensions: str) -> None:
    assert _loaded_after("import asyncflow", ASYNCFLOW_NO_EXTENSIONS=no_extensions) == []


def test_instrumenting_without_a_profiler_loads_nothing_heavy() -> None:
    code = """
import asyncio, asyncflow

@asyncflow.future
async def work(lock):
    async with lock:
        await asyncio.sleep(0)

async def main():
    lock = asyncflow.instrument_lock(asyncio.Lock())
    q = asyncflow.instrument_queue(asyncio.Queue())
    q.put_nowait(1)
    await q.get()
    await asyncio.gather(work(lock), work(lock))

asyncio.run(main())
"""
    assert _loaded_after(code) == []


#: loaded when the program first uses them (or a profiler starts), not by ``import asyncflow``:
#: each costs a module's load, and a program that tracks coroutines may use none of them
WHEN_USED = {
    "instrument_queue": "asyncflow.instrumentation.queues",
    "instrument_lock": "asyncflow.instrumentation.resources",
    "stream": "asyncflow.instrumentation.streams",
    "instrument_memory_stream": "asyncflow.instrumentation.memory",
    "instrument_executors": "asyncflow.instrumentation.executors",
    "track_never_awaited": "asyncflow.instrumentation.coroutines",
}


def _modules_after(code: str) -> set[str]:
    probe = f"import json, sys\n{code}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    return set(json.loads(out.splitlines()[-1]))


def test_import_asyncflow_loads_what_tracking_coroutines_needs_and_no_more() -> None:
    loaded = _modules_after("import asyncflow")
    assert "asyncflow.instrumentation.futures" in loaded and "asyncflow.profiler" in loaded
    never = {*WHEN_USED.values(), "asyncflow.instrumentation.channels", "concurrent.futures.thread"}
    assert sorted(never & loaded) == []


@pytest.mark.parametrize("name", sorted(WHEN_USED))
def test_a_name_loads_its_module_when_first_used(name: str) -> None:
    loaded = _modules_after(f"import asyncflow; asyncflow.{name}")
    assert WHEN_USED[name] in loaded


def test_the_lazy_names_still_resolve() -> None:
    # the documents' module loads when first asked for, and only then
    loaded = _loaded_after("import asyncflow; asyncflow.Snapshot")
    assert "asyncflow.schema" in loaded
    assert not {"aiohttp", "asyncflow.serve.server", "asyncflow.model.collector"} & set(loaded)


def test_the_small_bucket_table_is_bucket_of() -> None:
    # built a run at a time at import, it must agree with bucket_of everywhere
    assert len(stats.SMALL_BUCKET) == stats.SMALL_LIMIT
    assert [stats.bucket_of(ns) for ns in range(stats.SMALL_LIMIT)] == stats.SMALL_BUCKET


def test_a_program_that_never_uses_anyio_never_loads_it() -> None:
    """asyncflow knows anyio's files (its frames are a library's) without importing it: a
    profiled asyncio program that does not use anyio does not load it, as the transparency
    page says."""
    code = """
import asyncio, asyncflow

async def main():
    with asyncflow.instrument_tasks():
        await asyncio.gather(asyncio.sleep(0), asyncio.sleep(0))
    asyncflow.active_profiler().snapshot()  # (every document built: the waits read too)

with asyncflow.profile("plain", format="none", port=None):
    asyncio.run(main())
"""
    assert "anyio" not in _modules_after(code)


def test_a_program_run_whole_that_never_uses_anyio_never_loads_it(tmp_path: Path) -> None:
    """Under ``asyncflow run`` every primitive is instrumented, anyio's too, and still anyio
    (or trio) is never imported for it: its classes are hooked when the program loads them."""
    script = tmp_path / "prog.py"
    script.write_text(
        "import asyncio, sys\n"
        "async def main():\n"
        "    async with asyncio.Lock():\n"
        "        await asyncio.sleep(0)\n"
        "asyncio.run(main())\n"
        "print(sorted(m for m in ('anyio', 'sniffio', 'trio') if m in sys.modules))\n"
    )
    done = asyncflow_cmd("run", "--format", "none", str(script), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "[]\n"
