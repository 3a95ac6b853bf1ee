"""Target filtering in whole-program mode: include/exclude patterns pick the tasks tracked."""

from __future__ import annotations

import asyncio
import gc
import sys
import types
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest

import asyncflow
from asyncflow.config import resolve_options
from asyncflow.filtering import TargetFilter, matches, parse_patterns
from asyncflow.instrumentation import futures
from asyncflow.instrumentation.futures import InstrumentedCoroutine
from tests.support.commands import asyncflow_cmd, write

LIBRARY = """
import asyncio

async def internal(n):
    await asyncio.sleep(0)
    return n * 10

class Pool:
    async def keepalive(self, n):
        await asyncio.sleep(0)
        return -n
"""


@pytest.fixture
def library() -> Iterator[types.ModuleType]:
    """A module ``fakelib.pool`` of "library" coroutines, beside this module's own."""
    module = types.ModuleType("fakelib.pool")
    exec(compile(LIBRARY, "<fakelib/pool.py>", "exec"), module.__dict__)
    sys.modules["fakelib.pool"] = module
    yield module
    del sys.modules["fakelib.pool"]


async def mine(n: int) -> int:
    await asyncio.sleep(0)
    return n + 1


@pytest.mark.parametrize(
    ("pattern", "module", "qualname", "expected"),
    [
        ("aiohttp", "aiohttp", "f", True),
        ("aiohttp", "aiohttp.web_protocol", "RequestHandler.start", True),
        ("aiohttp", "aiohttp_cors", "f", False),  # a plain name is a package, not a prefix
        ("aiohttp.*", "aiohttp.web_protocol", "RequestHandler.start", True),
        ("aiohttp.*", "aiohttp", "f", True),  # aiohttp.f: a function of the package itself
        ("aiohttp.*", "aiohttpx", "f", False),
        ("myapp.jobs.run", "myapp.jobs", "run", True),
        ("myapp.jobs.run", "myapp.jobs", "runner", False),
        ("myapp.Worker.*", "myapp", "Worker.loop", True),
        ("__main__:main", "__main__", "main", True),
        ("*:Pool.keepalive", "fakelib.pool", "Pool.keepalive", True),
        ("*.keep?live", "fakelib.pool", "Pool.keepalive", True),
        ("[mf]akelib.*", "fakelib.pool", "internal", True),
    ],
)
def test_patterns_name_modules_packages_and_qualified_names(
    pattern: str, module: str, qualname: str, expected: bool
) -> None:
    assert matches(pattern, module, qualname) is expected


def test_exclude_wins_over_include() -> None:
    target = TargetFilter(include=["myapp"], exclude=["myapp.vendored"])
    assert target.admits("myapp.core", "run")
    assert not target.admits("myapp.vendored.http", "run")
    assert not target.admits("aiohttp", "run")
    assert TargetFilter(exclude=["aiohttp"]).admits("myapp", "run")
    assert not TargetFilter()  # no patterns: no filter at all


def test_options_environment_and_their_errors() -> None:
    env = {"ASYNCFLOW_INCLUDE": "myapp.*, __main__", "ASYNCFLOW_EXCLUDE": "aiohttp"}
    options = resolve_options("x", {}, env)
    assert options.include == ("myapp.*", "__main__") and options.exclude == ("aiohttp",)
    options = resolve_options("x", {"exclude": ["anyio", "anyio"]}, env)  # explicit wins
    assert options.exclude == ("anyio",) and options.include == ("myapp.*", "__main__")
    assert resolve_options("x", {}, {}).include == ()
    assert resolve_options("x", {}, {"ASYNCFLOW_INCLUDE": " "}).include == ()  # an empty var: unset
    for bad, said in [
        ("a[b", "unclosed '['"),
        ("my app", "not a module or qualified-name pattern"),
        (["ok", 3], "non-empty strings"),
        (7, "expected module or qualified-name patterns"),
        (b"ab", "expected module or qualified-name patterns"),  # not the patterns 97 and 98
        ("app]", "a ']' without its '['"),  # not "an unclosed '['": it has none
        ("a[b]c]", "a ']' without its '['"),
        ("", "names no pattern"),  # given but empty: not "track every task"
        (" , ", "names no pattern"),
        ([], "names no pattern"),
        ((), "names no pattern"),
    ]:
        with pytest.raises(ValueError, match=r"exclude.*" + said.replace("[", r"\[")):
            resolve_options("x", {"exclude": bad}, {})
    with pytest.raises(ValueError, match="ASYNCFLOW_INCLUDE"):
        resolve_options("x", {}, {"ASYNCFLOW_INCLUDE": "x" * 2000})
    assert parse_patterns(" a , ,b ", "include") == ("a", "b")
    assert parse_patterns("app[0-9].*,[!_]*,[]x]", "include") == ("app[0-9].*", "[!_]*", "[]x]")


