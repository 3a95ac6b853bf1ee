"""serve/client.py: the one fetch of an endpoint's documents that the CLI and ``asyncflow mcp``
share, and each failure it says."""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator

import pytest

from asyncflow.serve import client

ANSWERS = {
    "/doc": (200, b'{"a": 1}'),
    "/big": (200, b'{"a": "' + b"x" * 3_000_000 + b'"}'),
    "/html": (200, b"<html>hello</html>"),
    "/denied": (401, b'{"error": {"status": 401, "message": "a token is needed"}}'),
    "/broken": (500, b"<html>oops</html>"),
}


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        # (noted before the answer: the client may go on as soon as it has it)
        self.server.seen.append(self.headers.get("Authorization"))  # type: ignore[attr-defined]
        status, body = ANSWERS[self.path]
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def endpoint() -> Iterator[tuple[str, list[str | None]]]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.seen = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", server.seen  # type: ignore[attr-defined]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_a_document_is_read_with_the_token(endpoint: tuple[str, list[str | None]]) -> None:
    url, seen = endpoint
    assert client.get_json(url + "/", "/doc", "s3cret", timeout=10) == {"a": 1}
    assert seen == ["Bearer s3cret"]


def test_each_failure_is_said_in_one_line(endpoint: tuple[str, list[str | None]]) -> None:
    url, _ = endpoint
    with pytest.raises(client.FetchError) as caught:
        client.get_json(url, "/denied", timeout=10)
    assert (str(caught.value), caught.value.status) == (
        f"{url}/denied answered 401: a token is needed",
        401,
    )
    with pytest.raises(client.FetchError) as caught:
        client.get_json(url, "/broken", timeout=10, said="pid 7 (app)")
    assert str(caught.value) == "pid 7 (app): /broken answered 500: Internal Server Error"
    with pytest.raises(client.FetchError) as caught:
        client.get_json(url, "/html", timeout=10)
    assert str(caught.value) == f"{url}/html did not answer JSON: is it an asyncflow endpoint?"
    with pytest.raises(client.FetchError) as caught:
        client.get_json(url, "/big", timeout=10, most=1 << 20)
    assert str(caught.value) == f"{url}/big answered more than 1 MiB: is it an asyncflow endpoint?"


def test_nothing_listening_is_told_apart() -> None:
    with socket.socket() as sock:  # a port that was free, and is closed again
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(client.FetchError) as caught:
        client.get_json(f"http://127.0.0.1:{port}", "/doc", timeout=10)
    assert caught.value.refused
    assert str(caught.value) == f"nothing answers at http://127.0.0.1:{port}"
