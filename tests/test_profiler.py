"""Profiler lifecycle: one per process, idempotent stop, options, formats, duration, reporters."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import types
import urllib.error
import urllib.request
import warnings
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

import asyncflow
from asyncflow import config, profiler
from asyncflow.instrumentation import _session, recording
from asyncflow.model import collector
from asyncflow.render.reporters import FinishedCall
from asyncflow.schema import Snapshot
from asyncflow.views import documents as views


@asyncflow.future(name="unit")
async def unit(n: int) -> int:
    for _ in range(n):
        await asyncio.sleep(0)
    return n


class Collecting:
    def __init__(self) -> None:
        self.snapshots: list[Snapshot] = []
        self.done = threading.Event()

    def report(self, snapshot: Snapshot) -> None:
        self.snapshots.append(snapshot)
        self.done.set()


def test_one_profiler_per_process_and_idempotent_stop() -> None:
    first = asyncflow.start("first", format="none")
    try:
        with pytest.raises(
            asyncflow.AsyncflowError, match=r"'first'\) is already running.*stop\(\)"
        ):
            asyncflow.start("second", format="none")
        assert asyncflow.active_profiler() is first and first.running
    finally:
        final = asyncflow.stop()
    assert final is not None and final.status.running is False
    assert asyncflow.stop() is final  # nothing running: the same final snapshot again
    assert first.stop() is final  # idempotent, returns the same final snapshot
    assert first.snapshot() is final
    with pytest.raises(asyncflow.AsyncflowError, match="already run"):
        first.start()


def test_snapshot_before_start_is_refused() -> None:
    with pytest.raises(asyncflow.AsyncflowError, match="not been started"):
        asyncflow.profile("idle", format="none").snapshot()


def test_bad_options_are_refused_before_anything_starts() -> None:
    with pytest.raises(ValueError, match="format"):
        asyncflow.profile("bad", format="yaml")
    with pytest.raises(TypeError, match="unknown asyncflow option"):
        asyncflow.start("bad", port_number=1)
    assert asyncflow.active_profiler() is None


async def test_async_with_and_status_document() -> None:
    async with asyncflow.profile("svc", format="none") as prof:
        assert await unit(3) == 3
        snap = prof.snapshot()
    status = snap.status
    assert (status.name, status.schema, status.running, status.version) == (
        "svc",
        1,
        True,
        asyncflow.__version__,
    )
    assert status.events_recorded == 4 + 1  # four polls and one call end
    assert status.events_dropped == 0 and status.calls_live == 0
    assert prof.url is None  # the endpoint is not served yet


def test_every_session_starts_from_zero() -> None:
    for _ in range(2):
        with asyncflow.profile("again", format="none") as prof:
            asyncio.run(unit(2))
            entry = next(f for f in prof.snapshot().futures.futures if f.label == "unit")
        assert (entry.call_count, entry.total_polls) == (1, 3)


@pytest.mark.parametrize("fmt", ["json", "json-pretty"])
def test_json_report_is_the_snapshot(tmp_path: Path, fmt: str) -> None:
    out = tmp_path / "report.json"
    with asyncflow.profile("json", format=fmt, output=str(out)):
        asyncio.run(unit(1))
    document = json.loads(out.read_text())
    assert document["schema"] == 1 and document["status"]["name"] == "json"
    (entry,) = [f for f in document["futures"]["futures"] if f["label"] == "unit"]
    assert (entry["call_count"], entry["total_polls"]) == (1, 2)
    assert ("\n  " in out.read_text()) is (fmt == "json-pretty")


def test_table_report_to_standard_error(capsys: pytest.CaptureFixture[str]) -> None:
    with asyncflow.profile("tabled", limit=1):
        asyncio.run(unit(2))
    err = capsys.readouterr().err
    assert err.startswith("asyncflow · tabled · elapsed ")
    assert "future" in err and "p95 poll" in err and "\nunit " in err


def test_format_none_writes_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    with asyncflow.profile("quiet", format="none"):
        asyncio.run(unit(1))
    assert capsys.readouterr().err == ""


def test_environment_variables_configure_the_profiler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "env.json"
    monkeypatch.setenv("ASYNCFLOW_FORMAT", "json")
    monkeypatch.setenv("ASYNCFLOW_OUTPUT", str(out))
    monkeypatch.setenv("ASYNCFLOW_PERCENTILES", "90")
    with asyncflow.profile("env"):
        asyncio.run(unit(1))
    entry = orjson.loads(out.read_bytes())["futures"]["futures"][0]
    assert set(entry["poll_duration_ns"]) == {"p90"}


def test_reporter_replaces_the_formats_and_duration_stops_by_itself(
    capsys: pytest.CaptureFixture[str],
) -> None:
    reporter = Collecting()
    prof = asyncflow.start("timed", duration=0.05, reporter=reporter)
    try:
        assert reporter.done.wait(10), "duration did not stop the profiler"
    finally:
        prof.stop()
    assert not prof.running and asyncflow.active_profiler() is None
    assert len(reporter.snapshots) == 1  # reported once, though stop() was called again
    assert reporter.snapshots[0].status.name == "timed"
    assert capsys.readouterr().err == ""


class _EveryCall(recording.Recorder):
    """A user's recorder handed every finished call: the calls then wait in the buffer."""

    def __init__(self) -> None:
        self.calls = 0

    def call(self, call: FinishedCall) -> None:
        self.calls += 1


