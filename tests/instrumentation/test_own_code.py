"""A row per handler without code changes: under ``asyncflow run`` the program's own coroutine
functions are futures, as if decorated with ``@asyncflow.future`` (issue 26), and the program
sees no difference."""

from __future__ import annotations

import asyncio
import importlib
import os
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest

import asyncflow
from asyncflow.instrumentation import own_code
from asyncflow.instrumentation.futures import FutureFunction
from tests.support.commands import asyncflow_cmd, write

HELPER = '''\
"""The program's own module, imported by the script."""
import asyncio

from pydantic import BaseModel, validate_call


async def fetch(n):
    await asyncio.sleep(0)
    return n * 2


async def fail():
    raise ValueError("planted")


class Base:
    async def run(self, x: int) -> int:
        return x


class Worker(Base):
    async def run(self, x: int) -> int:  # zero-argument super() needs the __class__ cell
        return await super().run(x) + 1

    @classmethod
    async def make(cls) -> str:
        return cls.__name__

    @staticmethod
    async def ping() -> str:
        return "pong"


async def numbers():  # an async generator: left alone
    yield 1
    yield 2


def plain(x):  # a plain function: left alone
    return x


@validate_call  # refuses anything but a function (isinstance(f, types.FunctionType))
async def validated(x: int) -> int:
    return x * 2


class Order(BaseModel):  # its metaclass refuses any attribute but fields and functions
    id: int

    async def total(self) -> int:
        return self.id
'''

PROGRAM = """\
import asyncio
import functools
import inspect
import pickle
import traceback

import asyncflow
import helper


def logged(fn):
    @functools.wraps(fn)
    async def wrapper(*args, **kwargs):
        return await fn(*args, **kwargs)
    return wrapper


@logged
async def decorated(a: int, b: int = 2) -> int:
    return a + b


@asyncflow.future(name="explicit")
async def asked_for() -> str:
    return "e"


async def main():
    async def nested(k):
        return k

    results = [
        await helper.fetch(1), await helper.fetch(2), await helper.Worker().run(1),
        await helper.Worker.make(), await helper.Worker.ping(), await nested(3),
        await decorated(1), await asked_for(), [x async for x in helper.numbers()],
        helper.plain(4), await helper.validated("3"), await helper.Order(id=5).total(),
    ]
    print("results", results)
    for fn in (main, nested, decorated, helper.fetch, helper.Worker.run, helper.Worker().run,
               helper.Worker.make, helper.Worker.ping):
        print(fn.__qualname__, fn.__module__, inspect.iscoroutinefunction(fn),
              inspect.signature(fn), inspect.getsourcelines(fn)[1])
    print("kinds", inspect.isasyncgenfunction(helper.numbers), type(helper.numbers).__name__,
          type(helper.plain).__name__, inspect.isfunction(helper.fetch), helper.fetch.__class__)
    print("pickled", pickle.loads(pickle.dumps(helper.fetch)) is helper.fetch,
          pickle.loads(pickle.dumps(main)) is main)
    print("code lines", helper.fetch.__code__.co_firstlineno, main.__code__.co_firstlineno,
          decorated.__wrapped__.__code__.co_firstlineno)
    try:
        await helper.fail()
    except ValueError as exc:
        frames = traceback.extract_tb(exc.__traceback__)
        # (the pure-Python hot path adds its own frame, as for any tracked call)
        print("traceback", [(f.name, f.lineno, f.line) for f in frames
                            if "asyncflow" not in f.filename])
    try:
        import broken
    except SyntaxError as exc:
        print("syntax error", exc.msg, exc.lineno, exc.offset)


asyncio.run(main())
"""


def _program(directory: Path) -> Path:
    write(directory / "helper.py", HELPER)
    write(directory / "broken.py", "x = 1\nasync def f(:\n    pass\n")
    return write(directory / "app.py", PROGRAM)


def _env() -> dict[str, str]:
    return {"PYTHONDONTWRITEBYTECODE": ""}  # bytecode is written as a user's run writes it


