"""The endpoint under abuse: each reproduction of issue 11 that used it against the program.

Requests go over raw sockets on 127.0.0.1, so that what a browser, a fuzzer or a slow client
sends (a foreign ``Host``, an ``Origin``, half a request, bytes that are not HTTP) is sent as is.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

import asyncflow
from asyncflow.instrumentation import _session
from asyncflow.serve import _protocol, server
from asyncflow.views import documents as views
from tests.support.http import Raw, address, read_response, request, send


@pytest.fixture(autouse=True)
def _from_the_endpoint_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """HTTP served from the endpoint process, as in programs (conftest.py serves the other
    tests' endpoints on the profiler's thread)."""
    monkeypatch.setenv("ASYNCFLOW_ENDPOINT_PROCESS", "1")


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server closes ``sock`` (waits at most the socket's timeout, reads all)."""
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
    return True


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@asyncflow.future
async def tracked() -> int:
    return 1


@pytest.fixture
def served() -> Iterator[asyncflow.Profiler]:
    with asyncflow.profile("hardened", format="none", port=0) as prof:
        yield prof


def assert_error(reply: Raw, status: int, says: str = "") -> dict[str, Any]:
    got, headers, body = reply
    assert got == status, body
    assert headers["content-type"].startswith("application/json")
    assert body["error"]["status"] == status
    assert says in body["error"]["message"]
    return dict(body["error"])


# -- DNS rebinding: Host and Origin ---------------------------------------------------------------


def test_a_foreign_host_is_refused_with_421(served: asyncflow.Profiler) -> None:
    # The reproduction: curl -H 'Host: evil.example:6780' http://127.0.0.1:6780/snapshot
    _, port = address(served)
    for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1.evil.example:{port}"):
        error = assert_error(request(served, "/snapshot", host), 421, "does not name")
        assert "futures" not in str(error)
    assert_error(request(served, "/snapshot", f"127.0.0.1:{port + 1}"), 421)  # wrong port
    assert_error(request(served, "/snapshot", f"localhost.:{port}"), 421)


def test_loopback_names_with_the_right_port_are_answered(served: asyncflow.Profiler) -> None:
    _, port = address(served)
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LocalHost:{port}", f"[::1]:{port}"):
        status, _, body = request(served, "/profiler_status", host)
        assert status == 200 and body["name"] == "hardened", host


def test_a_missing_duplicate_or_malformed_host_is_400(served: asyncflow.Profiler) -> None:
    assert_error(request(served, "/futures", host=None), 400)
    ip, port = address(served)
    twice = f"GET /futures HTTP/1.1\r\nHost: {ip}:{port}\r\nHost: {ip}:{port}\r\n\r\n"
    assert_error(send(served, twice.encode()), 400)
    for host in (f"{ip}:x", f"{ip}:{port}:1", "[::1", f"{ip}:{port}/a", f"{ip}:+{port}"):
        assert_error(request(served, "/futures", host), 400, "malformed Host")


def test_allowed_hosts_adds_names_and_star_allows_any() -> None:
    with asyncflow.profile("named", format="none", port=0, allowed_hosts="Profiler.LAN") as prof:
        _, port = address(prof)
        assert request(prof, "/flow", f"profiler.lan:{port}")[0] == 200
        assert_error(request(prof, "/flow", f"other.lan:{port}"), 421)
    star = {"port": 0, "allowed_hosts": ["*"], "token": "s3cret"}
    with asyncflow.profile("any", format="none", **star) as prof:
        auth = {"Authorization": "Bearer s3cret"}
        assert request(prof, "/flow", "whatever.example:1", auth)[0] == 200


def test_allowed_hosts_star_without_a_token_refuses_to_start() -> None:
    # The reproduction (issue 24, item 12): with allowed_hosts="*" and no token, a request
    # whose Host and Origin both name evil.example (a page that rebound its name to
    # 127.0.0.1) was answered 200: "*" turned the DNS-rebinding defence off. The token is
    # what still tells such a page from a client, so "*" needs one, as a public bind does.
    prof = asyncflow.profile("star", format="none", port=0, allowed_hosts="*")
    with pytest.raises(asyncflow.AsyncflowError, match=r"allowed_hosts.*\*.*token="):
        prof.start()
    assert asyncflow.active_profiler() is None and prof.url is None
    with asyncflow.profile("star", format="none", port=0, allowed_hosts="*", token="s3cret") as p:
        evil = {"Origin": "http://evil.example"}
        assert_error(request(p, "/snapshot", "evil.example", evil), 401, "missing")


