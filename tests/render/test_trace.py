"""The trace recorder: a Chrome trace event file (Perfetto, chrome://tracing) with message flows.

Every trace made here is checked against the trace event format by :func:`check_format`:
it loads as JSON, slices are complete (``X``) or paired (``B``/``E`` on one track), timestamps
never go back on a track, slices on a track nest, and every flow has one start and one finish,
each inside a slice of its track (what Perfetto binds them to).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

import orjson
import pytest

import asyncflow
from asyncflow import cli, config
from asyncflow.clock import FakeClock
from asyncflow.errors import AsyncflowError
from asyncflow.instrumentation import probes
from asyncflow.render import trace

Event = dict[str, Any]
TRACKS = ("X", "B", "E", "s", "f", "i", "I")


def check_format(document: dict[str, Any]) -> list[Event]:
    """Assert that ``document`` is a well-formed trace; returns its events."""
    document = orjson.loads(trace.render(document))  # what a viewer reads
    events: list[Event] = document["traceEvents"]
    assert isinstance(events, list) and events
    known = {"X", "B", "E", "s", "t", "f", "C", "M"}
    assert {e["ph"] for e in events} <= known
    last: dict[tuple[int, int], float] = {}
    open_slices: dict[tuple[int, int], list[str]] = defaultdict(list)
    slices: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)  # in ns
    flows: dict[int, list[Event]] = defaultdict(list)
    for e in events:
        assert isinstance(e["pid"], int)
        if e["ph"] == "M":
            assert e["name"] in {
                "process_name",
                "process_sort_index",
                "thread_name",
                "thread_sort_index",
            }
            continue
        assert isinstance(e["ts"], int | float)
        if e["ph"] == "C":
            assert e["args"] and all(isinstance(v, int | float) for v in e["args"].values())
            continue
        track = (e["pid"], e["tid"])
        assert e["ts"] >= last.get(track, float("-inf")), f"time goes back on {track}: {e}"
        last[track] = e["ts"]
        if e["ph"] == "B":
            open_slices[track].append(e["name"])
        elif e["ph"] == "E":
            assert open_slices[track], f"an E with no B on {track}"
            open_slices[track].pop()
        elif e["ph"] == "X":
            assert e["dur"] >= 0
            # in ns: µs with 3 decimals added as floats can be off by an ulp
            at = round(e["ts"] * 1000)
            slices[track].append((at, at + round(e["dur"] * 1000)))
        else:
            flows[e["id"]].append(e)
    assert not any(open_slices.values()), "a B without its E"
    for track, spans in slices.items():  # on one track, slices nest or follow each other
        stack: list[int] = []
        for begins, ends in spans:
            while stack and begins >= stack[-1]:
                stack.pop()
            assert not stack or ends <= stack[-1], f"slices overlap on {track}"
            stack.append(ends)
    for ident, pair in flows.items():
        # a message's arrow: s then f; a lineage chain: s, a t at each stage's receive and
        # send, then f
        phases = [e["ph"] for e in pair]
        assert phases[0] == "s" and phases[-1] == "f", f"flow {ident}: {pair}"
        assert set(phases[1:-1]) <= {"t"}, f"flow {ident}: {pair}"
        start = pair[0]
        assert all((start["cat"], start["name"]) == (e["cat"], e["name"]) for e in pair)
        assert [e["ts"] for e in pair] == sorted(e["ts"] for e in pair)
        assert all(e.get("bp") == "e" for e in pair[1:])
        for point in pair:
            spans = slices[(point["pid"], point["tid"])]
            at = round(point["ts"] * 1000)
            assert any(a <= at <= b for a, b in spans), f"flow outside slices: {point}"
    meta = document["metadata"]["asyncflow"]
    assert meta["dropped"] == meta["recorded"] - meta["kept"]
    return events


def flows_of(events: list[Event]) -> list[tuple[Event, Event]]:
    """The messages' arrows (not the lineage's chains): (start, finish)."""
    messages = [e for e in events if e.get("cat") == "message"]
    starts = {e["id"]: e for e in messages if e["ph"] == "s"}
    return [(starts[e["id"]], e) for e in messages if e["ph"] == "f"]


def track_names(events: list[Event]) -> dict[tuple[int, int], str]:
    return {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in events
        if e["ph"] == "M" and e["name"] == "thread_name"
    }


# -- a planted producer -> consumer on the fake clock ------------------------------------------


async def pipeline(fake: FakeClock, q: asyncio.Queue[int | None], n: int) -> None:
    async def producer() -> None:
        for i in range(n):
            fake.advance(1_000)
            q.put_nowait(i)  # sent 1 µs into the poll
            fake.advance(2_000)
            await asyncio.sleep(0)  # each poll lasts 3 µs
        q.put_nowait(None)

    async def consumer() -> None:
        while await q.get() is not None:  # received at the start of the poll
            fake.advance(500)

    await asyncio.gather(producer(), consumer())


def run_pipeline(fake: FakeClock, n: int, **options: Any) -> tuple[dict[str, Any], Any]:
    with asyncflow.profile("trace", format="none", port=None, trace=True, **options) as prof:

        async def main() -> None:
            handle = asyncflow.instrument_tasks()
            try:
                q: asyncio.Queue[int | None] = asyncflow.instrument_queue(
                    asyncio.Queue(), name="jobs"
                )
                await asyncio.create_task(pipeline(fake, q, n))
            finally:
                handle.undo()

        asyncio.run(main())
        document = prof.trace()
        snapshot = prof.snapshot()
    return document, snapshot


def test_message_flows_go_from_the_sending_poll_to_the_receiving_one(fake_clock: FakeClock) -> None:
    document, snap = run_pipeline(fake_clock, 3)
    events = check_format(document)
    (channel,) = [c for c in snap.channels.channels if c.label == "jobs"]
    (logs,) = [log for log in snap.channel_logs if log.channel_id == channel.id]
    sent = {e.msg_id: e.timestamp_ns for e in logs.sent_logs}
    received = {e.msg_id: e.timestamp_ns for e in logs.received_logs}
    flows = flows_of(events)
    # every timed message is an arrow, keyed by channel and msg_id: 3 items and the None
    assert sorted(s["args"]["msg_id"] for s, _ in flows) == [1, 2, 3, 4]
    names = track_names(events)
    for start, finish in flows:
        msg_id = start["args"]["msg_id"]
        assert start["id"] == finish["id"] == trace.flow_id(channel.id, msg_id)
        assert start["args"]["channel_id"] == channel.id
        assert start["ts"] == sent[msg_id] / 1000
        assert finish["ts"] == received[msg_id] / 1000
        assert finish["args"]["delay_ns"] == received[msg_id] - sent[msg_id]
        assert "producer" in names[(start["pid"], start["tid"])]
        assert "consumer" in names[(finish["pid"], finish["tid"])]
    # exact poll durations: each producer poll that sends lasts 3 µs, the send 1 µs into it
    polls = [e for e in events if e["ph"] == "X" and e["name"].endswith("producer")]
    by_start = {p["ts"]: p for p in polls}
    for start, _ in flows[:3]:
        poll = by_start[start["ts"] - 1.0]
        assert poll["dur"] == 3.0
        assert (poll["pid"], poll["tid"]) == (start["pid"], start["tid"])
    assert [p["args"].get("outcome") for p in polls][-1] == "returned"
    consumer_polls = [e for e in events if e["ph"] == "X" and e["name"].endswith("consumer")]
    assert sorted({p["dur"] for p in consumer_polls}) == [0.0, 0.5]
    meta = document["metadata"]["asyncflow"]
    assert (meta["flows"], meta["flows_unbound"], meta["dropped"]) == (4, 0, 0)
    assert meta["polls_recorded"] is True


def test_the_ring_keeps_the_newest_events_and_counts_the_dropped(fake_clock: FakeClock) -> None:
    async def steps() -> None:
        for _ in range(40):
            fake_clock.advance(1_000)
            await asyncio.sleep(0)

    with asyncflow.profile("ring", format="none", port=None, trace=True, trace_events=10) as prof:
        coro = asyncflow.instrument(steps())
        polls = 0
        with pytest.raises(StopIteration):  # driven by hand: nothing but these polls happens
            while True:
                coro.send(None)
                polls += 1
        document = prof.trace()
    events = check_format(document)
    meta = document["metadata"]["asyncflow"]
    assert meta["capacity"] == meta["kept"] == 10
    assert meta["recorded"] >= polls + 1 == 41
    assert meta["dropped"] == meta["recorded"] - 10
    kept = [e["ts"] for e in events if e["ph"] == "X"]
    assert kept and len(kept) <= 10
    # the newest polls: the last ones, one every µs, up to the poll that returned
    last = max(kept)
    assert kept == [last - i for i in range(len(kept) - 1, -1, -1)]
    newest = next(e for e in events if e["ph"] == "X" and e["ts"] == last)
    assert newest["args"]["outcome"] == "returned"


def test_memory_stays_flat_however_many_polls() -> None:
    async def steps(n: int) -> None:
        for _ in range(n):
            await asyncio.sleep(0)

    with asyncflow.profile("flat", format="none", port=None, trace=True, trace_events=100) as prof:
        asyncio.run(asyncflow.instrument(steps(5_000)))
        recorder = prof._trace
        assert recorder is not None
        assert len(recorder.ring) == 100
        meta = prof.trace()["metadata"]["asyncflow"]
    assert meta["recorded"] > 5_000 and meta["kept"] == 100


# -- the real clock: blocked loops, counters, nested calls -------------------------------------


@asyncflow.future
async def inner() -> None:
    await asyncio.sleep(0)


async def blocker(q: asyncio.Queue[int]) -> None:
    for i in range(5):
        await inner()
        await q.put(i)
    time.sleep(0.1)  # blocks the loop: the planted problem


async def reader(q: asyncio.Queue[int]) -> None:
    for _ in range(5):
        await q.get()
        await inner()


def test_a_real_program_gives_a_well_formed_trace_with_episodes_and_counters() -> None:
    with asyncflow.profile(
        "real", format="none", port=None, trace=True, block_threshold=0.02
    ) as prof:

        async def main() -> None:
            handle = asyncflow.instrument_tasks()
            try:
                q: asyncio.Queue[int] = asyncflow.instrument_queue(asyncio.Queue(2), name="q")
                await asyncio.gather(blocker(q), reader(q))
                await asyncio.sleep(0.06)  # a heartbeat or two after the block
            finally:
                handle.undo()

        asyncio.run(main())
        document = prof.trace()
    events = check_format(document)
    names = track_names(events)
    (episode,) = [e for e in events if e.get("cat") == "blocked"]
    assert names[(episode["pid"], episode["tid"])].startswith("event loop")
    assert episode["dur"] >= 0.09 * 1e6
    assert episode["args"]["future"].endswith("blocker")
    assert "test_trace.py" in episode["args"]["where"]
    counters = {e["name"] for e in events if e["ph"] == "C"}
    assert any(name.startswith("q (channel") for name in counters)
    assert any(name.endswith("lag") for name in counters)
    # a decorated call awaited by a task is drawn inside the task's poll, on the task's track
    nested = [e for e in events if e["ph"] == "X" and e["name"] == "inner"]
    assert len(nested) == 20  # 10 calls, two polls each
    assert {names[(e["pid"], e["tid"])].split(" ")[1] for e in nested} <= {
        "(tests.test_trace:blocker)",
        "(tests.test_trace:reader)",
        "(blocker)",
        "(reader)",
    }
    assert len(flows_of(events)) == 5


# -- the option, the file at exit, and what it costs when off ----------------------------------


def test_off_no_probe_is_set(tmp_path: Path) -> None:
    with asyncflow.profile("off", format="none", port=None) as prof:
        assert probes.poll_probe() is None
        with pytest.raises(AsyncflowError, match="no trace is recorded"):
            prof.trace()
    path = tmp_path / "t.json"
    with asyncflow.profile("on", format="none", port=None, trace=str(path)):
        assert probes.poll_probe() is not None
    assert probes.poll_probe() is None  # removed at stop
    events = check_format(json.loads(path.read_text()))
    assert any(e["ph"] == "M" for e in events)


class Counting:
    def __init__(self) -> None:
        self.ends = 0

    def begin(self, record: Any) -> str:
        return "mine"

    def end(self, record: Any, token: Any, t0: int, dt: int, outcome: str) -> None:
        assert token == "mine"
        self.ends += 1


def test_the_recorder_shares_the_probe_seam_with_a_probe_set_before() -> None:
    async def steps() -> None:
        for _ in range(3):
            await asyncio.sleep(0)

    counting = Counting()
    probes.set_poll_probe(counting)
    try:
        with asyncflow.profile("both", format="none", port=None, trace=True) as prof:
            asyncio.run(asyncflow.instrument(steps()))
            document = prof.trace()
        assert probes.poll_probe() is counting  # left in place at stop
    finally:
        probes.set_poll_probe(None)
    assert counting.ends == 4
    assert len([e for e in check_format(document) if e["ph"] == "X"]) == 4


def test_trace_is_written_at_exit(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"

    async def main() -> None:
        q: asyncio.Queue[int] = asyncflow.instrument_queue(asyncio.Queue(), name="q")
        await asyncio.gather(q.put(1), asyncflow.instrument(q.get()))

    with asyncflow.profile("exit", format="none", port=None, trace=path):
        asyncio.run(main())
    check_format(json.loads(path.read_bytes()))


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("1", (True, None)),
        ("on", (True, None)),
        ("off", (False, None)),
        ("0", (False, None)),
    ],
)
def test_trace_from_the_environment(value: str, expected: tuple[bool, str | None]) -> None:
    options = config.resolve_options("x", {}, {"ASYNCFLOW_TRACE": value})
    assert (options.trace, options.trace_output) == expected


def test_trace_options(tmp_path: Path) -> None:
    path = str(tmp_path / "t.json")
    env = {"ASYNCFLOW_TRACE": path, "ASYNCFLOW_TRACE_EVENTS": "500"}
    options = config.resolve_options("x", {}, env)
    assert (options.trace, options.trace_output, options.trace_events) == (True, path, 500)
    # an explicit argument wins over the environment
    options = config.resolve_options("x", {"trace": False, "trace_events": 7}, env)
    assert (options.trace, options.trace_events) == (False, 7)
    assert config.resolve_options("x", {}, {}).trace_events == config.DEFAULT_TRACE_EVENTS
    with pytest.raises(ValueError, match="trace_events=0: expected a whole number from 1"):
        config.resolve_options("x", {"trace_events": 0}, {})
    with pytest.raises(ValueError, match="ASYNCFLOW_TRACE_EVENTS='many'"):
        config.resolve_options("x", {}, {"ASYNCFLOW_TRACE_EVENTS": "many"})
    with pytest.raises(ValueError, match="trace=3: expected True, False, or the trace file"):
        config.resolve_options("x", {"trace": 3}, {})
    with pytest.raises(ValueError, match="does not exist"):
        config.resolve_options("x", {"trace": str(tmp_path / "no" / "t.json")}, {})


def test_a_failing_write_is_counted_not_raised(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    with asyncflow.profile("gone", format="none", port=None, trace=str(path)) as prof:
        path.mkdir()  # the file cannot be written now
    assert prof.snapshot().status.internal_errors >= 1


# -- the command line --------------------------------------------------------------------------

PROGRAM = """
import asyncio