def _report(directory: Path, *options: str, env: dict[str, str] | None = None) -> Any:
    report = directory / "report.json"
    done = asyncflow_cmd(
        "run", "--format", "json", "--output", str(report), *options, "app.py",
        cwd=directory, env={**_env(), **(env or {})},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "internal error" not in done.stderr, done.stderr
    document = orjson.loads(report.read_bytes())
    return {f["label"]: f for f in document["futures"]["futures"]}


def test_the_programs_coroutine_functions_are_rows_with_no_code_change(tmp_path: Path) -> None:
    _program(tmp_path)
    futures = _report(tmp_path)
    calls = {label: (f["call_count"], f["tracked_by"]) for label, f in futures.items()}
    assert calls["fetch"] == (2, "own_code")
    assert calls["Worker.run"] == (1, "own_code")
    assert calls["Base.run"] == (1, "own_code")
    assert calls["Worker.make"] == (1, "own_code")
    assert calls["Worker.ping"] == (1, "own_code")
    assert calls["Order.total"] == (1, "own_code")  # tracked once its class exists
    assert calls["main.<locals>.nested"] == (1, "own_code")
    assert calls["decorated"] == (1, "own_code")  # the function the program's decorator wraps
    assert calls["logged.<locals>.wrapper"] == (1, "own_code")  # and the wrapper it made
    assert calls["main"] == (1, "own_code")  # asyncio.run's task: its coroutine is tracked
    assert calls["fail"][1] == "own_code"
    assert futures["fail"]["outcomes"]["raised"] == 1
    # the program's own decorator keeps its name; async generators are not futures
    assert calls["explicit"] == (1, "decorator")
    assert "asked_for" not in calls and "numbers" not in calls
    assert calls["validated"] == (1, "own_code")  # validate_call takes it for a function
    location = futures["fetch"]["location"]
    assert (Path(location["file"]).name, location["line"]) == ("helper.py", 7)
    assert not any(label.startswith(("sleep", "Runner.", "BaseEventLoop.")) for label in calls)


def test_the_program_sees_what_it_sees_without_asyncflow(tmp_path: Path) -> None:
    _program(tmp_path)
    plain = _python(tmp_path / "app.py", cwd=tmp_path)
    assert "results [2, 4, 2, 'Worker', 'pong', 3, 3, 'e', [1, 2], 4, 6, 5]" in plain
    assert "traceback [('main', 50, 'await helper.fail()'), ('fail', 13, " in plain
    assert "syntax error invalid syntax 2 13" in plain
    for flag in ([], ["--no-own-code"]):
        done = asyncflow_cmd("run", "--format", "none", *flag, "app.py", cwd=tmp_path, env=_env())
        assert done.returncode == 0, done.stderr
        assert done.stdout == plain, flag


_ASKS_INSPECT = """\
import asyncio
import inspect
import types

import httpx

seen = []


async def log_trace(event, info):
    seen.append(event)


async def serve(reader, writer):
    await reader.readuntil(b"\\r\\n\\r\\n")
    writer.write(b"HTTP/1.1 200 OK\\r\\nContent-Length: 2\\r\\n\\r\\nok")
    await writer.drain()
    writer.close()


async def fetch():
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with httpx.AsyncClient() as client:
        answer = await client.get(f"http://127.0.0.1:{port}/", extensions={"trace": log_trace})
    server.close()
    return answer.text


async def not_sync():
    pass


coro = not_sync()
print(inspect.iscoroutine(coro), isinstance(coro, types.CoroutineType))
print(inspect.getcoroutinestate(coro))
coro.close()
print(inspect.getcoroutinestate(coro))
# httpx's trace extension asks inspect whether the program's callback made a coroutine
print(asyncio.run(fetch()), "connection.connect_tcp.started" in seen)
"""


def test_libraries_that_ask_inspect_whether_a_call_made_a_coroutine_are_told_yes(
    tmp_path: Path,
) -> None:
    """A tracked call is a wrapper, but ``inspect.iscoroutine`` (what httpx's trace extension
    asks) says yes of it, as of the coroutine it wraps: under ``asyncflow run`` the program's
    async trace callback is awaited, as without asyncflow (trio's threads ask it too:
    tests/services/test_trio.py)."""
    write(tmp_path / "app.py", _ASKS_INSPECT)
    plain = _python(tmp_path / "app.py", cwd=tmp_path)
    assert plain == "True True\nCORO_CREATED\nCORO_CLOSED\nok True\n"
    report = tmp_path / "report.json"
    done = asyncflow_cmd(
        "run", "--format", "json", "--output", str(report), "app.py", cwd=tmp_path, env=_env()
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == plain
    assert "never awaited" not in done.stderr, done.stderr
    calls = {f["label"]: f for f in orjson.loads(report.read_bytes())["futures"]["futures"]}
    assert calls["log_trace"]["tracked_by"] == "own_code" and calls["log_trace"]["call_count"] > 2


def _python(script: Path, cwd: Path, *args: str) -> str:
    import subprocess

    env = {k: v for k, v in os.environ.items() if not k.startswith(("ASYNCFLOW_", "PYTHONDONT"))}
    done = subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_no_transformed_bytecode_is_written_or_read(tmp_path: Path) -> None:
    _program(tmp_path)
    cache = tmp_path / "__pycache__"
    _report(tmp_path)
    assert not cache.exists(), list(cache.iterdir())  # the run wrote nothing
    _python(tmp_path / "app.py", cwd=tmp_path)  # a plain run caches the plain bytecode
    (cached,) = (p for p in cache.iterdir() if p.name.startswith("helper."))
    before = cached.read_bytes()
    futures = _report(tmp_path)  # the run does not take the plain bytecode from the cache...
    assert futures["fetch"]["call_count"] == 2
    assert cached.read_bytes() == before  # ... nor write its own there
    probe = write(
        tmp_path / "probe.py",
        "import helper\nprint(type(helper.fetch).__name__, type(helper.Worker.ping).__name__)\n",
    )
    assert _python(probe, cwd=tmp_path) == "function function\n"  # a later plain run: plain


def test_include_exclude_and_the_switch_decide(tmp_path: Path) -> None:
    _program(tmp_path)
    futures = _report(tmp_path, "--exclude", "helper.Worker.*,*:main.<locals>.*")
    assert futures["fetch"]["tracked_by"] == "own_code"
    assert not any(label.startswith(("Worker.", "main.<locals>")) for label in futures)
    futures = _report(tmp_path, "--include", "helper")
    assert {"fetch", "Worker.run", "Base.run"} <= set(futures)
    assert "decorated" not in futures and "main" not in futures  # __main__'s are left out
    assert futures["explicit"]["tracked_by"] == "decorator"  # asked for by name: always
    for off in (["--no-own-code"], []):
        env = {"ASYNCFLOW_NO_OWN_CODE": "1"} if not off else None
        futures = _report(tmp_path, *off, env=env)
        assert not any(f["tracked_by"] == "own_code" for f in futures.values())
        assert futures["main"]["tracked_by"] == "task"  # whole-program mode as before
        assert "fetch" not in futures


def test_a_bad_variable_is_a_usage_error(tmp_path: Path) -> None:
    _program(tmp_path)
    done = asyncflow_cmd("run", "app.py", cwd=tmp_path, env={"ASYNCFLOW_NO_OWN_CODE": "maybe"})
    assert done.returncode == 2
    assert "ASYNCFLOW_NO_OWN_CODE='maybe': expected true or false" in done.stderr, done.stderr


def test_run_dash_m_tracks_the_packages_coroutine_functions(tmp_path: Path) -> None:
    write(tmp_path / "shop" / "__init__.py", "")
    write(tmp_path / "shop" / "jobs.py", "async def charge(n):\n    return n\n")
    write(
        tmp_path / "shop" / "__main__.py",
        "import asyncio\nfrom shop import jobs\n\n"
        "async def main():\n    print(await jobs.charge(3))\n\nasyncio.run(main())\n",
    )
    report = tmp_path / "report.json"
    done = asyncflow_cmd(
        "run", "--format", "json", "--output", str(report), "-m", "shop", cwd=tmp_path
    )  # fmt: skip
    assert (done.returncode, done.stdout) == (0, "3\n"), done.stderr
    futures = orjson.loads(report.read_bytes())["futures"]["futures"]
    own = {f["source"]: f["call_count"] for f in futures if f["tracked_by"] == "own_code"}
    assert own == {"shop.jobs:charge": 1, "__main__:main": 1}


def test_installed_code_and_the_standard_library_are_not_the_programs(tmp_path: Path) -> None:
    installed = tmp_path / "venv" / "lib" / "site-packages"
    write(installed / "extlib.py", "async def call_library():\n    return 1\n")
    write(tmp_path / "app.py", "import asyncio, extlib\nasyncio.run(extlib.call_library())\n")
    path = os.pathsep.join(filter(None, [str(installed), os.environ.get("PYTHONPATH")]))
    futures = _report(tmp_path, env={"PYTHONPATH": path})
    assert "call_library" in futures  # asyncio.run's task, tracked as a task...
    assert futures["call_library"]["tracked_by"] == "task"  # ... not as the program's own


# -- in the test's process: a FastAPI app called through httpx, no server --------------------

APP = """\
from __future__ import annotations

import asyncio
import time

from fastapi import Depends, FastAPI

app = FastAPI()


async def page_size(size: int = 10) -> int:
    return size


@app.get("/orders/{order_id}")
async def get_order(order_id: int, size: int = Depends(page_size)) -> dict[str, int]:
    await asyncio.sleep(0.03)  # slow: waits, the loop is free
    return {"id": order_id, "size": size}


@app.get("/report")
async def build_report() -> dict[str, str]:
    time.sleep(0.03)  # blocking: the loop waits with it
    return {"report": "ready"}
"""


@pytest.fixture
def app_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A module name whose file is the program's own, found first on ``sys.path``."""
    name = f"own_app_{os.getpid()}_{time.monotonic_ns()}"
    write(tmp_path / f"{name}.py", APP)
    monkeypatch.chdir(tmp_path)  # the current directory is the program's own code too
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


async def test_a_slow_route_and_a_blocking_route_are_two_rows(app_module: str) -> None:
    import httpx

    with asyncflow.profile("t", format="none") as prof:
        tracking = own_code.track_own_code(script=f"{app_module}.py")
        try:
            app = importlib.import_module(app_module).app
        finally:
            tracking.undo()
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            with anyio.fail_after(30):
                for i in range(5):
                    reply = await client.get(f"/orders/{i}", params={"size": 3})
                    assert reply.json() == {"id": i, "size": 3}
                    assert (await client.get("/report")).json() == {"report": "ready"}
                # FastAPI still reads the signature and the type hints (through __wrapped__)
                assert (await client.get("/orders/x")).status_code == 422
        schema = app.openapi()
        snap = prof.snapshot()
    parameters = schema["paths"]["/orders/{order_id}"]["get"]["parameters"]
    assert [(p["name"], p["schema"]["type"]) for p in parameters] == [
        ("order_id", "integer"),
        ("size", "integer"),
    ]
    rows = {f.label: f for f in snap.futures.futures}
    slow, blocking = rows["get_order"], rows["build_report"]
    assert (slow.call_count, slow.tracked_by) == (5, "own_code")
    assert (blocking.call_count, blocking.tracked_by) == (5, "own_code")
    assert rows["page_size"].call_count == 6  # the dependency is a row too (the 422 ran it)
    # the blocking route's time is busy (in its polls), the slow one's idle (between them);
    # medians, so that one stall of a loaded machine in a slow route's poll changes nothing
    assert blocking.busy_ns >= 5 * 30_000_000
    assert blocking.poll_duration_ns["p50"] >= 27_000_000  # (bucketed: within 10%)
    assert slow.idle_ns >= 5 * 29_000_000
    assert slow.poll_duration_ns["p50"] < 15_000_000
    assert slow.call_duration_ns["p50"] >= 27_000_000


def test_the_decorator_leaves_what_it_must_not_track_alone() -> None:
    async def coroutine_function() -> None:
        pass

    async def generator() -> Any:
        yield 1

    def plain() -> None:
        pass

    assert own_code._own(coroutine_function) is coroutine_function  # no tracking is on
    tracking = own_code.track_own_code()
    try:
        for fn in (generator, plain, len, "text"):
            assert own_code._own(fn) is fn
        with asyncflow.profile("t", format="none"):
            tracked = own_code._own(coroutine_function)
        assert isinstance(tracked, FutureFunction)
        assert tracked.__wrapped__ is coroutine_function
    finally:
        tracking.undo()
    assert own_code._finder not in sys.meta_path
    tracking.undo()  # idempotent


def test_the_transform_adds_one_decorator_per_coroutine_function_only() -> None:
    source = textwrap.dedent(
        """
        async def a(): pass
        async def g(): yield
        async def h(x=lambda: (yield)): pass
        @asyncflow.future
        async def named(): pass
        def s():
            async def inner(): pass
            return inner
        class K:
            async def m(self):
                def sync_gen():
                    yield 1
                return sync_gen
        """
    )
    code = own_code.transform(source, "<t>")
    decorated: list[str] = []

    def record(fn: Any) -> Any:
        decorated.append(fn.__qualname__)
        return fn

    def record_class(cls: type) -> type:
        decorated.extend(
            f.__qualname__ for f in vars(cls).values() if asyncio.iscoroutinefunction(f)
        )
        return cls

    namespace: dict[str, Any] = {
        own_code.DECORATOR: record,
        own_code.CLASS_DECORATOR: record_class,
        "asyncflow": asyncflow,
    }
    exec(code, namespace)
    namespace["s"]()
    assert sorted(decorated) == ["K.m", "a", "h", "s.<locals>.inner"]


def test_the_decorator_is_not_in_the_programs_namespaces(tmp_path: Path) -> None:
    write(tmp_path / "helper.py", HELPER)
    write(
        tmp_path / "app.py",
        "import helper\nprint(sorted(k for k in vars(helper) if 'asyncflow' in k))\n"
        "print(sorted(k for k in globals() if 'asyncflow' in k))\n",
    )
    done = asyncflow_cmd("run", "--format", "none", "app.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "[]\n[]\n"


def test_the_program_runs_on_the_running_loop_as_before() -> None:
    # the decorated coroutine is still awaited and scheduled as the program's own
    async def work() -> int:
        await asyncio.sleep(0)
        return 7

    tracking = own_code.track_own_code()
    try:
        with asyncflow.profile("t", format="none") as prof:
            tracked = own_code._own(work)
            assert asyncio.run(tracked()) == 7
            snap = prof.snapshot()
    finally:
        tracking.undo()
    # (its own row: other tests' functions named work may still be registered in this process)
    (row,) = [
        f
        for f in snap.futures.futures
        if f.label.endswith("work") and f.location.line == work.__code__.co_firstlineno
    ]
    assert (row.call_count, row.total_polls) == (1, 2)


def test_a_decorator_that_refuses_the_tracked_function_gets_the_function_itself() -> None:
    import types

    async def handler() -> None:
        pass

    def strict(fn: Any) -> Any:  # a decorator that takes only a function, by its type
        if type(fn) is not types.FunctionType:
            raise TypeError("should be applied to functions")
        return fn

    registered: list[Any] = []

    def route(fn: Any) -> Any:  # as @app.get(...)
        registered.append(fn)
        return fn

    def broken(fn: Any) -> Any:
        raise ValueError("the program's own mistake")

    tracking = own_code.track_own_code()
    try:
        with asyncflow.profile("t", format="none"):
            assert own_code._guard(strict)(own_code._own(handler)) is handler
            tracked = own_code._own(handler)
            assert own_code._guard(route)(tracked) is tracked and registered == [tracked]
            assert own_code._guard(route)(handler) is handler  # not ours: as it is
            with pytest.raises(ValueError, match="own mistake") as raised:
                own_code._guard(broken)(own_code._own(handler))
    finally:
        tracking.undo()
    assert raised.value.__context__ is None  # raised as without asyncflow, not during ours


STARLETTE_APP = """\
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route


async def homepage(request):
    return PlainTextResponse("home")


app = Starlette(routes=[Route("/", homepage)])  # anything but a function is taken for an app
"""


async def test_a_starlette_route_takes_the_tracked_handler_for_a_function(
    app_module: str, tmp_path: Path
) -> None:
    import httpx

    write(tmp_path / f"{app_module}.py", STARLETTE_APP)
    with asyncflow.profile("t", format="none") as prof:
        tracking = own_code.track_own_code(script=f"{app_module}.py")
        try:
            module = importlib.import_module(app_module)
        finally:
            tracking.undo()
        assert isinstance(module.homepage, own_code.OwnFunction)
        transport = httpx.ASGITransport(app=module.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            with anyio.fail_after(30):
                assert (await client.get("/")).text == "home"
        snap = prof.snapshot()
    (row,) = [f for f in snap.futures.futures if f.label == "homepage"]
    assert (row.call_count, row.tracked_by) == (1, "own_code")


def test_a_class_that_refuses_new_attributes_keeps_its_methods() -> None:
    from asyncflow.instrumentation import _session

    class Frozen(type):
        def __setattr__(cls, name: str, value: Any) -> None:
            raise AttributeError(f"{cls.__name__} is frozen")

    class Service(metaclass=Frozen):
        async def handle(self) -> int:
            return 1

    plain = vars(Service)["handle"]
    tracking = own_code.track_own_code()
    try:
        with asyncflow.profile("t", format="none"):
            errors = _session.errors.count
            assert own_code._own_class(Service) is Service
            assert _session.errors.count == errors  # not asyncflow's error: the class's choice
    finally:
        tracking.undo()
    assert vars(Service)["handle"] is plain


LOADED = """\
import asyncio
from asyncio import sleep


async def fetch(n):
    await sleep(0)
    return n


async def handle(n):
    return 2 * await fetch(n)


class Service:
    async def serve(self, n):
        return await handle(n)
"""


def test_a_module_loaded_before_the_tracking_has_its_functions_tracked_in_place() -> None:
    """As a spawned child's ``__mp_main__``: run by runpy before asyncflow was there, in a
    namespace of its own that the module got a copy of. Its functions and its classes'
    coroutine methods are tracked, in both namespaces; what it imported is left alone."""
    namespace: dict[str, Any] = {"__name__": "loaded_early"}
    exec(compile(LOADED, "loaded_early.py", "exec"), namespace)  # (no decorator added)
    module = type(sys)("loaded_early")
    module.__dict__.update(namespace)  # runpy's copy
    tracking = own_code.track_own_code()
    try:
        with asyncflow.profile("t", format="none") as prof:
            assert own_code.track_loaded(module) == 3
            assert module.sleep is asyncio.sleep and namespace["sleep"] is asyncio.sleep
            assert module.fetch is namespace["fetch"] and type(module.fetch) is own_code.OwnFunction
            assert asyncio.run(module.Service().serve(3)) == 6  # through the namespace's names
            assert own_code.track_loaded(module) == 0  # (tracked once)
            snap = prof.snapshot()
    finally:
        tracking.undo()
    calls = {
        f.label: f.call_count for f in snap.futures.futures if f.location.file == "loaded_early.py"
    }
    assert calls == {"fetch": 1, "handle": 1, "Service.serve": 1}
