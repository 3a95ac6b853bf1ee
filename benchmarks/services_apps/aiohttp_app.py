"""An aiohttp service with its own client session to an upstream.

Run it as a user would (``SERVICES_UPSTREAM`` is the upstream's unix socket):

    SERVICES_UPSTREAM=/tmp/up.sock python aiohttp_app.py --path /tmp/app.sock

Routes: ``/items/{n}`` (a GET to the upstream through the app's ``ClientSession``), ``/health``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

__all__ = ["main", "make_app"]

_SESSION = web.AppKey("session", aiohttp.ClientSession)


async def _session(app: web.Application) -> AsyncIterator[None]:
    connector = aiohttp.UnixConnector(path=os.environ.get("SERVICES_UPSTREAM", "/tmp/up.sock"))
    async with aiohttp.ClientSession(connector=connector) as session:
        app[_SESSION] = session
        yield


async def item(request: web.Request) -> web.Response:
    n = int(request.match_info["n"])
    async with request.app[_SESSION].get(f"http://upstream/price/{n}") as response:
        response.raise_for_status()
        price = (await response.json())["price"]
    return web.json_response({"item": n, "price": price})


async def health(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


def make_app() -> web.Application:
    """The application: its routes and its client session's lifetime."""
    app = web.Application()
    app.cleanup_ctx.append(_session)
    app.router.add_get("/items/{n}", item)
    app.router.add_get("/health", health)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--path", required=True, help="the unix socket to serve on")
    args = parser.parse_args()
    web.run_app(make_app(), path=args.path, access_log=None, print=None)


if __name__ == "__main__":
    main()