def test_dropped_log_entries_are_counted_and_counts_stay_exact(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_session, "FINISHED_BUFFER_SIZE", 10)
    monkeypatch.setattr(collector, "DRAIN_INTERVAL", 3600)  # the collector falls far behind

    async def many() -> None:
        for _ in range(100):
            await unit(0)

    user = _EveryCall()
    recording.add_recorder(user)  # every call goes through the buffer
    try:
        with asyncflow.profile("drops", format="none") as prof:
            # The collector's first tick drains, when the profiler's thread gets to it after
            # start() returned: let it pass before the calls (the snapshot queues behind it),
            # or it drains some of them and the buffer keeps more than 10.
            prof.snapshot()
            asyncio.run(many())
            snap = prof.snapshot()
    finally:
        recording.remove_recorder(user)
    entry = next(f for f in snap.futures.futures if f.label == "unit")
    assert (entry.call_count, entry.total_polls, entry.outcomes.returned) == (100, 100, 100)
    assert snap.status.events_dropped == 90
    logs = next(log for log in snap.future_logs if log.future_id == entry.id)
    assert len(logs.calls) == 10  # only what the buffer kept reached the log
    assert user.calls == 10


def test_calls_fold_where_they_finish_when_nobody_wants_each_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_session, "FINISHED_BUFFER_SIZE", 10)
    monkeypatch.setattr(collector, "DRAIN_INTERVAL", 3600)  # the collector never drains

    async def many() -> None:
        for n in range(100):
            await unit(n % 3)

    with asyncflow.profile("in place", format="none", recent_logs=20) as prof:
        asyncio.run(many())
        session = _session.active
        assert session is not None and len(session.finished) == 0
        snap = prof.snapshot()
    entry = next(f for f in snap.futures.futures if f.label == "unit")
    assert (entry.call_count, entry.outcomes.returned) == (100, 100)
    assert snap.status.events_dropped == 0
    logs = next(log for log in snap.future_logs if log.future_id == entry.id)
    assert len(logs.calls) == 20  # the newest ones, as the option asks
    assert entry.call_duration_ns  # every call's duration counted, though none was drained


def test_a_call_that_finishes_while_its_log_is_read_is_listed_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Calls are folded where they finish, on the program's threads, while the profiler's
    thread lists a future's live calls and then its recent ones."""

    @types.coroutine
    def suspend() -> Generator[None, None, None]:
        yield

    @asyncflow.future
    async def work() -> None:
        await suspend()

    with asyncflow.profile("log race", format="none"):
        w = work()
        w.send(None)  # one live call, suspended
        read_live = collector.live_calls

        def live_then_finish(record: Any) -> Any:
            calls = read_live(record)
            with pytest.raises(StopIteration):
                w.send(None)  # the call finishes between the two copies
            return calls

        monkeypatch.setattr(views, "live_calls", live_then_finish)
        logs = views.future_logs(work.future_record, 0, 0)  # type: ignore[attr-defined]
    assert [c.state for c in logs.calls] == ["ready"]  # once, finished


