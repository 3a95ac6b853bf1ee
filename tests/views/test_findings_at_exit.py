"""Findings the collector evaluates over the run by itself: each planted program (one problem
each, in ``examples/stuck``) runs under a plain ``asyncflow run`` with nobody polling,
and its exit report names the problem, with when it first and last held."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from tests.support.commands import EXAMPLES, asyncflow_cmd

PLANTED = EXAMPLES / "stuck"


def _exit_warnings(tmp_path: Path, program: str) -> dict[str, dict[str, Any]]:
    """The exit report's warnings of ``asyncflow run examples/stuck/PROGRAM.py``, by kind."""
    report = tmp_path / "report.json"
    done = asyncflow_cmd(
        "run", "--port", "off", "--format", "json", "--output", str(report),
        str(PLANTED / f"{program}.py"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    document: dict[str, Any] = orjson.loads(report.read_bytes())
    return {w["kind"]: w for w in document["warnings"]}


def _held(warning: dict[str, Any]) -> None:
    """It held during the run: first and last seen are times of the run, in order."""
    assert 0 < warning["first_seen_ns"] <= warning["last_seen_ns"]


def test_a_task_leak_reaches_the_exit_report_after_the_sweep_cancelled_its_tasks(
    tmp_path: Path,
) -> None:
    warnings = _exit_warnings(tmp_path, "leak")
    leak = warnings["task-leak"]
    _held(leak)
    assert leak["subject"]["label"] == "watch_ack"
    # judged from the live series' peak: it still holds once the sweep cancelled them all
    assert leak["active"] and leak["evidence"]["live_now"] == 0
    assert leak["evidence"]["live_peak"] >= 50 and leak["evidence"]["finished"] == 0
    assert "none is alive now: they ended cancelled" in leak["message"]
    # the leaked tasks' cancellation at exit is the leak's consequence, not a storm of its own
    assert "cancellation-storm" not in warnings


def test_an_event_never_set_reaches_the_exit_report_after_its_waiters_were_cancelled(
    tmp_path: Path,
) -> None:
    warnings = _exit_warnings(tmp_path, "event_never_set")
    event = warnings["event-never-set"]
    _held(event)
    assert "event_never_set.py:25" in event["message"]
    # the workers waited their whole lives and were cancelled: a warning, at exit too
    assert event["severity"] == "warning" and event["active"]
    assert event["message"].startswith("20 calls of `worker` waited on event")
    assert "whole lives" in event["message"] and "nobody ever set it" in event["message"]


def test_a_dead_consumer_is_named_with_its_exception_and_is_no_bottleneck(
    tmp_path: Path,
) -> None:
    warnings = _exit_warnings(tmp_path, "dead_consumer")
    dead = warnings["dead-consumer"]
    _held(dead)
    assert dead["severity"] == "error"
    assert dead["message"].startswith("The only consumer of `dead_consumer.py:24`, `consume`")
    assert "it raised KeyError: 'price'" in dead["message"]
    assert "its producer `produce` was blocked" in dead["message"]
    # the consumer is dead, not slow; the messages left in the queue are the same cause's
    assert "bottleneck" not in warnings and "messages-lost" not in warnings


def test_a_dead_producer_is_named_with_its_exception_and_its_waiting_consumer(
    tmp_path: Path,
) -> None:
    warnings = _exit_warnings(tmp_path, "dead_producer")
    dead = warnings["dead-producer"]
    _held(dead)
    assert dead["severity"] == "error" and dead["evidence"]["sent"] == 60
    assert dead["message"].startswith("The only producer of `dead_producer.py:25`, `read_feed`")
    assert "it raised ValueError: invalid literal for int()" in dead["message"]
    assert "its consumer `relay` has waited" in dead["message"]
    assert "starved" not in warnings


def test_an_unbounded_queue_that_keeps_growing_is_named_with_its_depth_and_wait(
    tmp_path: Path,
) -> None:
    warnings = _exit_warnings(tmp_path, "unbounded")
    growth = warnings["unbounded-growth"]
    _held(growth)
    assert growth["severity"] == "warning"
    assert growth["subject"]["label"] == "unbounded.py:27"
    assert growth["evidence"]["depth"] >= 1000
    assert growth["evidence"]["max_delay_ns"] >= 100_000_000
    assert growth["evidence"]["send_rate"] > growth["evidence"]["receive_rate"]
    assert "`ingest` sends" in growth["message"] and "`index` takes" in growth["message"]
    assert "bound it" in growth["hint"]


def test_a_busy_wait_on_sleep_0_is_named_with_its_polls_per_call(tmp_path: Path) -> None:
    warnings = _exit_warnings(tmp_path, "busy_wait")
    spin = warnings["busy-wait"]
    _held(spin)
    assert spin["subject"]["label"] == "wait_until_ready"
    assert spin["evidence"]["polls_per_call"] >= 1000 and spin["evidence"]["calls"] == 3
    assert "asyncio.Event" in spin["hint"]
    # one cause, one finding: its busy time is the spin, not CPU work (on the pure-Python hot
    # path, where each poll costs more, cpu-bound named it too)
    assert "cpu-bound" not in warnings
    # its partner, warm_cache, is fine (a loaded machine may stretch a poll into a long one)
    assert {w["subject"]["label"] for w in warnings.values()} == {"wait_until_ready"}


def test_a_slow_tail_is_named_with_its_p99_against_its_median(tmp_path: Path) -> None:
    warnings = _exit_warnings(tmp_path, "slow_tail")
    tail = warnings["tail-latency"]
    assert tail["subject"]["label"] == "fetch_price" and tail["severity"] == "warning"
    assert tail["evidence"]["p99_ns"] >= 250_000_000 and tail["evidence"]["ratio"] >= 10
    assert "its p99 call takes" in tail["message"] and "times its median" in tail["message"]
    # each page's gather waited for it: the gathers say so (issue 27)
    assert "finished last in 6 of the 6 gathers it was part of" in tail["message"]
    assert (tail["evidence"]["gathers"], tail["evidence"]["gathers_last"]) == (6, 6)
    assert "render_page" not in {w["subject"]["label"] for w in warnings.values()}


def test_a_notify_all_for_every_job_is_a_wakeup_storm_not_cpu_work(tmp_path: Path) -> None:
    warnings = _exit_warnings(tmp_path, "wakeup_storm")
    storm = warnings["wakeup-storm"]
    _held(storm)
    assert storm["subject"]["label"] == "wakeup_storm.py:30"
    assert storm["evidence"]["signals"] == 500 and storm["evidence"]["per_signal"] >= 100
    assert "notify()" in storm["hint"]
    # the workers' polls are the storm's wake-ups: not CPU work to move to an executor
    assert "cpu-bound" not in warnings


def test_a_task_exception_never_retrieved_is_named_while_the_program_runs(
    tmp_path: Path,
) -> None:
    warnings = _exit_warnings(tmp_path, "never_retrieved")
    lost = warnings["never-retrieved"]
    _held(lost)
    assert lost["severity"] == "error" and lost["subject"]["label"] == "refresh"
    assert "raised ValueError: could not convert string to float: '12,5'" in lost["message"]
    assert lost["evidence"]["tasks"] == 1
    assert "TaskGroup" in lost["hint"] and "add_done_callback" in lost["hint"]
    # the three refreshers that run on, cancelled at exit, are not flagged
    assert {w["subject"]["label"] for w in warnings.values()} == {"refresh"}


def test_tasks_started_and_forgotten_are_named_when_the_collector_destroys_them(
    tmp_path: Path,
) -> None:
    """``dropped_task.py`` fires a task per order and keeps no reference; the tasks whose
    acknowledgement is lost wait on a future nothing else holds, and are collected mid-wait.
    asyncio logs each; asyncflow names the function, and nothing else: their durations, cut
    by the collector, are no slow tail."""
    warnings = _exit_warnings(tmp_path, "dropped_task")
    dropped = warnings["task-dropped"]
    _held(dropped)
    assert (dropped["severity"], dropped["subject"]["label"]) == ("error", "notify_warehouse")
    assert dropped["evidence"]["dropped"] >= 10, dropped
    assert "destroyed while pending" in dropped["message"]
    assert "keep a reference to each task" in dropped["hint"]
    assert set(warnings) == {"task-dropped"}, list(warnings)
