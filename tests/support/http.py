"""HTTP clients for the endpoint's tests: one over urllib, one over raw sockets."""

from __future__ import annotations

import socket
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import orjson

import asyncflow

Reply = tuple[int, Any, dict[str, str]]


def get(
    url: str, path: str, token: str | None = None, method: str = "GET", timeout: float = 10
) -> Reply:
    """Status, decoded JSON body and headers of one request."""
    request = urllib.request.Request(url + path, method=method)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return (
                response.status,
                decoded(response.read(), response.headers),
                dict(response.headers),
            )
    except urllib.error.HTTPError as error:
        with error:
            return error.code, decoded(error.read(), error.headers), dict(error.headers)


def decoded(body: bytes, headers: Any) -> Any:
    """A JSON body decoded; any other kind of body as text."""
    if headers.get("Content-Type", "").startswith("application/json"):
        return orjson.loads(body)
    return body.decode("utf-8")


Raw = tuple[int, dict[str, str], Any]


def address(prof: asyncflow.Profiler) -> tuple[str, int]:
    assert prof.url is not None
    parsed = urllib.parse.urlsplit(prof.url)
    assert parsed.hostname is not None and parsed.port is not None
    return parsed.hostname, parsed.port


def read_response(sock: socket.socket) -> Raw:
    """One HTTP response from ``sock``: status, headers (lower-cased names), the JSON body
    decoded (any other body as bytes)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed before a response: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "closed in the middle of a body"
        body += chunk
    if body and not headers.get("content-type", "").startswith("application/json"):
        return status, headers, body  # a page or text route's body, as sent
    return status, headers, orjson.loads(body) if body else None


def send(prof: asyncflow.Profiler, data: bytes) -> Raw:
    """Send raw bytes on a new connection and read one response."""
    with socket.create_connection(address(prof), timeout=10) as sock:
        sock.sendall(data)
        return read_response(sock)


def request(
    prof: asyncflow.Profiler,
    path: str,
    host: str | None = "",
    headers: dict[str, str] | None = None,
) -> Raw:
    """A GET of ``path``; ``host`` "" sends the served address, None sends no Host at all."""
    ip, port = address(prof)
    lines = [f"GET {path} HTTP/1.1"]
    if host is not None:
        lines.append(f"Host: {host or f'{ip}:{port}'}")
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    return send(prof, ("\r\n".join([*lines, "Connection: close", "", ""])).encode("latin-1"))
