"""The web page ``GET /`` serves: one self-contained HTML file, and the headers it is sent with.

The page holds no data: its script fetches the endpoint's JSON routes (same origin, with the
bearer token when the user gives one) and draws them. Nothing is fetched from anywhere else, and
the Content-Security-Policy says so: only this page's own inline script and style (by hash) run,
and only this endpoint may be fetched.

The page also opens a recording (``record=``): one the user picks or drops on it, or the one
``asyncflow replay FILE --web`` serves (:func:`serve_recording`) at ``/recording``, which the
page reads when its address has ``?recording``; it decompresses and replays it in the browser.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import http.server
import re
import threading
from importlib import resources

__all__ = ["headers", "page", "serve_recording"]

_MEDIA_TYPE = "text/html; charset=utf-8"


@functools.cache
def page() -> bytes:
    """The page, as served (read once from the package)."""
    return resources.files(__package__).joinpath("page.html").read_bytes()


def _hashes(tag: str) -> str:
    """The CSP sources allowing each inline ``<tag>`` element of the page, by content hash."""
    found = re.findall(rb"<" + tag.encode() + rb">(.*?)</" + tag.encode() + rb">", page(), re.S)
    return " ".join(
        f"'sha256-{base64.b64encode(hashlib.sha256(body).digest()).decode()}'" for body in found
    )


@functools.cache
def headers() -> dict[str, str]:
    """The response headers of the page: its media type, a strict Content-Security-Policy, and
    no caching, framing, sniffing or referrer."""
    policy = "; ".join(
        (
            "default-src 'none'",
            f"script-src {_hashes('script')}",
            f"style-src {_hashes('style')}",
            "connect-src 'self'",
            "img-src 'self' data:",  # the page's icon is none, said as data: (no /favicon.ico)
            "base-uri 'none'",
            "form-action 'none'",
            "frame-ancestors 'none'",
        )
    )
    return {
        "Content-Type": _MEDIA_TYPE,
        "Content-Security-Policy": policy,
        "X-Content-Type-Options": "nosniff",
        "X-Frame-Options": "DENY",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-store",
    }


class _RecordingHandler(http.server.BaseHTTPRequestHandler):
    """``GET /``: the page; ``GET /recording``: the recording's bytes; anything else: 404."""

    server: _RecordingServer

    def do_GET(self) -> None:
        path = self.path.partition("?")[0]
        status, sent = 200, {"Cache-Control": "no-store"}
        if path == "/":
            body, sent = page(), headers()
        elif path == "/recording":
            body = self.server.recording
            sent["Content-Type"] = "application/octet-stream"
        else:
            status, body = 404, b"not found: this server serves / and /recording\n"
            sent["Content-Type"] = "text/plain; charset=utf-8"
        self.send_response(status)
        for name, value in sent.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass  # the terminal shows the address, not every request


class _RecordingServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, recording: bytes, host: str, port: int) -> None:
        self.recording = recording
        super().__init__((host, port), _RecordingHandler)


def serve_recording(
    recording: bytes, host: str = "127.0.0.1", port: int = 0
) -> tuple[http.server.ThreadingHTTPServer, str]:
    """Serve the page over ``recording`` (a recording file's bytes) on a thread of its own.

    Returns the server (``shutdown()`` stops it) and the page's address, which opens the
    recording at its first moment (add ``&at=SECONDS`` for another).
    """
    server = _RecordingServer(recording, host, port)
    threading.Thread(target=server.serve_forever, name="asyncflow-replay-web", daemon=True).start()
    bound_host, bound_port = server.server_address[:2]
    return server, f"http://{bound_host!s}:{bound_port}/?recording"
