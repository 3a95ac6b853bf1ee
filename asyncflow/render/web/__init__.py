"""The web page ``GET /`` serves: one self-contained HTML file, and the headers it is sent with.

The page holds no data: its script fetches the endpoint's JSON routes (same origin, with the
bearer token when the user gives one) and draws them. Nothing is fetched from anywhere else, and
the Content-Security-Policy says so: only this page's own inline script and style (by hash) run,
and only this endpoint may be fetched.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import re
from importlib import resources

__all__ = ["headers", "page"]

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
