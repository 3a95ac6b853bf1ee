"""``asyncflow top`` rendered headlessly by textual's own harness against a live profiler.

The tests that drive the app key by key take seconds each: they are marked slow."""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import anyio
import orjson
import pytest
from aiohttp import web
from textual.binding import Binding
from textual.pilot import Pilot
from textual.widgets import DataTable

import asyncflow
from asyncflow import schema
from asyncflow.render import top
from asyncflow.render.top import VIEWS, TopApp, compact_count, compact_duration, fit, help_text
from tests.support.workload import workload

SIZE = (160, 40)
#: the tests refresh explicitly (``until``); the timer never fires while they run
NEVER = 3600.0


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return "asyncio", {"debug": False}  # textual under asyncio's debug mode is 3x slower


async def until(pilot: Pilot[None], condition: Callable[[], Any], what: str) -> None:
    """Refresh until ``condition()`` holds (the endpoint answers from its own thread)."""
    app = pilot.app
    assert isinstance(app, TopApp)
    with anyio.fail_after(10):
        while True:
            await app.refresh_now()
            await pilot.pause()
            if condition():
                return
            await asyncio.sleep(0.01)  # not timing anything: lets the collector catch up


def row(app: TopApp, label: str) -> dict[str, str]:
    """The row labelled ``label``, by column name as shown."""
    names = [name.rstrip("▲▼") for name in app.header()]
    found = next(r for r in app.table_text() if named(r[0]) == label)
    return dict(zip(names, found, strict=True))


def named(shown: str) -> str:
    """A row's label without " (gone)": the workload's queue is freed when the cyclic GC runs
    (its hooks refer to it), so it may be listed as gone or not."""
    return shown.removesuffix(" (gone)")


def highlighted(app: TopApp) -> str | None:
    """The id of the row under the cursor."""
    table = app.query_one(DataTable)
    return table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value


def header_line(app: TopApp) -> str:
    """The table's header as it is on screen."""
    first = app.header()[0]
    return next(line for line in app.screen_text().splitlines() if line.startswith(f" {first}"))


def detail(app: TopApp) -> str:
    return str(app.query_one("#detail").render())


def shows(app: TopApp, start: str) -> Callable[[], bool]:
    """The logs pane begins with ``start`` (its first line names the row)."""
    return lambda: detail(app).startswith(start)


def refreshed(app: TopApp) -> Callable[[], bool]:
    """The app showed a new answer since this was called."""
    before = app.refreshes
    return lambda: app.refreshes > before


def status(app: TopApp) -> str:
    return str(app.query_one("#status").render())


@asyncflow.future(name="alpha")
async def alpha() -> None:
    await asyncio.sleep(0)


@asyncflow.future(name="beta")
async def beta() -> None:
    for _ in range(30):
        await asyncio.sleep(0)


@asyncflow.future(name="gamma")
async def gamma(never: asyncio.Event) -> None:
    await never.wait()


@contextmanager
def stuck() -> Iterator[asyncio.Task[None]]:
    """A call of ``gamma`` waiting on an event nobody sets, as a stuck program has."""
    never = asyncflow.instrument_lock(asyncio.Event(), name="never")
    task = asyncio.create_task(gamma(never))
    try:
        yield task
    finally:
        never.set()


async def futures_of_every_kind() -> None:
    for _ in range(3):
        await alpha()
        with asyncflow.measure_block("measured block"):
            pass
        asyncflow.counter("top.requests").add()
    await beta()
    await workload()
    executors = asyncflow.instrument_executors()
    try:
        assert await asyncio.to_thread(sum, [1, 2]) == 3
    finally:
        executors.undo()


# -- the views -----------------------------------------------------------------------------------