def test_allowed_hosts_is_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match=r"allowed_hosts.*not a host name"):
        asyncflow.profile("bad", allowed_hosts="host:6780")
    with pytest.raises(ValueError, match=r"allowed_hosts.*expected host names"):
        asyncflow.profile("bad", allowed_hosts=5)
    monkeypatch.setenv("ASYNCFLOW_ALLOWED_HOSTS", "a.lan, [::2]")
    prof = asyncflow.profile("env")
    assert prof.options.allowed_hosts == ("a.lan", "[::2]")


def test_cross_origin_browser_requests_are_refused(served: asyncflow.Profiler) -> None:
    ip, port = address(served)
    for origin in ("http://evil.example", f"http://evil.example:{port}", "null",
                   f"https://{ip}:{port}", f"http://{ip}:{port + 1}"):  # fmt: skip
        assert_error(request(served, "/flow", headers={"Origin": origin}), 403, "cross-origin")
    for site in ("cross-site", "same-site"):
        headers = {"Sec-Fetch-Site": site}
        assert_error(request(served, "/flow", headers=headers), 403, "web page refused")
    same = {"Origin": f"http://{ip}:{port}", "Sec-Fetch-Site": "same-origin"}
    assert request(served, "/flow", headers=same)[0] == 200
    assert request(served, "/flow", headers={"Sec-Fetch-Site": "none"})[0] == 200


def test_two_authorization_headers_are_refused_whichever_comes_first() -> None:
    """A request with two tokens is refused (400), as one with two Host headers is: which of
    them a proxy in front checked is not known, and the first one used to win."""
    with asyncflow.profile("guarded", format="none", port=0, token="s3cret") as prof:
        ip, port = address(prof)
        for first, second in (("s3cret", "wrong"), ("wrong", "s3cret")):
            raw = send(
                prof,
                f"GET /flow HTTP/1.1\r\nHost: {ip}:{port}\r\nAuthorization: Bearer {first}\r\n"
                f"Authorization: Bearer {second}\r\nConnection: close\r\n\r\n".encode(),
            )
            assert_error(raw, 400, "one Authorization header, not 2")
        assert request(prof, "/flow", headers={"Authorization": "Bearer s3cret"})[0] == 200


def test_the_host_check_comes_before_the_token() -> None:
    with asyncflow.profile("guarded", format="none", port=0, token="s3cret") as prof:
        assert_error(request(prof, "/flow", "evil.example"), 421)
        auth = {"Authorization": "Bearer s3cret"}
        assert request(prof, "/flow", headers=auth)[0] == 200


# -- connections: deadlines and the cap -----------------------------------------------------------


def _limited(
    monkeypatch: pytest.MonkeyPatch, header_timeout: float, token: str | None = None
) -> Iterator[asyncflow.Profiler]:
    limits = server.Limits(header_timeout=header_timeout, response_timeout=2.0, max_connections=4)
    monkeypatch.setattr(server, "LIMITS", limits)
    with asyncflow.profile("limited", format="none", port=0, token=token) as prof:
        yield prof


@pytest.fixture
def tight(monkeypatch: pytest.MonkeyPatch) -> Iterator[asyncflow.Profiler]:
    """A profiler whose endpoint has small limits, so that tests see them without waiting."""
    yield from _limited(monkeypatch, header_timeout=0.2)


