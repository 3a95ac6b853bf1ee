"""The short texts ``asyncflow mcp``'s tools answer with: one line per entry, figures named in
words, at most ``limit`` entries and a line saying how many were left out."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import time

import asyncflow
from asyncflow import schema
from asyncflow.render import brief
from tests.support.workload import workload


def _blocker() -> None:
    time.sleep(0.4)  # a blocking call on the loop: one episode well past the 100 ms threshold


async def _run() -> None:
    with asyncflow.instrument_tasks():
        await workload()
        _blocker()
        await asyncio.sleep(0)


def _snapshot() -> schema.Snapshot:
    with asyncflow.profile("brief", format="none", port="off") as prof:
        asyncio.run(_run())
        return prof.snapshot()


def test_each_document_in_a_few_lines() -> None:
    s = _snapshot()
    # the futures of this test's workload: functions decorated by earlier tests' modules stay
    # registered (with no call) for the whole run
    own = [f for f in s.futures.futures if f.source.startswith("tests.support.workload:")]
    only_own = dataclasses.replace(s.futures, futures=own, total=len(own))
    futures = brief.futures(only_own, 1).splitlines()
    assert futures[0] == "2 futures, most busy first:"
    assert futures[1].startswith(("consume: 1 call (1 returned, 0 raised, 0 cancelled; 0 live), "
                                  "10 polls; busy ", "produce: 1 call (1 returned"))  # fmt: skip
    assert " [tests.support.workload:" in futures[1]
    assert futures[2:] == ["(1 more futures left out: call again with a larger limit than 1)"]

    assert s.channels is not None
    work = brief.channels(s.channels, 5).splitlines()[1]
    assert work.startswith(("work (asyncio.Queue", "work (gone) (asyncio.Queue")), work
    assert " (asyncio.Queue, bounded[2]): 20 sent, 20 received, " in work
    assert work.endswith("senders: produce (20); receivers: consume (20)")

    assert s.streams is not None
    own_streams = [e for e in s.streams.streams if e.label == "numbers"]
    only_own_streams = dataclasses.replace(s.streams, streams=own_streams, total=1)
    numbers = brief.streams(only_own_streams, 5).splitlines()
    assert numbers[0] == "1 stream, most items first:"
    assert numbers[1].startswith("numbers (exhausted; iterations: 1 exhausted): 5 items; ")
    assert " [tests.support.workload:numbers at workload.py:" in numbers[1]

    assert s.resources is not None
    # (resources of earlier tests not yet collected may be listed too)
    # (another test's run of the same workload may have left its gate listed: take one)
    own_locks = [e for e in s.resources.resources if e.label.startswith("gate")][:1]
    only_own_locks = dataclasses.replace(s.resources, resources=own_locks, total=len(own_locks))
    gate = brief.resources(only_own_locks, 5).splitlines()
    assert gate[0] == "1 resource, most waited on first:"
    # (gone once collected: when depends on the collector's next drain)
    assert gate[1].startswith(
        ("gate (asyncio.Lock at workload.py:", "gate (gone) (asyncio.Lock")
    ), gate
    assert ": 1 acquired (0 after waiting); waits 0 (0 failed), " in gate[1]

    blocking = f"test_brief.py:{_blocker.__code__.co_firstlineno + 1}"
    assert s.loop is not None
    loop = brief.loop(s.loop, 5)
    assert loop.startswith("blocked means one step ran longer than 100 ms\nloop ")
    assert re.search(r"\nloop \d+ on MainThread", loop), loop  # (beside earlier tests' loops)
    assert "blocked 1x" in loop
    assert f"  line {blocking} in _blocker `time.sleep(0.4)" in loop
    assert "  longest: blocked " in loop and f" at {blocking} in _blocker `" in loop

    status = brief.status(s.status, "here").splitlines()
    assert status[0].startswith(f"brief: pid {s.status.pid}, running, up ")
    assert status[0].endswith("(read from here)")
    assert re.fullmatch(r"tracks \d+ futures \(0 calls live\), 2 channels, \d+ streams?", status[1])

    warnings = brief.warnings(s.warnings, 5)
    assert f"WARNING loop-blocked (now) about line `{blocking}`" in warnings
    assert "\n  hint: " in warnings  # (loop ids count the loops the whole run has made)
    assert re.search(r"\n  evidence: loop_id=\d+, blocks=1, total ", warnings), warnings


def test_empty_documents_say_so() -> None:
    assert brief.warnings([], 5) == "no warnings: asyncflow found nothing wrong\n"
    empty = schema.ChannelsDocument(schema.SCHEMA, 0, 0, 0, [])
    assert brief.channels(empty, 5).startswith("no channels")
    assert brief.executors(schema.ExecutorsDocument(schema.SCHEMA, []), 5).startswith("no exec")
    assert brief.left_out(5, 5, "tasks", 5) == []
    assert brief.left_out(5, 7, "tasks", 5) == [
        "(2 more tasks left out: call again with a larger limit than 5)"
    ]
