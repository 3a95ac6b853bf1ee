"""``asyncflow top``: a live terminal view of a running profiler's endpoint, built on textual.

It reads the same JSON documents as any other client, about twice a second. An unreachable
endpoint or a refused token is shown in the status line and retried; it never ends the view.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import aiohttp
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.css.query import NoMatches
from textual.widgets import DataTable, Footer, Static

from asyncflow.report import format_duration as dur

__all__ = ["VIEWS", "TopApp"]

Row = dict[str, Any]


@dataclass(frozen=True)
class View:
    """One of top's tables: which document it lists and how."""

    name: str
    route: str  # the list route
    key: str  # the list's field in that document
    columns: tuple[str, ...]
    cells: Callable[[Row], tuple[str, ...]]
    sorts: tuple[tuple[str, Callable[[Row], Any]], ...]
    logs: str | None  # "/futures/{id}/logs"...


def _pct(values: dict[str, int], key: str) -> str:
    return dur(values.get(key))


def _future_cells(f: Row) -> tuple[str, ...]:
    calls = f["calls"]
    return (
        f["label"],
        f"{f['call_count']:,}",
        str(calls["pending"]),
        str(calls["running"]),
        str(calls["suspended"]),
        str(calls["ready"]),
        str(calls["cancelled"]),
        f"{f['total_polls']:,}",
        dur(f["busy_ns"]),
        dur(f["idle_ns"]),
        _pct(f["poll_duration_ns"], "p95"),
        dur(f["max_poll_duration_ns"]),
    )


def _channel_cells(c: Row) -> tuple[str, ...]:
    return (
        c["label"],
        c["channel_type"],
        f"{c['queue_size']}/{c['max_queue_size']}",
        f"{c['sent_count']:,}",
        f"{c['received_count']:,}",
        _pct(c["delay_ns"], "p50"),
        _pct(c["delay_ns"], "p95"),
        dur(c["producers_blocked_ns"]),
        dur(c["consumers_starved_ns"]),
    )


def _stream_cells(s: Row) -> tuple[str, ...]:
    return (
        s["label"],
        s["state"],
        f"{s['items_yielded']:,}",
        _pct(s["wait_ns"], "p50"),
        dur(s["max_wait_ns"]),
        dur(s["total_wait_ns"]),
        dur(s["consumer_ns"]),
    )


def _loop_cells(loop: Row) -> tuple[str, ...]:
    running = loop["running"]
    return (
        f"loop {loop['id']}",
        loop["thread"],
        loop["state"] + (" BLOCKED" if loop["blocked"] else ""),
        dur(loop["lag_now_ns"]),
        _pct(loop["lag_ns"], "p50"),
        _pct(loop["lag_ns"], "p99"),
        dur(loop["max_lag_ns"]),
        f"{loop['tasks_alive']:,}",
        f"{running['label']} for {dur(running['elapsed_ns'])}" if running else "-",
        str(loop["blocked_count"]),
    )


VIEWS: dict[str, View] = {
    "futures": View(
        "futures",
        "/futures",
        "futures",
        (
            "future",
            "calls",
            "pend",
            "run",
            "susp",
            "ready",
            "cxl",
            "polls",
            "busy",
            "idle",
            "p95 poll",
            "max poll",
        ),
        _future_cells,
        (
            ("busy", lambda f: -f["busy_ns"]),
            ("calls", lambda f: -f["call_count"]),
            ("polls", lambda f: -f["total_polls"]),
            ("max poll", lambda f: -f["max_poll_duration_ns"]),
            ("name", lambda f: f["label"]),
        ),
        "/futures/{id}/logs",
    ),
    "channels": View(
        "channels",
        "/channels",
        "channels",
        (
            "channel",
            "type",
            "depth/max",
            "sent",
            "received",
            "p50 delay",
            "p95 delay",
            "producers blocked",
            "consumers starved",
        ),
        _channel_cells,
        (
            ("sent", lambda c: -c["sent_count"]),
            ("depth", lambda c: -c["queue_size"]),
            ("blocked", lambda c: -c["producers_blocked_ns"]),
            ("name", lambda c: c["label"]),
        ),
        "/channels/{id}/logs",
    ),
    "streams": View(
        "streams",
        "/streams",
        "streams",
        ("stream", "state", "items", "p50 wait", "max wait", "total wait", "consumer"),
        _stream_cells,
        (
            ("items", lambda s: -s["items_yielded"]),
            ("wait", lambda s: -s["total_wait_ns"]),
            ("name", lambda s: s["label"]),
        ),
        "/streams/{id}/logs",
    ),
    "loops": View(
        "loops",
        "/loop",
        "loops",
        (
            "loop",
            "thread",
            "state",
            "lag now",
            "lag p50",
            "lag p99",
            "max lag",
            "tasks",
            "running",
            "blocked",
        ),
        _loop_cells,
        (
            ("id", lambda loop: loop["id"]),
            ("lag", lambda loop: -loop["max_lag_ns"]),
        ),
        None,
    ),
}