@pytest.mark.slow
async def test_top_shows_futures_channels_streams_and_loops() -> None:
    with asyncflow.profile("topped", format="none", port=0) as prof:
        await workload()
        assert prof.url is not None
        app = TopApp(prof.url, interval=NEVER)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: len(app.table_text()) >= 2, "futures")
            assert {"produce", "consume"} <= {r[0] for r in app.table_text()}
            produce = row(app, "produce")
            assert produce["calls"] == produce["done"] == "1" and produce["live"] == "0"
            assert produce["where"].startswith("workload.py:")  # where width allows
            assert "futures by busyΣ ▼" in status(app)

            await pilot.press("c")
            await until(pilot, lambda: any(named(r[0]) == "work" for r in app.table_text()), "work")
            work = row(app, "work")
            assert work["sent"] == work["recv"] == "20" and work["depth"] == "0/2"

            await pilot.press("s")
            await until(pilot, lambda: any(r[0] == "numbers" for r in app.table_text()), "stream")
            assert row(app, "numbers")["items"] == "5"
            await pilot.press("l")
            await until(pilot, lambda: app.table_text() and app.view == "loops", "loops")
            assert "episodes" in detail(app) or "blocked" in detail(app)

            await pilot.press("1")  # the views by number too
            assert app.view == "futures"
            await pilot.press("p")
            assert app.paused and "PAUSED" in status(app)
            await pilot.press("q")
        assert not app.is_running


@pytest.mark.slow
async def test_the_logs_follow_the_selected_future_across_sorts_and_refreshes() -> None:
    with asyncflow.profile("follow", format="none", port=0) as prof, stuck():
        await futures_of_every_kind()
        assert prof.url is not None
        app = TopApp(prof.url, interval=NEVER)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: len(app.table_text()) >= 5, "five futures")
            table = app.query_one(DataTable)
            for index in (0, 3):
                table.move_cursor(row=index)
                await pilot.press("enter")
                chosen = highlighted(app)
                label = app.table_text()[index][0]
                await until(pilot, shows(app, f"{label}: "), "its logs")
                for key in (">", "r", "<", "o"):  # sorts that move it
                    await pilot.press(key)
                    assert highlighted(app) == chosen == app.selected
                    await until(pilot, refreshed(app), "a refresh")
                    assert highlighted(app) == chosen == app.selected
                    assert detail(app).startswith(f"{label}: ")
                # Moving the cursor with the logs open moves the logs with it.
                await pilot.press("down" if index == 0 else "up")
                moved = highlighted(app)
                assert moved != chosen and app.selected == moved
                other = app.table_text()[table.cursor_row][0]
                await until(pilot, shows(app, f"{other}: "), "new logs")
                await pilot.press("escape")
                assert app.selected is None and detail(app) == ""


@pytest.mark.slow
async def test_at_80_columns_the_columns_people_need_most_fit() -> None:
    needed = {
        "futures": {"future", "live", "oldest", "p95", "max", "busyΣ", "calls"},
        "channels": {"channel", "depth", "blockedΣ", "starvedΣ", "sent", "recv", "p95"},
        "streams": {"stream", "items", "max", "p50"},
        "loops": {"loop", "state", "lag", "max", "blocks", "p99"},
        "tasks": {"future", "age", "waits"},
        "graph": {"task", "cycle", "waits", "releaser"},
        "executors": {"executor", "workers", "queued", "running", "q-p95"},
        "warnings": {"warning", "sev", "kind"},
        "resources": {"resource", "kind", "waiting", "waitΣ", "holdΣ"},
        "threads": {"thread", "state", "cpu%", "avg%"},
        "functions": {"function", "calls", "totalΣ", "p95"},
        "user metrics": {"metric", "kind", "value", "updates"},
    }
    with asyncflow.profile("narrow", format="none", port=0) as prof, stuck():
        await futures_of_every_kind()
        assert prof.url is not None
        app = TopApp(prof.url, interval=NEVER)
        async with app.run_test(size=(80, 24)) as pilot:
            for view in VIEWS:
                await pilot.press(view.key)
                await until(pilot, lambda: app.table_text(), f"the {view.name} rows")
                line = header_line(app)
                on_screen = [word.rstrip("▲▼") for word in line.split()]
                assert needed[view.name] <= set(on_screen), line
                # Nothing cut at the right edge: every column's full name is on screen.
                assert on_screen == [name.rstrip("▲▼") for name in app.header()]
                assert all(len(text) <= 80 for text in app.screen_text().splitlines())
            await pilot.press("f")
            await until(pilot, lambda: app.table_text(), "futures")
            cell = row(app, "beta")["max"]
            assert cell.endswith(("ns", "µs", "ms")) and len(cell) <= 6 and " " not in cell


