"""Shared fixtures: asyncio with debug mode, a fake clock, and checks that no state leaks."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

import asyncflow
from asyncflow import clock
from asyncflow.instrumentation import _session


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return "asyncio", {"debug": True}


@pytest.fixture(autouse=True)
def _any_free_port(
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Profilers in tests (and the examples they run) serve on a free port, never a fixed one,
    register in a directory of their own (not among the user's running profilers), and time
    every message and item, so that figures are exact; the tests of sampling itself ask for it
    explicitly. Their endpoints serve HTTP on the profiler's thread
    (``ASYNCFLOW_ENDPOINT_PROCESS=0``), sparing each test the start of an endpoint process (a
    Python that imports aiohttp); tests/serve/test_server*.py serve from the process, as
    programs do."""
    monkeypatch.setenv("ASYNCFLOW_PORT", "0")
    monkeypatch.setenv("ASYNCFLOW_ENDPOINT_PROCESS", "0")
    monkeypatch.setenv("ASYNCFLOW_RUNTIME_DIR", str(tmp_path_factory.mktemp("runtime")))
    monkeypatch.setenv("ASYNCFLOW_SAMPLING", "1")
    monkeypatch.delenv("ASYNCFLOW_HOST", raising=False)
    monkeypatch.delenv("ASYNCFLOW_TOKEN", raising=False)


@pytest.fixture(autouse=True)
def _no_leaks() -> Iterator[None]:
    """Every test leaves no profiler running and no asyncflow task factory installed."""
    assert asyncflow.active_profiler() is None, "a previous test left a profiler running"
    yield
    still = asyncflow.active_profiler()
    if still is not None:
        still.stop()
        pytest.fail("the test left a profiler running")
    assert _session.active is None
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    factory = loop.get_task_factory()
    assert type(factory).__name__ != "_TaskFactory", "the test left instrument_tasks() installed"


@pytest.fixture
def fake_clock() -> Iterator[clock.FakeClock]:
    """Time that moves only with ``advance()``: durations in assertions are exact."""
    fake = clock.FakeClock()
    previous = clock.set_clock(fake)
    yield fake
    clock.set_clock(previous)


@pytest.fixture
def prof() -> Iterator[asyncflow.Profiler]:
    """A running profiler that writes no report."""
    with asyncflow.profile("test", format="none") as p:
        yield p