def test_idle_and_half_sent_connections_are_closed(tight: asyncflow.Profiler) -> None:
    ip, port = address(tight)
    silent = socket.create_connection((ip, port), timeout=5)
    partial = socket.create_connection((ip, port), timeout=5)
    partial.sendall(f"GET /futures HTTP/1.1\r\nHost: {ip}:{port}\r\nX-Slow: ".encode())
    kept = socket.create_connection((ip, port), timeout=5)
    kept.sendall(f"GET /flow HTTP/1.1\r\nHost: {ip}:{port}\r\n\r\n".encode())
    with silent, partial, kept:
        assert read_response(kept)[0] == 200  # answered, then idle on keep-alive
        for sock in (silent, partial, kept):
            assert closed_by_server(sock)  # within header_timeout; the 5 s bound never hit


def connect(prof: asyncflow.Profiler) -> socket.socket:
    return socket.create_connection(address(prof), timeout=10)


def get_on(sock: socket.socket, prof: asyncflow.Profiler, path: str, token: str = "") -> Raw:
    """One keep-alive GET on ``sock``, and its response."""
    ip, port = address(prof)
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {ip}:{port}\r\n{auth}\r\n".encode())
    return read_response(sock)


def hang_up(sock: socket.socket) -> None:
    """Close ``sock`` and wait until the endpoint has closed its end: it holds it no more."""
    sock.shutdown(socket.SHUT_WR)
    assert closed_by_server(sock)
    sock.close()


def endpoint_sockets(prof: asyncflow.Profiler) -> int:
    """The sockets the endpoint process holds now (those a flood of connections would add to)."""
    link = prof._server.link if prof._server is not None else None
    assert link is not None and link.process.pid is not None, "no endpoint process serves"
    folder = f"/proc/{link.process.pid}/fd"
    found = 0
    for fd in os.listdir(folder):
        with contextlib.suppress(FileNotFoundError):  # closed meanwhile
            found += os.readlink(f"{folder}/{fd}").startswith("socket:")
    return found


def serving(prof: asyncflow.Profiler, token: str = "") -> None:
    """Wait until the endpoint process serves (it starts at the first connection, which on a
    loaded machine can take seconds), and holds no connection of this call's any more."""
    with connect(prof) as sock:
        assert get_on(sock, prof, "/profiler_status", token)[0] == 200
        hang_up(sock)


@pytest.fixture
def guarded_cap(monkeypatch: pytest.MonkeyPatch) -> Iterator[asyncflow.Profiler]:
    """A cap of 4 connections and a token; no connection is closed by its deadline meanwhile."""
    yield from _limited(monkeypatch, header_timeout=60.0, token="s3cret")


def test_unauthenticated_connections_never_starve_an_authenticated_request(
    guarded_cap: asyncflow.Profiler,
) -> None:
    # The reproduction (issue 24, item 13): the cap was counted before the token was looked
    # at, so 70 idle reconnecting sockets against a cap of 64 refused every legitimate request
    # (503) for 12 s. Here 8 idle and half-sent sockets without the token against a cap of 4.
    serving(guarded_cap, "s3cret")
    base = endpoint_sockets(guarded_cap)
    idle = [connect(guarded_cap) for _ in range(8)]
    try:
        for sock in idle[::2]:
            sock.sendall(b"GET /snapshot HTTP/1.1\r\n")
        with connect(guarded_cap) as sock:
            status, _, body = get_on(sock, guarded_cap, "/flow", "s3cret")
            assert status == 200, body
            # While it holds its place, the unauthenticated ones take turns in the rest: each
            # newcomer closes the oldest of them (as its header deadline would, only sooner).
            late = [connect(guarded_cap) for _ in range(4)]
            try:
                assert [closed_by_server(s) for s in [*idle, late[0]]] == [True] * 9
                assert get_on(sock, guarded_cap, "/flow", "s3cret")[0] == 200
                assert endpoint_sockets(guarded_cap) - base == 4  # never more than the cap
            finally:
                for s in late:
                    s.close()
    finally:
        for sock in idle:
            sock.close()


@pytest.fixture
def capped(monkeypatch: pytest.MonkeyPatch) -> Iterator[asyncflow.Profiler]:
    """A cap of 4 connections, none closed by its deadline while a test runs: the test closes
    them itself (a deadline of a second let a stall of a loaded machine free a place)."""
    yield from _limited(monkeypatch, header_timeout=60.0)