def test_narrower_terminals_drop_the_least_useful_columns_first() -> None:
    futures = next(v for v in VIEWS if v.name == "futures")
    cells = [tuple("1.23ms" for _ in futures.columns)]
    kept_at: dict[int, list[str]] = {}
    for width in (200, 120, 100, 80, 60, 40, 20):
        shown = fit(futures, cells, width, futures.sort)
        names = [futures.columns[i].name for i, _ in shown]
        kept_at[width] = names
        assert "future" in names
        assert sum(w + 2 for _, w in shown) + 1 <= width or len(names) == 1
        # Kept columns are always the most important ones: none dropped outranks one kept.
        kept = {futures.column(n).priority for n in names if n != "future"}
        dropped = {c.priority for c in futures.columns if c.name not in names}
        assert not kept or not dropped or max(kept) <= min(dropped)
    assert len(kept_at[200]) == len(futures.columns)
    assert len(kept_at[40]) < len(kept_at[80]) < len(kept_at[120])


def test_a_cut_location_keeps_its_line_number() -> None:
    assert top._clip("src/app/handlers.py:123", 12, left=True) == "…lers.py:123"
    assert top._clip("a_long_future_label", 8) == "a_long_…"
    assert top._clip("short", 8, left=True) == "short"


def test_durations_and_counts_are_compact() -> None:
    assert [
        compact_duration(ns)
        for ns in (
            None,
            850,
            12_345,
            1_234_567,
            999_960_000,
            4_560_000_000,
            420_000_000_000,
            1_669_000_000_000,
            3 * 3_600_000_000_000,
            90 * 3_600_000_000_000,
        )
    ] == ["-", "850ns", "12.3µs", "1.23ms", "1s", "4.56s", "420s", "27.8m", "3h", "3.75d"]
    assert [compact_count(n) for n in (7, 12_345, 123_456, 4_567_890)] == [
        "7",
        "12,345",
        "123k",
        "4.57M",
    ]
    assert all(len(compact_duration(10**e * 7)) <= 6 for e in range(18))


# -- sorting and help ------------------------------------------------------------------------------


def numbers(app: TopApp, column: str) -> list[int]:
    """The column's numbers, row by row as shown. Read from each row itself, not found again by
    its label: futures are process-wide, and a still-alive function of an earlier test may share
    a label with one of this test's (``work``), with other figures."""
    i = [name.rstrip("▲▼") for name in app.header()].index(column)
    return [int(r[i].replace(",", "")) for r in app.table_text()]


@pytest.mark.slow
async def test_sort_by_a_chosen_column_reverse_it_or_click_its_header() -> None:
    with asyncflow.profile("sorted", format="none", port=0) as prof:
        await futures_of_every_kind()
        assert prof.url is not None
        app = TopApp(prof.url, interval=NEVER)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: len(app.table_text()) >= 4, "futures")
            await pilot.press(">")  # busyΣ -> the column to its right
            assert "futures by polls ▼" in status(app) and "polls▼" in app.header()
            assert numbers(app, "polls") == sorted(numbers(app, "polls"), reverse=True)
            await pilot.press("r")
            assert "futures by polls ▲" in status(app) and "polls▲" in app.header()
            assert numbers(app, "polls") == sorted(numbers(app, "polls"))
            await pilot.press("<", "<")
            assert "by max ▼" in status(app)

            x = header_line(app).index(" future") + 2
            await pilot.click("#table", offset=(x, 0))  # text sorts A to Z
            labels = [r[0] for r in app.table_text()]
            assert "by future ▼" in status(app) and labels == sorted(labels)
            await pilot.click("#table", offset=(x, 0))  # again: reversed
            assert [r[0] for r in app.table_text()] == sorted(labels, reverse=True)
            await until(pilot, lambda: app.refreshes > 3, "refreshes")  # the order survives them
            assert [r[0] for r in app.table_text()] == sorted(labels, reverse=True)
            x = header_line(app).index(" calls") + 3
            await pilot.click("#table", offset=(x, 0))
            assert "by calls ▼" in status(app)
            assert numbers(app, "calls") == sorted(numbers(app, "calls"), reverse=True)


