"""Findings the collector evaluates over the run by itself: each planted program (one problem
each, under ``tests/views/planted``) runs under a plain ``asyncflow run`` with nobody polling,
and its exit report names the problem, with when it first and last held."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from tests.support.commands import asyncflow_cmd

PLANTED = Path(__file__).parent / "planted"


def _exit_warnings(tmp_path: Path, program: str) -> dict[str, dict[str, Any]]:
    """The exit report's warnings of ``asyncflow run planted/PROGRAM.py``, by kind."""
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


def test_an_event_never_set_reaches_the_exit_report_after_its_waiters_were_cancelled(
    tmp_path: Path,
) -> None:
    warnings = _exit_warnings(tmp_path, "event_never_set")
    event = warnings["event-never-set"]
    _held(event)
    assert "event_never_set.py:25" in event["message"]