def test_a_call_whose_fold_fails_still_leaves_the_live_calls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Every collector tick says again where calls fold (fold_where): one between the line that
    # breaks the fold and the call's end folded the call after all, and nothing failed.
    monkeypatch.setattr(collector.Collector, "fold_where", lambda self: None)
    errors = _session.errors.count
    with asyncflow.profile("fold fails", format="none") as prof:
        session = _session.active
        assert session is not None
        session.keep_in_place = -1  # not a log length: folding the call raises
        assert asyncio.run(unit(2)) == 2  # the program sees nothing
        stats = unit.future_record.stats  # type: ignore[attr-defined]
        assert stats.live == {} and stats.returned == 1
        snap = prof.snapshot()
    entry = next(f for f in snap.futures.futures if f.label == "unit")
    assert (entry.calls.running, entry.calls.suspended, entry.calls.ready) == (0, 0, 1)
    assert _session.errors.count > errors


def test_a_recorder_added_while_profiling_is_handed_the_calls_finished_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def some(n: int) -> None:
        for _ in range(n):
            await unit(0)

    with asyncflow.profile("late recorder", format="none") as prof:
        asyncio.run(some(5))  # folded where they finish: no recorder wants them
        user = _EveryCall()
        recording.add_recorder(user)
        try:
            asyncio.run(some(7))
            snap = prof.snapshot()  # drains: the calls are handed over by now
        finally:
            recording.remove_recorder(user)
    entry = next(f for f in snap.futures.futures if f.label == "unit")
    assert entry.call_count == 12 and user.calls == 7


def test_a_profiler_left_running_reports_at_interpreter_exit(tmp_path: Path) -> None:
    script = tmp_path / "forgot.py"
    script.write_text(
        "import asyncio, asyncflow\n"
        "@asyncflow.future\n"
        "async def job():\n"
        "    await asyncio.sleep(0)\n"
        "asyncflow.start('forgetful')\n"
        "asyncio.run(job())\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASYNCFLOW_")}
    env["ASYNCFLOW_PORT"] = "0"  # any free port: never the default one, which may be taken
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith("asyncflow · forgetful · elapsed")
    assert "\njob " in done.stderr


def test_table_report_lists_channels(capsys: pytest.CaptureFixture[str]) -> None:
    async def pipe() -> None:
        q: asyncio.Queue[int] = asyncflow.instrument_queue(asyncio.Queue(8), name="pipe-queue")
        for i in range(5):
            await q.put(i)
        for _ in range(5):
            await q.get()

    with asyncflow.profile("channels"):
        asyncio.run(pipe())
    err = capsys.readouterr().err
    assert "producers blocked" in err
    (row,) = [line for line in err.splitlines() if line.startswith("pipe-queue")]
    assert row.split()[:5] == ["pipe-queue", "bounded[8]", "5", "5", "0/5"]


def test_documents_page_by_offset_and_limit() -> None:
    from asyncflow.views import documents as views

    @asyncflow.future(name="paged-a")
    async def a() -> None:
        pass

    @asyncflow.future(name="paged-b")
    async def b() -> None:
        pass

    with asyncflow.profile("paging", format="none") as prof:
        asyncio.run(a())
        asyncio.run(b())
        collector = prof._collector
        assert collector is not None
        everything = views.futures_document(collector, 0)
        first = views.futures_document(collector, 0, offset=0, limit=1)
        rest = views.futures_document(collector, 0, offset=1, limit=1000)
    assert (first.total, first.offset, first.limit, len(first.futures)) == (
        everything.total,
        0,
        1,
        1,
    )
    assert [f.id for f in first.futures + rest.futures] == [f.id for f in everything.futures]
    assert rest.limit == 1000 and len(rest.futures) == everything.total - 1


# -- transparency: the profiler's own tasks draw no numbers from asyncio's task names ----------


