"""The JSON endpoint, driven over real HTTP on 127.0.0.1 from a running, instrumented program."""

from __future__ import annotations

import asyncio
import gc
import socket
import threading
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Iterator
from typing import Any

import jsonschema
import orjson
import pytest

import asyncflow
from asyncflow.instrumentation import _session, loops
from asyncflow.render.report import format_duration, render_table
from asyncflow.serve import server
from asyncflow.views import documents as views
from tests.support.http import Reply, get
from tests.support.workload import workload


@pytest.fixture(autouse=True)
def _from_the_endpoint_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """HTTP served from the endpoint process, as in programs (conftest.py serves the other
    tests' endpoints on the profiler's thread)."""
    monkeypatch.setenv("ASYNCFLOW_ENDPOINT_PROCESS", "1")


@pytest.fixture
def served() -> Iterator[asyncflow.Profiler]:
    with asyncflow.profile("served", format="none", port=0, trace=True) as prof:
        asyncio.run(workload())
        yield prof


def validator(spec: dict[str, Any], component: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(
        {"$ref": f"#/components/schemas/{component}", "components": spec["components"]}
    )


def test_every_route_answers_and_matches_the_openapi_document(served: asyncflow.Profiler) -> None:
    url = served.url
    assert url is not None and url.startswith("http://127.0.0.1:")
    status, spec, headers = get(url, "/openapi.json")
    assert status == 200 and headers["Content-Type"].startswith("application/json")
    assert spec["openapi"].startswith("3.")
    jsonschema.Draft202012Validator.check_schema(spec["components"]["schemas"]["Snapshot"])
    assert set(spec["paths"]) == {route.path for route in server.ROUTES}

    _, futures, _ = get(url, "/futures")
    _, channels, _ = get(url, "/channels")
    _, streams, _ = get(url, "/streams")
    _, resources, _ = get(url, "/resources")
    labels = {f["label"] for f in futures["futures"]}
    assert {"produce", "consume"} <= labels
    # (channels and streams of earlier tests may still be alive: ids are process-wide)
    assert {"work", "mem"} <= {c["label"] for c in channels["channels"]}
    assert "numbers" in [s["label"] for s in streams["streams"]]
    paths = [route.path for route in server.ROUTES if "{id}" not in route.path]
    assert len(paths) >= 12  # and the four logs routes below
    paths += [f"/futures/{f['id']}/logs" for f in futures["futures"]]
    paths += [f"/channels/{c['id']}/logs" for c in channels["channels"]]
    paths += [f"/streams/{s['id']}/logs" for s in streams["streams"]]
    assert "gate" in [r["label"] for r in resources["resources"]]
    paths += [f"/resources/{r['id']}/logs" for r in resources["resources"]]
    media = {route.path: route.media_type for route in server.ROUTES}
    for path in paths:
        status, body, headers = get(url, path)
        assert status == 200, (path, body)
        template = path if path in spec["paths"] else "/" + path.split("/")[1] + "/{id}/logs"
        assert headers["Content-Type"] == media[template], path
        (kind,) = spec["paths"][template]["get"]["responses"]["200"]["content"]
        assert headers["Content-Type"].startswith(kind)
        ref = spec["paths"][template]["get"]["responses"]["200"]["content"][kind]
        schema = ref["schema"]
        if "$ref" in schema:
            validator(spec, schema["$ref"].rsplit("/", 1)[1]).validate(body)
            assert body.get("schema", 1) == 1


def test_documents_match_the_snapshot(served: asyncflow.Profiler) -> None:
    assert served.url is not None
    _, flow, _ = get(served.url, "/flow")
    snap = orjson.loads(orjson.dumps(served.snapshot()))
    assert flow == snap["flow"]
    edges = {(e["source"], e["target"]): e["messages"] for e in flow["edges"]}
    produce_id = next(n["id"] for n in flow["nodes"] if n["label"] == "produce")
    work = next(n["id"] for n in flow["nodes"] if n["label"] == "work")
    assert edges[(produce_id, work)] == 20
    _, status, _ = get(served.url, "/profiler_status")
    assert status["name"] == "served" and status["running"] is True
    assert status["channels"] >= 2 and status["streams"] >= 1


def test_paging_and_its_bounds(served: asyncflow.Profiler) -> None:
    url = served.url
    assert url is not None
    _, everything, _ = get(url, "/futures")
    total = everything["total"]
    assert total >= 2 and everything["limit"] == server.DEFAULT_PAGE
    _, page, _ = get(url, "/futures?limit=1&offset=1")
    assert (page["total"], page["offset"], page["limit"]) == (total, 1, 1)
    assert [f["id"] for f in page["futures"]] == [f["id"] for f in everything["futures"][1:2]]
    _, past, _ = get(url, f"/futures?offset={total}")
    assert past["futures"] == [] and past["total"] == total
    consume_id = next(f["id"] for f in everything["futures"] if f["label"] == "consume")
    _, logs, _ = get(url, f"/futures/{consume_id}/logs?limit=0")
    assert logs["calls"] == []
    _, logs, _ = get(url, f"/futures/{consume_id}/logs?limit=1")
    assert len(logs["calls"]) == 1
    _, channels, _ = get(url, "/channels")
    work = next(c for c in channels["channels"] if c["label"] == "work")
    _, logs, _ = get(url, f"/channels/{work['id']}/logs?limit={server.MAX_PAGE}")
    assert len(logs["sent_logs"]) == len(logs["received_logs"]) == 20


@pytest.mark.parametrize(
    ("path", "status", "says"),
    [
        ("/futures?limit=-1", 400, "must be 0 or more"),
        ("/futures?limit=ten", 400, "expected a whole number"),
        (f"/futures?limit={server.MAX_PAGE + 1}", 400, f"at most {server.MAX_PAGE}"),
        ("/channels?offset=1.5", 400, "expected a whole number"),
        ("/streams?sort=label", 400, "an unknown parameter for /streams"),
        ("/flow?limit=3", 400, "it takes none"),
        ("/futures/abc/logs", 400, "expected a whole number"),
        ("/futures/999999/logs", 404, "no future with id 999999"),
        ("/futures/0/logs", 404, "ids start at 1"),
        ("/channels/999999/logs", 404, "no channel"),
        ("/streams/999999/logs", 404, "no stream"),
        ("/nothing/here", 404, "no such route"),
    ],
)
def test_bad_requests_get_json_errors(
    served: asyncflow.Profiler, path: str, status: int, says: str
) -> None:
    assert served.url is not None
    got, body, headers = get(served.url, path)
    assert got == status
    assert headers["Content-Type"].startswith("application/json")
    assert body["error"]["status"] == status
    assert says in body["error"]["message"]


def test_other_methods_are_refused_as_json(served: asyncflow.Profiler) -> None:
    assert served.url is not None
    status, body, headers = get(served.url, "/futures", method="POST")
    assert status == 405 and "use GET" in body["error"]["message"]
    assert headers["Allow"] == "GET, HEAD"


def test_an_internal_error_answers_500_and_is_counted(
    served: asyncflow.Profiler, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    assert served.url is not None

    def broken(*args: object) -> object:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(views, "flow", broken)
    monkeypatch.setattr(_session.errors, "logged", set())  # (an earlier test may have logged it)
    status, body, _ = get(served.url, "/flow")
    assert status == 500 and "ZeroDivisionError: a bug" in body["error"]["message"]
    _, status_doc, _ = get(served.url, "/profiler_status")
    assert "serving /flow" in status_doc["last_internal_error"]
    # logged once, to the asyncflow logger (never a traceback on the program's stderr)
    assert "internal error in serving /flow" in caplog.text
    monkeypatch.undo()
    assert get(served.url, "/flow")[0] == 200  # and it keeps serving


def test_a_token_guards_every_route() -> None:
    with asyncflow.profile("guarded", format="none", port=0, token="s3cret") as prof:
        assert prof.url is not None
        for path in ("/futures", "/openapi.json", "/nothing"):
            status, body, headers = get(prof.url, path)
            assert status == 401 and "missing" in body["error"]["message"], path
            assert headers["WWW-Authenticate"] == "Bearer"
            status, body, _ = get(prof.url, path, token="wrong")
            assert status == 401 and "wrong" in body["error"]["message"]
        assert get(prof.url, "/futures", token="s3cret")[0] == 200
        assert get(prof.url, "/nothing", token="s3cret")[0] == 404
        _, spec, _ = get(prof.url, "/openapi.json", token="s3cret")
        assert spec["security"] == [{"bearer": []}]


def test_a_public_address_without_a_token_refuses_to_start() -> None:
    prof = asyncflow.profile("exposed", format="none", host="0.0.0.0", port=0)
    with pytest.raises(asyncflow.AsyncflowError, match=r"refusing to serve on '0.0.0.0'.*token"):
        prof.start()
    assert asyncflow.active_profiler() is None and prof.url is None


def test_a_busy_port_names_the_port_and_leaves_nothing_behind() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        before = {t.name for t in threading.enumerate()}
        prof = asyncflow.profile("clash", format="none", port=port)
        with pytest.raises(asyncflow.AsyncflowError, match=rf"port {port} .*in use.*port=0"):
            prof.start()
        assert asyncflow.active_profiler() is None
        assert prof.url is None and not prof.running
        assert {t.name for t in threading.enumerate()} == before
    with asyncflow.profile("after", format="none", port=0) as again:
        assert again.url is not None  # nothing half-started blocks the next one


def test_port_none_serves_nothing_and_url_ends_with_the_profiler() -> None:
    with asyncflow.profile("quiet", format="none", port=None) as prof:
        assert prof.url is None
        assert prof.snapshot().status.running
    with asyncflow.profile("loud", format="none", port=0) as prof:
        url = prof.url
        assert url is not None and get(url, "/profiler_status")[0] == 200
    assert prof.url is None
    with pytest.raises(OSError):
        urllib.request.urlopen(url + "/profiler_status", timeout=5)


# -- /loop -------------------------------------------------------------------------------------

BLOCK_LINE = "time.sleep(1.0)  # the blocking call /loop must point at"


@asyncflow.future(name="blocker")
async def blocker(started: threading.Event, answered: threading.Event) -> None:
    await asyncio.sleep(0)
    started.set()
    time.sleep(1.0)  # the blocking call /loop must point at
    answered.wait(10)


def _blocked_by_blocker(document: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        loop
        for loop in document["loops"]
        if loop["blocked"] and (loop["running"] or {}).get("label") == "blocker"
    ]


def test_loop_answers_while_the_loop_is_blocked_and_names_the_blocker() -> None:
    replies: list[Reply] = []
    started, answered = threading.Event(), threading.Event()

    def probe(url: str) -> None:
        started.wait(10)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # until the monitor has seen the block (~0.1 s)
            replies.append(get(url, "/loop"))
            if _blocked_by_blocker(replies[-1][1]):
                break
        answered.set()

    with asyncflow.profile("blocked", format="none", port=0, block_threshold=0.1) as prof:
        assert prof.url is not None
        assert get(prof.url, "/profiler_status")[0] == 200  # the endpoint process is up
        thread = threading.Thread(target=probe, args=(prof.url,))
        thread.start()
        asyncio.run(blocker(started, answered))
        thread.join()
        snap = prof.snapshot()
        final = snap.loop
    status, document, _ = replies[-1]
    assert status == 200 and document["block_threshold_ns"] == 100_000_000
    # (a closed loop of an earlier test may still be listed until it is garbage-collected:
    # the registry holds loops weakly)
    (loop,) = _blocked_by_blocker(document)
    assert loop["blocked"] and loop["state"] == "running"
    assert loop["running"]["label"] == "blocker"
    episode = loop["episodes"][0]
    # Answered during the block: the episode was still going on.
    assert episode["ongoing"] is True and episode["blocked_ns"] >= 100_000_000
    assert episode["call"]["label"] == "blocker" and episode["task"] is not None
    top = episode["stack"][0]
    assert top["file"] == __file__ and top["function"] == "blocker"
    assert top["code"] == BLOCK_LINE
    # Once the loop ran again the episode ended, with the whole block measured.
    assert final is not None
    (after,) = [entry for entry in final.loops if entry.id == loop["id"]]
    assert not after.blocked and after.blocked_count == 1
    assert not after.episodes[0].ongoing and after.episodes[0].blocked_ns >= 900_000_000
    # The exit report names the blocker and its line too.
    table = render_table(snap, (50.0,), 0)
    assert f"blocked {format_duration(after.episodes[0].blocked_ns)} by blocker" in table
    assert f"test_server.py:{top['line']} (blocker): {BLOCK_LINE}" in table


def test_loops_are_held_weakly(prof: asyncflow.Profiler) -> None:
    @asyncflow.future
    async def tracked() -> int:
        return 1

    loop = asyncio.new_event_loop()
    assert loop.run_until_complete(tracked()) == 1
    (record,) = [r for r in loops.loop_registry() if r.loop() is loop]
    loop.close()
    freed = threading.Event()
    weakref.finalize(loop, freed.set)
    del loop
    # Only this test's loop and record are judged (other tests' loops may come and go). The
    # profiler's thread may hold the loop a moment (its monitor's tick reads each loop it
    # watches into a local): the loop must be gone once that moment is over, not at once.
    deadline = time.monotonic() + 10
    while not freed.is_set() and time.monotonic() < deadline:
        gc.collect()
        freed.wait(0.01)
    assert freed.is_set() and record.loop() is None
    assert record not in loops.loop_registry()


def test_loop_reports_lag_and_tasks_alive() -> None:
    async def main(url: str) -> Any:
        handle = asyncflow.instrument_tasks()
        try:
            gate = asyncio.Event()
            tasks = [asyncio.create_task(gate.wait()) for _ in range(5)]
            for _ in range(1000):  # until a heartbeat came back (the monitor ticks every 25 ms)
                _, doc, _ = await asyncio.to_thread(get, url, "/loop")
                if any(loop["heartbeats"] for loop in doc["loops"]):
                    break
            gate.set()
            await asyncio.gather(*tasks)
            return doc
        finally:
            handle.undo()

    with asyncflow.profile("lag", format="none", port=0) as prof:
        assert prof.url is not None
        doc = asyncio.run(main(prof.url))
    # A loop an earlier test left for the cyclic GC is listed too (alive, never run here): this
    # test's loop is the one the monitor heard from.
    (loop,) = [loop for loop in doc["loops"] if loop["heartbeats"]]
    assert loop["heartbeats"] >= 1 and loop["lag_ns"]["p50"] >= 0
    assert loop["max_lag_ns"] >= loop["lag_ns"]["p50"]
    assert loop["tasks_alive"] >= 6  # main and the five waiting tasks
    assert loop["thread"] == "MainThread" and not loop["blocked"]
    assert loop["running"] is None or loop["running"]["label"] == "main"


def test_each_document_is_built_at_most_every_tenth_of_a_second(
    fake_clock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Served on the profiler's thread, where the fake clock is also the cache's: the window is
    # exact. (tests/serve/test_server_process.py counts the builds behind an endpoint process.)
    monkeypatch.setattr(server, "PROCESS", False)
    monkeypatch.setattr(server, "LIMITS", server.Limits(cache_cost_share=0))
    with asyncflow.profile("cached", format="none", port=0) as prof:
        assert prof.url is not None
        first = get(prof.url, "/profiler_status")[1]
        fake_clock.advance(50_000_000)
        assert get(prof.url, "/profiler_status")[1] == first  # served again, not rebuilt
        assert get(prof.url, "/profiler_status?")[1] == first
        fake_clock.advance(50_000_001)
        later = get(prof.url, "/profiler_status")[1]
        assert later["uptime_ns"] == first["uptime_ns"] + 100_000_001


def test_a_costly_document_is_served_longer(
    fake_clock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Building holds the GIL, so the program waits: a document that costs 5 ms of the
    # profiler thread's CPU is built at most every 0.5 s (1% of the program's time).
    monkeypatch.setattr(server, "PROCESS", False)
    built: list[int] = []
    real = views.flow

    def costly(*args: Any) -> Any:
        built.append(1)
        spent = time.thread_time_ns() + 5_000_000
        while time.thread_time_ns() < spent:
            pass
        return real(*args)

    monkeypatch.setattr(views, "flow", costly)
    with asyncflow.profile("costly", format="none", port=0) as prof:
        assert prof.url is not None
        get(prof.url, "/flow")
        fake_clock.advance(400_000_000)  # past 0.1 s, within 0.5 s: served again
        get(prof.url, "/flow")
        assert len(built) == 1
        fake_clock.advance(2_000_000_000)  # never longer than cache_most_seconds
        get(prof.url, "/flow")
        assert len(built) == 2


def test_tasks_route_names_what_a_live_task_waits_on() -> None:
    """A program's loop running in its own thread: /tasks reads it on that thread."""
    ready = threading.Event()
    stop: list[asyncio.AbstractEventLoop] = []
    inbox: list[asyncio.Queue[int]] = []

    async def wait_for_mail() -> None:
        await inbox[0].get()

    async def program() -> None:
        stop.append(asyncio.get_running_loop())
        inbox.append(asyncflow.instrument_queue(asyncio.Queue[int](), name="inbox"))
        with asyncflow.instrument_tasks():
            waiter = asyncio.create_task(wait_for_mail(), name="mailman")
            await asyncio.sleep(0)
            ready.set()
            await waiter

    with asyncflow.profile("tasks", format="none", port=0) as prof:
        thread = threading.Thread(target=asyncio.run, args=(program(),))
        thread.start()
        try:
            assert ready.wait(5)
            assert prof.url is not None
            status, body, _ = get(prof.url, "/tasks")
            assert status == 200, body
            (mailman,) = [t for t in body["tasks"] if t["name"] == "mailman"]
            assert mailman["state"] == "waiting"
            assert mailman["waits_on"]["description"] == "get from queue inbox"
            assert mailman["future_label"].endswith("wait_for_mail")
            assert body["consistent"] is True
            counted = [w["tasks"] for w in body["waits"] if w["label"].endswith("wait_for_mail")]
            assert counted == [1]
        finally:
            stop[0].call_soon_threadsafe(inbox[0].put_nowait, 1)
            thread.join(5)
