"""The services' upstream: a minimal HTTP/1.1 server on a unix socket, never profiled.

It answers every GET with a small JSON body and keeps connections alive, so that the services'
clients (httpx, aiohttp's ClientSession) reuse their pooled connections as they would against a
real upstream. It runs in a process of its own, whose CPU time no figure counts.

    python upstream.py SOCKET
"""

from __future__ import annotations

import asyncio
import sys

__all__ = ["main", "serve"]


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            request = await reader.readuntil(b"\r\n\r\n")
            path = request.split(b" ", 2)[1]
            body = b'{"path": "%s", "price": %d}' % (path, len(path) * 7)
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def serve(path: str) -> None:
    """Serve on the unix socket ``path`` until cancelled."""
    server = await asyncio.start_unix_server(_answer, path)
    async with server:
        await server.serve_forever()


def main() -> None:
    asyncio.run(serve(sys.argv[1]))


if __name__ == "__main__":
    main()