def _next_task_number(task_class: Any) -> int:
    """The number asyncio's counter gives the next unnamed task of ``task_class`` (it takes
    it: the counter advances by exactly one)."""

    async def own_name() -> str:
        task = asyncio.current_task()
        assert task is not None
        return task.get_name()

    loop = asyncio.new_event_loop()
    try:
        task = task_class(own_name(), loop=loop)
        return int(loop.run_until_complete(task).removeprefix("Task-"))
    finally:
        loop.close()


def test_the_profilers_tasks_and_requests_leave_task_names_alone() -> None:
    # asyncio numbers unnamed tasks from process-wide counters (one for the C Task, one for
    # the Python Task): every task the profiler's loop, its server or aiohttp left unnamed
    # would shift the program's own task names ("Task-5" instead of "Task-1").
    implementations = [asyncio.tasks._PyTask]  # type: ignore[attr-defined]
    if asyncio.tasks._CTask is not asyncio.tasks._PyTask:  # type: ignore[attr-defined]
        implementations.append(asyncio.tasks._CTask)  # type: ignore[attr-defined]
    before = [_next_task_number(cls) for cls in implementations]
    with asyncflow.profile("names", format="none", port=0) as prof:
        assert prof.url is not None
        for path in ("/profiler_status", "/futures", "/snapshot", "/no-such-route"):
            try:
                urllib.request.urlopen(prof.url + path, timeout=10).read()
            except urllib.error.HTTPError as error:
                error.close()
        prof.snapshot()

    async def main() -> str:
        task = asyncio.current_task()
        assert task is not None
        return task.get_name()

    # What the program sees: its main task is named as if no profiler had run.
    main_name = asyncio.run(main())
    assert main_name == f"Task-{before[-1] + 1}"
    after = [_next_task_number(cls) for cls in implementations[:-1]]
    assert after == [n + 1 for n in before[:-1]]


# -- the port: a default that is taken gives way; a chosen one that is taken fails clearly -------


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port some other program listens on (bound here on 127.0.0.1:0, so always free to take)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


def _port_of(url: str | None) -> int:
    assert url is not None
    return int(url.rsplit(":", 1)[1])


def _profiler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("asyncflow-profiler")]


