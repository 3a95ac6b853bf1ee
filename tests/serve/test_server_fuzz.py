"""The endpoint fuzzed from its own OpenAPI document: every route and parameter, hostile values.

Hypothesis draws requests for each operation ``/openapi.json`` describes: valid values within
the documented bounds, values past them, spellings that are not canonical digits, text in any
script, raw percent-encoded bytes, repeated and unknown parameters, and foreign ``Host`` and
``Origin`` headers. Every answer must be JSON with a status the document lists for that
operation (never 500), an error document for errors and, for 200, a document that validates
against the operation's schema. Bounded: a fixed number of examples, derandomized.

While it asks, tasks are stuck on a loop of their own (a lock-order deadlock under a parent
that gathers them, a consumer on an empty queue) and the status names something not profiled,
so that ``/tasks``, ``/graph`` and ``/profiler_status`` are fuzzed with every field filled in.
(Schemathesis 4.32, run by hand on the same endpoint with ``--checks all``, passed its 2,424
cases too; it is not a test dependency.)
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import threading
import urllib.parse
from collections.abc import Iterator
from typing import Any

import jsonschema
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import asyncflow
from asyncflow.instrumentation import _session, every_loop
from tests.support.http import address, read_response
from tests.support.workload import workload


@pytest.fixture(autouse=True)
def _from_the_endpoint_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """HTTP served from the endpoint process, as in programs (conftest.py serves the other
    tests' endpoints on the profiler's thread)."""
    monkeypatch.setenv("ASYNCFLOW_ENDPOINT_PROCESS", "1")


Drawn = tuple[str, str, list[tuple[str, str]], dict[str, str]]
FUZZ = settings(
    max_examples=200,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

HOSTILE_NUMBERS = [
    "\u0661\u0662",  # Arabic-Indic twelve
    "\uff11",  # fullwidth one
    "+5",
    "-1",
    "-0",
    "1_000",
    " 5",
    "5 ",
    "0x10",
    "1e3",
    "1.0",
    "",
    "0" * 300 + "1",
    str(2**63),
    str(2**64),
    "9" * 5000,
    "NaN",
    "%00",
]


async def _stuck(ready: threading.Event, stop: asyncio.Event) -> None:
    """Tasks stuck while the fuzzer asks: two in a lock-order deadlock, a parent awaiting
    them (the task tree's awaits and awaiters), a consumer on an empty queue; so that
    ``/tasks`` and ``/graph`` carry every field (parent, awaits, awaiters, held_at, chain_calls,
    a cycle)."""
    with asyncflow.instrument_tasks(), asyncflow.instrument_locks():
        first, second = asyncio.Lock(), asyncio.Lock()
        empty: asyncio.Queue[int] = asyncflow.instrument_queue(asyncio.Queue(), name="empty")
        both = asyncio.Barrier(2)

        async def transfer(one: asyncio.Lock, other: asyncio.Lock) -> None:
            async with one:
                await both.wait()  # each holds its first lock before taking the other
                async with other:
                    pass

        async def parent() -> None:
            await asyncio.gather(transfer(first, second), transfer(second, first), empty.get())

        task = asyncio.create_task(parent())
        while not (first.locked() and second.locked()):
            await asyncio.sleep(0.001)
        ready.set()
        await stop.wait()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@contextlib.contextmanager
def _stuck_program() -> Iterator[None]:
    """Run :func:`_stuck` on a loop of its own thread until the block ends."""
    ready = threading.Event()
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    thread = threading.Thread(target=loop.run_until_complete, args=(_stuck(ready, stop),))
    thread.start()
    try:
        assert ready.wait(10), "the stuck program did not start"
        yield
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
        loop.close()


def _served() -> tuple[asyncflow.Profiler, dict[str, Any]]:
    prof = asyncflow.start("fuzzed", format="none", port=0)
    asyncio.run(workload())
    # what asyncflow could not profile (a trio run, say): ProfilerStatus.not_profiled
    every_loop.note_not_profiled("trio", "trio.run", "fuzzed: trio's scheduler has no hook")
    ip, port = address(prof)
    with socket.create_connection((ip, port), timeout=10) as sock:
        sock.sendall(f"GET /openapi.json HTTP/1.1\r\nHost: {ip}:{port}\r\n\r\n".encode())
        status, _, spec = read_response(sock)
    assert status == 200
    return prof, spec


@pytest.fixture
def profiled() -> Iterator[tuple[asyncflow.Profiler, dict[str, Any]]]:
    errors = _session.errors.count
    prof, spec = _served()
    try:
        with _stuck_program():
            yield prof, spec
    finally:
        status = prof.snapshot().status
        prof.stop()
    # nothing the fuzzer sent was an internal error (each would be counted here)
    assert status.internal_errors == errors, status.last_internal_error


def _value(schema: dict[str, Any]) -> st.SearchStrategy[str]:
    low, high = schema.get("minimum", 0), schema.get("maximum", 2**31)
    return st.one_of(
        st.integers(low, min(high, low + 50)).map(str),  # small: ids that exist, short pages
        st.integers(low, high).map(str),
        st.integers(-(2**70), 2**70).map(str),
        st.integers(0, 10**6).map(lambda n: "0" * (n % 40) + str(n)),  # zero-padded
        st.sampled_from(HOSTILE_NUMBERS),
        st.sampled_from(HOSTILE_NUMBERS),
        st.text(max_size=30),
        st.binary(max_size=20).map(lambda b: b.decode("latin-1")),
    )


def _quote(value: str) -> str:
    return urllib.parse.quote(value.encode("utf-8", "surrogatepass"), safe="")


@st.composite
def requests(draw: st.DrawFn, spec: dict[str, Any]) -> Drawn:
    """A route template, the request target, the parameters given, and extra headers."""
    template = draw(st.sampled_from(sorted(spec["paths"])))
    operation = spec["paths"][template]["get"]
    path = template
    pairs: list[tuple[str, str]] = []
    for param in operation.get("parameters", []):
        value = draw(_value(param["schema"]))
        if param["in"] == "path":
            value = value or "0"
            path = path.replace("{" + param["name"] + "}", _quote(value))
            pairs.append((param["name"], value))
        elif draw(st.booleans()):
            pairs += [(param["name"], value)] * draw(st.sampled_from([1, 1, 1, 2]))
    if draw(st.integers(0, 9)) == 0:
        pairs.append((draw(st.text(min_size=1, max_size=10)), draw(st.text(max_size=10))))
    if draw(st.integers(0, 19)) == 0:  # raw bytes, not even UTF-8
        raw = draw(st.binary(min_size=1, max_size=10))
        target = path + "?" + urllib.parse.quote_from_bytes(raw, safe="=&")
        pairs.append(("raw", repr(raw)))
    else:
        query = "&".join(f"{_quote(k)}={_quote(v)}" for k, v in pairs if k != "id")
        target = path + ("?" + query if query else "")
    headers: dict[str, str] = {}
    if draw(st.integers(0, 9)) == 0:
        headers["Origin"] = draw(st.sampled_from(["http://evil.example", "null", "https://x"]))
    if draw(st.integers(0, 9)) == 0:
        headers["Host"] = draw(
            st.sampled_from(["evil.example", "localhost", "127.0.0.1:1", "[::1", "a b"])
        )
    return template, target, pairs, headers


def assert_canonical(operation: dict[str, Any], pairs: list[tuple[str, str]]) -> None:
    """What a 200 implies: every parameter the route takes, given once, in ASCII digits, within
    the bounds the document states; nothing else."""
    params = {p["name"]: p["schema"] for p in operation.get("parameters", [])}
    names = [name for name, _ in pairs]
    assert len(names) == len(set(names)), pairs
    for name, value in pairs:
        assert name in params, pairs
        assert re.fullmatch("[0-9]+", value), pairs
        low, high = params[name].get("minimum", 0), params[name].get("maximum")
        assert low <= int(value) and (high is None or int(value) <= high), pairs


def test_every_route_answers_json_with_a_documented_status(
    profiled: tuple[asyncflow.Profiler, dict[str, Any]], capfd: pytest.CaptureFixture[str]
) -> None:
    prof, spec = profiled
    ip, port = address(prof)

    @FUZZ
    @given(data=st.data())
    def check(data: st.DataObject) -> None:
        template, target, pairs, headers = data.draw(requests(spec))
        headers.setdefault("Host", f"{ip}:{port}")  # unless a foreign one was drawn
        lines = [f"GET {target} HTTP/1.1", *(f"{k}: {v}" for k, v in headers.items())]
        with socket.create_connection((ip, port), timeout=10) as sock:
            sock.sendall("\r\n".join([*lines, "Connection: close", "", ""]).encode("latin-1"))
            status, head, body = read_response(sock)
        responses = spec["paths"][template]["get"]["responses"]
        assert str(status) in responses, (target, headers, status, body)
        (media,) = responses[str(status)]["content"]  # what the document says this answer is
        assert head["content-type"].startswith(media), (target, status, head)
        if media == "application/json":
            schema = responses[str(status)]["content"][media]["schema"]
            validator = jsonschema.Draft202012Validator(
                {**schema, "components": spec["components"]}
            )
            validator.validate(body)
        else:  # a page or text route: only its 200 is not JSON
            assert status == 200 and isinstance(body, bytes) and body
        if status == 200:
            assert headers == {"Host": f"{ip}:{port}"}  # no foreign Host or Origin answered
            assert_canonical(spec["paths"][template]["get"], pairs)
        else:
            assert body["error"]["status"] == status

    check()
    assert capfd.readouterr().err == ""


def test_bytes_that_are_not_http_get_json_or_a_closed_connection(
    profiled: tuple[asyncflow.Profiler, dict[str, Any]], capfd: pytest.CaptureFixture[str]
) -> None:
    prof, _ = profiled

    @settings(FUZZ, max_examples=100)
    @given(
        method=st.sampled_from(["GET", "HEAD", "POST", "get", "G\x00T", "", "PRI"]),
        target=st.binary(max_size=40),
        version=st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0", b"", b"HTTP/1.1 x"]),
        rest=st.binary(max_size=60),
    )
    def check(method: str, target: bytes, version: bytes, rest: bytes) -> None:
        request = method.encode() + b" /" + target + b" " + version + b"\r\n" + rest
        data = b""
        with socket.create_connection(address(prof), timeout=10) as sock:
            try:  # the server may answer and close before all of it is sent
                sock.sendall(request + b"\r\n\r\n")
                sock.shutdown(socket.SHUT_WR)  # no more comes: an incomplete request ends here
            except OSError:
                pass
            try:
                while chunk := sock.recv(65536):
                    data += chunk
            except ConnectionResetError:
                pass
        if not data:
            return  # closed without an answer: what was sent never made a request
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        assert status < 500, data
        fields = dict(line.lower().split(": ", 1) for line in lines[1:])
        assert fields["content-type"].startswith("application/json")
        if method != "HEAD":
            document = orjson.loads(body[: int(fields["content-length"])])
            assert document["error"]["status"] == status or status == 200

    check()
    assert capfd.readouterr().err == ""


def test_the_fuzzed_documents_carry_the_task_tree_the_graph_and_what_was_not_profiled(
    profiled: tuple[asyncflow.Profiler, dict[str, Any]],
) -> None:
    """What the fuzzer validates is not empty: the stuck tasks' new fields, a cycle in
    ``/graph`` and ``not_profiled`` are there, each valid against the document's schema."""
    prof, spec = profiled
    ip, port = address(prof)
    found: dict[str, Any] = {}
    for route in ("/tasks", "/graph", "/profiler_status"):
        with socket.create_connection((ip, port), timeout=10) as sock:
            sock.sendall(f"GET {route} HTTP/1.1\r\nHost: {ip}:{port}\r\n\r\n".encode())
            status, _, found[route] = read_response(sock)
        assert status == 200, (route, found[route])
        schema = spec["paths"][route]["get"]["responses"]["200"]["content"]["application/json"]
        jsonschema.Draft202012Validator(
            {**schema["schema"], "components": spec["components"]}
        ).validate(found[route])
    tasks = {task["coroutine"].rsplit(".", 1)[-1]: task for task in found["/tasks"]["tasks"]}
    assert len(tasks["parent"]["awaits"]) == 3
    stuck = [t for t in found["/tasks"]["tasks"] if t["coroutine"].endswith(".transfer")]
    assert all(len(t["held_at"]) == 1 for t in stuck)  # the first lock, taken in `async with`
    assert len(stuck) == 2 and all(t["parent"] == tasks["parent"]["name"] for t in stuck)
    assert all(tasks["parent"]["name"] in t["awaiters"] for t in stuck)
    assert all(t["chain_calls"] for t in stuck)
    (cycle,) = found["/graph"]["cycles"]
    assert sorted(cycle["tasks"]) == sorted(t["name"] for t in stuck)
    assert found["/profiler_status"]["not_profiled"] == [
        {
            "kind": "trio",
            "name": "trio.run",
            "reason": "fuzzed: trio's scheduler has no hook",
            "count": 1,
        }
    ]