@pytest.mark.slow
async def test_the_help_screen_says_what_each_column_means() -> None:
    text = help_text("channels")
    assert text.index("channels (c)") < text.index("keys") < text.index("futures (f)")
    for view in VIEWS:
        for column in view.columns:
            assert any(
                line.split()[:1] == [column.name] and len(line.split()) > 2
                for line in text.splitlines()
            ), (view.name, column.name)
    assert "summed over all calls" in text and "Σ marks a sum" in text
    with asyncflow.profile("helped", format="none", port=0) as prof:
        assert prof.url is not None
        app = TopApp(prof.url, interval=NEVER)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.press("question_mark")
            await pilot.pause()
            shown = app.screen_text()
            assert "futures (f)" in shown and "summed over all calls" in shown
            assert type(app.screen).__name__ == "HelpScreen"
            await pilot.press("escape")
            assert type(app.screen).__name__ != "HelpScreen"


def test_every_view_is_one_entry_of_the_table() -> None:
    keys = [v.key for v in VIEWS]
    app_keys = {"greater_than_sign", "o", "less_than_sign", "r", "question_mark", "p", "q"}
    assert len(set(keys)) == len(keys) and not set(keys) & app_keys
    for view in VIEWS:
        names = [c.name for c in view.columns]
        assert len(set(names)) == len(names)
        assert [c.flex for c in view.columns].count(True) == 1 and view.columns[0].flex
        assert view.column(view.sort).sortable
        assert all(c.help for c in view.columns)
        assert view.logs is None or view.row_lines is None  # logs of one kind only
    bound = {b.key for b in TopApp.BINDINGS if isinstance(b, Binding)}
    assert set(keys) <= bound


def test_a_rows_name_says_when_it_sums_gone_objects_or_is_gone() -> None:
    """The documents' own fields decide: ``folded_count`` (``folded`` for resources) and
    ``alive`` (``state: gone`` for executors and resources)."""
    views = {v.name: v for v in VIEWS}
    rows = {
        "futures": (fake_future(label="parse", alive=False), schema.FutureEntry, "parse (gone)"),
        "channels": (fake_channel(label="jobs", folded_count=7), schema.ChannelEntry,
                     "jobs (7 gone, summed)"),
        "resources": ({"label": "db", "state": "gone", "folded": 0}, None, "db (gone)"),
        "executors": ({"label": "img", "state": "gone", "folded_count": 1200}, None,
                      "img (1,200 gone, summed)"),
    }  # fmt: skip
    for name, (fields, cls, shown) in rows.items():
        entry = schema.load(cls, fields) if cls is not None else SimpleNamespace(**fields)
        assert views[name].columns[0].cell(top.Row(entry)) == shown, name


# -- what the logs and the columns say ---------------------------------------------------------


@pytest.mark.slow
async def test_channel_logs_name_the_futures_and_keep_sends_and_receives_apart() -> None:
    with asyncflow.profile("named", format="none", port=0) as prof:
        await workload()
        assert prof.url is not None
        app = TopApp(prof.url, interval=NEVER)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("c")
            await until(pilot, lambda: any(named(r[0]) == "work" for r in app.table_text()), "work")
            index = [named(r[0]) for r in app.table_text()].index("work")
            app.query_one(DataTable).move_cursor(row=index)
            await pilot.press("enter")
            await until(pilot, lambda: "received" in detail(app), "the channel's logs")
            lines = detail(app).splitlines()[1:]
            assert len(lines) == 20
            for line in lines:
                assert ("sent" in line) != ("received" in line), line
                assert line.count("call") == 1, line
            sent = [line for line in lines if " sent " in line]
            received = [line for line in lines if " received " in line]
            assert sent and received
            assert all("by produce (call " in line for line in sent)
            assert all("by consume (call " in line and " after " in line for line in received)


