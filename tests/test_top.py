"""``asyncflow top`` rendered headlessly by textual's own harness against a live profiler."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest
from textual.widgets import DataTable

import asyncflow
from asyncflow.top import TopApp
from tests.test_server import workload

SIZE = (160, 40)


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return "asyncio", {"debug": False}  # textual under asyncio's debug mode is 3x slower


async def until(pilot: Any, condition: Any, what: str) -> None:
    """Let the app refresh until ``condition()`` holds (the endpoint answers from its thread)."""
    for _ in range(200):
        await pilot.pause(0.02)
        if condition():
            return
    pytest.fail(f"top never showed {what}")


async def test_top_shows_futures_channels_streams_and_loops() -> None:
    with asyncflow.profile("topped", format="none", port=0) as prof:
        await workload()
        assert prof.url is not None
        app = TopApp(prof.url, interval=0.05)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.table_text(), "futures")
            labels = [row[0] for row in app.table_text()]
            assert {"produce", "consume"} <= set(labels)
            produce = next(row for row in app.table_text() if row[0] == "produce")
            assert produce[1] == "1" and produce[5] == "1"  # one call, ready

            await pilot.press("o")  # sort by calls
            calls = [int(row[1].replace(",", "")) for row in app.table_text()]
            assert calls == sorted(calls, reverse=True)
            assert "futures by calls" in str(app.query_one("#status").render())

            await pilot.press("c")
            await until(pilot, lambda: any(r[0] == "work" for r in app.table_text()), "work")
            work = next(row for row in app.table_text() if row[0] == "work")
            assert work[1] == "bounded[2]" and work[3] == work[4] == "20"

            # Select the channel: its logs appear below the table.
            await pilot.press("p")  # paused: rows stay where they are while we pick one
            row = [r[0] for r in app.table_text()].index("work")
            app.query_one(DataTable).move_cursor(row=row)
            await pilot.press("enter", "p")
            detail = app.query_one("#detail")
            await until(pilot, lambda: "received msg" in str(detail.render()), "channel logs")
            await pilot.press("escape")
            assert "received msg" not in str(detail.render())

            await pilot.press("s")
            await until(pilot, lambda: any(r[0] == "numbers" for r in app.table_text()), "stream")
            await pilot.press("l")
            await until(pilot, lambda: "loop" in "".join(r[0] for r in app.table_text()), "loops")
            detail_text = str(app.query_one("#detail").render())
            assert "episodes" in detail_text or "blocked" in detail_text

            await pilot.press("p")
            assert app.paused and "PAUSED" in str(app.query_one("#status").render())
            await pilot.press("q")
        assert not app.is_running


@asyncflow.future(name="alpha")
async def alpha() -> None:
    await asyncio.sleep(0)


@asyncflow.future(name="beta")
async def beta() -> None:
    for _ in range(30):
        await asyncio.sleep(0)


def highlighted(app: TopApp) -> str | None:
    """The id of the row under the cursor."""
    table = app.query_one(DataTable)
    return table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value


async def test_the_logs_follow_the_selected_future_across_sorts() -> None:
    with asyncflow.profile("follow", format="none", port=0) as prof:
        for _ in range(3):
            await alpha()
        await beta()
        await workload()
        assert prof.url is not None
        app = TopApp(prof.url, interval=0.05)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: len(app.table_text()) >= 4, "four futures")
            await pilot.press("p")  # paused: the rows move only when sorted
            table = app.query_one(DataTable)
            for row in (0, 3):
                table.move_cursor(row=row)
                await pilot.press("enter")
                chosen = highlighted(app)
                assert str(app.selected) == chosen
                for _ in range(5):  # through every sort order
                    await pilot.press("o")
                    assert highlighted(app) == chosen == str(app.selected)
                await pilot.press("escape")


async def test_top_says_what_is_wrong_and_keeps_retrying() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = TopApp(f"http://127.0.0.1:{port}", interval=0.05)
    async with app.run_test(size=SIZE) as pilot:
        status = app.query_one("#status")
        await until(pilot, lambda: "retrying" in str(status.render()), "the error")
        assert f"127.0.0.1:{port}" in str(status.render())
        assert app.is_running

    with asyncflow.profile("guarded", format="none", port=0, token="right") as prof:
        assert prof.url is not None
        app = TopApp(prof.url, token="wrong", interval=0.05)
        async with app.run_test(size=SIZE) as pilot:
            status = app.query_one("#status")
            await until(pilot, lambda: "refused the token" in str(status.render()), "401")
        app = TopApp(prof.url, token="right", interval=0.05)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: "guarded" in str(app.query_one("#status").render()), "ok")
        await asyncio.sleep(0)
