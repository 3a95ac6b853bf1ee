"""Message lineage as documents: each path's end-to-end percentiles, its slowest messages' hops."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from asyncflow import stats
from asyncflow.instrumentation import lineage as _lineage
from asyncflow.instrumentation.lineage import ChainReading
from asyncflow.schema import LineageHop, LineageMessage, LineagePath, LineageTail
from asyncflow.views.paging import at_most

__all__ = ["ChainReading", "dominant_hop", "dropped", "lineage_paths", "recent_chains"]

#: paths listed at most (the most followed first)
PATHS_SHOWN = 50


def lineage_paths(
    futures: Mapping[int | None, str], channels: Mapping[int, str], qs: Sequence[float]
) -> list[LineagePath]:
    """Every path the sampled messages went, most messages first.

    Args:
        futures: future id -> label (None: code outside any tracked call).
        channels: channel id -> label, and minus a stream's id -> the stream's label.
        qs: the percentiles to give.
    """
    out: list[LineagePath] = []
    for p in _lineage.paths()[:PATHS_SHOWN]:
        # a negative origin is a stream's (its items begin the way), named like a channel
        origin = channels.get(p.origin, "?") if p.origin is not None and p.origin < 0 else None
        names = [origin or futures.get(p.origin, "?")] + [
            _stage_name(futures, f, by) for f, by in zip(p.stages, p.senders, strict=True)
        ]
        chans = [channels.get(c, f"channel {c}") for c in p.channels]
        n = max(1, p.messages)

        def hop(
            i: int, duration: int, busy: int, names: list[str] = names, chans: list[str] = chans
        ) -> LineageHop:
            if i % 2 == 0:
                return LineageHop("channel", chans[i // 2], duration)
            return LineageHop("stage", names[i // 2 + 1], duration, busy if busy >= 0 else None)

        mean = [
            hop(i, total // n, p.busy_sums[i] // n if i % 2 else -1)
            for i, total in enumerate(p.hop_sums)
        ]
        slowest = [
            LineageMessage(
                end_to_end_ns=m.end_to_end_ns,
                sent_ns=m.sent_ns,
                hops=[hop(i, h.duration_ns, h.busy_ns) for i, h in enumerate(m.hops)],
            )
            for m in p.slowest
        ]
        # the flow graph's nodes along the way (as documents.flow names them)
        if p.origin is not None and p.origin < 0:
            nodes = [f"stream:{-p.origin}"]
        else:
            nodes = [_future_node(p.origin)]
        for channel, stage in zip(p.channels, p.stages, strict=True):
            nodes += [f"channel:{channel}", _future_node(stage)]
        path = LineagePath(
            label=" → ".join(names),
            stages=names,
            channels=chans,
            messages=p.messages,
            end_to_end_ns=at_most(stats.percentiles(p.end_to_end_hist, qs), p.max_ns),
            max_end_to_end_ns=p.max_ns,
            mean_hops=mean,
            slowest=slowest,
            node_ids=nodes,
        )
        found = dominant_hop(path, path.end_to_end_ns.get("p99", p.max_ns))
        if found is not None:
            index, said, share, spent = found
            tail = LineageTail(index, said, round(100 * share), spent)
            path = dataclasses.replace(path, tail=tail)
        out.append(path)
    return out


def _stage_name(futures: Mapping[int | None, str], stage: int | None, by: int | None) -> str:
    """A stage's name: ``dispatch → work`` when ``dispatch`` received the message and handed it
    to ``work``, a task of its own, that sent a derived one on (the hop's time is mostly
    ``work``'s, and not only ``dispatch``'s)."""
    name = futures.get(stage, "?")
    return name if by == stage else f"{name} → {futures.get(by, '?')}"


def _future_node(future_id: int | None) -> str:
    """A future's node id in the flow graph (code outside tracked calls is one node)."""
    return f"future:{future_id}" if future_id is not None else "future:untracked"


def recent_chains(after: int) -> list[ChainReading]:
    """The sampled messages that went their whole way lately, numbered past ``after`` (for the
    trace's arrow chains)."""
    return _lineage.recent(after)


def dropped() -> int:
    """Sampled messages whose lineage was let go: a bounded table was full."""
    return _lineage.dropped()


def _hop_name(i: int, h: LineageHop, path: LineagePath) -> str:
    """Hop ``i`` of the path (channel, stage, channel...) in words."""
    if h.kind == "stage":
        if h.busy_ns is None or h.duration_ns <= 0:
            return f"in `{h.name}`"
        if 2 * h.busy_ns < h.duration_ns:
            return f"in `{h.name}`, waiting on something inside it"
        return f"in `{h.name}`, running"
    receiver = path.stages[i // 2 + 1] if i // 2 + 1 < len(path.stages) else "?"
    return f"waiting in `{receiver}`'s input queue `{h.name}`"


def dominant_hop(path: LineagePath, tail_ns: int) -> tuple[int, str, float, int] | None:
    """The hop where the path's tail (its sampled messages at or past ``tail_ns``) spent most
    of its time: (its index among the hops, what it was in words, its share of those messages'
    time, its mean time in them)."""
    tail = [m for m in path.slowest if m.end_to_end_ns >= tail_ns] or path.slowest[:1]
    if not tail:
        return None
    sums: dict[int, int] = {}
    whole = 0
    for m in tail:
        whole += m.end_to_end_ns
        for i, h in enumerate(m.hops):
            sums[i] = sums.get(i, 0) + h.duration_ns
    if whole <= 0 or not sums:
        return None
    i, spent = max(sums.items(), key=lambda kv: kv[1])
    return i, _hop_name(i, tail[0].hops[i], path), spent / whole, spent // len(tail)
