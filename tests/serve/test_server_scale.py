"""What documents cost as clients vary their requests: one build per window of a list, one
reading of the tasks for every document that shows them (issue 28)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

import asyncflow
from asyncflow.serve import server
from asyncflow.serve._protocol import MAX_PAGE, _Answer, _Pages, _Query, _window
from asyncflow.views import documents as views
from asyncflow.views import wait_views
from tests.support.http import get
from tests.support.parked import parked_loop


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Served on the profiler's thread (the fake clock is the cache's too); each build of
    /futures and each reading of the tasks noted."""
    monkeypatch.setattr(server, "PROCESS", False)
    monkeypatch.setattr(server, "LIMITS", server.Limits(cache_cost_share=0))
    built: list[str] = []
    futures, read = views.futures_document, getattr(wait_views, "read_tasks", None)

    def futures_document(*args: Any) -> Any:
        if len(args) == 4:  # the endpoint's (collector, now, offset, limit), not the findings'
            built.append("futures")
        return futures(*args)

    def read_tasks(*args: Any, **kwargs: Any) -> Any:
        built.append("tasks")
        assert read is not None
        return read(*args, **kwargs)

    monkeypatch.setattr(views, "futures_document", futures_document)
    monkeypatch.setattr(wait_views, "read_tasks", read_tasks, raising=False)
    return built


@contextlib.contextmanager
def running_program() -> Iterator[None]:
    """A program whose loop runs in its own thread, with 30 tasks waiting on an event."""
    with parked_loop(30, tracked=True, prefix="w"):
        yield


@pytest.fixture
def program() -> Iterator[None]:
    with running_program():
        yield


def test_pages_of_a_list_are_cut_from_one_build(fake_clock: Any, counted: list[str]) -> None:
    @asyncflow.future
    async def one() -> None:
        pass

    @asyncflow.future
    async def two() -> None:
        pass

    @asyncflow.future
    async def both() -> None:
        await asyncio.gather(one(), two())

    with asyncflow.profile("paged", format="none", port=0) as prof:
        asyncio.run(both())
        assert prof.url is not None
        _, everything, _ = get(prof.url, "/futures")
        ids = [f["id"] for f in everything["futures"]]
        assert len(ids) >= 3
        for offset, limit in [(1, 1), (0, 2), (2, 7), (len(ids), 5)]:
            _, page, _ = get(prof.url, f"/futures?offset={offset}&limit={limit}")
            assert [f["id"] for f in page["futures"]] == ids[offset : offset + limit]
            assert (page["total"], page["offset"], page["limit"]) == (len(ids), offset, limit)
        assert counted == ["futures"]  # whatever the page, within the cache's window
        fake_clock.advance(100_000_001)
        get(prof.url, "/futures?limit=3")
        assert counted == ["futures", "futures"]


def test_tasks_graph_and_snapshot_share_one_reading(
    fake_clock: Any, counted: list[str], program: None
) -> None:
    with asyncflow.profile("tasks", format="none", port=0) as prof:
        assert prof.url is not None
        _, first, _ = get(prof.url, "/tasks?limit=5")
        _, later, _ = get(prof.url, "/tasks?offset=5&limit=5")
        assert first["total"] == later["total"] and first["walked"] == later["walked"]
        _, whole, _ = get(prof.url, "/tasks")
        names = [t["name"] for t in first["tasks"] + later["tasks"]]
        assert names == [t["name"] for t in whole["tasks"]][:10]  # pages of one list
        assert {f"w{i:05}" for i in range(30)} <= {t["name"] for t in whole["tasks"]}
        assert get(prof.url, "/graph")[0] == 200
        assert get(prof.url, "/snapshot")[0] == 200
        assert counted.count("tasks") == 1
        fake_clock.advance(100_000_001)
        get(prof.url, "/tasks")
        assert counted.count("tasks") == 2


def test_a_window_holds_any_page_from_its_offset() -> None:
    query = _Query("/futures", None, (("limit", MAX_PAGE), ("offset", MAX_PAGE * 3 - 1)))
    window = _window(query)
    assert window is not None and _window(window) is None  # a window is built as it is
    assert window.offset == MAX_PAGE * 2 and window.offset + window.limit >= 4 * MAX_PAGE - 1
    assert _window(_Query("/flow")) is None
    assert _window(_Query("/futures/{id}/logs", 3, (("limit", 5),))) is None


def test_a_page_of_an_error_is_the_error() -> None:
    query = _Query("/futures", None, (("limit", 1), ("offset", 0)))
    window = _window(query)
    assert window is not None
    refused = _Answer(503, "application/json", b'{"error": {}}')
    assert _Pages().page(query, window, refused) is refused


def test_the_snapshot_holds_the_newest_of_each_log(
    fake_clock: Any, counted: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server, "SNAPSHOT_LOGS", 4, raising=False)
    with asyncflow.profile("logs", format="none", port=0) as prof, running_program():
        assert prof.url is not None
        _, snap, _ = get(prof.url, "/snapshot")
        (waiters,) = [f for f in snap["futures"]["futures"] if f["label"] == "waiter"]
        live = waiters["calls"]
        assert live["pending"] + live["running"] + live["suspended"] == 30
        (logs,) = [g for g in snap["future_logs"] if g["future_id"] == waiters["id"]]
        assert len(logs["calls"]) == 4  # of its 30 live calls


def test_the_snapshot_counts_a_loops_tasks_from_the_reading(
    fake_clock: Any, counted: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Listing 100,000 tasks again for /snapshot's loop section took 0.1-0.36 s: the reading
    # the snapshot's tasks come from has counted them already.
    listed: list[object] = []
    all_tasks = asyncio.all_tasks

    def counting(loop: Any = None) -> Any:
        listed.append(loop)
        return all_tasks(loop)

    with asyncflow.profile("count", format="none", port=0) as prof, running_program():
        assert prof.url is not None
        _, tasks, _ = get(prof.url, "/tasks?limit=1")
        monkeypatch.setattr(asyncio, "all_tasks", counting)
        _, snap, _ = get(prof.url, "/snapshot")
        monkeypatch.setattr(asyncio, "all_tasks", all_tasks)
        assert counted.count("tasks") == 1  # the snapshot used the reading /tasks made
        assert listed == []
        alive = [loop["tasks_alive"] for loop in snap["loop"]["loops"]]
        assert sum(alive) == tasks["total"] == snap["tasks"]["total"] >= 30


def test_the_snapshot_keeps_the_oldest_thousand_live_calls_of_a_future(
    fake_clock: Any, counted: list[str]
) -> None:
    # 10,000 entries a log took 0.2-0.3 s of /snapshot's second with 100,000 live tasks; the
    # future's own log pages them all.
    profiler = asyncflow.profile("cap", format="none", port=0)
    with profiler as prof, parked_loop(1_200, tracked=True, prefix="c"):
        assert prof.url is not None
        _, snap, _ = get(prof.url, "/snapshot")
        (waiters,) = [f for f in snap["futures"]["futures"] if f["label"] == "waiter"]
        (logs,) = [g for g in snap["future_logs"] if g["future_id"] == waiters["id"]]
        ids = [c["call_id"] for c in logs["calls"]]
        _, whole, _ = get(prof.url, f"/futures/{waiters['id']}/logs?limit=10000")
    assert (len(ids), len(whole["calls"])) == (1_000, 1_200)
    assert ids == [c["call_id"] for c in whole["calls"]][:1_000] == sorted(ids)
