"""``asyncflow replay``: ``top`` over a recording, with time controls.

:class:`RecordingSource` answers top's routes (``/futures``, ``/channels/{id}/logs``...) with
the documents of one moment of a recording; :class:`ReplayApp` is top reading from it instead
of an endpoint, with keys to play, pause, step and jump to the moments a finding begins.
"""

from __future__ import annotations

from typing import Any, ClassVar, TypeVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import Static

from asyncflow import schema
from asyncflow.render.record import Recording
from asyncflow.render.top import NotServed, TopApp

__all__ = ["RecordingSource", "ReplayApp"]

_D = TypeVar("_D")

#: a logs route's section, and the field its entries are found by
_LOGS = {
    "futures": ("future_logs", "future_id"),
    "channels": ("channel_logs", "channel_id"),
    "streams": ("stream_logs", "stream_id"),
    "resources": ("resource_logs", "resource_id"),
}
#: routes named otherwise than their section
_ROUTES = {"profiler_status": "status"}


class RecordingSource:
    """One moment of a recording (``index``), answered as the endpoint's routes would."""

    def __init__(self, recording: Recording, index: int = 0) -> None:
        self.recording = recording
        #: the moments a finding begins
        self.starts = recording.findings_start()
        self.index = 0
        self.seek(index)

    @property
    def last(self) -> int:
        return len(self.recording.frames) - 1

    @property
    def t(self) -> float:
        """The moment shown, in seconds since the start."""
        return self.recording.frames[self.index].t

    def seek(self, index: int) -> int:
        """Show frame ``index`` (clamped to the recording); returns the index shown."""
        self.index = min(max(0, index), self.last)
        return self.index

    def next_finding(self, step: int) -> int | None:
        """The next (``step`` 1) or previous (-1) moment a finding begins; None if none."""
        later = [i for i in self.starts if (i - self.index) * step > 0]
        if not later:
            return None
        return min(later) if step > 0 else max(later)

    def document(self, path: str) -> Any:
        """The decoded JSON ``GET path`` would answer at this moment.

        Raises:
            NotServed: the recording holds no such document at this moment (never recorded,
                or thinned by its budget), or the route is not one top reads.
        """
        sections = self.recording.frames[self.index].sections
        parts = path.partition("?")[0].strip("/").split("/")
        if len(parts) == 1:
            name = _ROUTES.get(parts[0], parts[0])
            if name == "warnings":
                warnings = sections.get("warnings") or []
                t_ns = round(self.t * 1e9)
                return {"schema": schema.SCHEMA, "evaluated_ns": t_ns, "warnings": warnings}
            found = sections.get(name)
        elif len(parts) == 3 and parts[0] in _LOGS and parts[2] == "logs":
            section, key = _LOGS[parts[0]]
            found = next(
                (e for e in sections.get(section) or () if str(e.get(key)) == parts[1]), None
            )
        else:
            found = None
        if found is None:
            raise NotServed(
                f"404: the recording holds no {path.partition('?')[0]} at {self.t:.2f} s "
                "(left out to keep it within its budget, or never recorded)"
            )
        return found


class ReplayApp(TopApp):
    """top over a recording: space plays or pauses, arrows step, n/N jump to findings."""

    TITLE = "asyncflow replay"
    CSS = TopApp.CSS + "\n#replay { height: 1; background: $accent; }\n"
    # priority: the table, which has the focus, binds the arrows, home and end itself
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("space", "pause", "Play/pause", key_display="␣", priority=True),
        Binding("right", "step(1)", "Step", show=False, priority=True),
        Binding("left", "step(-1)", "Back", show=False, priority=True),
        Binding("n", "finding(1)", "Next finding", show=False),
        Binding("N", "finding(-1)", "Previous finding", show=False),
        Binding("home", "seek(0)", "First", show=False, priority=True),
        Binding("end", "seek(-1)", "Last", show=False, priority=True),
    ]

    def __init__(
        self, recording: Recording, at: float = 0.0, speed: float = 1.0, interval: float = 0.5
    ) -> None:
        super().__init__(recording.path, None, interval)
        self.source = RecordingSource(recording, recording.index_at(at))
        self.speed = speed
        self.playing = False
        #: the recording's clock while playing, in seconds since the start
        self.cursor = self.source.t

    def compose(self) -> ComposeResult:
        yield Static("", id="replay", markup=False)
        yield from super().compose()

    async def on_mount(self) -> None:
        self._redraw()
        await self._show(self.source.index)
        self.set_interval(self.interval, self._play)

    async def on_unmount(self) -> None:
        pass  # no connection to close

    async def _get(self, path: str, document: type[_D]) -> _D:
        body = self.source.document(path)
        try:
            return schema.load(document, body, ignore_unknown=True)
        except schema.DocumentError as exc:
            raise schema.DocumentError(
                f"the recording's {path.partition('?')[0]} does not read: {exc}"
            ) from None

    def replay_line(self) -> str:
        """The time line: playing or paused, the moment, and where the findings begin."""
        source = self.source
        state = "▶ playing" if self.playing else "❚❚ paused"
        frame = source.recording.frames[source.index]
        end = " (end state)" if frame.final else ""
        if frame.stale:  # thinned by the budget: say how old the oldest is
            end += f" (some sections as of {min(frame.stale.values()):.2f} s)"
        starts = len(source.starts)
        return (
            f"{state} · {source.t:.2f} s of {source.recording.duration:.2f} s{end} · moment "
            f"{source.index + 1}/{source.last + 1} · speed {self.speed:g} · {starts} finding "
            "start(s) (n/N) · ␣ play/pause · ←/→ step"
        )

    async def _show(self, index: int) -> None:
        self.source.seek(index)
        self.query_one("#replay", Static).update(self.replay_line())
        self.paused = False
        await self.refresh_now()

    async def _play(self) -> None:
        if not self.playing:
            return
        self.cursor += self.interval * self.speed
        index = self.source.recording.index_at(self.cursor)
        if index >= self.source.last:
            self.playing = False
        await self._show(index)

    def action_pause(self) -> None:
        self.playing = not self.playing
        if self.playing and self.source.index >= self.source.last:
            self.source.seek(0)  # played to the end: play again from the start
        self.cursor = self.source.t
        self.query_one("#replay", Static).update(self.replay_line())

    async def action_step(self, step: int) -> None:
        self.playing = False
        await self._show(self.source.index + step)
        self.cursor = self.source.t

    async def action_seek(self, index: int) -> None:
        self.playing = False
        await self._show(self.source.last if index < 0 else index)
        self.cursor = self.source.t

    async def action_finding(self, step: int) -> None:
        found = self.source.next_finding(step)
        if found is None:
            self.notify("no finding begins " + ("later" if step > 0 else "earlier"))
            return
        self.playing = False
        await self._show(found)
        self.cursor = self.source.t
