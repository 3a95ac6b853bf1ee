"""A small web crawler over a simulated site, profiled by asyncflow.

Workers take URLs from a frontier, fetch them (simulated network latency; slow pages time out
and are cancelled), parse them (a little CPU work; one page is malformed and raises) and follow
their links. Run it and read the report asyncflow prints at exit:

    python examples/crawler.py [--pages N] [--workers N] [--timeout SECONDS] [--linger SECONDS]

While it runs, the endpoint serves the live profile (``--linger`` keeps it up after the crawl so
there is time to ``curl`` it).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import random
import re
import time

import asyncflow

FETCH_TIMEOUT = 0.05
_LINK = re.compile(r'href="https://example\.test/page/(\d+)"')


class MalformedPage(Exception):
    """The page's markup could not be parsed."""


class Site:
    """A deterministic fake web site: every page links to a few others."""

    def __init__(self, pages: int, seed: int = 7, timeout: float = FETCH_TIMEOUT) -> None:
        rng = random.Random(seed)
        self.pages = pages
        self.timeout = timeout
        self.links = {p: rng.sample(range(pages), k=min(4, pages)) for p in range(pages)}
        # Most pages answer in a few ms; some take four times the timeout, and hit it.
        slow = 4 * timeout
        self.latency = {p: rng.choice([0.001, 0.002, 0.004, 0.008, slow]) for p in range(pages)}
        self.malformed = {pages // 2}

    def url(self, page: int) -> str:
        return f"https://example.test/page/{page}"


@asyncflow.future
async def fetch(site: Site, page: int) -> str:
    """Download a page (simulated)."""
    await asyncio.sleep(site.latency[page])
    links = " ".join(f'<a href="{site.url(p)}">' for p in site.links[page])
    return f"<html>{'<broken' if page in site.malformed else ''}{links}</html>"


@asyncflow.future
async def parse(body: str) -> list[int]:
    """Extract links; does a little CPU work, as real parsers do."""
    if "<broken" in body:
        raise MalformedPage("unclosed tag")
    digest = body.encode()
    for _ in range(200):
        digest = hashlib.sha256(digest).digest()
    await asyncio.sleep(0)  # parsers that yield to the loop between chunks
    return [int(page) for page in _LINK.findall(body)]


@asyncflow.future
async def crawl_one(site: Site, page: int) -> list[int]:
    """Fetch with a timeout, then parse."""
    async with asyncio.timeout(site.timeout):
        body = await fetch(site, page)
    return await parse(body)


@asyncflow.future(name="worker")
async def worker(
    site: Site, frontier: asyncio.Queue[int], seen: set[int], stats: dict[str, int]
) -> None:
    while True:
        page = await frontier.get()
        try:
            for link in await crawl_one(site, page):
                if link not in seen:
                    seen.add(link)
                    frontier.put_nowait(link)
            stats["crawled"] += 1
        except TimeoutError:
            stats["timed out"] += 1
        except MalformedPage:
            stats["malformed"] += 1
        finally:
            frontier.task_done()


async def main(pages: int, workers: int, timeout: float = FETCH_TIMEOUT) -> dict[str, int]:
    with asyncflow.instrument_tasks():  # whole-program mode too: every task is tracked
        return await crawl_site(pages, workers, timeout)


async def crawl_site(pages: int, workers: int, timeout: float = FETCH_TIMEOUT) -> dict[str, int]:
    site = Site(pages, timeout=timeout)
    frontier: asyncio.Queue[int] = asyncio.Queue()
    seen = {0}
    frontier.put_nowait(0)
    stats = {"crawled": 0, "timed out": 0, "malformed": 0}
    crew = [asyncio.create_task(worker(site, frontier, seen, stats)) for _ in range(workers)]
    await frontier.join()
    for task in crew:
        task.cancel()  # idle workers are cancelled: they show up as cancelled calls
    await asyncio.gather(*crew, return_exceptions=True)
    return stats


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < 3600:
        raise argparse.ArgumentTypeError(f"must be a number of seconds in (0, 3600), not {text!r}")
    return value


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=120, help="pages on the site (default 120)")
    parser.add_argument("--workers", type=int, default=8, help="crawler workers (default 8)")
    parser.add_argument(
        "--timeout",
        type=_seconds,
        default=FETCH_TIMEOUT,
        help=f"each fetch's timeout; slow pages take four times it (default {FETCH_TIMEOUT:g})",
    )
    parser.add_argument(
        "--linger",
        type=float,
        default=0.0,
        help="seconds to keep the endpoint up after the crawl (default 0)",
    )
    args = parser.parse_args(argv)
    # under `asyncflow run`, the command has said where the endpoint is
    hosted = asyncflow.active_profiler() is not None
    with asyncflow.profile("crawler") as prof:
        if not hosted:
            print(
                f"asyncflow: profiling 'crawler'; endpoint: {prof.url or 'not served'}", flush=True
            )
        stats = asyncio.run(main(args.pages, args.workers, args.timeout))
        print(
            f"crawled {stats['crawled']} pages, {stats['timed out']} timed out, "
            f"{stats['malformed']} malformed",
            flush=True,
        )
        if args.linger > 0:
            print(f"endpoint stays up for {args.linger:g} s: curl {prof.url}/futures", flush=True)
            time.sleep(args.linger)
    return 0


if __name__ == "__main__":
    raise SystemExit(run())
