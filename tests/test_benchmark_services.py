"""``benchmarks/services.py --base-checkout DIR`` pairs a change against the code before it:
its first server must run DIR's asyncflow, wherever the benchmark is started from. Started
from the repository's root, ``python -m asyncflow`` put the working directory first on the
path, ahead of the PYTHONPATH that names DIR: both servers ran the working tree's code, and a
pairing of two commits read as noise."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys
import types
from pathlib import Path

import pytest

from asyncflow import config

REPO = Path(__file__).resolve().parents[1]

pytest.importorskip("httpx", reason="benchmarks/services.py drives its servers with httpx")


def _services(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """benchmarks/services.py, as its script imports it (its folder first on the path)."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    spec = importlib.util.spec_from_file_location("services", REPO / "benchmarks" / "services.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "services", module)  # (its dataclasses look it up)
    spec.loader.exec_module(module)
    return module


def _checkout(root: Path, ran: Path) -> Path:
    """A checkout whose ``python -m asyncflow`` writes where it was imported from, and ends."""
    package = root / "asyncflow"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text(
        f"import pathlib, asyncflow\npathlib.Path({str(ran)!r}).write_text(asyncflow.__file__)\n"
    )
    return root


@pytest.mark.parametrize("folder", ["repository", "elsewhere"])
def test_a_base_checkouts_server_runs_that_checkouts_asyncflow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, folder: str
) -> None:
    services = _services(monkeypatch)
    ran = tmp_path / "ran.txt"
    checkout = _checkout(tmp_path / "before", ran)
    monkeypatch.chdir(REPO if folder == "repository" else tmp_path)
    server = services.Server(
        services.SERVICES["aiohttp"], False, tmp_path, None, (), checkout=checkout
    )
    server.start(str(tmp_path / "upstream.sock"))
    try:
        assert server.process.wait(timeout=60) == 0  # (the real asyncflow would serve on)
    finally:
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait()
        server.log.close()
    assert Path(ran.read_text()) == checkout / "asyncflow" / "__init__.py"


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/PID/maps")
def test_a_base_checkout_whose_extension_its_server_does_not_run_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without its extension built in place, the base server would run the pure-Python path
    (or another checkout's extension): a pairing of that reads as a change it is not."""
    services = _services(monkeypatch)
    checkout = _checkout(tmp_path / "before", tmp_path / "ran.txt")
    (checkout / "asyncflow" / "__main__.py").write_text("import time\ntime.sleep(60)\n")
    server = services.Server(
        services.SERVICES["aiohttp"], False, tmp_path, None, (), checkout=checkout
    )
    server.start(str(tmp_path / "upstream.sock"))
    try:
        with pytest.raises(RuntimeError, match=r"no compiled extension.*build_ext --inplace"):
            server.runs_checkout()
    finally:
        server.process.kill()
        server.process.wait()
        server.log.close()


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/PID/maps")
def test_a_base_checkout_whose_extension_its_server_runs_is_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """This checkout as the base, from elsewhere: its server runs its extension."""
    pytest.importorskip("aiohttp")
    services = _services(monkeypatch)
    if config.no_extensions() or not list(
        (REPO / "asyncflow" / "instrumentation").glob("_speedups*.so")
    ):
        pytest.skip("the extension is not built in place here, or not to be used")
    monkeypatch.chdir(tmp_path)
    server = services.Server(services.SERVICES["aiohttp"], False, tmp_path, None, (), REPO)
    server.start(str(tmp_path / "upstream.sock"))
    try:
        asyncio.run(server.ready())
        server.runs_checkout()
    finally:
        server.stop()


@pytest.mark.parametrize("new_connections", [False, True])
def test_a_servers_loads_keep_their_clients_connections(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, new_connections: bool
) -> None:
    # Each slice's clients opened new connections: more work a request in both servers, and
    # fewer requests a second, so that the profiler's work a second weighed more on each. The
    # clients now keep one connection each for the server's life (--new-connections: as before).
    services = _services(monkeypatch)
    monkeypatch.setattr(services, "NEW_CONNECTIONS", new_connections)
    web = pytest.importorskip("aiohttp.web")
    sock = str(tmp_path / "service.sock")
    peers: list[object] = []

    async def answer(request: object) -> object:
        return web.Response(text="ok")

    class Counting(web.RequestHandler):  # type: ignore[misc,name-defined]
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            peers.append(transport)
            super().connection_made(transport)

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/{tail:.*}", answer)
        runner = web.AppRunner(app, handler_cancellation=True)
        await runner.setup()
        loop = asyncio.get_running_loop()
        server = await loop.create_unix_server(lambda: Counting(runner.server, loop=loop), sock)
        load = services.Server(services.SERVICES["aiohttp"], False, tmp_path, None)
        load.sock = sock
        load.process = types.SimpleNamespace(pid=os.getpid())
        try:
            for _ in range(3):
                await load.load(20, 2)
        finally:
            await load.close_clients()
            server.close()
            await server.wait_closed()
            await runner.cleanup()

    asyncio.run(main())
    assert len(peers) == (6 if new_connections else 2)


def test_each_servers_variables_reach_its_environment_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--base-env``/``--run-env``: a variable set for one server is in its environment, over
    this process's, and not in the other's; with ``--base-checkout``, a PYTHONPATH given
    that way stays after the checkout."""
    services = _services(monkeypatch)
    ran = tmp_path / "ran.txt"
    checkout = _checkout(tmp_path / "before", ran)
    (checkout / "asyncflow" / "__main__.py").write_text(
        "import os, pathlib\n"
        f"pathlib.Path({str(ran)!r} + os.environ['WHICH']).write_text(\n"
        "    os.environ.get('PICKED', '-') + ' ' + os.environ['PYTHONPATH'])\n"
    )
    monkeypatch.setenv("PICKED", "inherited")
    monkeypatch.setenv("PYTHONPATH", "")
    servers = [
        services.Server(
            services.SERVICES["aiohttp"],
            profiled,
            tmp_path,
            None,
            (),
            checkout,
            env={"WHICH": str(profiled), **extra},
        )
        for profiled, extra in [
            (False, {"PICKED": "a=b", "PYTHONPATH": str(tmp_path / "extra")}),
            (True, {}),
        ]
    ]
    for server in servers:
        server.start(str(tmp_path / "upstream.sock"))
    for server in servers:
        assert server.process.wait(timeout=60) == 0
        server.log.close()
    assert (tmp_path / "ran.txtFalse").read_text() == (
        f"a=b {checkout}{os.pathsep}{tmp_path / 'extra'}"
    )
    assert (tmp_path / "ran.txtTrue").read_text() == f"inherited {checkout}"


@pytest.mark.parametrize("bad", ["NAME", "=value", ""])
def test_a_variable_that_is_not_name_equals_value_is_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], bad: str
) -> None:
    services = _services(monkeypatch)
    with pytest.raises(SystemExit) as exit_:
        services.main(["--base-env", bad, "--pairs", "1"])
    assert exit_.value.code == 2
    assert f"{bad!r}: expected NAME=VALUE" in capsys.readouterr().err
    assert services._variable("A=b=c") == ("A", "b=c")
    assert services._variable("A=") == ("A", "")
