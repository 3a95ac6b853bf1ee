"""``asyncflow mcp``: the MCP server over stdio, spoken to as an agent's client speaks to it.

Each test starts the server as a child process and writes JSON-RPC to its standard input, one
message a line, as the protocol's stdio transport does: ``initialize``, ``tools/list``, then
``tools/call`` against a running profiled program (by PID and by URL) and against the files
that program saved. A source that cannot be read is the tool's error, and the server answers
the next call.
"""

from __future__ import annotations

import functools
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from asyncflow.serve import mcp, registry
from tests.support.commands import ASYNCFLOW, EXAMPLES, asyncflow_cmd, console_script
from tests.test_install_hints import check_hint

pytest.importorskip("mcp.server.mcpserver", reason="the mcp extra (mcp>=2) is not installed")

TIMEOUT = 30.0
#: what a client offers in ``initialize`` (the handshake's revision most clients speak)
PROTOCOL = "2025-06-18"
TOOLS = {
    "profilers",
    "status",
    "warnings",
    "futures",
    "channels",
    "streams",
    "tasks",
    "resources",
    "executors",
    "loop",
    "diff",
}


class Session:
    """An MCP client over a child's standard input and output."""

    def __init__(self, command: list[str]) -> None:
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.ids = iter(range(1, 1_000_000))
        self.said = ""
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put("")  # the server closed its output

    def send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(orjson.dumps({"jsonrpc": "2.0", **message}).decode() + "\n")
        self.process.stdin.flush()

    def ask(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """One request's response; every line the server writes must be JSON-RPC."""
        number = next(self.ids)
        self.send(
            {"id": number, "method": method, **({} if params is None else {"params": params})}
        )
        deadline = time.monotonic() + TIMEOUT
        while True:
            line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            assert line, f"the server closed its output; stderr: {self.stderr()}"
            message = orjson.loads(line)
            assert message["jsonrpc"] == "2.0", line
            if message.get("id") == number:
                return dict(message)

    def start(self) -> dict[str, Any]:
        """The handshake: ``initialize``, then the client's ``initialized``; the result."""
        reply = self.ask(
            "initialize",
            {
                "protocolVersion": PROTOCOL,
                "capabilities": {},
                "clientInfo": {"name": "asyncflow-tests", "version": "1"},
            },
        )
        self.send({"method": "notifications/initialized"})
        return dict(reply["result"])

    def call(self, tool: str, **arguments: Any) -> tuple[bool, str]:
        """A tool's answer: whether it is an error, and its text."""
        reply = self.ask("tools/call", {"name": tool, "arguments": arguments})
        result = reply["result"]
        text = "".join(c["text"] for c in result["content"] if c["type"] == "text")
        return bool(result.get("isError")), text

    def close(self) -> int:
        """Close the server's input (the client goes away); its exit status. Its standard
        error is kept for :meth:`stderr`."""
        try:
            assert self.process.stdin is not None
            self.process.stdin.close()
            return self.process.wait(TIMEOUT)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait(TIMEOUT)
            self.reader.join(TIMEOUT)
            assert self.process.stdout is not None and self.process.stderr is not None
            self.process.stdout.close()
            with self.process.stderr:
                self.said = self.process.stderr.read()

    def stderr(self) -> str:
        return self.said if self.process.poll() is not None else "(still running)"


@pytest.fixture
def server() -> Iterator[Session]:
    session = Session([sys.executable, "-m", "asyncflow.serve.mcp"])
    try:
        yield session
    finally:
        assert session.close() == 0, session.stderr()


@pytest.fixture
def deadlocked() -> Iterator[tuple[int, str]]:
    """``asyncflow run examples/deadlock.py --wait 0``: two tasks deadlocked until it is
    ended; yields its pid and endpoint URL once it serves."""
    program = subprocess.Popen(
        [*ASYNCFLOW, "run", "--port", "0", str(EXAMPLES / "deadlock.py"), "--wait", "0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert program.stderr is not None
        line = program.stderr.readline()  # "asyncflow: profiling 'deadlock'; endpoint: URL"
        assert "endpoint: http://127.0.0.1:" in line, line
        yield program.pid, line.rsplit(" ", 1)[-1].strip()
    finally:
        program.terminate()  # it writes its report and exits
        try:
            program.wait(TIMEOUT)
        finally:
            if program.poll() is None:
                program.kill()
                program.wait(TIMEOUT)
            assert program.stderr is not None
            program.stderr.close()


def _until(session: Session, text: str, tool: str, **arguments: Any) -> str:
    """A tool's answer once it holds ``text`` (the program's tasks deadlock some 50 ms after
    it starts, and the warning follows at the collector's next evaluation); bounded."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        error, answer = session.call(tool, **arguments)
        assert not error, answer
        if text in answer:
            return answer
        assert time.monotonic() < deadline, answer
        threading.Event().wait(0.1)  # ask again: each call is a request to the endpoint


def test_initialize_and_the_tools_listed(server: Session) -> None:
    result = server.start()
    assert result["serverInfo"]["name"] == "asyncflow"
    assert result["protocolVersion"] == PROTOCOL
    assert "tools" in result["capabilities"]
    assert "warnings tool" in result["instructions"]
    listed = server.ask("tools/list")["result"]["tools"]
    assert {t["name"] for t in listed} == TOOLS
    for tool in listed:
        assert tool["annotations"]["readOnlyHint"] is True, tool
        assert len(tool["description"]) > 100, tool
        properties = tool["inputSchema"]["properties"]
        if tool["name"] not in ("profilers", "diff"):
            assert properties["source"]["type"] == "string", tool
            assert "PID" in tool["description"], tool
        if tool["name"] not in ("profilers", "status"):
            assert properties["limit"]["type"] == "integer", tool


def test_tools_read_a_running_program_by_pid_and_by_url(
    server: Session, deadlocked: tuple[int, str]
) -> None:
    pid, url = deadlocked
    server.start()
    error, listed = server.call("profilers")
    assert not error, listed
    assert f"pid {pid} deadlock: {url}" in listed

    answer = _until(server, "ERROR deadlock", "warnings", source=str(pid))
    assert "about task `Task-2 -> Task-3`" in answer
    assert "hint: take the locks in one order everywhere" in answer
    assert "evidence: tasks=2, resources=2, held " in answer
    error, alone = server.call("warnings")  # no source: the one profiler running here
    assert not error and "ERROR deadlock" in alone, alone

    error, tasks = server.call("tasks", source=url, limit=5)
    assert not error, tasks
    assert tasks.startswith("3 live tasks\n")
    assert "stuck tasks (2, in 1 deadlock)" in tasks
    assert "Task-2 (transfer) waits at " in tasks and "held by Task-3" in tasks

    error, status = server.call("status", source=url)
    assert not error, status
    assert status.startswith(f"deadlock: pid {pid}, running, up ")
    assert f"(read from {url})" in status
    error, status = server.call("status", source=str(pid))
    assert not error and f"(read from pid {pid} (deadlock) at {url})" in status, status

    error, resources = server.call("resources", source=str(pid), limit=1)
    assert not error, resources
    assert resources.startswith("2 resources, most waited on first:\n")
    assert "held now by transfer" in resources
    assert resources.rstrip().endswith(
        "(1 more resources left out: call again with a larger limit than 1)"
    )

    for tool in ("futures", "channels", "streams", "executors", "loop"):
        error, text = server.call(tool, source=str(pid))
        assert not error and text, (tool, text)

    error, same = server.call("diff", base=str(pid), new=url)  # its state now, twice
    assert not error, same
    assert same.startswith(f"base: {pid} (deadlock, "), same
    assert f"\nnew: {url} (deadlock, " in same


def test_a_bad_source_is_the_tools_error_and_the_server_goes_on(
    server: Session, tmp_path: Path
) -> None:
    server.start()
    not_json = tmp_path / "notes.json"
    not_json.write_text("not a snapshot")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    for arguments, said in (
        ({"source": gone.stdout.strip()}, f"no process has pid {gone.stdout.strip()}"),
        ({"source": str(os.getpid())}, "runs no asyncflow profiler with an endpoint"),
        ({"source": "http://127.0.0.1:1"}, "nothing answers at http://127.0.0.1:1"),
        ({"source": "http://"}, "is not an endpoint URL"),
        ({"source": str(tmp_path / "missing.json")}, "is no PID, no endpoint URL"),
        ({"source": str(not_json)}, "is not JSON"),
        ({"source": str(tmp_path)}, "is a directory"),
        ({"source": str(not_json), "limit": 0}, "limit=0: expected a whole number from 1"),
        ({}, "no source given, and no profiler is running here"),
    ):
        error, text = server.call("warnings", **arguments)
        assert error, (arguments, text)
        assert said in text, (arguments, text)
    error, text = server.call("diff", base=str(not_json), new=str(tmp_path / "missing.json"))
    assert error and "is not JSON" in text, text
    error, text = server.call("profilers")
    assert not error and text.startswith("no profiler is running here"), text


def test_tools_read_saved_reports_and_recordings(server: Session, tmp_path: Path) -> None:
    report, recording = tmp_path / "run.json", tmp_path / "run.afrec"
    # (deadlock.py gives up after 1.5 s: the findings' evaluation, once a second, sees it)
    done = asyncflow_cmd(
        "run", "--port", "off", "--format", "json", "--output", str(report),
        "--record", str(recording), str(EXAMPLES / "deadlock.py"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    server.start()
    for source in (report, recording):
        error, answer = server.call("warnings", source=str(source))
        assert not error, answer
        # the program ended, its tasks cancelled: the deadlock held earlier in the run
        assert "ERROR deadlock (earlier, " in answer, answer
        assert "about task `Task-2 -> Task-3`" in answer, answer
        error, futures = server.call("futures", source=str(source), limit=1)
        assert not error, futures
        first, one, more = futures.splitlines()
        assert first == "2 futures, most busy first:", futures
        assert one.startswith(("transfer: 2 calls (0 returned", "main: 1 call")), futures
        assert more == "(1 more futures left out: call again with a larger limit than 1)"
    # a recording's moment: FILE@SECONDS (past its end: the end state); only a recording has
    error, ended = server.call("status", source=str(recording))
    assert not error and ended.startswith("deadlock: pid "), ended
    error, started = server.call("status", source=f"{recording}@0")
    assert not error and started.startswith("deadlock: pid "), started
    assert started.replace("@0)", ")") != ended  # its uptime then, and what it tracked
    error, past = server.call("status", source=f"{recording}@1000")
    assert not error and past.replace("@1000)", ")") == ended, past
    error, text = server.call("status", source=f"{report}@0.5")
    assert error and "is not a recording, which alone has moments" in text, text
    error, same = server.call("diff", base=str(report), new=str(report))
    assert not error, same
    assert f"base: {report} (deadlock, " in same
    assert same.rstrip().endswith("passed: no figure got worse by more than 2x"), same


def test_main_without_the_sdk_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in [n for n in sys.modules if n == "mcp" or n.startswith("mcp.")] + ["mcp"]:
        monkeypatch.setitem(sys.modules, name, None)  # importing it fails, as when not installed
    assert mcp.main([]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("asyncflow mcp: error: it needs the MCP SDK, mcp 2 or newer")
    check_hint(err, "mcp", "mcp")


@functools.cache
def _wired() -> bool:
    """Whether the command line has ``asyncflow mcp`` yet."""
    done = asyncflow_cmd("--help")
    return any(line.split()[:1] == ["mcp"] for line in done.stdout.splitlines())


@pytest.mark.skipif("not _wired()", reason="'asyncflow mcp' is not a command of the CLI yet")
def test_the_asyncflow_mcp_command_serves_the_tools(tmp_path: Path) -> None:
    session = Session([*console_script(tmp_path), "mcp"])  # as pip installs `asyncflow`
    try:
        assert session.start()["serverInfo"]["name"] == "asyncflow"
        listed = session.ask("tools/list")["result"]["tools"]
        assert "warnings" in {t["name"] for t in listed}
        error, text = session.call("profilers")
        assert not error and text.startswith("no profiler is running here"), text
    finally:
        assert session.close() == 0, session.stderr()


def test_the_registry_of_a_login_session_is_found_without_its_variable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A client that starts the server with few variables (the SDK's own passes no
    XDG_RUNTIME_DIR) still finds the profilers a terminal started."""
    session = tmp_path / "run-user-{uid}"
    monkeypatch.setattr(mcp, "_SESSION_RUNTIME", str(session))
    monkeypatch.setenv("XDG_RUNTIME_DIR", "")  # unset, as such a client leaves it (restored)
    monkeypatch.setenv("ASYNCFLOW_RUNTIME_DIR", str(tmp_path / "given"))
    assert mcp.find_session_registry() is None  # a directory given: it is used
    monkeypatch.delenv("ASYNCFLOW_RUNTIME_DIR")
    assert mcp.find_session_registry() is None  # no registry in the session's directory
    mine = Path(str(session).format(uid=os.getuid()))
    (mine / "asyncflow").mkdir(parents=True)
    assert mcp.find_session_registry() == str(mine)
    assert os.environ["XDG_RUNTIME_DIR"] == str(mine)
    assert registry.directory() == mine / "asyncflow"
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert mcp.find_session_registry() is None  # set: left alone


#: a profiled program whose endpoint needs a token; it serves until its standard input closes
GUARDED = """
import sys
import asyncflow

with asyncflow.profile("guarded", port=0, format="none") as prof:
    print(prof.url, flush=True)
    sys.stdin.readline()
"""


def test_an_endpoint_s_token_goes_to_this_machine_s_endpoints_only(tmp_path: Path) -> None:
    script = tmp_path / "guarded.py"
    script.write_text(GUARDED)
    program = subprocess.Popen(
        [sys.executable, str(script)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "ASYNCFLOW_TOKEN": "s3cr3t-t0ken"},
    )
    try:
        assert program.stdout is not None
        url = program.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url
        # the tools in this process: the protocol around them is the other tests' subject
        with pytest.raises(mcp.SourceError, match=r"answered 401: .*needs a token"):
            mcp.Tools().status(url)
        with pytest.raises(mcp.SourceError, match="is not this endpoint's"):
            mcp.Tools(token="nope").status(url)
        text = mcp.Tools(token="s3cr3t-t0ken").status(str(program.pid))
        assert text.startswith(f"guarded: pid {program.pid}, running"), text
    finally:
        assert program.stdin is not None and program.stdout is not None
        program.stdin.close()
        program.wait(TIMEOUT)
        program.stdout.close()
    tools = mcp.Tools(token="t", default="http://10.1.2.3:6780")
    assert tools._trusted("http://127.0.0.1:6780") and tools._trusted("http://[::1]:6780")
    assert tools._trusted("http://10.1.2.3:9999")  # the host the server was started for
    assert not tools._trusted("http://10.9.9.9:6780")  # a host an agent names: no token
    assert not mcp.Tools(token="t")._trusted("http://example.com")


def test_an_answer_is_bounded() -> None:
    lines = "".join(f"line {i}\n" for i in range(10_000))
    cut = mcp.bounded(lines, 100)
    assert len(cut) < 200 and cut.startswith("line 0\nline 1\n")
    assert cut.endswith(
        f"(answer cut at 94 of {len(lines):,} characters: ask with a smaller limit)\n"
    )
    assert mcp.bounded("short\n") == "short\n"
    with pytest.raises(mcp.SourceError, match="no process has pid 0"):
        mcp.Tools().status("0")


#: an asyncio program with a task waiting on an event, until its standard input closes
ARMED = """
import asyncio, sys

async def waiter(event):
    await event.wait()

async def main():
    event = asyncio.Event()
    task = asyncio.create_task(waiter(event), name="waiter")
    await asyncio.sleep(0)  # the waiter waits
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    event.set()
    await task

asyncio.run(main())
"""


def test_an_armed_process_is_named_with_how_to_attach_it(tmp_path: Path) -> None:
    script = tmp_path / "waits.py"
    script.write_text(ARMED)
    program = subprocess.Popen(
        [*ASYNCFLOW, "run", "--armed", str(script)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert program.stderr is not None and program.stdout is not None
        line = program.stderr.readline()  # "asyncflow: 'waits' runs armed (pid N): ..."
        assert f"runs armed (pid {program.pid})" in line, line
        assert program.stdout.readline() == "ready\n"  # its tasks are made
        tools = mcp.Tools()
        assert f"pid {program.pid} waits: armed: no endpoint until" in tools.profilers()
        with pytest.raises(mcp.SourceError) as by_pid:
            tools.status(str(program.pid))
        assert str(by_pid.value) == (
            f"pid {program.pid} (waits) is armed and serves no endpoint yet: "
            f"'asyncflow attach {program.pid}' turns its profiler on"
        )
        with pytest.raises(mcp.SourceError, match=r"\(pid \d+ \(waits\) is armed: 'asyncflow"):
            tools.status("")
        # its tasks, as 'asyncflow dump PID' reads them, attaching nothing
        dumped = tools.tasks(str(program.pid), 5)
        assert dumped.startswith(
            f"pid {program.pid} (waits) is armed: its tasks as 'asyncflow dump {program.pid}' "
            f"reads them ('asyncflow attach {program.pid}' turns on the other tools)\n"
            f"asyncflow: pid {program.pid} (waits), armed: 2 live tasks\n"
        ), dumped
        assert f"  waiter (waiter) waiting at {script}:5 on wait for event Event at " in dumped
        assert "pid " in tools.profilers() and "armed: no endpoint" in tools.profilers()
    finally:
        assert program.stdin is not None and program.stderr is not None
        assert program.stdout is not None
        program.stdin.close()
        program.wait(TIMEOUT)
        program.stderr.close()
        program.stdout.close()
