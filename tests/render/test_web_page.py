"""The web page at ``GET /``: what a real browser (headless Chromium) renders of a live profile."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import http.server
import os
import re
import shutil
import subprocess
import threading
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, TypeVar

import pytest

import asyncflow
from asyncflow.render import web

ROOT = Path(__file__).resolve().parent.parent.parent
TOKEN = "page-t0ken"
#: bounds a browser run; it takes a few seconds
BROWSER_TIMEOUT = 60.0


def chromium() -> str | None:
    """A Chromium (or Chrome) to drive headless: Debian's package, else any on PATH."""
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found is not None:
            return found
    return None


_chromium_here = pytest.mark.skipif(
    chromium() is None,
    reason="no Chromium here (apt-get install chromium; .ci/run installs it where it can)",
)
_Test = TypeVar("_Test", bound=Callable[..., Any])


def needs_chromium(test: _Test) -> _Test:
    """A test that renders the page in headless Chromium (skipped without one): slow, as a
    browser takes seconds to start and render."""
    marked: _Test = pytest.mark.slow(_chromium_here(test))
    return marked


# -- a planted program: a pipeline with a bottleneck, and a lock ---------------------------------
# (names of their own: futures are process-wide, and other tests count theirs by label)


@asyncflow.future
async def feed_jobs(jobs: asyncio.Queue[int | None]) -> None:
    for i in range(40):
        await jobs.put(i)
    await jobs.put(None)


@asyncflow.future
async def slow_stage(
    jobs: asyncio.Queue[int | None], results: asyncio.Queue[int | None], db: asyncio.Lock
) -> None:
    while (item := await jobs.get()) is not None:
        async with db:
            await asyncio.sleep(0.005)  # the slow stage: `jobs` fills up behind it (0.2 s)
        await results.put(item)
    await results.put(None)


@asyncflow.future
async def drain_results(results: asyncio.Queue[int | None]) -> None:
    while await results.get() is not None:
        pass


async def pipeline() -> None:
    jobs: asyncio.Queue[int | None] = asyncflow.instrument_queue(asyncio.Queue(2), name="jobs")
    results: asyncio.Queue[int | None] = asyncflow.instrument_queue(asyncio.Queue(), name="results")
    db = asyncflow.instrument_lock(asyncio.Lock(), name="db")
    await asyncio.wait_for(
        asyncio.gather(feed_jobs(jobs), slow_stage(jobs, results, db), drain_results(results)), 30
    )


@pytest.fixture
def planted() -> Iterator[asyncflow.Profiler]:
    with asyncflow.profile("planted", format="none", port=0, token=TOKEN) as prof:
        asyncio.run(pipeline())
        yield prof


# -- reading what the browser rendered -----------------------------------------------------------


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    text: list[str] = field(default_factory=list)

    @property
    def classes(self) -> list[str]:
        return self.attrs.get("class", "").split()

    @property
    def content(self) -> str:
        return " ".join("".join(self.text).split())


class _Dom(HTMLParser):
    """Every element of a serialised DOM, with its text (that of its descendants included)."""

    VOID = frozenset({"meta", "link", "input", "br", "img", "hr", "col", "source", "wbr"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[Element] = []
        self._open: list[Element] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, {k: v or "" for k, v in attrs})
        self.elements.append(element)
        if tag not in self.VOID:
            self._open.append(element)

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self._open) - 1, -1, -1):
            if self._open[i].tag == tag:
                del self._open[i:]
                return

    def handle_data(self, data: str) -> None:
        for element in self._open:
            element.text.append(data)


def render(*urls: str, tmp_path: Path) -> list[list[Element]]:
    """Load each of ``urls`` in a headless Chromium of its own (all at once), let the page's
    scripts run (and fetch), and parse the DOM each rendered.

    A page still ``loading`` when Chromium dumped it is loaded again, twice at most: virtual
    time waits for fetches and timers, not for work off the page's thread (a recording's
    ``DecompressionStream``), which a loaded machine can leave unfinished (seen once in a full
    run: the end state of a replay had no moment yet)."""
    rendered = _render(urls, tmp_path, "chromium")
    for attempt in (1, 2):
        for i, url in enumerate(urls):
            if _settled(rendered[i]) == "loading":
                (rendered[i],) = _render((url,), tmp_path, f"again-{attempt}-{i}")
    return rendered