def test_connections_beyond_the_cap_are_answered_503_and_closed(capped: asyncflow.Profiler) -> None:
    # The reproduction: 1,000 half-sent requests raised the program's open files from 13 to
    # 1,013. Here a cap of 4, held by four clients, and twenty half-sent requests after them.
    # It once failed on a loaded machine with a TimeoutError in recv: the endpoint process
    # starts at the first connection (seconds, under load) while the twenty waited 5 s for an
    # answer, and a held connection's one-second deadline could pass mid-test and let a later
    # one in. So: the process serves before the count begins, no deadline passes, and every
    # wait is for something the endpoint does (an answer, or its end of a socket closed).
    serving(capped)
    base = endpoint_sockets(capped)
    clients = [connect(capped) for _ in range(4)]
    try:
        for sock in clients:
            assert get_on(sock, capped, "/flow")[0] == 200  # answered: held on keep-alive
        for _ in range(16):
            with connect(capped) as sock:
                sock.sendall(b"GET /snapshot HTTP/1.1\r\n")
                status, headers, body = read_response(sock)
                assert status == 503 and headers["connection"] == "close"
                assert "holds 4 connections" in body["error"]["message"]
                assert closed_by_server(sock)
        assert endpoint_sockets(capped) - base == 4
        for sock in clients:
            assert get_on(sock, capped, "/flow")[0] == 200  # the clients were never disturbed
    finally:
        for sock in clients:
            hang_up(sock)
    # Twenty half-sent requests and no client: each newcomer closes the oldest, and the
    # endpoint never holds more than 4.
    flood = [connect(capped) for _ in range(20)]
    try:
        for sock in flood:
            sock.sendall(b"GET /snapshot HTTP/1.1\r\n")
        assert [closed_by_server(sock) for sock in flood[:16]] == [True] * 16
        assert endpoint_sockets(capped) - base == 4
    finally:
        for sock in flood[:16]:
            sock.close()
        for sock in flood[16:]:
            hang_up(sock)
    assert request(capped, "/flow")[0] == 200  # and the endpoint serves again


# -- parameters: canonical and bounded ------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ("limit=%D9%A1%D9%A2", "ASCII digits"),  # Arabic-Indic twelve
        ("limit=%2B5", "ASCII digits"),  # +5
        ("limit=1_000", "ASCII digits"),
        ("limit=%205", "ASCII digits"),
        ("limit=5%20", "ASCII digits"),
        ("limit=0x10", "ASCII digits"),
        ("limit=", "ASCII digits"),
        ("limit", "ASCII digits"),
        ("limit=1&limit=2", "given 2 times"),
        ("offset=18446744073709551616", f"at most {server.MAX_OFFSET}"),  # 2**64: was a 500
        ("offset=" + "9" * 400, f"at most {server.MAX_OFFSET}"),
        ("limit=10001", "at most 10000"),
        ("offset=-0", "must be 0 or more"),
        ("%FF=1", "unknown parameter"),
    ],
)
def test_parameters_are_ascii_digits_given_once_and_bounded(
    served: asyncflow.Profiler, query: str, says: str
) -> None:
    assert_error(request(served, f"/futures?{query}"), 400, says)


def test_ids_are_parsed_like_parameters(served: asyncflow.Profiler) -> None:
    asyncio.run(tracked())
    status, _, futures = request(served, "/futures")
    assert status == 200
    first = futures["futures"][0]["id"]
    status, _, logs = request(served, f"/futures/{first:08d}/logs?limit=01")
    assert status == 200 and logs["future_id"] == first
    assert_error(request(served, "/futures/%D9%A1/logs"), 400, "ASCII digits")
    assert_error(request(served, "/futures/18446744073709551616/logs"), 400, "at most")
    assert_error(request(served, "/futures/000/logs"), 404, "ids start at 1")