def test_a_taken_default_port_gives_way_to_a_free_one_and_says_where(
    taken_port: int, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A second worker of one service on one host must not crash at start because the first
    # serves on the default port.
    monkeypatch.delenv("ASYNCFLOW_PORT")
    monkeypatch.setattr(config, "DEFAULT_PORT", taken_port)
    caplog.set_level(logging.INFO, logger="asyncflow")
    with asyncflow.profile("second-worker", format="none") as prof:
        port = _port_of(prof.url)
        assert port not in (taken_port, 0)
        with urllib.request.urlopen(f"{prof.url}/profiler_status", timeout=10) as answer:
            assert orjson.loads(answer.read())["name"] == "second-worker"
    (said,) = [r.getMessage() for r in caplog.records if r.name == "asyncflow"]
    assert f"port {taken_port} on 127.0.0.1 is in use" in said
    assert f"serving on http://127.0.0.1:{port} instead" in said


def test_the_default_port_gives_way_on_standard_error_without_logging_set_up(
    tmp_path: Path, taken_port: int
) -> None:
    script = tmp_path / "worker.py"
    script.write_text(
        "import asyncflow\n"
        "from asyncflow import config\n"
        f"config.DEFAULT_PORT = {taken_port}\n"
        "with asyncflow.profile('worker', format='none') as prof:\n"
        "    print(prof.url)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASYNCFLOW_")}
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    url = done.stdout.strip()
    assert _port_of(url) != taken_port
    assert done.stderr == (
        f"asyncflow: port {taken_port} on 127.0.0.1 is in use; serving on {url} instead\n"
    )


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_a_taken_port_that_was_chosen_fails_naming_the_option(
    taken_port: int, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    before = _profiler_threads()
    if how == "argument":
        prof = asyncflow.profile("clash", format="none", port=taken_port)
        named = r"pass another port= \(port=0 picks a free one\)"
    else:
        monkeypatch.setenv("ASYNCFLOW_PORT", str(taken_port))
        prof = asyncflow.profile("clash", format="none")
        named = r"set ASYNCFLOW_PORT to another port \(0 picks a free one\)"
    with pytest.raises(asyncflow.AsyncflowError, match=rf"^port {taken_port} on 127.0.0.1 "):
        prof.start()
    with pytest.raises(asyncflow.AsyncflowError, match=named):
        asyncflow.start(
            "again", format="none", **({"port": taken_port} if how == "argument" else {})
        )
    assert asyncflow.active_profiler() is None and prof.url is None and not prof.running
    assert _profiler_threads() == before


def test_asyncflow_run_names_its_port_flag(tmp_path: Path, taken_port: int) -> None:
    script = tmp_path / "prog.py"
    script.write_text("print('ran')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASYNCFLOW_")}
    command = [sys.executable, "-m", "asyncflow", "run", "--port", str(taken_port), str(script)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == (
        f"asyncflow run: error: port {taken_port} on 127.0.0.1 is already in use; pass another "
        "--port (--port 0 picks a free one)\n"
    )


# -- import cost: nothing heavy until an endpoint starts ---------------------------------------


def test_import_asyncflow_loads_no_server_until_an_endpoint_starts() -> None:
    probe = (
        "import sys\n"
        "import asyncflow\n"
        "heavy = ('aiohttp', 'asyncflow.serve.server', 'asyncflow.schema',"
        " 'asyncflow.views.documents')\n"
        "print(*[name in sys.modules for name in heavy])\n"
        "with asyncflow.profile('no-endpoint', format='none', port=None):\n"
        "    pass\n"
        "print('aiohttp' in sys.modules)\n"
        "with asyncflow.profile('endpoint', format='none', port=0):\n"
        "    pass\n"
        "print('asyncflow.serve.server' in sys.modules)\n"  # aiohttp only where HTTP is served
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASYNCFLOW_")}
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False"] * 5 + ["True"]


# -- ASYNCFLOW_DISABLE=1: nothing starts, nothing is served or reported -------------------------


def test_disabled_start_serves_nothing_and_reports_nothing(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("ASYNCFLOW_DISABLE", "1")
    caplog.set_level(logging.INFO, logger="asyncflow")
    before = _profiler_threads()
    with asyncflow.profile("off") as prof:
        assert asyncio.run(unit(2)) == 2
        assert not prof.running and prof.url is None
        assert asyncflow.active_profiler() is None and _session.active is None
        assert _profiler_threads() == before
        with pytest.raises(asyncflow.AsyncflowError, match=r"disabled \(ASYNCFLOW_DISABLE=1\)"):
            prof.snapshot()
    assert prof.stop() is None and asyncflow.stop() is None
    assert capsys.readouterr().err == ""  # no report, empty or not
    (said,) = [r.getMessage() for r in caplog.records if r.name == "asyncflow"]
    assert said == "asyncflow is disabled (ASYNCFLOW_DISABLE=1): 'off' is not profiled"


def test_asyncflow_run_when_disabled_runs_the_program_and_says_so(tmp_path: Path) -> None:
    script = tmp_path / "prog.py"
    script.write_text("import sys\nprint('ran')\nsys.exit(3)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASYNCFLOW_")}
    env["ASYNCFLOW_DISABLE"] = "1"
    command = [sys.executable, "-m", "asyncflow", "run", "--port", "0", str(script)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)
    assert (done.returncode, done.stdout) == (3, "ran\n")
    assert done.stderr == (
        "asyncflow is disabled (ASYNCFLOW_DISABLE=1): 'prog' runs without profiling\n"
    )
    env["ASYNCFLOW_DISABLE"] = "maybe"  # not a clear no: it disables, and says what it read
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)
    assert (done.returncode, done.stdout) == (3, "ran\n")
    assert done.stderr == (
        "asyncflow is disabled (ASYNCFLOW_DISABLE='maybe', not 0/false/no/off): 'prog' runs "
        "without profiling\n"
    )


# -- stop(): every later stop returns the final snapshot -----------------------------------------


def test_every_stop_returns_the_final_snapshot() -> None:
    first = asyncflow.start("twice", format="none")
    final = asyncflow.stop()
    assert final is not None and final.status.name == "twice"
    assert asyncflow.stop() is final  # the module-level stop, again
    assert first.stop() is final and first.stop() is final
    with asyncflow.profile("block", format="none") as prof:
        pass
    assert prof.stop() is prof.stop() is not None
    assert asyncflow.stop() is prof.stop()  # the most recent profiler's


def test_a_stop_while_another_is_stopping_waits_for_the_snapshot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    entered, release = threading.Event(), threading.Event()
    real = asyncflow.Profiler._final_snapshot

    def slow(self: asyncflow.Profiler) -> Snapshot:
        entered.set()
        release.wait(10)
        return real(self)

    monkeypatch.setattr(asyncflow.Profiler, "_final_snapshot", slow)
    prof = asyncflow.start("racing", format="none")
    results: list[Snapshot | None] = []
    first = threading.Thread(target=lambda: results.append(prof.stop()))
    first.start()
    assert entered.wait(10)
    second = threading.Thread(target=lambda: results.append(prof.stop()))
    second.start()
    release.set()
    first.join(10)
    second.join(10)
    assert len(results) == 2 and results[0] is not None and results[0] is results[1]


# -- interrupted start(): nothing is left running ----------------------------------------------


@pytest.mark.parametrize("when", ["before the thread is ready", "once it serves"])
def test_an_interrupted_start_leaves_nothing_running(
    monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    before = _profiler_threads()
    prof = asyncflow.profile("interrupted", format="none", port=0)
    served: list[str | None] = []

    def interrupted(ready: threading.Event, timeout: float) -> bool:
        if when == "once it serves":
            assert ready.wait(timeout)
            served.append(prof.url)
        raise KeyboardInterrupt  # Ctrl-C a few milliseconds after start()

    monkeypatch.setattr(profiler, "_wait_ready", interrupted)
    with pytest.raises(KeyboardInterrupt):
        prof.start()
    assert _profiler_threads() == before
    assert asyncflow.active_profiler() is None and _session.active is None
    assert prof.url is None and not prof.running
    if served:  # the port it served on is free again: nothing listens there
        with socket.socket() as again:
            again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            again.bind(("127.0.0.1", _port_of(served[0])))
            again.listen()
    monkeypatch.undo()
    with asyncflow.profile("after", format="none", port=0) as next_one:
        assert next_one.running and next_one.url is not None


def test_a_first_start_imports_orjson_where_no_ctrl_c_is_raised(tmp_path: Path) -> None:
    # orjson's module init crashes the process (a segfault) when a nested import is interrupted
    # by Ctrl-C: the first start() imports it on a thread of its own, where no KeyboardInterrupt
    # is ever raised. Here a Ctrl-C comes as orjson starts to load on the main thread.
    script = tmp_path / "first.py"
    script.write_text(
        "import sys, threading\n"
        "class CtrlC:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'orjson' and threading.current_thread() is threading.main_thread():\n"
        "            raise KeyboardInterrupt\n"
        "        return None\n"
        "sys.meta_path.insert(0, CtrlC())\n"
        "import asyncflow\n"
        "assert 'orjson' not in sys.modules, 'import asyncflow imported orjson'\n"
        "asyncflow.start('first', format='none', port=None)\n"
        "asyncflow.stop()\n"
        "print('started and stopped')\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASYNCFLOW_")}
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=env
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "started and stopped\n", "")


