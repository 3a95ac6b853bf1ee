"""Reading an endpoint's JSON documents over HTTP: one request, its failures said in one place.

``asyncflow snapshot``, ``trace`` and the other commands that read a running profiler, and
``asyncflow mcp``'s tools, fetch their documents here; each says a :class:`FetchError` in its
own words where it has more to add (a hint about the token, the profilers listed).
"""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Any

import orjson

from asyncflow.errors import AsyncflowError

__all__ = ["FetchError", "endpoint_said", "get_json"]

#: the most of an error's body read for its message (another server's error page can be big)
_ERROR_BYTES = 64 * 1024


class FetchError(AsyncflowError):
    """A document that could not be read, said in one line.

    Args:
        message: what went wrong, naming the endpoint and the path.
        status: the HTTP status the endpoint answered with, if it answered.
        refused: nothing listens at the endpoint's address (the connection was refused).
    """

    def __init__(self, message: str, status: int | None = None, refused: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.refused = refused


def endpoint_said(error: urllib.error.HTTPError) -> str:
    """What an endpoint said of a request it refused: its JSON error's message (read up to
    64 KiB), else the HTTP reason."""
    with error:
        body = error.read(_ERROR_BYTES)
    try:
        return str(orjson.loads(body)["error"]["message"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return str(error.reason)


def get_json(
    url: str,
    path: str,
    token: str | None = None,
    timeout: float = 10.0,
    most: int | None = None,
    said: str | None = None,
) -> Any:
    """``GET url + path``, parsed as JSON.

    Args:
        url: the endpoint, e.g. ``http://127.0.0.1:6780``.
        path: the route and its query, e.g. ``/snapshot``.
        token: sent as ``Authorization: Bearer <token>`` when given.
        timeout: seconds for the connection and each read.
        most: the largest answer read, in bytes (more is an error); None: any.
        said: how the messages name the endpoint (``said: path``) [``url`` + ``path``].

    Raises:
        FetchError: an HTTP error status (the endpoint's message), nothing listening, an
            unreachable address, an answer too large, or one that is not JSON.
    """
    where = f"{said}: {path}" if said is not None else f"{url.rstrip('/')}{path}"
    request = urllib.request.Request(url.rstrip("/") + path)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read() if most is None else response.read(most + 1)
    except urllib.error.HTTPError as error:
        raise FetchError(
            f"{where} answered {error.code}: {endpoint_said(error)}", status=error.code
        ) from None
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        if isinstance(reason, ConnectionRefusedError):
            raise FetchError(f"nothing answers at {url}", refused=True) from None
        raise FetchError(f"cannot reach {said or url}: {reason}") from None
    if most is not None and len(body) > most:
        raise FetchError(
            f"{where} answered more than {most >> 20} MiB: is it an asyncflow endpoint?"
        )
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        raise FetchError(f"{where} did not answer JSON: is it an asyncflow endpoint?") from None