@pytest.mark.slow
async def test_a_call_waiting_forever_shows_as_live_with_its_age() -> None:
    with asyncflow.profile("stuck", format="none", port=0) as prof, stuck():
        await futures_of_every_kind()
        assert prof.url is not None
        app = TopApp(prof.url, interval=NEVER)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: any(r[0] == "gamma" for r in app.table_text()), "gamma")
            waiting, done = row(app, "gamma"), row(app, "alpha")
            # the warnings that hold are counted on the status line, whatever the view (the
            # event gamma waits on is one; earlier tests' primitives may add others)
            assert re.search(r"⚠ \d+ warnings? \((info|warning|error); w shows them\)", status(app))
            assert waiting["live"] == "1" and waiting["susp"] == "1"
            assert waiting["oldest"] not in ("-", "?") and waiting["oldest"][-1] in "smh"
            assert done["live"] == "0" and done["oldest"] == "-"
            # Sums say they are sums; the per-call mean sits beside them.
            assert {"busyΣ", "idleΣ", "idle/call"} <= {h.rstrip("▲▼") for h in app.header()}
            await pilot.press("greater_than_sign")
            while app.sort["futures"] != "oldest":
                await pilot.press("less_than_sign")
            assert app.table_text()[0][0] == "gamma"
            index = [r[0] for r in app.table_text()].index("gamma")
            app.query_one(DataTable).move_cursor(row=index)
            await pilot.press("enter")
            await until(pilot, lambda: "suspended" in detail(app), "gamma's live call")
            call = next(line.split() for line in detail(app).splitlines() if "suspended" in line)
            assert call[2][-1] in "smh" and call[3] == "1"  # its age, its one poll

            # The tasks view says what the stuck call waits on, and where.
            await pilot.press("t")
            await until(pilot, lambda: any(r[0] == "gamma" for r in app.table_text()), "its task")
            waiting = row(app, "gamma")
            assert "event" in waiting["waits"] and waiting["state"] == "waiting"
            assert waiting["age"][-1] in "smh"
            assert waiting["where"].startswith("test_top.py:")
            assert "1 task of gamma waits at test_top.py:" in detail(app)
            index = [r[0] for r in app.table_text()].index("gamma")
            app.query_one(DataTable).move_cursor(row=index)
            await pilot.press("enter")
            await until(pilot, shows(app, f"{waiting['task']}: its await chain"), "the chain")
            assert "test_top.py" in detail(app) and "waits on:" in detail(app)

            # The warnings view names the event nobody sets; enter shows it whole.
            await pilot.press("w")
            await until(pilot, lambda: app.table_text(), "the warnings")
            assert row(app, "1 task waits on event `never`, which nobody has set yet")["sev"] == (
                "INFO"
            )
            # and the resources view lists the event, one task waiting on it
            await pilot.press("k")
            await until(pilot, lambda: app.table_text(), "the resources")
            assert row(app, "never")["waiting"] == "1"


# -- the endpoint away or refusing -------------------------------------------------------------


def fake_status() -> schema.ProfilerStatus:
    return schema.ProfilerStatus(
        schema.SCHEMA, "fake", "0", 7, "3", 2_000_000_000, True, 0, 0, 0, None, 1, 0, 0, 0
    )


def fake_channel(**fields: Any) -> dict[str, Any]:
    """One entry of ``/channels`` as JSON, with ``fields`` changed."""
    entry = schema.ChannelEntry(
        2, "jobs", "asyncio.Queue", "unbounded", "active", 0, 0, 0, 0, 0, 0.0, 0.0, {}, 0, 0, 0,
        [], [],
    )  # fmt: skip
    return {**orjson.loads(schema.dumps(entry)), **fields}


def fake_future(**fields: Any) -> dict[str, Any]:
    """One entry of ``/futures`` as JSON, with ``fields`` changed."""
    entry = schema.FutureEntry(
        1, "fetch", "app:fetch", schema.Location("app.py", 3), "decorator", 2,
        schema.CallStates(0, 0, 0, 2, 0), schema.Outcomes(2, 0, 0, 0, 0), 4, 1_000, 0,
        500, {"p95": 500}, {"p95": 900},
    )  # fmt: skip
    return {**orjson.loads(schema.dumps(entry)), **fields}


