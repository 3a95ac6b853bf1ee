"""The handles of whole-program modes for channels: ``instrument_queues()`` and
``instrument_memory_streams()`` give handles that behave alike (nest, undo once, ``with``, logs
while any handle in use asked for them)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest

import asyncflow
from asyncflow.instrumentation.memory import instrument_memory_streams
from asyncflow.schema import Snapshot

pytestmark = pytest.mark.anyio

Mode = Callable[..., Any]


async def _through_a_queue(item: str) -> None:
    q: asyncio.Queue[str] = asyncio.Queue(1)
    await q.put(item)
    assert await q.get() == item


async def _through_a_stream(item: str) -> None:
    send, receive = anyio.create_memory_object_stream[str](1)
    async with send, receive:
        await send.send(item)
        assert await receive.receive() == item


MODES: list[tuple[Mode, Callable[[str], Awaitable[None]]]] = [
    (asyncflow.instrument_queues, _through_a_queue),
    (instrument_memory_streams, _through_a_stream),
]
IDS = ["queues", "memory-streams"]


def _messages(snap: Snapshot) -> dict[str, list[str | None]]:
    """Each channel made in this file (by its first message's text), with the messages logged."""
    assert snap.channels is not None
    found: dict[str, list[str | None]] = {}
    for logs in snap.channel_logs:
        (entry,) = [c for c in snap.channels.channels if c.id == logs.channel_id]
        if entry.label.startswith("test_mode_handles.py:"):
            found[entry.label + f"#{entry.id}"] = [log.message for log in logs.sent_logs]
    return found


@pytest.mark.parametrize(("mode", "send"), MODES, ids=IDS)
async def test_a_mode_handle_is_a_context_manager_that_undoes_once(
    mode: Mode, send: Callable[[str], Awaitable[None]]
) -> None:
    with asyncflow.profile("handles", format="none") as prof:
        with mode() as handle:
            assert handle.active
            await send("inside")
        assert not handle.active
        handle.undo()  # idempotent after the with
        await send("after")
        made = _messages(prof.snapshot())
    assert list(made.values()) == [[None]]  # only the channel made inside, without logs


@pytest.mark.parametrize(("mode", "send"), MODES, ids=IDS)
async def test_logs_last_while_a_handle_that_asked_for_them_is_in_use(
    mode: Mode, send: Callable[[str], Awaitable[None]]
) -> None:
    with asyncflow.profile("handles", format="none") as prof:
        outer = mode()
        inner = mode(log_messages=True)
        await send("logged")
        inner.undo()
        inner.undo()  # undone twice: counted once
        assert outer.active and not inner.active
        await send("plain")
        outer.undo()
        await send("after")
        made = _messages(prof.snapshot())
    assert sorted(made.values(), key=str) == [["'logged'"], [None]]
