"""The slow-tail finding judges a future's tail by the gathers it takes part in: a tail is a
finding when the gathers wait for it (it ended last in most of them), or when its calls are
awaited alone; not when a slower sibling ends last in every gather anyway (issue 27)."""

from __future__ import annotations

import asyncio
import dataclasses

import anyio

import asyncflow
from asyncflow import schema
from asyncflow.clock import FakeClock
from asyncflow.views import lints
from asyncflow.views.lints import Documents, Finding, Thresholds
from tests.views.test_lints_cause import future, loop_with

MS = 1_000_000


def tail(gathers: int = 0, last: int = 0) -> schema.FutureEntry:
    """A lookup whose p99 call takes 60 times its median, over 200 calls."""
    return dataclasses.replace(
        future(1, "fetch_price", 20 * MS, 1 * MS),
        location=schema.Location("app.py", 9),
        call_count=200,
        outcomes=schema.Outcomes(200, 0, 0, 0, 0),
        call_duration_ns={"p50": 5 * MS, "p95": 290 * MS, "p99": 300 * MS},
        gathers=gathers,
        gathers_last=last,
    )


def _tail_findings(f: schema.FutureEntry) -> list[Finding]:
    docs = Documents(now_ns=1000 * MS, elapsed_ns=1000 * MS, futures=[f])
    return list(lints.tail_latency(docs, Thresholds()))


def test_a_tail_the_gathers_wait_for_says_so() -> None:
    (finding,) = _tail_findings(tail(gathers=50, last=41))
    assert finding.message == (
        "`fetch_price` (app.py:9) has a slow tail: its p99 call takes 300 ms, 60 times its "
        "median of 5 ms (p95 290 ms), over 200 calls, and it finished last in 41 of the 50 "
        "gathers it was part of, so each of them waited for its tail"
    )
    assert finding.evidence["gathers"] == 50 and finding.evidence["gathers_last"] == 41


def test_a_tail_a_slower_sibling_always_outlasts_is_no_finding() -> None:
    # every gather waits for another future's call: this one's tail costs no one anything
    assert _tail_findings(tail(gathers=50, last=10)) == []
    assert _tail_findings(tail(gathers=50, last=25)) == []  # half is not most
    assert [f.kind for f in _tail_findings(tail(gathers=50, last=26))] == ["tail-latency"]


def test_a_tail_awaited_alone_is_judged_as_before() -> None:
    (finding,) = _tail_findings(tail())
    assert finding.message.endswith(
        "over 200 calls: whatever waits for several of them (a gather) waits for the slowest"
    )
    assert "gathers" not in finding.evidence


def test_too_few_gathers_to_judge_keep_the_tail_with_their_fact() -> None:
    # under 10 gathers, whether it ends last is not judged: the tail is, and the fact is told
    (finding,) = _tail_findings(tail(gathers=6, last=6))
    assert finding.message.endswith(
        "and it finished last in 6 of the 6 gathers it was part of, so each of them waited "
        "for its tail"
    )
    (finding,) = _tail_findings(tail(gathers=6, last=1))
    assert finding.message.endswith(", and it finished last in 1 of the 6 gathers it was part of")


# -- on a running program (a fake clock: the calls' durations are exact) ---------------------


class Group:
    """Calls that end together when told to: each waits for ``go`` and counts itself out."""

    def __init__(self, n: int) -> None:
        self.go, self.all_done, self.n, self.done = asyncio.Event(), asyncio.Event(), n, 0

    async def wait(self) -> None:
        await self.go.wait()
        self.done += 1
        if self.done == self.n:
            self.all_done.set()

    async def end(self, clock: FakeClock, at_ms: int, started_ns: int) -> None:
        clock.advance(started_ns + at_ms * MS - clock())
        self.go.set()
        with anyio.fail_after(5):
            await self.all_done.wait()
        await asyncio.sleep(0)  # the last call's step has returned


async def _pages(fake_clock: FakeClock, reviews_ms: int) -> list[schema.WarningEntry]:
    """20 pages, gathered at once, each of 10 price lookups (one in ten slow: 120 ms, the
    others 2 ms) and one review lookup that takes ``reviews_ms``; the warnings after."""
    pages = 20
    quick, slow, reviews = Group(pages * 9), Group(pages), Group(pages)

    @asyncflow.future(name="tail_fetch_price")
    async def fetch_price(i: int) -> int:
        await (slow if i % 10 == 3 else quick).wait()
        return i

    @asyncflow.future(name="tail_fetch_reviews")
    async def fetch_reviews() -> int:
        await reviews.wait()
        return 0

    with asyncflow.profile("tail", format="none", port=None) as prof:
        t0 = fake_clock()
        gathered = [
            asyncio.gather(fetch_reviews(), *(fetch_price(i) for i in range(10)))
            for _ in range(pages)
        ]
        await asyncio.sleep(0)  # every call waits
        for at_ms, group in sorted([(2, quick), (120, slow), (reviews_ms, reviews)]):
            await group.end(fake_clock, at_ms, t0)
        for page in gathered:
            assert len(await page) == 11
        await asyncio.sleep(0)  # the gathers are credited
        return [w for w in prof.snapshot().warnings if w.severity != "info"]