def test_the_futures_view_shows_the_scheduled_delay_and_a_dash_where_none_was_measured() -> None:
    """A high scheduled p99 is a loop too busy to run a woken call promptly; under uvloop (no
    wake-up measured) the column says ``-``, not a 0 that reads as "never kept waiting"."""
    futures = next(v for v in VIEWS if v.name == "futures")
    sched = next(c for c in futures.columns if c.name == "sch-p99")
    woken = schema.load(
        schema.FutureEntry,
        fake_future(scheduled_polls=3, scheduled_delay_ns={"p99": 4_000_000}),
    )
    unmeasured = schema.load(schema.FutureEntry, fake_future())
    assert sched.cell(top.Row(woken)) == compact_duration(4_000_000)
    assert sched.cell(top.Row(unmeasured)) == "-"
    assert sched.key(top.Row(unmeasured)) < sched.key(top.Row(woken))


def test_a_futures_call_log_shows_each_calls_scheduled_time_or_a_dash() -> None:
    """Beside each call's busy and idle time, its scheduled time; ``-`` for every call of a
    future whose wake-ups were not measured (uvloop), not a 0."""
    call = schema.CallEntry(
        7, 1, "done", 2, 1_000, 600, 400, 1_000, 5_000_000, 0, 10, 6_000_000, None, "Task-3",
        "returned", None, None, scheduled_ns=3_000_000,
    )  # fmt: skip
    logs = schema.FutureLogs(1, 1, "fetch", [call])
    measured = schema.load(schema.FutureEntry, fake_future(scheduled_polls=2))
    unmeasured = schema.load(schema.FutureEntry, fake_future())
    lines = top._call_lines(logs, top.Context(row=measured))
    assert lines[1].split()[4:7] == ["busy", "idle", "sched"]
    assert lines[2].split()[4:7] == [compact_duration(1_000), compact_duration(5_000_000),
                                     compact_duration(3_000_000)]  # fmt: skip
    assert top._call_lines(logs, top.Context(row=unmeasured))[2].split()[6] == "-"


@asynccontextmanager
async def fake_endpoint(
    answer: Callable[[web.Request], Awaitable[web.Response]],
) -> AsyncIterator[str]:
    """An endpoint on 127.0.0.1 whose every route ``answer`` answers; yields its URL."""
    server = web.Application()
    server.router.add_get("/{route:.*}", answer)
    runner = web.AppRunner(server)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@pytest.mark.slow
async def test_a_document_top_cannot_read_is_said_on_the_status_line() -> None:
    """top parses every document with the schema: one that does not parse is named, with the
    field, in the status line (one line, no traceback), and top keeps asking."""
    answers: dict[str, tuple[int, Any]] = {
        "/profiler_status": (200, orjson.loads(schema.dumps(fake_status()))),
        "/warnings": (200, {"schema": schema.SCHEMA, "evaluated_ns": 0, "warnings": []}),
        "/futures": (200, {}),
    }

    async def answer(request: web.Request) -> web.Response:
        status, body = answers[request.path]
        return web.json_response(body, status=status)

    async with fake_endpoint(answer) as url:
        app = TopApp(url, interval=NEVER)
        async with app.run_test(size=SIZE) as pilot:
            page = {"schema": schema.SCHEMA, "total": 1, "offset": 0, "limit": 100}
            for entry, said in (
                (
                    fake_future(busy_ns="a lot"),
                    "FuturesDocument.futures[0].busy_ns: expected int, got str",
                ),
                (
                    {k: v for k, v in fake_future().items() if k != "label"},
                    "FuturesDocument.futures[0]: missing field 'label'",
                ),
                (
                    fake_future(location={"file": "app.py", "line": "3\n"}),
                    "FuturesDocument.futures[0].location.line: expected int, got str",
                ),
            ):
                answers["/futures"] = (200, {**page, "futures": [entry]})
                await app.refresh_now()
                await pilot.pause()
                assert status(app).startswith(
                    f"GET /futures answered a document top cannot read: {said} · "
                ), status(app)
                assert "\n" not in status(app) and app.is_running and app.table_text() == []
            # a field top does not know (a newer asyncflow's) is left out: a new field is
            # compatible
            newer = fake_future(cpu_seconds=1.5, location={"file": "a.py", "line": 3, "col": 2})
            answers["/futures"] = (200, {**page, "futures": [newer], "next": None})
            await app.refresh_now()
            await pilot.pause()
            assert "fake · pid 7" in status(app) and app.table_text()[0][0] == "fetch"
            # an error whose body is not the endpoint's error document
            answers["/warnings"] = (503, ["down"])
            await app.refresh_now()
            await pilot.pause()
            assert status(app).startswith("503: Service Unavailable · "), status(app)
            # the endpoint mends: top shows it at the next refresh
            answers["/warnings"] = (
                200,
                {"schema": schema.SCHEMA, "evaluated_ns": 0, "warnings": []},
            )
            answers["/futures"] = (200, {**page, "futures": [fake_future()]})
            await app.refresh_now()
            await pilot.pause()
            assert "fake · pid 7" in status(app) and app.table_text()[0][0] == "fetch"


