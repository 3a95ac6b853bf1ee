"""Program text that is not valid UTF-8 (issue 24, item 8) in every document and export.

``os.fsdecode(b"caf\\xe9.txt")`` is ``"caf\\udce9.txt"``: a lone surrogate, which no UTF-8 encoder
takes. A label, task name, file name or logged value holding one made ``/futures``,
``/channels``, ``/flow``, ``/snapshot``, ``/metrics`` (and ``/tasks`` for a task name) answer 500
for the rest of the run, and ``format="json"`` wrote no report. Such a character is written as
its escape, ``\\udce9``, in every document and export.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

import asyncflow
from asyncflow import schema
from asyncflow.render import prometheus, trace
from asyncflow.render.reporters import figures_of
from asyncflow.schema import Snapshot

BAD = os.fsdecode(b"caf\xe9.txt")
#: how BAD reads in every document (the JSON string holds a backslash, then "udce9")
SHOWN = "caf\\udce9.txt"


@pytest.fixture(autouse=True)
def _from_the_endpoint_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCFLOW_ENDPOINT_PROCESS", "1")


def test_bad_is_what_a_file_name_gives() -> None:
    assert BAD == "caf\udce9.txt"
    with pytest.raises(UnicodeEncodeError):
        BAD.encode("utf-8")


def test_dumps_writes_a_lone_surrogate_as_its_escape() -> None:
    document = {"label": BAD, BAD: [BAD, ("x", 1)], 5: schema.ErrorInfo(400, BAD)}
    data = schema.dumps(document)
    assert orjson.loads(data) == {
        "label": SHOWN,
        SHOWN: [SHOWN, ["x", 1]],
        "5": {"status": 400, "message": SHOWN},
    }
    assert orjson.loads(schema.dumps(document, pretty=True)) == orjson.loads(data)
    assert schema.dumps({"label": "café"}) == '{"label":"café"}'.encode()  # the common path
    with pytest.raises(TypeError):
        schema.dumps({"not": object()})  # anything else orjson refuses is still refused


def strings(document: Any) -> Iterator[str]:
    """Every string a decoded JSON document holds, keys too."""
    if isinstance(document, str):
        yield document
    elif isinstance(document, dict):
        for key, value in document.items():
            yield key
            yield from strings(value)
    elif isinstance(document, list):
        for value in document:
            yield from strings(value)


def get(url: str, path: str) -> tuple[int, bytes, str]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url + path, timeout=10) as response:
            return response.status, response.read(), response.headers["Content-Type"]
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.read(), error.headers["Content-Type"]


Named = Callable[[asyncio.Queue[str], asyncio.Event], Coroutine[Any, Any, str]]


def make_named() -> Named:
    """A future named BAD, made per test: a module-level one would live on in the futures of
    every later test's profile (whose own orjson.dumps of a snapshot would then fail)."""

    @asyncflow.future(name=BAD, log_result=True)
    async def named(q: asyncio.Queue[str], gate: asyncio.Event) -> str:
        await q.put(BAD)
        item = await q.get()
        await gate.wait()
        return item

    return named


ROUTES = [
    "/profiler_status",
    "/futures",
    "/channels",
    "/flow",
    "/warnings",
    "/tasks",
    "/loop",
    "/user_metrics",
    "/snapshot",
    "/metrics",
    "/trace",
]


@pytest.fixture
def answers(tmp_path: Path) -> Iterator[tuple[dict[str, tuple[int, bytes, str]], Path]]:
    """Every route's answer while a task named BAD waits; and the JSON report's path."""
    got: dict[str, tuple[int, bytes, str]] = {}
    report = tmp_path / "report.json"
    options: dict[str, Any] = {"port": 0, "trace": True, "output": str(report)}
    with asyncflow.profile(BAD, format="json", **options) as prof:
        assert prof.url is not None
        url = prof.url

        async def main() -> None:
            asyncflow.instrument_tasks()
            q: asyncio.Queue[str] = asyncflow.instrument_queue(
                asyncio.Queue(), name=BAD, log_messages=True
            )
            asyncflow.value("file", BAD)
            gate = asyncio.Event()
            task = asyncio.create_task(make_named()(q, gate), name=BAD)
            while q.qsize() or not task.get_coro().cr_await:  # type: ignore[union-attr]
                await asyncio.sleep(0)
            for path in ROUTES:  # while the task named BAD is alive
                got[path] = await asyncio.to_thread(get, url, path)
            for kind in ("future", "channel"):  # the logs of the one named BAD
                status, body, _ = got[f"/{kind}s"]
                entries = orjson.loads(body)[f"{kind}s"] if status == 200 else []
                for entry in entries:
                    if entry["label"] == SHOWN:
                        path = f"/{kind}s/{entry['id']}/logs"
                        got[f"/{kind}s/logs"] = await asyncio.to_thread(get, url, path)
            gate.set()
            await task

        asyncio.run(main())
    yield got, report


