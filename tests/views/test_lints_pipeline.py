"""A pipeline of unbounded queues whose middle stage is slower than the rate, for every message
(the reviewer's `pipe.py`): its input queue builds up while its output waits. Nothing blocks a
producer (the queues are unbounded) and every message is slow (the median-ratio rule of
slow-path cannot tell), so the backlog itself must name that stage, and the stages after it
(whose inputs it feeds) must not be said to set the pace."""

from __future__ import annotations

import dataclasses

from asyncflow import schema
from asyncflow.views import lints
from asyncflow.views.lints import Documents, Finding, Thresholds
from tests.views.test_lints_cause import future

MS = 1_000_000
S = 1000 * MS


def _stage(fid: int, label: str) -> schema.FutureEntry:
    """A stage whose one call lives through the run (1.9 s), waiting most of it."""
    return dataclasses.replace(
        future(fid, label, 8 * MS, 1 * MS),
        call_count=1,
        outcomes=schema.Outcomes(1, 0, 0, 0, 0),
        idle_ns=1900 * MS - 8 * MS,
    )


def _edge(f: schema.FutureEntry, delay_ns: int = 20_000) -> schema.EdgeEntry:
    return schema.EdgeEntry(f.id, f.label, 301, {"p50": delay_ns}, delay_ns)


def _queue(
    cid: int,
    src: schema.FutureEntry,
    dst: schema.FutureEntry,
    starved_ns: int,
    *,
    p50_ns: int = 20_000,
    depth: int = 2,
) -> schema.ChannelEntry:
    return schema.ChannelEntry(
        id=cid, label=f"q{cid}", kind="asyncio.Queue", channel_type="unbounded",
        state="active", sent_count=301, received_count=301, unpaired_count=0, queue_size=0,
        max_queue_size=depth, send_rate=160.0, receive_rate=160.0,
        delay_ns={"p50": p50_ns, "p99": 2 * p50_ns}, max_delay_ns=2 * p50_ns,
        producers_blocked_ns=0, consumers_starved_ns=starved_ns,
        senders=[_edge(src, p50_ns)], receivers=[_edge(dst, p50_ns)], timed_count=301,
    )  # fmt: skip


def _pipeline(geocode_p50_ns: int = 129 * MS, geocode_starved_ns: int = 41 * MS) -> Documents:
    """ingest → validate → geocode → store → sink, as the reviewer's run measured it."""
    ingest, validate, geocode, store, sink = (
        _stage(i, n) for i, n in enumerate(("ingest", "validate", "geocode", "store", "sink"), 1)
    )
    channels = [
        _queue(1, ingest, validate, 1270 * MS),
        _queue(2, validate, geocode, geocode_starved_ns, p50_ns=geocode_p50_ns, depth=43),
        _queue(3, geocode, store, 1530 * MS),
        _queue(4, store, sink, 1880 * MS),
    ]
    return Documents(
        now_ns=1900 * MS, elapsed_ns=1900 * MS,
        futures=[ingest, validate, geocode, store, sink], channels=channels,
    )  # fmt: skip


def _said(docs: Documents) -> list[Finding]:
    return lints.evaluate(docs, Thresholds())


def _necks(docs: Documents) -> list[Finding]:
    return [f for f in _said(docs) if f.kind == "bottleneck"]


def test_the_stage_whose_unbounded_input_builds_up_is_the_bottleneck() -> None:
    found = _said(_pipeline())
    (neck,) = _necks(_pipeline())
    assert neck.subject.label == "q2"
    assert neck.message.startswith("`geocode` is the bottleneck: its input `q2` (unbounded)")
    # ingest sets the pace of its own output only: not of the queues after geocode
    paced = [f for f in found if f.kind == "starved"]
    assert [f.subject.label for f in paced] == ["q1"]
    assert paced[0].message.startswith("`ingest` sets the pace of `q1`")
    assert "alike" not in paced[0].message


def test_a_queue_whose_consumer_mostly_waits_for_input_is_no_bottleneck() -> None:
    # messages waited long in it once, but its consumer waited for input most of the time:
    # bursts, not a stage slower than the rate
    assert _necks(_pipeline(geocode_starved_ns=1500 * MS)) == []
    # a queue whose messages pass quickly is no backlog, however busy its consumer
    assert _necks(_pipeline(geocode_p50_ns=2 * MS)) == []


def _etl(transform_scheduled_ns: int, transform_busy_ns: int = 60 * MS) -> Documents:
    """extract → `rows` (bounded[20], full: extract blocked 800 ms of its 3.9 s) → transform
    (four calls, 60 ms busy in all, their thread jobs' results handed back through the loop)
    → sink, whose writes block the loop."""
    extract, sink = _stage(1, "extract"), _stage(3, "sink")
    transform = dataclasses.replace(
        _stage(2, "transform"),
        call_count=4,
        busy_ns=transform_busy_ns,
        idle_ns=4 * 3900 * MS - transform_busy_ns,
        scheduled_ns=transform_scheduled_ns,
        scheduled_polls=760,
    )
    rows = dataclasses.replace(
        _queue(1, extract, transform, 2 * MS),
        channel_type="bounded[20]", max_queue_size=20, producers_blocked_ns=800 * MS,
    )  # fmt: skip
    return Documents(
        now_ns=3900 * MS, elapsed_ns=3900 * MS, futures=[extract, transform, sink], channels=[rows]
    )


def test_a_stage_that_mostly_waited_for_the_loop_is_no_bottleneck_of_its_own() -> None:
    """The reviewer's ETL, whose sink writes each record synchronously on the loop: the
    transform stage's input is full, but the stage did next to nothing itself and, most of its
    time, was woken and waiting for the loop the sink held. The loop-blocked finding names the
    cause; the bottleneck is info and says why. A stage that waited for its own I/O (its
    scheduled time small) stays the bottleneck, a warning."""
    (neck,) = _necks(_etl(transform_scheduled_ns=11_700 * MS))  # 75% of its calls' time
    assert (neck.severity, neck.subject.label) == ("info", "q1")
    assert neck.message.startswith("`transform` is the bottleneck: its input `q1`")
    assert neck.message.endswith(
        "but it waited for the loop 75% of its time (woken, its next poll not run yet) while "
        "other code held it: what holds up the loop holds it up"
    )
    assert neck.hint.startswith("unblock the loop")
    (neck,) = _necks(_etl(transform_scheduled_ns=150 * MS))  # 1%: slow by itself
    assert neck.severity == "warning" and "waited for the loop" not in neck.message
    # where no wake-up was measured (uvloop, trio) nothing is known of it: a warning
    docs = _etl(transform_scheduled_ns=0)
    unmeasured = dataclasses.replace(
        docs, futures=[dataclasses.replace(f, scheduled_polls=0) for f in docs.futures]
    )
    assert [n.severity for n in _necks(unmeasured)] == ["warning"]
    # four transform calls that compute (3.2 s of the 3.9 s) wait for each other, not for
    # other code: they are the slow stage
    (neck,) = _necks(_etl(transform_scheduled_ns=11_700 * MS, transform_busy_ns=3_200 * MS))
    assert neck.severity == "warning" and "waited for the loop" not in neck.message
    # the share is an option of ``warn``
    strict = lints.evaluate(_etl(11_700 * MS), Thresholds(loop_wait_share=0.8))
    assert [f.severity for f in strict if f.kind == "bottleneck"] == ["warning"]