@pytest.mark.slow
async def test_top_says_what_is_wrong_and_keeps_retrying() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = TopApp(f"http://127.0.0.1:{port}", interval=0.05)
    async with app.run_test(size=SIZE) as pilot:
        with anyio.fail_after(10):
            while "retrying" not in status(app):
                await pilot.pause(0.02)  # the timer's own refreshes
        assert f"127.0.0.1:{port}" in status(app)
        assert status(app).startswith("the profiler does not answer")  # words first, not aiohttp's
        assert app.is_running

    with asyncflow.profile("guarded", format="none", port=0, token="right") as prof:
        assert prof.url is not None
        app = TopApp(prof.url, token="wrong", interval=NEVER)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: "refused the token" in status(app), "401")
        app = TopApp(prof.url, token="right", interval=NEVER)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: "guarded" in status(app), "ok")
        await asyncio.sleep(0)


def test_a_warnings_evidence_reads_in_units() -> None:
    evidence = {
        "producers_blocked_ns": 28_005_701_306,
        "consumers_starved_ns": 1_344_012,
        "producers": 4,
        "share": 0.97,
        "stage": "store",
    }
    assert top._evidence(evidence) == (
        "producers blocked 28s, consumers starved 1.34ms, producers 4, share 0.97, stage store"
    )


@pytest.mark.slow
async def test_at_80_columns_the_footer_shows_help_and_quit_whole() -> None:
    """The footer is not cut: every key it shows is whole, '? Help' and 'q Quit' last; the
    views it leaves out are on the help screen, as every key is."""
    app = TopApp("http://127.0.0.1:9", interval=NEVER)  # the footer needs no endpoint
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        footer = app.screen_text().splitlines()[-1]
    assert len(footer) <= 80 and footer.endswith("? Help q Quit"), footer
    shown = [b for b in app.BINDINGS if isinstance(b, Binding) and b.show]
    assert (
        footer.split()
        == " ".join(f"{b.key_display or b.key} {b.description}" for b in shown).split()
    )
    assert [v.key for v in VIEWS[:4]] == [b.key for b in shown[:4]]  # the first views at least
    keys = help_text(width=80)
    assert all(f"{v.name} ({v.key})" in keys for v in VIEWS)


def test_counts_of_one_are_said_in_the_singular() -> None:
    status = replace(fake_status(), futures=1, calls_live=1, channels=1, streams=1)
    line = top._status_line(replace(status, internal_errors=1))
    assert line.endswith("1 future · 1 live call · 1 channel · 1 stream · 1 internal error"), line
    many = replace(status, futures=2, calls_live=0, channels=3, streams=0)
    assert "2 futures · 0 live calls · 3 channels · 0 streams" in top._status_line(many)
    group = schema.JobGroup("f", None, 1, 0, 0, 0, 0, 0)
    executor = SimpleNamespace(label="pool", functions=[group], futures=[])
    jobs = top._job_lines(executor, top.Context())  # type: ignore[arg-type]
    assert jobs[1].split()[:3] == ["1", "job", "f"], jobs
    waits = schema.ResourceFutureEntry(None, "g", 1, 0, 0, 1, 0, 0, 0)
    resource = SimpleNamespace(label="l", kind="lock", holders=[], futures=[waits])
    said = top._resource_lines(resource, top.Context())[1].split()  # type: ignore[arg-type]
    assert "wait" in said and "hold" in said and "waits" not in said, said
