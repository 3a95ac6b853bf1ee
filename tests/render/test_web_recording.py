"""The web page over a recording (``asyncflow replay FILE --web``): a moment's documents as they
were recorded, rebuilt in the browser from the file's section deltas (headless Chromium)."""

from __future__ import annotations

import asyncio
import json
import os
import selectors
import subprocess
import urllib.error
import urllib.request
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import asyncflow
from asyncflow.render import web
from asyncflow.render.record import MAGIC, read_recording
from tests.render.test_web_page import (
    BROWSER_TIMEOUT,
    Element,
    by_id,
    chromium,
    needs_chromium,
    render,
)
from tests.support.commands import ASYNCFLOW
from tests.support.recording import moments, profiled


async def _backlog_filled_then_drained() -> None:
    backlog: asyncio.Queue[int] = asyncflow.instrument_queue(asyncio.Queue(50), name="backlog")
    for i in range(50):
        backlog.put_nowait(i)
    await moments(3)  # full for three of the recording's moments
    while not backlog.empty():
        await backlog.get()


def _record(path: Path) -> None:
    profiled(path, _backlog_filled_then_drained, name="backlog-run", queues=False)


def _backlog_row(elements: list[Element]) -> list[str]:
    """The cells of the channels table's row of ``backlog``."""
    cells: list[str] | None = None
    inside = False
    for e in elements:
        if e.tag == "table":
            inside = e.attrs.get("id") == "channels-table"
        elif inside and e.tag == "tr":
            if cells is not None:
                break
            cells = [] if "data-id" in e.attrs else None
        elif inside and e.tag == "td" and cells is not None:
            cells.append(e.content)
            if cells[0] != "backlog":
                cells = None
    assert cells is not None, "no row of backlog in the channels table"
    return cells