async def produce(q):
    for i in range(3):
        await q.put(i)

async def consume(q):
    for _ in range(3):
        await q.get()

async def main():
    q = asyncio.Queue()
    await asyncio.gather(produce(q), consume(q))

asyncio.run(main())
"""


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ASYNCFLOW_PORT": "0"}
    return subprocess.run(
        [sys.executable, "-m", "asyncflow", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_run_with_trace_writes_the_file(tmp_path: Path) -> None:
    (tmp_path / "prog.py").write_text(PROGRAM)
    done = run_cli("run", "--format", "none", "--trace", "out.json", "prog.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    events = check_format(json.loads((tmp_path / "out.json").read_text()))
    flows = flows_of(events)
    assert len(flows) == 3
    names = track_names(events)
    assert all("produce" in names[(s["pid"], s["tid"])] for s, _ in flows)


def test_run_refuses_a_bad_trace_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "prog.py").write_text(PROGRAM)
    out = str(tmp_path / "o.json")
    code = cli.main(["run", "--trace", out, "--trace-events", "0", str(tmp_path / "prog.py")])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert line.startswith("asyncflow run: error: --trace-events 0: expected a whole number")


# -- on demand: GET /trace and asyncflow trace URL ---------------------------------------------


def get(url: str) -> tuple[int, bytes, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.read(), response.headers["Content-Type"]
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.read(), error.headers["Content-Type"]


def test_the_endpoint_serves_the_trace_and_the_command_saves_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with asyncflow.profile("served", format="none", port=0, trace=True) as prof:

        async def main() -> None:
            handle = asyncflow.instrument_tasks()
            try:
                q: asyncio.Queue[int] = asyncflow.instrument_queue(asyncio.Queue(2), name="q")
                await asyncio.gather(blocker(q), reader(q))
            finally:
                handle.undo()

        asyncio.run(main())
        assert prof.url is not None
        status, body, media = get(prof.url + "/trace")
        assert status == 200 and media.startswith("application/json")
        served = orjson.loads(body)
        check_format(served)
        assert len(flows_of(served["traceEvents"])) == 5
        saved = tmp_path / "saved.json"
        assert cli.main(["trace", prof.url, "-o", str(saved)]) == 0
        said = capsys.readouterr().err
        assert "saved" in said and "ui.perfetto.dev" in said
        check_format(json.loads(saved.read_text()))


def test_without_a_trace_the_endpoint_answers_404_and_the_command_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with asyncflow.profile("untraced", format="none", port=0) as prof:
        assert prof.url is not None
        status, body, media = get(prof.url + "/trace")
        assert status == 404 and media.startswith("application/json")
        assert "no trace is recorded" in orjson.loads(body)["error"]["message"]
        code = cli.main(["trace", prof.url, "-o", str(tmp_path / "saved.json")])
    assert code == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "/trace answered 404: no trace is recorded" in line
    assert not (tmp_path / "saved.json").exists()


def test_an_arrow_whose_polls_left_the_ring_is_not_drawn(fake_clock: FakeClock) -> None:
    document, _ = run_pipeline(fake_clock, 3, trace_events=8)
    events = check_format(document)  # no arrow without its slices
    meta = document["metadata"]["asyncflow"]
    assert meta["dropped"] > 0 and meta["kept"] == 8
    assert meta["flows"] == len(flows_of(events))
    assert meta["flows_unbound"] >= 1
    assert meta["flows"] + meta["flows_unbound"] <= 4


def test_tasks_are_grouped_under_their_loops_thread() -> None:
    async def steps() -> None:
        for _ in range(3):
            await asyncio.sleep(0)

    def run_loop() -> None:
        async def main() -> None:
            with asyncflow.instrument_tasks():
                await asyncio.create_task(steps(), name="in-the-other-thread")

        asyncio.run(main())

    with asyncflow.profile("threads", format="none", port=None, trace=True) as prof:
        other = threading.Thread(target=run_loop, name="second-loop")
        other.start()
        other.join(30)
        run_loop()  # and one on this thread
        document = prof.trace()
    events = check_format(document)
    processes = {
        e["pid"]: e["args"]["name"]
        for e in events
        if e["ph"] == "M" and e["name"] == "process_name"
    }
    names = track_names(events)
    tasks = {(pid, name) for (pid, _), name in names.items() if "in-the-other-thread" in name}
    assert len(tasks) == 2  # one task on each loop, each under its own thread's process
    groups = sorted(processes[pid] for pid, _ in tasks)
    assert groups[0].startswith("thread MainThread · event loop ")
    assert groups[1].startswith("thread second-loop · event loop ")
    polls = [e for e in events if e["ph"] == "X" and e["name"].endswith("steps")]
    assert len(polls) == 8 and len({e["pid"] for e in polls}) == 2


def test_polls_are_written_exactly_whatever_their_names(fake_clock: FakeClock) -> None:
    """Poll slices are written as text from a format per call and track (not as dicts): names
    with %, quotes, backslashes, non-ASCII and control characters, times to the nanosecond,
    outcomes, and a poll that began before the profiler did (written the slow way)."""
    label = 'odd %d %s "quoted" \\ é\x07'

    @asyncflow.future(name=label)
    async def odd() -> int:
        fake_clock.advance(1_234_567)
        await asyncio.sleep(0)
        fake_clock.advance(1)
        return 1

    async def main() -> None:
        assert await odd() == 1

    with asyncflow.profile("trace-text", format="none", port=None, trace=True) as prof:
        fake_clock.advance(5)
        asyncio.run(main())
        recorder = prof._trace
        assert recorder is not None
        data = prof._call(recorder.data)
        document = prof.trace()
        origin = prof._collector.session.start_ns  # type: ignore[union-attr]
        t0, _, call_id, _, _ = recorder.ring[0]
        begun = max(e[4] for e in recorder.ring) + 1
        recorder.ring.append((origin - 2_500, 1_001, call_id, "raised", begun))  # before it
        early = [e for e in check_format(prof.trace()) if e.get("args", {}).get("outcome")]
    assert orjson.loads(data)["traceEvents"] == document["traceEvents"]
    events = check_format(document)
    polls = [e for e in events if e["ph"] == "X"]
    assert [p["name"] for p in polls] == ['odd %d %s "quoted" \\ é?'] * 2
    assert [p["dur"] for p in polls] == [1234.567, 0.001]
    assert polls[1]["ts"] == (t0 - origin + 1_234_567) / 1000
    assert polls[0]["ts"] == (t0 - origin) / 1000
    assert [p["args"].get("outcome") for p in polls] == [None, "returned"]
    assert {p["args"]["call_id"] for p in polls} == {call_id}
    assert [(e["ts"], e["dur"], e["args"]["outcome"]) for e in early] == [
        (-2.5, 1.001, "raised"),
        (polls[1]["ts"], 0.001, "returned"),
    ]


def test_a_sampled_message_through_two_stages_is_one_arrow_chain(fake_clock: FakeClock) -> None:
    """src -> raw -> stage -> cooked -> sink: each message's way is one chain of arrows, from
    src's send through stage's receive and send to sink's receive, on their tracks."""
    with asyncflow.profile("trace", format="none", port=None, trace=True) as prof:

        async def main() -> None:
            handle = asyncflow.instrument_tasks()
            try:
                raw = asyncflow.instrument_queue(asyncio.Queue[int](), name="raw")
                cooked = asyncflow.instrument_queue(asyncio.Queue[int](), name="cooked")

                async def src() -> None:
                    for i in range(3):
                        fake_clock.advance(1_000)
                        raw.put_nowait(i)
                        await asyncio.sleep(0)
                    raw.put_nowait(-1)

                async def stage() -> None:
                    while (i := await raw.get()) >= 0:
                        fake_clock.advance(2_000)
                        cooked.put_nowait(i)
                    cooked.put_nowait(-1)

                async def sink() -> None:
                    while await cooked.get() >= 0:
                        fake_clock.advance(500)

                await asyncio.gather(
                    asyncio.create_task(src()),
                    asyncio.create_task(stage()),
                    asyncio.create_task(sink()),
                )
            finally:
                handle.undo()

        asyncio.run(main())
        document = prof.trace()
    events = check_format(document)
    chains: dict[int, list[Event]] = defaultdict(list)
    for e in events:
        if e.get("cat") == "lineage":
            chains[e["id"]].append(e)
    assert len(chains) >= 3  # the three messages (and the -1 that ends them)
    names = track_names(events)
    for chain in chains.values():
        assert [e["ph"] for e in chain] == ["s", "t", "t", "f"]
        where = [names[(e["pid"], e["tid"])] for e in chain]
        assert "src" in where[0] and "stage" in where[1] and "stage" in where[2]
        assert "sink" in where[3]
        # the stage's receive, then its send 2 µs of its poll later
        assert chain[2]["ts"] - chain[1]["ts"] == 2.0
    meta = document["metadata"]["asyncflow"]
    assert meta["lineage_chains"] == len(chains) and meta["lineage_chains_unbound"] == 0