class _StalledStart(threading.Event):
    """A thread's "started" event: its ``set()`` (on the new thread, once it has its ident)
    waits for ``go``, and its ``wait()`` (in ``Thread.start()``) raises KeyboardInterrupt as
    soon as the thread has its ident: Ctrl-C in the moment a thread exists, not yet started."""

    def __init__(self, go: threading.Event) -> None:
        super().__init__()
        self.go = go
        self.identified = threading.Event()

    def set(self) -> None:
        self.identified.set()
        self.go.wait(10)
        super().set()

    def wait(self, timeout: float | None = None) -> bool:
        assert self.identified.wait(10)
        raise KeyboardInterrupt

    def marked(self, timeout: float) -> bool:
        """Wait until the thread is marked started (it can be joined then)."""
        return super().wait(timeout)


def test_ctrl_c_as_the_profiler_thread_starts_is_a_keyboard_interrupt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = _profiler_threads()
    go = threading.Event()
    started: list[threading.Thread] = []
    served: list[bool] = []
    original_start = threading.Thread.start
    original_serve = profiler.Profiler._serve

    def start(thread: threading.Thread) -> None:
        if thread.name.startswith("asyncflow-profiler["):
            thread._started = _StalledStart(go)  # type: ignore[attr-defined]
            started.append(thread)
        original_start(thread)

    async def serve(self: profiler.Profiler, loop: Any, collector: Any) -> str:
        served.append(True)
        return await original_serve(self, loop, collector)

    monkeypatch.setattr(threading.Thread, "start", start)
    monkeypatch.setattr(profiler.Profiler, "_serve", serve)
    prof = asyncflow.profile("interrupted", format="none", port=0)
    try:
        with pytest.raises(KeyboardInterrupt):  # not RuntimeError: cannot join thread...
            prof.start()
    finally:
        go.set()
    assert len(started) == 1
    assert started[0]._started.marked(10)  # type: ignore[attr-defined]
    started[0].join(10)
    assert not started[0].is_alive()
    assert served == []  # the thread saw that start() gave up before it served anything
    assert _profiler_threads() == before
    assert asyncflow.active_profiler() is None and _session.active is None
    assert prof.url is None and not prof.running
    monkeypatch.undo()
    with asyncflow.profile("after", format="none", port=0) as next_one:
        assert next_one.running and next_one.url is not None


