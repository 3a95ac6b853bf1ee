"""The threads document: every thread's state, CPU time and CPU share, sampled off the hot path."""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import jsonschema
import orjson
import pytest

import asyncflow
from asyncflow.instrumentation import _session
from asyncflow.model import threads
from asyncflow.model.threads import EXITED_KEPT, ThreadReading, ThreadSampler, threads_document
from asyncflow.render.report import render_table

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")
MS = 1_000_000


class FakeThreads:
    """A process whose threads, CPU times and wall clock the test sets."""

    def __init__(self) -> None:
        self.wall = 0
        self.cpu: dict[int, int] = {}
        self.state: dict[int, str] = {}

    def read(self) -> list[ThreadReading]:
        return [
            ThreadReading(tid, f"t{tid}", self.state.get(tid, "sleeping"), cpu, cpu // 2, cpu // 2)
            for tid, cpu in self.cpu.items()
        ]

    def sampler(self) -> ThreadSampler:
        return ThreadSampler(self.read, lambda: [], interval_ns=500 * MS, wall=lambda: self.wall)


def test_shares_are_cpu_over_wall_time_exactly() -> None:
    fake = FakeThreads()
    fake.cpu = {1: 0, 2: 1000 * MS}
    sampler = fake.sampler()
    sampler.sample(now=0)
    fake.wall, fake.cpu[1], fake.cpu[2] = 1000 * MS, 250 * MS, 1000 * MS
    fake.state[1] = "running"
    sampler.sample(now=1000 * MS)
    fake.wall, fake.cpu[1] = 2000 * MS, 1000 * MS
    sampler.sample(now=2000 * MS)
    doc = threads_document(sampler, 2000 * MS, origin=0)
    busy, idle = doc.threads
    assert (busy.native_id, busy.name, busy.state) == (1, "t1", "running")
    assert (busy.share, busy.max_share, busy.avg_share) == (0.75, 0.75, 0.5)
    assert (busy.cpu_ns, busy.user_ns, busy.system_ns) == (1000 * MS, 500 * MS, 500 * MS)
    assert busy.interval_ns == 1000 * MS and not busy.python and busy.daemon is None
    # CPU used before the thread was first seen counts in cpu_ns, never in a share.
    assert (idle.cpu_ns, idle.share, idle.max_share, idle.avg_share) == (1000 * MS, 0.0, 0.0, 0.0)
    assert doc.total == 2 and doc.process_share == 0.75 and doc.samples == 3


def test_the_collector_tick_samples_at_most_every_interval() -> None:
    fake = FakeThreads()
    fake.cpu = {1: 0}
    sampler = fake.sampler()
    sampler.tick(0)
    sampler.tick(499 * MS)
    assert sampler.samples == 1
    sampler.tick(500 * MS)
    assert sampler.samples == 2
    sampler.fresh(550 * MS)  # a document: the last sample is recent enough
    assert sampler.samples == 2
    sampler.fresh(600 * MS)
    sampler.fresh(600 * MS, within_ns=0)  # the final snapshot: always a fresh one
    assert sampler.samples == 4


def test_threads_that_end_are_kept_a_while_and_a_reused_id_is_a_new_thread() -> None:
    fake = FakeThreads()
    fake.cpu = {1: 0, **{100 + i: i * MS for i in range(EXITED_KEPT + 4)}}
    sampler = fake.sampler()
    sampler.sample(0)
    fake.wall = 1000 * MS
    fake.cpu = {1: 500 * MS}
    sampler.sample(1000 * MS)
    doc = threads_document(sampler, 1000 * MS, 0)
    assert doc.total == 1 and len(doc.threads) == 1 + EXITED_KEPT  # bounded history
    assert {t.state for t in doc.threads[1:]} == {"exited"}
    assert doc.threads[0].share == 0.5
    # The kernel gives id 1 to a new thread: its CPU clock starts again from zero.
    fake.wall, fake.cpu = 2000 * MS, {1: 100 * MS}
    sampler.sample(2000 * MS)
    first = threads_document(sampler, 2000 * MS, 0).threads
    assert first[0].native_id == 1 and first[0].cpu_ns == 100 * MS and first[0].share is None
    assert first[1].native_id == 1 and first[1].state == "exited" and first[1].share == 0.5


class _FakePythonThread:
    def __init__(self, native_id: int, name: str) -> None:
        self.native_id, self.ident, self.name, self.daemon = native_id, native_id, name, False


def test_a_python_thread_that_was_joined_is_not_running_while_the_os_ends_it() -> None:
    # join() returns before the kernel has taken the thread down: /proc may still list it,
    # "running", for a moment. Python has finished with it: the document must not call it
    # running (a final report showed a joined worker "running").
    fake = FakeThreads()
    fake.cpu, fake.state = {1: 0, 2: 0}, {2: "running"}
    alive: list[Any] = [_FakePythonThread(1, "MainThread"), _FakePythonThread(2, "flusher")]
    sampler = ThreadSampler(fake.read, lambda: list(alive), wall=lambda: fake.wall)
    sampler.sample(0)
    fake.wall, fake.cpu[2] = 1000 * MS, 300 * MS
    del alive[1]  # joined: gone from threading.enumerate(), still in /proc
    sampler.sample(1000 * MS)
    doc = threads_document(sampler, 1000 * MS, 0)
    flusher = next(t for t in doc.threads if t.name == "flusher")
    assert (flusher.state, flusher.share, flusher.cpu_ns) == ("exited", 0.3, 300 * MS)
    assert [t.state for t in doc.threads if t.name == "MainThread"] == ["sleeping"]
    # Once the kernel drops it, it is listed once, exited, with its last figures.
    fake.wall = 2000 * MS
    del fake.cpu[2]
    sampler.sample(2000 * MS)
    doc = threads_document(sampler, 2000 * MS, 0)
    assert [(t.name, t.state, t.cpu_ns) for t in doc.threads if t.name == "flusher"] == [
        ("flusher", "exited", 300 * MS)
    ]


def test_asyncflows_own_thread_joined_before_sampling_is_never_listed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # start()'s import thread is joined before the profiler's thread samples, but /proc may
    # still list it, nameless: one report in three of a single-threaded program had a threads
    # table for a "python" thread that "exited".
    monkeypatch.setattr(threads, "_own_ended", set())
    fake = FakeThreads()
    fake.cpu = {1: 0, 7: MS}
    importer = _FakePythonThread(7, "asyncflow-import")
    threads.own_thread_ended(importer)  # type: ignore[arg-type]
    main: list[Any] = [_FakePythonThread(1, "MainThread")]
    sampler = ThreadSampler(fake.read, lambda: main, wall=lambda: fake.wall)
    sampler.sample(0)
    del fake.cpu[7]  # the kernel takes it down
    fake.wall = 1000 * MS
    sampler.sample(1000 * MS)
    assert [t.native_id for t in threads_document(sampler, 1000 * MS, 0).threads] == [1]
    # Its id, once free, may go to a thread of the program, which is listed.
    fake.cpu[7] = MS
    fake.wall = 2000 * MS
    sampler.sample(2000 * MS)
    assert sorted(t.native_id for t in threads_document(sampler, 2000 * MS, 0).threads) == [1, 7]


def test_a_thread_list_that_cannot_be_read_is_counted_never_raised() -> None:
    def broken() -> list[ThreadReading]:
        raise RuntimeError("no /proc today")

    before = _session.errors.count
    sampler = ThreadSampler(broken)
    sampler.tick(0)
    sampler.tick(1)  # not retried before the interval
    assert _session.errors.count == before + 1
    assert threads_document(sampler, 2, 0).threads == []


@pytest.fixture
def planted() -> Iterator[tuple[threading.Thread, threading.Thread, dict[str, threading.Event]]]:
    """A thread that burns 100 ms of CPU once told to go, and one that only waits."""
    events = {name: threading.Event() for name in ("go", "burned", "stop")}

    def burn() -> None:
        events["go"].wait(30)
        start = time.thread_time_ns()
        while time.thread_time_ns() - start < 100 * MS and not events["stop"].is_set():
            pass
        events["burned"].set()
        events["stop"].wait(30)

    burner = threading.Thread(target=burn, name="planted-burner", daemon=True)
    idle = threading.Thread(target=events["stop"].wait, args=(30,), name="planted-idle")
    burner.start()
    idle.start()
    try:
        yield burner, idle, events
    finally:
        events["stop"].set()
        events["go"].set()
        burner.join(30)
        idle.join(30)


@linux
def test_a_busy_thread_is_seen_beside_an_idle_one(
    planted: tuple[threading.Thread, threading.Thread, dict[str, threading.Event]],
) -> None:
    burner, idle, events = planted
    sampler = ThreadSampler()
    sampler.sample(time.perf_counter_ns())
    events["go"].set()
    assert events["burned"].wait(30), "the burner never got its 100 ms of CPU"
    doc = threads_document(sampler, time.perf_counter_ns(), 0, within_ns=0)
    by_name = {t.name: t for t in doc.threads}
    hot, cold = by_name["planted-burner"], by_name["planted-idle"]
    assert hot.native_id == burner.native_id and hot.ident == burner.ident
    assert cold.native_id == idle.native_id
    assert hot.python and hot.daemon is True and cold.daemon is False
    assert cold.state == "sleeping"
    assert hot.cpu_ns is not None and cold.cpu_ns is not None
    assert hot.share is not None and cold.share is not None
    # The burner used at least its 100 ms in the interval; the share is of one core at most.
    assert hot.share * hot.interval_ns >= 100 * MS * 0.99
    assert cold.share < hot.share and cold.share < 0.05
    assert 0 < hot.share <= 1.05 and hot.max_share == hot.share
    assert doc.threads.index(hot) < doc.threads.index(cold)  # the busiest first
    assert hot.user_ns is not None and hot.system_ns is not None
    assert hot.user_ns + hot.system_ns <= hot.cpu_ns + 20 * MS  # ticks against the clock
    main = by_name["MainThread"]
    assert main.python and main.native_id == threading.main_thread().native_id


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return orjson.loads(response.read())


@linux
def test_served_at_threads_and_in_the_snapshot_and_the_report(
    planted: tuple[threading.Thread, threading.Thread, dict[str, threading.Event]],
) -> None:
    with asyncflow.profile("threads", format="none", port=0) as prof:
        assert prof.url is not None
        spec = _get(prof.url + "/openapi.json")
        body = _get(prof.url + "/threads")
        jsonschema.Draft202012Validator(
            {"$ref": "#/components/schemas/ThreadsDocument", "components": spec["components"]}
        ).validate(body)
        assert spec["paths"]["/threads"]["get"]
        names = {t["name"]: t for t in body["threads"]}
        assert body["source"] == "proc" and body["schema"] == 1
        own = names[f"asyncflow-profiler[{prof.name}]"]
        assert own["asyncflow"] and own["daemon"] and not names["MainThread"]["asyncflow"]
        assert {"planted-burner", "planted-idle"} <= set(names)
        snap = prof.snapshot()
    assert snap.threads is not None
    assert "planted-idle" in {t.name for t in snap.threads.threads}
    text = render_table(snap, (50.0,), 0)
    assert "planted-idle" in text and "avg cpu" in text


def test_a_single_threaded_program_gets_no_thread_table() -> None:
    with asyncflow.profile("alone", format="none", port=None) as prof:
        pass
    snap = prof.snapshot()
    assert snap.threads is not None
    entries = {t.name: t for t in snap.threads.threads}
    own = next(t for t in snap.threads.threads if t.asyncflow)
    alone = dataclasses.replace(snap.threads, threads=[entries["MainThread"], own])
    assert "avg cpu" not in render_table(dataclasses.replace(snap, threads=alone), (50.0,), 0)
    worker = dataclasses.replace(own, name="worker", asyncflow=False, native_id=1)
    more = dataclasses.replace(alone, threads=[*alone.threads, worker])
    text = render_table(dataclasses.replace(snap, threads=more), (50.0,), 0)
    assert "avg cpu" in text and "worker [1]" in text and "(asyncflow)" in text


def test_other_platforms_list_pythons_threads_without_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")
    readings = threads.read_threads()
    ids = {r.native_id for r in readings}
    assert threading.main_thread().native_id in ids
    assert all(r.cpu_ns is None and r.state is None for r in readings)


async def test_the_threads_running_instrumented_loops_are_named() -> None:
    async def step() -> None:
        await asyncio.sleep(0)

    with asyncflow.profile("loops", format="none", port=None) as prof:
        with asyncflow.instrument_tasks():
            await asyncio.create_task(step())
        snap = prof.snapshot()
    assert snap.threads is not None and snap.loop is not None
    by_id = {t.native_id: t for t in snap.threads.threads}
    here = by_id[threading.get_native_id()]
    # Loops an earlier test closed on this thread may still be listed (closed): ours runs.
    (mine,) = [
        entry.id
        for entry in snap.loop.loops
        if entry.thread == threading.current_thread().name and entry.state == "running"
    ]
    assert here.loop_ids == [mine]
    assert all(not t.loop_ids for t in snap.threads.threads if t is not here)
