"""Warnings that stay precise on a real stack (issue 26): one warning for the resources created at
one line, a library's resources and channels judged by their effect on the program's own code,
never a site in asyncflow or its launcher, and kinds or modules the user silenced left out."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import re
import sys
import sysconfig
import types
from pathlib import Path
from typing import Any

import pytest

import asyncflow
from asyncflow import config
from asyncflow.clock import FakeClock
from asyncflow.schema import Location, NeverAwaitedEntry
from asyncflow.views import lints
from asyncflow.views.lints import Documents, Finding, Thresholds

ROOT = Path(__file__).resolve().parent.parent.parent
#: a file of an installed package, as httpcore's locks and uvicorn's queues are
LIBRARY = Location(str(Path(sysconfig.get_paths()["purelib"]) / "somelib" / "pool.py"), 68)


@pytest.fixture(autouse=True)
def _no_primitives_of_earlier_tests() -> None:
    gc.collect()  # instrumented primitives are freed by the cyclic GC only


def _docs(prof: asyncflow.Profiler) -> Documents:
    return lints.documents_of(prof.snapshot())


def _evaluate(docs: Documents, **thresholds: Any) -> list[Finding]:
    return lints.evaluate(docs, Thresholds(**thresholds))


def _kinds(findings: list[Finding]) -> list[tuple[str, str]]:
    return [(f.kind, f.subject.label) for f in findings]


async def _advance(ns: int) -> None:
    """Let ``ns`` of fake time pass while the caller is suspended (simulated I/O)."""
    from asyncflow import clock

    fake = clock.now_ns
    assert isinstance(fake, FakeClock)
    asyncio.get_running_loop().call_soon(fake.advance, ns)
    await asyncio.sleep(0)
    await asyncio.sleep(0)


async def _contended_locks(count: int, callers: int = 10) -> list[asyncio.Lock]:
    """``count`` locks made at one line (one per connection, say), each held across an await by
    ``callers`` calls of ``request`` at once."""
    locks = [asyncflow.instrument_lock(asyncio.Lock(), name="conn.py:12") for _ in range(count)]

    @asyncflow.future(name="request")
    async def request(lock: asyncio.Lock) -> None:
        async with lock:
            await _advance(1_000_000)

    await asyncio.gather(*(request(lock) for lock in locks for _ in range(callers)))
    return locks


async def test_locks_made_at_one_line_are_one_warning_with_their_count(
    fake_clock: FakeClock, prof: asyncflow.Profiler
) -> None:
    locks = await _contended_locks(4)
    findings = [f for f in _evaluate(_docs(prof)) if f.kind == "lock-contention"]
    assert len(findings) == 1, _kinds(findings)
    (finding,) = findings
    assert finding.message.startswith(
        "4 locks created at `conn.py:12` serialise `request`: 36 of 40 acquisitions waited"
    ), finding.message
    assert finding.evidence["resources"] == 4
    assert finding.evidence["acquisitions"] == 40 and finding.evidence["hold_ns"] >= 40_000_000
    # the book keeps one warning for the site, whichever lock is its first from one
    # evaluation to the next
    book = lints.WarningBook()
    book.update(_docs(prof))
    book.update(_docs(prof))
    assert [w.kind for w in book.document(0).warnings] == ["lock-contention"]
    del locks


def _as_library(docs: Documents, *, own_waiters: bool) -> Documents:
    """The documents with every resource created in a library, and the futures that used them
    the program's own (``own_waiters``) or a library's too."""
    resources = [dataclasses.replace(r, location=LIBRARY) for r in docs.resources]
    futures = docs.futures
    if not own_waiters:
        futures = [dataclasses.replace(f, location=LIBRARY) for f in futures]
    return dataclasses.replace(docs, resources=resources, futures=futures)


async def test_a_library_lock_is_judged_by_the_program_s_own_waits(
    fake_clock: FakeClock, prof: asyncflow.Profiler
) -> None:
    locks = await _contended_locks(2)
    docs = _docs(prof)
    # the library's own tasks queue on it: the library's business, not the program's
    assert not [f for f in _evaluate(_as_library(docs, own_waiters=False)) if f.kind != "cpu-bound"]
    # the program's own calls wait behind it: the program's problem, wherever the lock was made
    (finding,) = _evaluate(_as_library(docs, own_waiters=True))
    assert finding.kind == "lock-contention"
    assert "serialise `request`" in finding.message
    del locks


async def test_a_library_s_internal_queue_is_not_the_program_s(
    fake_clock: FakeClock, prof: asyncflow.Profiler
) -> None:
    """A framework's queue that only its own tasks use (uvicorn's lifespan queue: the server
    waiting for its shutdown message) says nothing; the same queue used by the program's own
    code is a finding."""
    q: asyncio.Queue[int] = asyncflow.instrument_queue(asyncio.Queue(), name="on.py:40")

    @asyncflow.future(name="LifespanOn.main")
    async def main() -> None:
        await q.get()

    @asyncflow.future(name="Server.serve")
    async def serve() -> None:
        await _advance(1_000_000_000)
        q.put_nowait(1)

    await asyncio.gather(main(), serve())
    docs = _docs(prof)
    assert _kinds(_evaluate(docs)) == [("starved", "on.py:40")]
    library = [dataclasses.replace(f, location=LIBRARY) for f in docs.futures]
    assert _evaluate(dataclasses.replace(docs, futures=library)) == []


async def test_a_library_s_tasks_cancelled_are_judged_by_the_program_s_own(
    fake_clock: FakeClock, prof: asyncflow.Profiler
) -> None:
    """aiohttp cancels a connection's handler task when its client closes the keep-alive
    connection: a library's task living by its rules. Where the program has futures of its own,
    theirs are judged; with none (``--no-own-code``), every future is."""
    never = asyncio.Event()

    @asyncflow.future(name="RequestHandler.start")
    async def start() -> None:
        await never.wait()

    @asyncflow.future(name="item")
    async def item() -> None:
        await asyncio.sleep(0)

    collector = prof._collector
    assert collector is not None
    prof._call(lambda: collector.sample_live(fake_clock()))  # no sample while they live
    calls = [asyncio.create_task(start()) for _ in range(12)]
    await asyncio.sleep(0)
    for call in calls:
        call.cancel()
    await asyncio.gather(*calls, return_exceptions=True)
    await item()
    docs = _docs(prof)
    assert _kinds(_evaluate(docs)) == [("cancellation-storm", "RequestHandler.start")]
    library = [
        dataclasses.replace(f, location=LIBRARY) if f.label == "RequestHandler.start" else f
        for f in docs.futures
    ]
    assert _evaluate(dataclasses.replace(docs, futures=library)) == []
    alone = [f for f in library if f.label == "RequestHandler.start"]
    assert _kinds(_evaluate(dataclasses.replace(docs, futures=alone))) == [
        ("cancellation-storm", "RequestHandler.start")
    ]


def test_no_warning_names_asyncflow_or_its_launcher() -> None:
    """Coroutines never awaited, as the lint sees them, at asyncflow's own line or the
    ``asyncflow`` console script's: neither is the program's to fix."""
    ours = Path(asyncflow.__file__).parent / "instrumentation" / "_gone.py"
    script = Path(sysconfig.get_paths()["scripts"]) / "asyncflow"
    elsewhere = Path("/opt/tools/bin/asyncflow")
    program = ROOT / "examples" / "app.py"
    entries = [
        NeverAwaitedEntry(f"f{i}", Location(str(path), 8), None, 3)
        for i, path in enumerate((ours, script, elsewhere, program))
    ]
    findings = _evaluate(Documents(now_ns=1, elapsed_ns=1, never_awaited=entries))
    assert [f.subject.label for f in findings] == ["f3"]


async def test_warn_silences_a_kind_or_a_module(
    fake_clock: FakeClock, prof: asyncflow.Profiler
) -> None:
    locks = await _contended_locks(1, callers=20)
    docs = _docs(prof)
    assert _kinds(_evaluate(docs)) == [("lock-contention", "conn.py:12")]
    for warn in ("no-lock-contention", f"ignore:{__name__}", "ignore:tests.views.*"):
        thresholds = Thresholds.from_options(asyncflow.profile("t", warn=warn).options.warn)
        assert lints.evaluate(docs, thresholds) == [], warn
    # another kind, another module: still there
    for warn in ("no-starved", "ignore:httpcore", "ignore:tests.model.*"):
        thresholds = Thresholds.from_options(asyncflow.profile("t", warn=warn).options.warn)
        assert _kinds(lints.evaluate(docs, thresholds)) == [("lock-contention", "conn.py:12")]
    del locks


def test_ignore_main_reaches_what_the_program_s_script_made(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``ignore:__main__`` silences warnings about a resource the script made (located in the
    script's file) as it does about the script's futures."""
    script = tmp_path / "service.py"
    monkeypatch.setitem(sys.modules, "__main__", types.SimpleNamespace(__file__=str(script)))
    entry = NeverAwaitedEntry("send_mail", Location(str(script), 5), None, 2)
    docs = Documents(now_ns=1, elapsed_ns=1, never_awaited=[entry])
    assert len(_evaluate(docs)) == 1
    for warn, left in (("ignore:__main__", 0), ("ignore:service", 1)):
        thresholds = Thresholds.from_options(asyncflow.profile("t", warn=warn).options.warn)
        assert len(lints.evaluate(docs, thresholds)) == left, warn