def _log_lines(view: str, document: Row) -> list[str]:
    """The selected row's logs as text lines."""
    if view == "futures":
        return [
            f"call {c['call_id']:>7}  {c['state']:<9}  polls {c['poll_count']:>5}  "
            f"busy {dur(c['busy_ns']):>9}  idle {dur(c['idle_ns']):>9}  "
            f"{c['outcome'] or ''}{' ' + c['exception']['type'] if c['exception'] else ''}"
            f"{'  task ' + c['task'] if c['task'] else ''}"
            for c in document["calls"]
        ]
    if view == "channels":
        sent = [
            f"sent     msg {e['msg_id']}  at {dur(e['timestamp_ns'])}  by call {e['call_id']}"
            + (f"  {e['message']}" if e["message"] is not None else "")
            for e in document["sent_logs"]
        ]
        received = [
            f"received msg {e['msg_id']}  at {dur(e['timestamp_ns'])}  by call {e['call_id']}"
            f"  after {dur(e['delay_ns'])}"
            for e in document["received_logs"]
        ]
        return [line for pair in zip(sent, received, strict=False) for line in pair] + (
            sent[len(received) :] or received[len(sent) :]
        )
    return [
        f"item {e['index']:>7}  at {dur(e['timestamp_ns'])}  waited {dur(e['wait_ns'])}"
        + (f"  {e['item']}" if e["item"] is not None else "")
        for e in document["items"]
    ]


def _episode_lines(loops: list[Row]) -> list[str]:
    lines = []
    for loop in loops:
        for e in loop["episodes"][:5]:
            who = e["call"]["label"] if e["call"] else (e["task"] or "untracked code")
            top = e["stack"][0] if e["stack"] else None
            where = f" at {top['file']}:{top['line']} ({top['function']})" if top else ""
            state = "blocking now" if e["ongoing"] else "blocked"
            lines.append(f"loop {loop['id']} {state} {dur(e['blocked_ns'])} by {who}{where}")
    return lines or ["no blocked-loop episodes"]