async def _run_mixed(library: types.ModuleType) -> tuple[list[Any], list[asyncio.Task[Any]]]:
    made: list[Coroutine[Any, Any, Any]] = []
    for i in range(3):
        made += [mine(i), library.internal(i), library.Pool().keepalive(i)]
    tasks = [asyncio.create_task(c) for c in made]
    return list(await asyncio.gather(*tasks)), tasks


async def test_excluded_tasks_are_left_unwrapped_and_decided_once(
    library: types.ModuleType,
) -> None:
    # The futures of earlier tests' libraries go with them (a module is freed by the cyclic
    # GC only), and the future of ``mine`` an earlier test tracked with instrument() lives on
    # beside the one of its tasks: the labels are read from the futures of tasks.
    gc.collect()
    with asyncflow.profile("filtered", format="none", port=None, exclude=["fakelib"]) as prof:
        with asyncflow.instrument_tasks():
            results, tasks = await _run_mixed(library)
        target = futures.task_filter
        assert isinstance(target, TargetFilter)
        assert target.rejected == 2  # two code objects, decided once each for three tasks
        snap = prof.snapshot()
    assert futures.task_filter is None  # the profiler's filter leaves with it
    wrapped = [isinstance(t.get_coro(), InstrumentedCoroutine) for t in tasks]
    assert wrapped == [True, False, False] * 3
    labels = {f.label: f.call_count for f in snap.futures.futures if f.tracked_by == "task"}
    assert labels.get("mine") == 3
    assert not {"internal", "Pool.keepalive"} & set(labels)
    # Transparency: the same results as without asyncflow.
    assert results == [1, 0, 0, 2, 10, -1, 3, 20, -2]


async def test_include_keeps_only_what_matches(library: types.ModuleType) -> None:
    include = [f"{__name__}:mine", "*:Pool.*"]
    with asyncflow.profile("focused", format="none", port=None, include=include) as prof:
        with asyncflow.instrument_tasks():
            await _run_mixed(library)
        snap = prof.snapshot()
    labels = {f.label for f in snap.futures.futures if f.call_count}
    assert {"mine", "Pool.keepalive"} <= labels and "internal" not in labels


async def test_a_filter_does_not_outlive_its_profiler(library: types.ModuleType) -> None:
    first = asyncflow.profile("first", format="none", port=None, exclude=["fakelib"])
    with first, asyncflow.instrument_tasks():
        await _run_mixed(library)
    with asyncflow.profile("second", format="none", port=None) as prof:
        with asyncflow.instrument_tasks():
            await _run_mixed(library)
        snap = prof.snapshot()
    assert {"internal", "Pool.keepalive", "mine"} <= {f.label for f in snap.futures.futures}


async def test_decorated_coroutines_are_tracked_whatever_the_filter() -> None:
    @asyncflow.future(name="asked_for")
    async def asked_for() -> int:
        return 1

    with asyncflow.profile("decorated", format="none", port=None, include=["nothing.here"]):
        with anyio.fail_after(10):
            assert await asyncflow.instrument(mine(1)) == 2
            assert await asyncio.create_task(asked_for()) == 1
        snap = asyncflow.stop()
    assert snap is not None
    assert {"asked_for", "mine"} <= {f.label for f in snap.futures.futures}


def test_run_include_and_exclude_flags(tmp_path: Path) -> None:
    script = write(
        tmp_path / "app.py",
        "import asyncio\n\n"
        "async def worker(n):\n    await asyncio.sleep(0)\n    return n\n\n"
        "async def helper(n):\n    await asyncio.sleep(0)\n    return n\n\n"
        "async def main():\n"
        "    print(sum(await asyncio.gather(*(asyncio.create_task(f(i))\n"
        "        for i in range(5) for f in (worker, helper)))))\n\n"
        "asyncio.run(main())\n",
    )
    report = tmp_path / "report.json"
    done = asyncflow_cmd(
        "run", "--format", "json", "--output", str(report), "--port", "off",
        "--exclude", "__main__:helper", str(script),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == "20\n"
    labels = {f["label"] for f in orjson.loads(report.read_bytes())["futures"]["futures"]}
    assert labels == {"worker", "main"}
    done = asyncflow_cmd(
        "run", "--format", "json", "--output", str(report), "--port", "off",
        "--include", "__main__:w*", str(script),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    labels = {f["label"] for f in orjson.loads(report.read_bytes())["futures"]["futures"]}
    assert labels == {"worker"}
    bad = asyncflow_cmd("run", "--include", "app[", str(script))
    assert bad.returncode == 2 and "--include" in bad.stderr and "unclosed" in bad.stderr
    assert bad.stdout == ""  # the program never ran
