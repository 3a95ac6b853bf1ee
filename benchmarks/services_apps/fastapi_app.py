"""A FastAPI service as people write them: httpx to an upstream, aiosqlite, a semaphore pool.

Run it as a user would (``SERVICES_UPSTREAM`` is the upstream's unix socket, ``SERVICES_DB``
the SQLite file, made and filled at start-up if missing):

    SERVICES_UPSTREAM=/tmp/up.sock uvicorn fastapi_app:app --uds /tmp/app.sock --loop uvloop

Routes: ``/items/{n}`` (a permit of a 4-permit semaphore, a GET to the upstream, a query),
``/users/{n}`` (a query), ``/health``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiosqlite
import httpx
from fastapi import FastAPI, HTTPException

__all__ = ["app"]

_ROWS = 100


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    upstream = os.environ.get("SERVICES_UPSTREAM", "/tmp/upstream.sock")
    db = await aiosqlite.connect(os.environ.get("SERVICES_DB", ":memory:"))
    await db.execute("CREATE TABLE IF NOT EXISTS users (id INTEGER PRIMARY KEY, name TEXT)")
    await db.executemany(
        "INSERT OR IGNORE INTO users VALUES (?, ?)", [(i, f"user-{i}") for i in range(_ROWS)]
    )
    await db.commit()
    transport = httpx.AsyncHTTPTransport(uds=upstream)
    async with httpx.AsyncClient(transport=transport, base_url="http://upstream") as client:
        app.state.client = client
        app.state.db = db
        app.state.pool = asyncio.Semaphore(4)
        try:
            yield
        finally:
            await db.close()


app = FastAPI(lifespan=lifespan)


async def _user(n: int) -> dict[str, Any]:
    async with app.state.db.execute("SELECT id, name FROM users WHERE id = ?", (n,)) as rows:
        row = await rows.fetchone()
    if row is None:
        raise HTTPException(status_code=404, detail=f"no user {n}")
    return {"id": row[0], "name": row[1]}


@app.get("/items/{n}")
async def item(n: int) -> dict[str, Any]:
    async with app.state.pool:
        response = await app.state.client.get(f"/price/{n}")
    response.raise_for_status()
    return {"item": n, "price": response.json()["price"], "owner": await _user(n % _ROWS)}


@app.get("/users/{n}")
async def user(n: int) -> dict[str, Any]:
    return await _user(n % _ROWS)


@app.get("/health")
async def health() -> dict[str, bool]:
    return {"ok": True}