def test_warn_refuses_what_it_cannot_silence() -> None:
    for bad, words in (
        ("no-contention", "unknown warning kind"),
        ("ignore:", "names no module"),
        ("ignore:a b", "not a module"),
        ("quiet", "no-KIND or ignore:MODULE"),
    ):
        with pytest.raises(ValueError, match=words):
            asyncflow.profile("t", warn=bad)
    assert asyncflow.profile("t", warn={"no": ["starved"], "ignore": "x.*"}).options.warn == (
        ("no", "starved"),
        ("ignore", "x.*"),
    )


def test_the_kinds_warn_knows_are_the_lints_and_the_docs() -> None:
    source = (ROOT / "asyncflow" / "views" / "lints.py").read_text(encoding="utf-8")
    made = set(re.findall(r'Finding\(\s*"([a-z-]+)"', source))
    made |= set(re.findall(r'^\s*"([a-z]+-[a-z-]+)",\s*$', source, re.MULTILINE)) & set(
        config.WARNING_KINDS
    )
    missing = made - set(config.WARNING_KINDS)
    assert not missing, f"add {missing} to config.WARNING_KINDS and docs/warnings.md's table"
    docs = (ROOT / "docs" / "warnings.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| `([a-z-]+)` \|", docs, re.MULTILINE))
    assert listed == set(config.WARNING_KINDS), "docs/warnings.md's table lists every kind"