def _settled(elements: list[Element]) -> str | None:
    """The page's state as its body says it (``loading`` until its first render)."""
    return next((e.attrs.get("data-state") for e in elements if e.tag == "body"), None)


def _render(urls: tuple[str, ...], tmp_path: Path, profiles: str) -> list[list[Element]]:
    browser = chromium()
    assert browser is not None
    runs = [
        subprocess.Popen(
            command(browser, url, tmp_path / f"{profiles}-{i}"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i, url in enumerate(urls)
    ]
    rendered = []
    try:
        for run in runs:
            out, err = run.communicate(timeout=BROWSER_TIMEOUT)
            assert run.returncode == 0, err[-2000:]
            dom = _Dom()
            dom.feed(out)
            rendered.append(dom.elements)
    finally:
        for run in runs:
            if run.poll() is None:
                run.kill()
                run.communicate()
    return rendered


def command(browser: str, url: str, profile: Path) -> list[str]:
    return [
        browser,
        "--headless",
        "--no-sandbox",  # as root (CI containers) Chromium refuses to start sandboxed
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        f"--user-data-dir={profile}",
        # virtual time: the page's fetches complete and its first refreshes run, at once
        "--virtual-time-budget=5000",
        "--dump-dom",
        url,
    ]


def by_id(elements: list[Element], ident: str) -> Element:
    (found,) = [e for e in elements if e.attrs.get("id") == ident]
    return found


# -- tests ---------------------------------------------------------------------------------------


@needs_chromium
def test_the_page_renders_warnings_graph_and_tables_of_a_live_profile(
    planted: asyncflow.Profiler, tmp_path: Path
) -> None:
    snapshot = planted.snapshot()
    assert planted.url is not None and snapshot.flow is not None
    # The token reaches the page in the fragment, which is never sent to the server.
    (elements,) = render(f"{planted.url}/#token={TOKEN}", tmp_path=tmp_path)
    (body,) = [e for e in elements if e.tag == "body"]
    assert body.attrs["data-state"] == "ready", body.content[:500]
    assert "hidden" in by_id(elements, "login").classes
    assert "hidden" in by_id(elements, "problem").classes
    assert by_id(elements, "name").content == "planted"

    # warnings first, each with its message as the profile says it
    sections = [e.attrs["id"] for e in elements if e.tag == "section"]
    assert sections.index("warnings") < sections.index("flow") < sections.index("futures")
    shown = [e for e in elements if e.tag == "li" and "data-kind" in e.attrs]
    assert snapshot.warnings, "the planted bottleneck was not diagnosed"
    assert [e.attrs["data-kind"] for e in shown] == [w.kind for w in snapshot.warnings]
    spans = {
        part: [e.content for e in elements if e.tag == "span" and part in e.classes]
        for part in ("message", "hint")
    }
    assert spans["message"] == [" ".join(w.message.split()) for w in snapshot.warnings]
    assert spans["hint"] == [" ".join(w.hint.split()) for w in snapshot.warnings if w.hint]
    assert "bottleneck" in [e.attrs["data-kind"] for e in shown]

    # the flow graph: a node per future, channel and resource, an edge per flow edge, drawn
    nodes = {e.attrs["data-id"]: e for e in elements if e.tag == "g" and "node" in e.classes}
    assert set(nodes) == {n.id for n in snapshot.flow.nodes}
    kinds = {n.kind for n in snapshot.flow.nodes}
    assert {"future", "channel", "resource"} <= kinds
    for node in snapshot.flow.nodes:
        assert nodes[node.id].attrs["data-kind"] == node.kind
        assert node.label in nodes[node.id].content
        assert re.fullmatch(r"translate\([0-9.]+,[0-9.]+\)", nodes[node.id].attrs["transform"])
    # a node the warnings name is marked
    # (ids are process-wide: earlier tests' futures, channels and locks took the first ones)
    ids = {(n.kind, n.label): n.id for n in snapshot.flow.nodes}
    jobs, work_id, db = ids["channel", "jobs"], ids["future", "slow_stage"], ids["resource", "db"]
    assert "warned" in nodes[jobs].classes
    edges = {
        (e.attrs["data-source"], e.attrs["data-target"])
        for e in elements
        if e.tag == "g" and "edge" in e.classes and "data-source" in e.attrs
    }
    assert edges == {(e.source, e.target) for e in snapshot.flow.edges}
    labels = [e.content for e in elements if e.tag == "g" and "label" in e.classes]
    for edge, label in zip(snapshot.flow.edges, labels, strict=True):
        unit = "holds" if "resource:" in edge.source + edge.target else "msgs"
        assert label.startswith(f"{edge.messages:,} {unit}"), (edge, label)
    # through `jobs`: 40 items and the end marker, with their time in the channel
    assert any(re.fullmatch(r"41 msgs ?[0-9.]+ [µm]?s / [0-9.]+ [µm]?s", label) for label in labels)
    paths = [e for e in elements if e.tag == "path" and e.attrs.get("marker-end")]
    assert len(paths) == len(snapshot.flow.edges)

    # the tables: a row per future, channel, resource and loop
    def rows(table: str) -> dict[str, list[str]]:
        """The cells of each row of a table, by the row's ``data-id``."""
        found: dict[str, list[str]] = {}
        inside, cells = False, None
        for e in elements:
            if e.tag == "table":
                inside, cells = e.attrs.get("id") == f"{table}-table", None
            elif inside and e.tag == "tr":
                cells = found.setdefault(e.attrs["data-id"], []) if "data-id" in e.attrs else None
            elif e.tag == "td" and cells is not None:
                cells.append(e.content)
        return found

    futures = rows("futures")
    assert set(futures) == {f"future:{f.id}" for f in snapshot.futures.futures}
    assert futures[work_id][:3] == ["slow_stage", "1", "0"]  # label, calls, live
    assert futures[work_id][-1] == f"test_web_page.py:{slow_stage.__code__.co_firstlineno}"
    # beside busy and idle, the scheduled delay's p99 (a woken call's wait for the loop), and
    # the page's dash where no wake-up was measured (uvloop), not a 0
    heads = [e.content for e in elements if e.tag == "th"]
    assert heads[heads.index("idle") + 1] == "sched p99"
    for f in snapshot.futures.futures:
        measured = futures[f"future:{f.id}"][6]
        assert (measured == "\u2013") == (f.scheduled_polls == 0), (f.label, measured)
    assert next(f for f in snapshot.futures.futures if f.label == "slow_stage").scheduled_polls
    assert snapshot.channels is not None and snapshot.resources is not None
    channels = rows("channels")
    assert set(channels) == {f"channel:{c.id}" for c in snapshot.channels.channels}
    assert channels[jobs][:6] == ["jobs", "bounded[2]", "41", "41", "0", "2"]
    assert channels[jobs][-1] == "feed_jobs → slow_stage"
    resources = rows("resources")
    assert set(resources) == {f"resource:{r.id}" for r in snapshot.resources.resources}
    assert resources[db][:3] == ["db", "asyncio.Lock", "40"]
    assert snapshot.loop is not None
    assert set(rows("loops")) == {f"loop:{loop.id}" for loop in snapshot.loop.loops}


@needs_chromium
def test_without_the_token_the_page_asks_for_it(
    planted: asyncflow.Profiler, tmp_path: Path
) -> None:
    without, wrong = render(f"{planted.url}/", f"{planted.url}/#token=wrong", tmp_path=tmp_path)
    elements = without
    (body,) = [e for e in elements if e.tag == "body"]
    assert body.attrs["data-state"] == "token"
    login = by_id(elements, "login")
    assert "hidden" not in login.classes
    assert "This endpoint needs a token" in login.content
    # nothing was drawn from documents it could not read
    assert not [e for e in elements if e.tag == "g" and "node" in e.classes]

    # a wrong token is refused and said so
    elements = wrong
    (body,) = [e for e in elements if e.tag == "body"]
    assert body.attrs["data-state"] == "token"
    said = by_id(elements, "login-said").content
    assert said.startswith("refused: the bearer token is wrong")


def test_the_page_is_served_without_the_token_with_a_strict_policy(
    planted: asyncflow.Profiler,
) -> None:
    assert planted.url is not None
    with urllib.request.urlopen(planted.url + "/", timeout=10) as response:
        assert response.status == 200
        assert response.headers["Content-Type"] == "text/html; charset=utf-8"
        body = response.read()
        policy = response.headers["Content-Security-Policy"]
        assert response.headers["X-Content-Type-Options"] == "nosniff"
        assert response.headers["Cache-Control"] == "no-store"
    assert body == web.page()
    # the documents it draws still need the token
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(planted.url + "/flow", timeout=10)
    assert refused.value.code == 401
    refused.value.close()

    # Only the page's own inline script and style may run, only this endpoint be fetched.
    directives = dict(d.strip().split(" ", 1) for d in policy.split(";"))
    assert directives["default-src"] == "'none'"
    assert directives["connect-src"] == "'self'"
    for tag in ("script", "style"):
        (inline,) = re.findall(rf"<{tag}>(.*?)</{tag}>".encode(), body, re.S)
        digest = base64.b64encode(hashlib.sha256(inline).digest()).decode()
        assert directives[f"{tag}-src"] == f"'sha256-{digest}'"
    assert "unsafe" not in policy
    # self-contained: nothing to load from anywhere, no inline handlers or style attributes
    text = body.decode()
    # but its icon, which is none: no request for /favicon.ico (a 404 in every browser's log)
    assert re.findall(r"\b(?:src|href|srcset|action)\s*=[^>]*", text) == ['href="data:,"']
    assert '<link rel="icon" href="data:,">' in text
    assert directives["img-src"] == "'self' data:"  # else the icon is refused, and looked for
    assert not re.search(r"\son[a-z]+\s*=|\sstyle\s*=|@import|url\(\s*['\"]?(https?:)?//", text)
    assert "innerHTML" not in text and "eval(" not in text


def test_the_page_is_package_data() -> None:
    """A non-editable install must carry the page."""
    with (ROOT / "pyproject.toml").open("rb") as file:
        package_data = tomllib.load(file)["tool"]["setuptools"]["package-data"]
    assert "*.html" in package_data["asyncflow.render.web"]
    assert (ROOT / "asyncflow" / "render" / "web" / "page.html").is_file()
    assert os.path.basename(web.__file__) == "__init__.py"


# -- what the browser asks for, and how a note is drawn ------------------------------------------


@asyncflow.future
async def trickle(paced: asyncio.Queue[int | None]) -> None:
    for i in range(4):
        await asyncio.sleep(0.03)  # a slow producer: the consumer waits (starved, a note)
        await paced.put(i)
    await paced.put(None)


@asyncflow.future
async def waits_for_trickle(paced: asyncio.Queue[int | None]) -> None:
    while await paced.get() is not None:
        pass


class _Recorder:
    """A proxy in front of the endpoint that notes every path the browser asks for."""

    def __init__(self, target: str, missing: frozenset[str] = frozenset()) -> None:
        self.paths: list[str] = []
        recorder = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                recorder.paths.append(self.path)
                if self.path.partition("?")[0] in missing:  # an older profiler's endpoint
                    body = b'{"error": {"status": 404, "message": "no route"}}'
                    self.send_response(404)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                request = urllib.request.Request(target + self.path)
                if auth := self.headers.get("Authorization"):
                    request.add_header("Authorization", auth)
                try:
                    with urllib.request.urlopen(request, timeout=10) as answer:
                        status, headers, body = answer.status, answer.headers, answer.read()
                except urllib.error.HTTPError as error:
                    with error:
                        status, headers, body = error.code, error.headers, error.read()
                self.send_response(status)
                for name in ("Content-Type", "Content-Security-Policy"):
                    if headers.get(name):
                        self.send_header(name, headers[name])
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


@needs_chromium
def test_an_info_note_outlines_nothing_and_no_icon_is_asked_for(tmp_path: Path) -> None:
    async def paced_pipeline() -> None:
        paced: asyncio.Queue[int | None] = asyncflow.instrument_queue(asyncio.Queue(), name="paced")
        await asyncio.wait_for(asyncio.gather(trickle(paced), waits_for_trickle(paced)), 30)

    warn = "min_wait=0.01,starved_share=0.2"
    with asyncflow.profile("noted", format="none", port=0, token=TOKEN, warn=warn) as prof:
        asyncio.run(paced_pipeline())
        snapshot = prof.snapshot()
        assert prof.url is not None and snapshot.flow is not None
        notes = [w for w in snapshot.warnings if w.subject.label == "paced"]
        assert [(w.kind, w.severity) for w in notes] == [("starved", "info")], snapshot.warnings
        proxy = _Recorder(prof.url)
        try:
            (elements,) = render(f"{proxy.url}/#token={TOKEN}", tmp_path=tmp_path)
        finally:
            proxy.close()
    (body,) = [e for e in elements if e.tag == "body"]
    assert body.attrs["data-state"] == "ready", body.content[:500]
    shown = [e.attrs["data-kind"] for e in elements if e.tag == "li" and "data-kind" in e.attrs]
    assert "starved" in shown  # listed, as every warning is
    nodes = {e.attrs["data-id"]: e for e in elements if e.tag == "g" and "node" in e.classes}
    paced = next(n.id for n in snapshot.flow.nodes if n.label == "paced")
    assert "/favicon.ico" not in proxy.paths, proxy.paths
    assert "warned" not in nodes[paced].classes  # a note is not a problem: no red outline
    assert proxy.paths[0] == "/" and all(p.startswith("/") for p in proxy.paths)


# -- the wait-for graph and the task tree ----------------------------------------------------------


async def _transfer(a: asyncio.Lock, b: asyncio.Lock, both: asyncio.Event) -> None:
    async with a:
        await both.wait()
        async with b:
            pass


async def _bank(keep: list[object]) -> None:
    """Two transfers that take two vaults' locks (made on one line) in opposite order; ``keep``
    holds them (a deadlock nothing refers to is garbage, and the cyclic GC frees it)."""
    first, second = (asyncflow.instrument_lock(asyncio.Lock(), name="vault") for _ in "12")
    both = asyncio.Event()
    payer = asyncio.create_task(_transfer(first, second, both), name="payer")
    payee = asyncio.create_task(_transfer(second, first, both), name="payee")
    keep += [asyncio.current_task(), payer, payee, first, second]
    while not (first.locked() and second.locked()):
        await asyncio.sleep(0)
    both.set()
    await asyncio.gather(payer, payee)


async def _cancel_all() -> None:
    mine = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not mine]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@contextmanager
def _deadlocked(prof: asyncflow.Profiler) -> Iterator[None]:
    """``_bank`` deadlocked on a loop of its own thread (every task tracked: the tree), until
    the profile's graph has the cycle; cancelled and stopped after."""
    loop = asyncio.new_event_loop()
    tracked = asyncflow.instrument_tasks(loop)
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        kept: list[object] = []
        asyncio.run_coroutine_threadsafe(_bank(kept), loop)
        deadline = time.monotonic() + 10
        while not ((graph := prof.snapshot().graph) and graph.cycles):
            assert time.monotonic() < deadline, "no deadlock in the graph within 10 s"
            time.sleep(0.01)  # not timing anything: the profiler's thread reads the loop
        yield
    finally:
        asyncio.run_coroutine_threadsafe(_cancel_all(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        tracked.undo()
        loop.close()


def _table_rows(elements: list[Element], table: str) -> dict[str, tuple[Element, list[str]]]:
    """Each row of a table by its ``data-id``: the row and its cells' text."""
    found: dict[str, tuple[Element, list[str]]] = {}
    inside, cells = False, None
    for e in elements:
        if e.tag == "table":
            inside, cells = e.attrs.get("id") == f"{table}-table", None
        elif inside and e.tag == "tr":
            cells = None
            if "data-id" in e.attrs:
                cells = found.setdefault(e.attrs["data-id"], (e, []))[1]
        elif e.tag == "td" and cells is not None:
            cells.append(e.content)
    return found


@needs_chromium
def test_the_page_shows_a_deadlock_the_waits_and_the_task_tree(tmp_path: Path) -> None:
    with (
        asyncflow.profile("stuck-page", format="none", port=0, token=TOKEN) as prof,
        _deadlocked(prof),
    ):
        assert prof.url is not None
        older = _Recorder(prof.url, missing=frozenset({"/graph"}))
        try:
            now, old = render(
                f"{prof.url}/#token={TOKEN}", f"{older.url}/#token={TOKEN}", tmp_path=tmp_path
            )
        finally:
            older.close()
    (body,) = [e for e in now if e.tag == "body"]
    assert body.attrs["data-state"] == "ready", body.content[:500]
    sections = [e.attrs["id"] for e in now if e.tag == "section"]
    assert sections.index("flow") < sections.index("waits") < sections.index("futures")

    # the deadlock, highlighted and in words: both tasks, both vaults, who holds each
    (deadlock,) = [e for e in now if e.tag == "li" and "data-cycle" in e.attrs]
    assert deadlock.attrs["data-cycle"] == "1"
    assert sorted(deadlock.attrs["data-tasks"].split()) == ["payee", "payer"]
    said = deadlock.content
    assert said.startswith("⟳1 deadlock:")
    assert len(set(re.findall(r"lock vault #\d+", said))) == 2, said
    assert "held by payer" in said and "held by payee" in said

    # the waits: each transfer in the deadlock, on one vault, held by the other
    waits = _table_rows(now, "waits")
    for me, other in (("payer", "payee"), ("payee", "payer")):
        row, cells = waits[f"task:{me}"]
        assert "cycle" in row.classes and "bad" in row.classes
        assert cells[0] == f"{me} (_transfer)" and cells[1] == "⟳1"
        assert re.fullmatch(r"lock vault #\d+", cells[2]), cells
        assert cells[3].startswith(f"held by {other} for "), cells
        assert f"(took it at test_web_page.py:{_transfer.__code__.co_firstlineno + 1})" in cells[3]
        assert cells[4].startswith("test_web_page.py:")
        # where it was made and by whom, as the report says it
        made = _bank.__code__.co_firstlineno + (5 if me == "payer" else 6)
        by = r"made by (Task-\d+) at test_web_page\.py:(\d+) and awaited by \1"
        assert (found := re.fullmatch(by, cells[5])), cells
        assert int(found[2]) == made, cells
    assert "deadlock" in by_id(now, "waits-count").content

    # the task tree: the bank's task, with both transfers under it, marked
    tree = {e.attrs["data-task"]: e for e in now if e.tag == "li" and "data-task" in e.attrs}
    assert "cycle" in tree["payer"].classes and "cycle" in tree["payee"].classes
    (bank,) = [e for e in tree.values() if e.text[1:2] == ["_bank"]]
    assert bank.text[2] == "waits on tasks payee, payer"
    for me in ("payer", "payee"):  # its children's items, inside its own
        at = bank.text.index(f"{me} ⟳1")
        assert bank.text[at + 1] == "_transfer"
        assert re.fullmatch(r"waits on lock vault #\d+", bank.text[at + 2])
        made = _bank.__code__.co_firstlineno + (5 if me == "payer" else 6)
        assert bank.text[at + 3] == f"made at test_web_page.py:{made}", bank.text

    # an older profiler (no /graph): the page still renders, says so, and draws the tree
    (body,) = [e for e in old if e.tag == "body"]
    assert body.attrs["data-state"] == "ready", body.content[:500]
    assert "serves no /graph" in by_id(old, "waits").content
    assert not [e for e in old if e.tag == "li" and "data-cycle" in e.attrs]
    assert {"payer", "payee"} <= {e.attrs["data-task"] for e in old if "data-task" in e.attrs}


@asyncflow.future
async def flaky_price(n: int) -> int:
    if n % 4 == 0:
        raise KeyError(n)
    raise TimeoutError


@needs_chromium
def test_the_futures_raised_column_names_the_runs_exception_types(tmp_path: Path) -> None:
    async def run() -> None:
        for n in range(8):
            with contextlib.suppress(KeyError, TimeoutError):
                await flaky_price(n)

    with asyncflow.profile("raising-page", format="none", port=0, token=TOKEN) as prof:
        asyncio.run(run())
        assert prof.url is not None
        (elements,) = render(f"{prof.url}/#token={TOKEN}", tmp_path=tmp_path)
        (entry,) = [f for f in prof.snapshot().futures.futures if f.label == "flaky_price"]
    (row, cells) = _table_rows(elements, "futures")[f"future:{entry.id}"]
    assert "bad" in row.classes
    assert cells[11] == "8: 6 TimeoutError, 2 KeyError", cells
