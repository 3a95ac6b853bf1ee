"""Profiler lifecycle: one per process, idempotent stop, options, formats, duration, reporters."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import orjson
import pytest

import asyncflow
from asyncflow import collector
from asyncflow.instrument import _session
from asyncflow.schema import Snapshot


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
    assert asyncflow.stop() is None  # nothing running: nothing to do
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


def test_dropped_log_entries_are_counted_and_counts_stay_exact(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_session, "FINISHED_BUFFER_SIZE", 10)
    monkeypatch.setattr(collector, "DRAIN_INTERVAL", 3600)  # the collector falls far behind

    async def many() -> None:
        for _ in range(100):
            await unit(0)

    with asyncflow.profile("drops", format="none") as prof:
        asyncio.run(many())
        snap = prof.snapshot()
    entry = next(f for f in snap.futures.futures if f.label == "unit")
    assert (entry.call_count, entry.total_polls, entry.outcomes.returned) == (100, 100, 100)
    assert snap.status.events_dropped == 90
    logs = next(log for log in snap.future_logs if log.future_id == entry.id)
    assert len(logs.calls) == 10  # only what the buffer kept reached the log


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
    from asyncflow import views

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