def test_zero_padded_spellings_share_one_cached_document(
    fake_clock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The reproduction: 255 GETs of /futures/1/logs?limit=00...010000 grew the program from 54
    # to 905 MiB, and each spelling was rebuilt. Now one spelling is one cache entry. (Served
    # on the profiler's thread, so that the fake clock is the cache's too.)
    monkeypatch.setattr(server, "PROCESS", False)
    monkeypatch.setattr(server, "LIMITS", server.Limits(cache_cost_share=0))
    with asyncflow.profile("hardened", format="none", port=0) as served:
        check_one_cached_document(fake_clock, served, monkeypatch)


def check_one_cached_document(
    fake_clock: Any, served: asyncflow.Profiler, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[int] = []
    real = views.futures_document

    def counting(*args: Any) -> Any:
        built.append(1)
        return real(*args)

    monkeypatch.setattr(views, "futures_document", counting)
    bodies = set()
    for zeros in range(0, 255, 15):
        status, _, body = request(served, f"/futures?limit={'0' * zeros}10&offset={'0' * zeros}0")
        assert status == 200 and body["limit"] == 10 and body["offset"] == 0
        bodies.add(orjson.dumps(body))
    assert len(built) == 1 and len(bodies) == 1
    fake_clock.advance(100_000_000)
    request(served, "/futures?limit=10")
    assert len(built) == 2  # rebuilt once its 0.1 s are over


def answer(body: bytes, fresh_ns: int = 100_000_000) -> _protocol._Answer:
    return _protocol._Answer(200, "application/json", body, fresh_ns)


def test_the_cache_is_bounded_in_entries_and_bytes() -> None:
    cache = _protocol._Cache(entries=3, size=100)
    for key in range(10):
        cache.put(key, 0, answer(b"x" * 30))
        assert len(cache) <= 3 and cache.bytes <= 100
    held = [cache.get(key, 1) for key in (7, 8, 9)]
    assert [h.answer if h else None for h in held] == [answer(b"x" * 30)] * 3
    assert cache.get(0, 1) is None
    cache.put("big", 0, answer(b"y" * 101))  # larger than the whole cache: not kept
    assert cache.get("big", 1) is None and cache.bytes == 90
    cache.put("fresh", 200_000_000, answer(b"z"))  # entries past their 0.1 s are dropped first
    assert len(cache) == 1 and cache.bytes == 1
    assert cache.get("fresh", 300_000_000) is None and cache.bytes == 0
    cache.put("unfit", 0, answer(b"w", fresh_ns=0))  # an internal error's 500 is never kept
    assert cache.get("unfit", 0) is None and len(cache) == 0


def test_the_cache_keeps_an_answer_out_of_date_for_its_stale_time() -> None:
    cache = _protocol._Cache(entries=3, size=100, stale_ns=1_000)
    cache.put("doc", 0, answer(b"x", fresh_ns=100))
    held = cache.get("doc", 99)
    assert held is not None and held.until == 100 and held.asked == 0  # fresh: 99 < until
    held = cache.get("doc", 1_099)
    assert held is not None and held.answer == answer(b"x", fresh_ns=100)  # out of date, kept
    assert cache.get("doc", 1_100) is None and cache.bytes == 0  # past its stale time: gone
    cache.put("old", 0, answer(b"y", fresh_ns=100))
    cache.put("new", 1_100, answer(b"z", fresh_ns=100))  # putting drops what is past it too
    assert len(cache) == 1 and cache.bytes == 1


# -- errors: JSON, and nothing on the program's stderr --------------------------------------------


MALFORMED = [
    b"GARBAGE-LINE-SECRET\r\n\r\n",
    b"GET /futures HTTP/1.1\r\nHost: x\r\nBad Header SECRET\r\n\r\n",
    b"GET /futures HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * 20_000 + b"\r\n\r\n",
    b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\n\r\n",
    b"GET /futures HTTP/9.9\r\nHost: x\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03SECRET\r\n\r\n",  # TLS to an HTTP port
    b"GET /futures HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
    b"GET /futures HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
]


@pytest.mark.parametrize("data", MALFORMED)
def test_malformed_requests_get_json_and_print_nothing(
    served: asyncflow.Profiler, data: bytes, capfd: pytest.CaptureFixture[str]
) -> None:
    status, headers, body = send(served, data)
    assert 400 <= status < 500, body
    assert headers["content-type"].startswith("application/json")
    assert body["error"]["status"] == status
    assert "SECRET" not in str(body)  # the request is never echoed
    request(served, "/flow")  # the next request is served: the server is fine
    out, err = capfd.readouterr()
    assert err == "" and out == ""


def test_405_says_which_methods_are_allowed(served: asyncflow.Profiler) -> None:
    ip, port = address(served)
    for method in ("POST", "PUT", "DELETE", "OPTIONS", "CONNECT", "PATCH"):
        data = f"{method} /futures HTTP/1.1\r\nHost: {ip}:{port}\r\nContent-Length: 0\r\n\r\n"
        status, headers, body = send(served, data.encode())
        assert status == 405 and "use GET" in body["error"]["message"]
        assert headers["allow"] == "GET, HEAD"


def test_a_non_utf8_authorization_header_is_401(capfd: pytest.CaptureFixture[str]) -> None:
    errors = _session.errors.count
    with asyncflow.profile("guarded", format="none", port=0, token="s3cret") as prof:
        ip, port = address(prof)
        for value in (b"Bearer \xff\xfe", b"\xff", b"Bearer s3cret\xff"):
            data = f"GET /flow HTTP/1.1\r\nHost: {ip}:{port}\r\nAuthorization: ".encode()
            assert_error(send(prof, data + value + b"\r\n\r\n"), 401, "wrong")
        status, _, body = request(
            prof, "/profiler_status", headers={"Authorization": "Bearer s3cret"}
        )
        assert status == 200 and body["internal_errors"] == errors
    assert capfd.readouterr().err == ""


def test_huge_offsets_are_no_internal_error(
    served: asyncflow.Profiler, capfd: pytest.CaptureFixture[str]
) -> None:
    errors = _session.errors.count
    for path in ("/futures?offset=18446744073709551616", "/channels?offset=1" + "0" * 30):
        assert_error(request(served, path), 400)
    status, _, body = request(served, "/profiler_status")
    assert status == 200 and body["internal_errors"] == errors
    assert capfd.readouterr().err == ""


def test_errors_never_echo_the_request(served: asyncflow.Profiler) -> None:
    # The reproduction (issue 24, item 13): error bodies quoted the request's path, parameter
    # names and values, Host, Origin, Sec-Fetch-Site and method, though docs/endpoint.md says an
    # error never echoes the request. Each request below carries the marker ECHO.
    ip, port = address(served)
    asked = [
        request(served, "/ECHO/here"),
        request(served, "/futures?ECHO=1"),
        request(served, "/futures?limit=ECHO"),
        request(served, "/futures?offset=-9ECHO"),
        request(served, "/futures/ECHO/logs"),
        request(served, "/flow", f"ECHO.example:{port}"),
        request(served, "/flow", f"{ip}:{port}/ECHO"),
        request(served, "/flow", headers={"Origin": "http://ECHO.example"}),
        request(served, "/flow", headers={"Sec-Fetch-Site": "ECHO"}),
        send(served, f"ECHO /futures HTTP/1.1\r\nHost: {ip}:{port}\r\n\r\n".encode()),
        send(served, f"PUT /ECHO HTTP/1.1\r\nHost: {ip}:{port}\r\n\r\n".encode()),
    ]
    for status, headers, body in asked:
        assert 400 <= status < 500 and body["error"]["status"] == status, body
        assert "echo" not in str(body).lower(), body
        assert headers["x-content-type-options"] == "nosniff"


def test_every_answer_says_nosniff(served: asyncflow.Profiler) -> None:
    # The reproduction (issue 24, item 13): JSON and /metrics answers carry the program's text
    # (labels, messages) but no X-Content-Type-Options, so a browser could sniff them as HTML.
    asyncio.run(tracked())
    for path in [route.path.replace("{id}", "1") for route in server.ROUTES]:
        status, headers, _ = request(served, path)
        assert status in (200, 404), path
        assert headers["x-content-type-options"] == "nosniff", path
    status, headers, _ = send(served, b"GARBAGE\r\n\r\n")  # the HTTP parser's own refusal
    assert status == 400 and headers["x-content-type-options"] == "nosniff"