# -- fork: the child starts without the parent's profiler --------------------------------------


def _in_a_child(check: Callable[[], list[str]]) -> list[str]:
    """Fork; the child runs ``check`` and reports what it found wrong; bounded."""
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads, on 3.12+
        pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 1
        try:
            os.close(read_end)
            problems = check()
            os.write(write_end, orjson.dumps(problems))
            code = 0
        except BaseException as exc:
            os.write(write_end, orjson.dumps([f"child raised {exc!r}"]))
        finally:
            os._exit(code)
    os.close(write_end)
    try:
        ready, _, _ = select.select([read_end], [], [], 30)
        if not ready:
            os.kill(pid, signal.SIGKILL)
            pytest.fail("the forked child did not finish in 30 s")
        with os.fdopen(read_end, "rb") as answer:
            found: list[str] = orjson.loads(answer.read() or b'["child wrote nothing"]')
    finally:
        os.waitpid(pid, 0)
    return found


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_child_starts_without_the_parents_profiler() -> None:
    prof = asyncflow.start("parent", format="none", port=0)
    port = _port_of(prof.url)
    listening = {os.fstat(fd).st_ino for fd in prof._listening_fds}
    assert listening and not any(os.get_inheritable(fd) for fd in prof._listening_fds)

    def check() -> list[str]:
        problems = []
        if asyncflow.active_profiler() is not None:
            problems.append("active_profiler() is the parent's")
        if _session.active is not None:
            problems.append("recorders still write into the parent's session")
        if prof.running or prof.url is not None:
            problems.append("the parent's profiler looks alive")
        if _profiler_threads():
            problems.append("a profiler thread")
        for fd in map(int, os.listdir("/proc/self/fd") if os.path.isdir("/proc/self/fd") else []):
            try:
                if os.fstat(fd).st_ino in listening:
                    problems.append(f"fd {fd} is the parent's listening socket")
            except OSError:
                pass
        if prof.stop() is not None:
            problems.append("stopping the parent's profiler did something")
        with asyncflow.profile("child", format="none", port=0) as own:
            answer = urllib.request.urlopen(f"{own.url}/profiler_status", timeout=10)
            status = orjson.loads(answer.read())
            if status["pid"] != os.getpid():
                problems.append("the child's endpoint is not the child's")
        return problems

    try:
        assert _in_a_child(check) == []
    finally:
        final = prof.stop()
    assert final is not None and final.status.name == "parent"
    with socket.socket() as again:  # the parent's port is free: no child kept it
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", port))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_forked_children_exit_at_once_and_do_not_keep_the_port(tmp_path: Path) -> None:
    # A fork-pool worker exits through the interpreter's normal exit (atexit included) while
    # the parent still profiles; then the parent stops and its port must be free again. The
    # parent waits until the child runs (its fork hooks close its copy of the listening socket):
    # on a loaded machine the child was not scheduled yet, and its copy still held the port.
    script = tmp_path / "pool.py"
    script.write_text(
        "import os, socket, sys, warnings\n"
        "import asyncflow\n"
        "prof = asyncflow.start('pool', format='none', port=0)\n"
        "port = int(prof.url.rsplit(':', 1)[1])\n"
        "go_r, go_w = os.pipe()\n"
        "ready_r, ready_w = os.pipe()\n"
        "warnings.simplefilter('ignore', DeprecationWarning)\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os.close(go_w)\n"
        "    os.write(ready_w, b'r')  # fork() returned here: the child's fork hooks have run\n"
        "    os.read(go_r, 1)  # lives on until the parent has stopped\n"
        "    sys.exit(0)  # the normal exit: atexit hooks run\n"
        "os.close(go_r)\n"
        "os.read(ready_r, 1)\n"
        "prof.stop()\n"
        "with socket.socket() as s:\n"
        "    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        "    s.bind(('127.0.0.1', port))\n"
        "    s.listen()\n"
        "os.write(go_w, b'x')\n"
        "_, status = os.waitpid(pid, 0)\n"
        "print('child', os.waitstatus_to_exitcode(status))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASYNCFLOW_")}
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=env
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "child 0\n", "")