async def test_a_planted_tail_every_page_waits_for_is_named_with_its_gathers(
    fake_clock: FakeClock,
) -> None:
    warnings = await _pages(fake_clock, reviews_ms=50)
    (finding,) = [w for w in warnings if w.kind == "tail-latency"]
    assert finding.subject.label == "tail_fetch_price"
    assert "finished last in 20 of the 20 gathers it was part of" in finding.message
    assert finding.evidence["gathers"] == 20 and finding.evidence["gathers_last"] == 20


async def test_a_tail_that_a_slower_sibling_outlasts_is_quiet(fake_clock: FakeClock) -> None:
    # the same tail, but every page waits for its reviews (200 ms) anyway
    warnings = await _pages(fake_clock, reviews_ms=200)
    assert [w for w in warnings if w.kind == "tail-latency"] == [], [w.message for w in warnings]


async def test_a_healthy_gather_of_uniform_calls_is_quiet(fake_clock: FakeClock) -> None:
    group = Group(200)

    @asyncflow.future(name="tail_uniform")
    async def lookup(i: int) -> int:
        await group.wait()
        return i

    with asyncflow.profile("healthy", format="none", port=None) as prof:
        t0 = fake_clock()
        gathered = [asyncio.gather(*(lookup(i) for i in range(10))) for _ in range(20)]
        await asyncio.sleep(0)
        await group.end(fake_clock, 5, t0)
        for page in gathered:
            await page
        await asyncio.sleep(0)
        warnings = [w for w in prof.snapshot().warnings if w.severity != "info"]
        entry = next(f for f in prof.snapshot().futures.futures if f.label == "tail_uniform")
    assert warnings == [], [w.message for w in warnings]
    assert (entry.gathers, entry.gathers_last) == (20, 20)


def _late_loop(lag_p99_ms: int) -> schema.LoopEntry:
    """A loop whose heartbeats were this late at p99 (a machine short of CPU, mostly)."""
    return dataclasses.replace(
        loop_with(episodes=0),
        lag_ns={"p50": 1 * MS, "p99": lag_p99_ms * MS},
        max_lag_ns=2 * lag_p99_ms * MS,
    )


def test_a_tail_the_late_loop_explains_is_the_loops_not_the_calls() -> None:
    # On a machine short of CPU the loop wakes its tasks late: a call of a few awaits then
    # ends late by a few times the loop's lag, whatever it does. The calls did nothing
    # differently: the loop's lag is the figure to read, not a tail of this future's.
    f = tail()
    docs = Documents(1000 * MS, 1000 * MS, futures=[f], loops=[_late_loop(100)])
    assert list(lints.tail_latency(docs, Thresholds())) == []
    # a loop late by far less than the tail leaves it the call's own
    docs = Documents(1000 * MS, 1000 * MS, futures=[f], loops=[_late_loop(2)])
    assert [x.kind for x in lints.tail_latency(docs, Thresholds())] == ["tail-latency"]


def test_a_tail_of_the_first_calls_waiting_for_a_lazy_import_is_a_warm_up() -> None:
    """A service's handler imports a module on its first request (httpx does inside its first
    request): the calls in flight then all wait for it, once, and make a p99 no later call has.
    The import's line names it (info, advice to import at start-up); it is no slow tail of the
    handler's. The same time lost in a CPU-bound line, on the CPU throughout, stays one."""
    f = tail()
    for kind, tailed in (("import", False), ("cpu", True)):
        line = schema.BlockedLine(
            "/srv/app.py", 37, "item", "price = await http.get('/price')", 1, 320 * MS,
            320 * MS, 0, 320 * MS, 320 * MS, kind, 1, "fetch_price",
        )  # fmt: skip
        docs = Documents(1000 * MS, 1000 * MS, futures=[f], loops=[loop_with(line, episodes=0)])
        kinds = [x.kind for x in lints.tail_latency(docs, Thresholds())]
        assert kinds == (["tail-latency"] if tailed else []), kind