@contextmanager
def replay_web(path: Path) -> Iterator[str]:
    """``asyncflow replay PATH --web``, the command a user types: it prints the page's address
    (given here), then serves until stopped (when the block ends)."""
    server = subprocess.Popen(
        [*ASYNCFLOW, "replay", str(path), "--web"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with selectors.DefaultSelector() as wait:
            assert server.stdout is not None
            wait.register(server.stdout, selectors.EVENT_READ)
            assert wait.select(timeout=60), "replay --web printed no address"
            said = server.stdout.readline()
        assert said.startswith(f"asyncflow: the recording {path} at http://127.0.0.1:"), said
        url = said.split()[-1]
        assert url.endswith("/?recording")
        yield url
    finally:
        server.terminate()
        server.communicate(timeout=60)


def _body(elements: list[Element]) -> Element:
    (body,) = [e for e in elements if e.tag == "body"]
    return body


@needs_chromium
def test_replay_web_shows_the_queue_full_at_an_early_moment_and_drained_at_the_end(
    tmp_path: Path,
) -> None:
    path = tmp_path / "backlog.afrec"
    _record(path)
    rec = read_recording(str(path))
    depths = []
    for frame in rec.frames:
        channels = (frame.sections.get("channels") or {}).get("channels") or []
        depths.append(next((c["queue_size"] for c in channels if c["label"] == "backlog"), None))
    full = depths.index(50)
    assert depths[-1] == 0 and rec.frames[-1].final

    with replay_web(path) as url:
        at_full, at_end = render(
            f"{url}&at={rec.frames[full].t!r}", f"{url}&at=1e9", tmp_path=tmp_path
        )

    # the early moment: the backlog full, as recorded
    body = _body(at_full)
    assert body.attrs["data-state"] == "recording", body.content[:500]
    assert body.attrs["data-moment"] == str(full)
    assert by_id(at_full, "name").content == "backlog-run"
    assert "hidden" not in by_id(at_full, "replay").classes
    assert by_id(at_full, "replay-at").content.startswith(f"moment {full + 1} of {len(rec.frames)}")
    # label, type, sent, received, queued, max queued
    assert _backlog_row(at_full)[:6] == ["backlog", "bounded[50]", "50", "0", "50", "50"]

    # the end state: drained
    body = _body(at_end)
    assert body.attrs["data-moment"] == str(len(rec.frames) - 1)
    assert "the end state" in by_id(at_end, "replay-at").content
    assert _backlog_row(at_end)[:6] == ["backlog", "bounded[50]", "50", "50", "0", "50"]


@needs_chromium
def test_the_page_refuses_a_newer_format_and_reads_a_cut_recording_up_to_the_cut(
    tmp_path: Path,
) -> None:
    moment = b'{"t":100000000,"s":{"status":{"name":"cut","pid":1,"uptime_ns":1}}}\n'
    body = zlib.compressobj()
    whole = body.compress(moment) + body.flush(zlib.Z_SYNC_FLUSH)
    torn = (body.compress(b'{"t":2' * 500) + body.flush())[:40]  # a moment cut mid-write
    cut = MAGIC + b'{"version":1,"name":"cut"}\n' + whole + torn
    newer = MAGIC + b'{"version":99,"asyncflow":"9.0"}\n' + whole
    servers = [web.serve_recording(data) for data in (cut, newer)]
    try:
        at_cut, at_newer = render(*(url for _, url in servers), tmp_path=tmp_path)
    finally:
        for server, _ in servers:
            server.shutdown()
            server.server_close()
    assert _body(at_cut).attrs["data-state"] == "recording"
    assert by_id(at_cut, "name").content == "cut"
    said = by_id(at_cut, "replay-at").content
    assert said.startswith("moment 1 of 1 · 0.10 s"), said
    assert "no end state" in said and "ends mid-write" in said

    assert _body(at_newer).attrs["data-state"] == "error"
    problem = by_id(at_newer, "problem")
    assert "hidden" not in problem.classes
    assert "is a recording of format 99, written by asyncflow 9.0" in problem.content


def test_the_recording_server_serves_the_page_and_the_bytes_only() -> None:
    server, url = web.serve_recording(b"the bytes")
    try:
        base = url.partition("?")[0]
        with urllib.request.urlopen(base, timeout=10) as response:
            assert response.read() == web.page()
            assert (
                response.headers["Content-Security-Policy"]
                == web.headers()["Content-Security-Policy"]
            )
        with urllib.request.urlopen(base + "recording", timeout=10) as response:
            assert response.read() == b"the bytes"
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(base + "flow", timeout=10)
        assert missing.value.code == 404
        missing.value.close()
    finally:
        server.shutdown()
        server.server_close()
    assert url.startswith("http://127.0.0.1:")


class _Browser:
    """A headless Chromium driven over the DevTools protocol on a pipe (fds 3 and 4): one page,
    to pick a file in, click and read back (what ``--dump-dom`` cannot do)."""

    def __init__(self, profile: Path) -> None:
        browser = chromium()
        assert browser is not None
        to_read, self._send = os.pipe()
        self._receive, to_write = os.pipe()
        assert min(to_read, to_write) > 4  # so that the dup2s below clobber neither

        def pipes() -> None:
            os.dup2(to_read, 3)
            os.dup2(to_write, 4)

        self.process = subprocess.Popen(
            [
                browser,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                f"--user-data-dir={profile}",
                "--remote-debugging-pipe",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=pipes,  # the protocol's fds are 3 and 4, by number
            close_fds=False,  # (kept: the others are close-on-exec anyway)
        )
        os.close(to_read)
        os.close(to_write)
        self._buffer = b""
        self._ids = 0
        self.session: str | None = None
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)[
            "sessionId"
        ]

    def call(self, method: str, **params: Any) -> Any:
        """Send one command and wait (bounded) for its answer; events between are skipped."""
        self._ids += 1
        message: dict[str, Any] = {"id": self._ids, "method": method, "params": params}
        if self.session is not None:
            message["sessionId"] = self.session
        os.write(self._send, json.dumps(message).encode() + b"\0")
        with selectors.DefaultSelector() as wait:
            wait.register(self._receive, selectors.EVENT_READ)
            while True:
                while b"\0" in self._buffer:
                    raw, _, self._buffer = self._buffer.partition(b"\0")
                    answer = json.loads(raw)
                    if answer.get("id") == self._ids:
                        assert "error" not in answer, (method, answer["error"])
                        return answer["result"]
                assert wait.select(timeout=BROWSER_TIMEOUT), f"no answer to {method}"
                chunk = os.read(self._receive, 1 << 16)
                assert chunk, "the browser closed its pipe"
                self._buffer += chunk

    def evaluate(self, expression: str) -> Any:
        return self.call("Runtime.evaluate", expression=expression, returnByValue=True)[
            "result"
        ].get("value")

    def until(self, expression: str) -> Any:
        """Evaluate ``expression`` until it is truthy (bounded), and return its value."""
        for _ in range(int(BROWSER_TIMEOUT * 20)):
            value = self.evaluate(expression)
            if value:
                return value
            self.call(
                "Runtime.evaluate",
                expression="new Promise(r => setTimeout(r, 50))",
                awaitPromise=True,
            )
        raise AssertionError(f"never true: {expression}")

    def close(self) -> None:
        self.process.kill()
        self.process.wait(timeout=BROWSER_TIMEOUT)
        os.close(self._send)
        os.close(self._receive)


#: the backlog's row of the channels table, as the page shows it now
_ROW = """[...document.querySelectorAll('#channels-table tbody tr')]
  .map(tr => [...tr.cells].map(td => td.textContent))
  .filter(cells => cells[0] === 'backlog')[0]"""


@needs_chromium
def test_a_live_page_opens_a_picked_recording_and_steps_through_it(tmp_path: Path) -> None:
    path = tmp_path / "backlog.afrec"
    _record(path)
    rec = read_recording(str(path))
    token = "rec-t0ken"
    with asyncflow.profile("live", port=0, format="none", token=token) as prof:
        browser = _Browser(tmp_path / "chromium")
        try:
            browser.call("Page.navigate", url=f"{prof.url}/#token={token}")
            browser.until("document.body.getAttribute('data-state') === 'ready'")
            assert browser.evaluate("document.getElementById('name').textContent") == "live"
            # the user picks the file: the live view stops, the recording's first moment shows
            root = browser.call("DOM.getDocument")["root"]["nodeId"]
            picker = browser.call("DOM.querySelector", nodeId=root, selector="#open-file")
            browser.call("DOM.setFileInputFiles", files=[str(path)], nodeId=picker["nodeId"])
            browser.until("document.body.getAttribute('data-state') === 'recording'")
            assert browser.evaluate("document.getElementById('name').textContent") == (
                "backlog-run"
            )
            said = browser.evaluate("document.getElementById('replay-at').textContent")
            assert said.startswith(f"moment 1 of {len(rec.frames)}"), said
            # the end state: drained, whatever the endpoint would say now
            browser.evaluate("document.getElementById('replay-last').click()")
            assert browser.evaluate(_ROW)[:6] == ["backlog", "bounded[50]", "50", "50", "0", "50"]
            assert "the end state" in browser.evaluate(
                "document.getElementById('replay-at').textContent"
            )
            # a step back from the end, through the moments, reaches the backlog full
            for _ in rec.frames:
                row = browser.evaluate(_ROW)
                if row is not None and row[4] == "50":
                    break
                browser.evaluate("document.getElementById('replay-back').click()")
            assert row is not None and row[:6] == [
                "backlog",
                "bounded[50]",
                "50",
                "0",
                "50",
                "50",
            ], row
            assert browser.evaluate("document.body.getAttribute('data-state')") == "recording"
        finally:
            browser.close()