class TopApp(App[None]):
    """The live view. ``refresh_now()`` fetches once; a timer calls it every ``interval``."""

    TITLE = "asyncflow top"
    CSS = """
    #status { height: 1; background: $boost; }
    #table { height: 1fr; }
    #detail { height: auto; max-height: 40%; border-top: solid $accent; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("f", "show('futures')", "Futures"),
        Binding("c", "show('channels')", "Channels"),
        Binding("s", "show('streams')", "Streams"),
        Binding("l", "show('loops')", "Loops"),
        Binding("o", "sort", "Sort"),
        Binding("p", "pause", "Pause"),
        Binding("escape", "unselect", "Close logs"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(self, url: str, token: str | None = None, interval: float = 0.5) -> None:
        super().__init__()
        self.url = url.rstrip("/")
        self.token = token
        self.interval = interval
        self.view = "futures"
        self.sort = dict.fromkeys(VIEWS, 0)
        self.paused = False
        self.selected: int | None = None  # id of the row whose logs are shown
        self.rows: list[Row] = []
        self.error: str | None = None
        self.name_line = ""
        self._session: aiohttp.ClientSession | None = None
        self._busy = False  # a refresh is in flight; a tick meanwhile is skipped

    def compose(self) -> ComposeResult:
        yield Static("connecting…", id="status")
        yield DataTable(id="table", cursor_type="row", zebra_stripes=True)
        yield Static("", id="detail")
        yield Footer()

    async def on_mount(self) -> None:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else None
        self._session = aiohttp.ClientSession(
            headers=headers, timeout=aiohttp.ClientTimeout(total=max(2.0, self.interval * 4))
        )
        self._set_columns()
        await self.refresh_now()
        self.set_interval(self.interval, self.refresh_now)

    async def on_unmount(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def _get(self, path: str) -> Row:
        assert self._session is not None
        async with self._session.get(self.url + path) as response:
            body = await response.json(content_type=None)
            if response.status != 200:
                message = body.get("error", {}).get("message", response.reason)
                if response.status == 401:
                    message = f"the endpoint refused the token: {message}"
                raise RuntimeError(f"{response.status}: {message}")
            result: Row = body
            return result

    async def refresh_now(self) -> None:
        """Fetch the current view's documents and redraw; errors go to the status line."""
        if self.paused or self._busy:
            return
        self._busy = True
        try:
            await self._fetch(VIEWS[self.view])
        except NoMatches:  # the app is closing under a refresh in flight
            pass
        finally:
            self._busy = False

    async def _fetch(self, view: View) -> None:
        selected = self.selected
        try:
            status = await self._get("/profiler_status")
            document = await self._get(view.route)
            detail: list[str] | None = None
            if self.view == "loops":
                detail = _episode_lines(document["loops"])
            elif selected is not None and view.logs is not None:
                logs = await self._get(view.logs.format(id=selected) + "?limit=20")
                detail = _log_lines(self.view, logs)
        except (aiohttp.ClientError, TimeoutError, RuntimeError, ValueError, KeyError) as exc:
            self.error = (
                f"{self.url}: {exc or type(exc).__name__}; retrying every {self.interval:g} s"
            )
            self._status()
            return
        if view.name != self.view or selected != self.selected:
            return  # the user switched views meanwhile: this answer is for another view
        self.error = None
        self.name_line = (
            f"{status['name']} · pid {status['pid']} · up {dur(status['uptime_ns'])} · "
            f"{status['futures']} futures · {status['calls_live']:,} live calls · "
            f"{status['channels']} channels · {status['streams']} streams"
            + (
                f" · {status['internal_errors']} internal errors"
                if status["internal_errors"]
                else ""
            )
        )
        self.rows = document[view.key]
        self._redraw()
        detail_widget = self.query_one("#detail", Static)
        detail_widget.update("\n".join(detail) if detail else "")
        self._status()

    def _status(self) -> None:
        view = VIEWS[self.view]
        sort = view.sorts[self.sort[self.view]][0]
        state = " · PAUSED" if self.paused else ""
        text = (
            f"[b red]{self.error}[/]"
            if self.error
            else f"{self.name_line} · {self.view} by {sort}{state}"
        )
        self.query_one("#status", Static).update(text)

    def _set_columns(self) -> None:
        table = self.query_one("#table", DataTable)
        table.clear(columns=True)
        table.add_columns(*VIEWS[self.view].columns)

    def _redraw(self) -> None:
        view = VIEWS[self.view]
        table = self.query_one("#table", DataTable)
        cursor = table.cursor_row
        # The cursor follows an entity, not a position: the selected one (its logs are shown),
        # else the one highlighted before the rows were sorted or refreshed.
        follow = str(self.selected) if self.selected is not None else self._highlighted(table)
        rows = sorted(self.rows, key=view.sorts[self.sort[self.view]][1])
        table.clear()
        for row in rows:
            table.add_row(*view.cells(row), key=str(row["id"]))
        if rows:
            ids = [str(row["id"]) for row in rows]
            target = ids.index(follow) if follow in ids else min(cursor, len(rows) - 1)
            table.move_cursor(row=target, animate=False)

    @staticmethod
    def _highlighted(table: DataTable[Any]) -> str | None:
        if not table.row_count:
            return None
        return table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value

    def table_text(self) -> list[tuple[str, ...]]:
        """The table's rows as shown (what the tests read)."""
        table = self.query_one("#table", DataTable)
        return [tuple(str(c) for c in table.get_row_at(i)) for i in range(table.row_count)]

    async def action_show(self, view: str) -> None:
        self.view = view
        self.selected = None
        self.rows = []
        self._set_columns()
        self.query_one("#detail", Static).update("")
        self.call_later(self.refresh_now)

    async def action_sort(self) -> None:
        self.sort[self.view] = (self.sort[self.view] + 1) % len(VIEWS[self.view].sorts)
        self._redraw()
        self._status()

    def action_pause(self) -> None:
        self.paused = not self.paused
        self._status()

    def action_unselect(self) -> None:
        self.selected = None
        self.query_one("#detail", Static).update("")

    async def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if VIEWS[self.view].logs is None or event.row_key.value is None:
            return
        self.selected = int(event.row_key.value)
        self.query_one("#detail", Static).update("loading logs…")
        self.call_later(self.refresh_now)