def test_every_route_answers_with_the_text_escaped(
    answers: tuple[dict[str, tuple[int, bytes, str]], Path],
) -> None:
    got = answers[0]
    assert sorted(got) == sorted([*ROUTES, "/futures/logs", "/channels/logs"])
    for path, (status, body, media) in got.items():
        assert status == 200, (path, body)
        text = body.decode("utf-8")  # valid UTF-8
        if media.startswith("application/json"):
            found = set(strings(orjson.loads(body)))
            assert SHOWN in found or path in ("/loop", "/warnings"), path
        else:
            assert path == "/metrics"
            # a Prometheus label value escapes the backslash once more
            assert 'label="caf\\\\udce9.txt"' in text
            assert 'name="caf\\\\udce9.txt"' in text  # the profile's, in asyncflow_info
    futures = orjson.loads(got["/futures"][1])["futures"]
    assert any(f["label"] == SHOWN for f in futures)
    channels = orjson.loads(got["/channels"][1])["channels"]
    assert any(c["label"] == SHOWN for c in channels)
    tasks = orjson.loads(got["/tasks"][1])["tasks"]
    assert any(t["name"] == SHOWN for t in tasks)
    messages = list(strings(orjson.loads(got["/channels/logs"][1])))
    assert repr(BAD) in messages  # the message's repr (which escapes it already)
    values = list(strings(orjson.loads(got["/user_metrics"][1])))
    assert SHOWN in values  # asyncflow.value("file", BAD)
    assert orjson.loads(got["/profiler_status"][1])["name"] == SHOWN
    events = orjson.loads(got["/trace"][1])
    assert events["metadata"]["asyncflow"]["name"] == SHOWN


def test_the_json_report_is_written(
    answers: tuple[dict[str, tuple[int, bytes, str]], Path],
) -> None:
    report = answers[1]
    document = orjson.loads(report.read_bytes())
    snapshot = schema.load(Snapshot, document)
    assert snapshot.status.name == SHOWN
    assert any(f.label == SHOWN for f in snapshot.futures.futures)


def test_prometheus_text_and_its_textfile(tmp_path: Path) -> None:
    with asyncflow.profile(BAD, format="none", port=None) as prof:
        asyncio.run(make_named()(asyncio.Queue(), _set_event()))
        final = prof.snapshot()
    text = prometheus.render(figures_of(final))
    text.encode("utf-8")  # valid: the one place a Prometheus label is written escapes it
    assert 'name="caf\\\\udce9.txt"' in text
    path = tmp_path / "asyncflow.prom"
    reporter = prometheus.TextfileReporter(str(path), interval=0.05)
    reporter.close(figures_of(final))
    assert 'name="caf\\\\udce9.txt"' in path.read_text("utf-8")


def _set_event() -> asyncio.Event:
    event = asyncio.Event()
    event.set()
    return event


def test_a_trace_file_is_valid_json(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    with asyncflow.profile(BAD, format="none", port=None, trace=str(path)):

        async def main() -> None:
            q: asyncio.Queue[str] = asyncflow.instrument_queue(asyncio.Queue(), name=BAD)
            await make_named()(q, _set_event())

        asyncio.run(main())
    document = orjson.loads(path.read_bytes())
    assert document["metadata"]["asyncflow"]["name"] == SHOWN
    assert trace.render(document) == path.read_bytes() or document  # readable as it is
    names = {e["name"] for e in document["traceEvents"]}
    assert SHOWN in names  # the polls of the future named BAD


def test_otel_attributes_are_valid_utf8() -> None:
    pytest.importorskip("opentelemetry.sdk.metrics")
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from asyncflow.render import otel

    reader = InMemoryMetricReader()
    reporter = otel.OtelReporter(meter_provider=MeterProvider(metric_readers=[reader]))
    done = threading.Event()
    with asyncflow.profile("otel", format="none", port=None, reporters=[reporter]):
        asyncio.run(make_named()(asyncio.Queue(), _set_event()))
        done.set()
        data = reader.get_metrics_data()
    assert data is not None
    labels = set()
    for resource_metrics in data.resource_metrics:
        for scope in resource_metrics.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    for value in (point.attributes or {}).values():
                        # an OTLP exporter encodes every attribute as UTF-8
                        str(value).encode("utf-8")
                        labels.add(value)
    assert SHOWN in labels


def test_the_registry_lists_a_profiler_whose_name_is_not_utf8() -> None:
    # `asyncflow ps` reads these files: a name that is not UTF-8 left the profiler unlisted.
    from asyncflow.serve import registry

    registration = registry.register(BAD, "http://127.0.0.1:1", False)
    assert registration is not None
    try:
        assert SHOWN in [entry.name for entry in registry.entries()]
    finally:
        registration.remove()
