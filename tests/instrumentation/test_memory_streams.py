"""Whole-program memory streams: every anyio memory object stream the program creates is
instrumented and labelled where it was made, as queues are under ``asyncflow run`` (issue 26)."""

from __future__ import annotations

from collections import deque
from typing import Any

import anyio
import pytest
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

import asyncflow
from asyncflow.instrumentation.memory import instrument_memory_streams
from asyncflow.schema import ChannelEntry, Snapshot

pytestmark = pytest.mark.anyio


def _streams(snapshot: Snapshot) -> dict[str, ChannelEntry]:
    assert snapshot.channels is not None
    return {c.label: c for c in snapshot.channels.channels if c.kind == "anyio.MemoryObjectStream"}


async def _pipeline() -> list[int]:
    plain: tuple[MemoryObjectSendStream[int], MemoryObjectReceiveStream[int]] = (
        anyio.create_memory_object_stream(2)  # line A
    )
    plain_send, plain_receive = plain
    typed_send, typed_receive = anyio.create_memory_object_stream[int](max_buffer_size=0)  # line B
    got: list[int] = []

    async def stage() -> None:
        async with plain_receive, typed_send:
            async for item in plain_receive:
                await typed_send.send(item * 10)

    async def sink() -> None:
        async with typed_receive:
            async for item in typed_receive:
                got.append(item)

    async with anyio.create_task_group() as tg:
        tg.start_soon(stage)
        tg.start_soon(sink)
        async with plain_send:
            for i in range(5):
                await plain_send.send(i)
    return got


def _line(marker: str) -> int:
    with open(__file__, encoding="utf-8") as source:
        for number, text in enumerate(source, 1):
            if text.rstrip().endswith(f"# {marker}"):
                return number
    raise AssertionError(marker)


async def test_every_stream_created_is_instrumented_and_labelled_where_it_was_made() -> None:
    with asyncflow.profile("streams", format="none") as prof:
        handle = instrument_memory_streams()
        try:
            assert await _pipeline() == [0, 10, 20, 30, 40]
        finally:
            handle.undo()
        streams = _streams(prof.snapshot())
    plain = streams[f"test_memory_streams.py:{_line('line A')}"]
    typed = streams[f"test_memory_streams.py:{_line('line B')}"]
    assert (plain.sent_count, plain.received_count, plain.channel_type) == (5, 5, "bounded[2]")
    assert (typed.sent_count, typed.received_count, typed.channel_type) == (5, 5, "bounded[0]")


async def test_the_programs_own_name_wins_and_undo_leaves_new_streams_alone() -> None:
    with asyncflow.profile("streams", format="none") as prof:
        handle = instrument_memory_streams()
        send, receive = anyio.create_memory_object_stream[Any](1)
        asyncflow.instrument_memory_stream(send, receive, name="jobs")
        handle.undo()
        handle.undo()  # idempotent
        later_send, later_receive = anyio.create_memory_object_stream[Any](1)
        async with send, receive:
            await send.send(1)
            assert await receive.receive() == 1
        labels = set(_streams(prof.snapshot()))
    assert "jobs" in labels
    assert not any(label.startswith("test_memory_streams.py") for label in labels)
    assert type(later_send._state.buffer) is deque  # not instrumented
    later_send.close()
    later_receive.close()