@contextlib.contextmanager
def _held_on_a_thread(*locks: Any) -> Iterator[None]:
    """Hold ``locks`` on a helper thread for the duration (as the profiler's thread may hold
    one at the moment the program forks)."""
    holding, done = threading.Event(), threading.Event()

    def hold() -> None:
        with contextlib.ExitStack() as stack:
            for lock in locks:
                stack.enter_context(lock)
            holding.set()
            done.wait(60)

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    try:
        assert holding.wait(10)
        yield
    finally:
        done.set()
        thread.join(10)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_child_does_not_wait_for_a_gauge_lock_held_at_the_fork() -> None:
    g = asyncflow.gauge("held at the fork")

    def check() -> list[str]:
        with asyncflow.profile("child", format="none", port=0) as own:
            g.set(3)  # waited for ever for the lock the parent's helper thread held
            final = own.stop()
        document = final.user_metrics if final is not None else None
        values = [m.value for m in (document.metrics if document else []) if m.name == g.name]
        return [] if values == [3] else [f"the child's gauge read {values}"]

    with _held_on_a_thread(g.lock):
        assert _in_a_child(check) == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_every_lock_asyncflow_made_is_free_in_a_forked_child() -> None:
    # Per-object locks (a gauge's, an executor record's, a loop state's) and module locks
    # that objects also keep (a history of gone records keeps its family's registry lock).
    from asyncflow.instrumentation import executors, futures
    from asyncflow.model import monitor

    loop = asyncio.new_event_loop()
    try:
        record = executors._record_of(loop, "held")
        state = monitor.LoopState(types.SimpleNamespace())  # type: ignore[arg-type]
        locks = {
            "gauge": asyncflow.gauge("held too").lock,
            "executor record": record.lock,
            "loop state": state.lock,
            "history of futures": futures._history.lock,
        }

        def check() -> list[str]:
            return [name for name, lock in locks.items() if not lock.acquire(timeout=5)]

        with _held_on_a_thread(*locks.values()):
            assert _in_a_child(check) == []
    finally:
        loop.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_child_does_not_wait_for_the_stopped_event_of_its_parents_profiler() -> None:
    # A thread of the parent's may be inside the profiler's _stopped.set() at the fork (stop()
    # on the duration's thread): the child's fork handler must not wait for that event's lock.
    prof = asyncflow.start("parent", format="none", port=None)
    try:

        def check() -> list[str]:
            return [] if asyncflow.active_profiler() is None else ["the parent's is active"]

        with _held_on_a_thread(prof._stopped._cond):  # type: ignore[attr-defined]
            assert _in_a_child(check) == []
    finally:
        prof.stop()
