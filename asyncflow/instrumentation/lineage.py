"""Message lineage: which timed message a stage sent because of which one it received.

Only the timed sample is followed (see ``channels``): a channel's timed receive hands its message's
chain to the receiving holder (the tracked call running the receive, else the task), and that
holder's next timed send carries the chain on into the next channel. So that the next send is
timed, a timed receive asks the channels its stage sent into before to time their next send, and
its own channel to time its next receive (a holder that receives again without sending ends its
chain there: a sink, or a stage that dropped the message). The untimed path is the channels' own:
nothing here runs for a message that is not timed.

A chain that ends is appended to a bounded buffer; the cold side (:func:`paths`) folds the
buffer into one figure per path (channel, stage, channel...): an end-to-end histogram, the hops'
sums, and the slowest few messages with their hops. Every table is bounded; what a full one lets
go is counted (``dropped``).

The program says what the inference cannot see with :func:`derive`: a message made from another
by a different task, or by a call that received several.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

from asyncflow.instrumentation import _session
from asyncflow.instrumentation import futures as _futures
from asyncflow.stats import Histogram, new_histogram
from asyncflow.stats import record as _record_ns

__all__ = [
    "MAX_HOPS",
    "MAX_OPEN",
    "MAX_PATHS",
    "RECENT_KEPT",
    "SLOWEST_KEPT",
    "ChainReading",
    "HopReading",
    "MessageReading",
    "PathReading",
    "derive",
    "dropped",
    "fold",
    "paths",
    "recent",
    "reset",
    "sizes",
]

#: holders with a received message they have not sent on yet
MAX_OPEN = 1024
#: chained messages sent and not received yet
MAX_IN_FLIGHT = 4096
#: items remembered for derive(), by id: the last received and the last sent
MAX_ITEMS = 1024
#: ended chains waiting for the cold side to fold them
MAX_ENDED = 8192
#: distinct paths; a chain of a path past them is dropped (counted)
MAX_PATHS = 100
#: channels a chain goes through at most (a message that goes round a loop of stages)
MAX_HOPS = 16
#: slowest messages kept per path, with their hops
SLOWEST_KEPT = 5
#: channels each sending stage is remembered to send into
_OUTPUTS_KEPT = 8


class _Chain:
    """One sampled message's way so far: where it began and each channel it went through.

    ``hops`` holds per channel (channel id, receiver's future id, sent at, received at, stage
    busy at the receive, stage time, stage busy, receiver's call id, the future id that sent it
    on): the stage's time and busy part are filled when the receiving holder sends on (-1 until
    then); the last is the receiver's unless derive() handed the message to another task.
    """

    __slots__ = ("counted", "forked", "hops", "origin", "origin_call", "parent", "sent_ns")

    def __init__(self, origin: int | None, sent_ns: int, origin_call: int | None) -> None:
        self.origin = origin
        self.sent_ns = sent_ns
        self.origin_call = origin_call  # the call that sent it first (for the trace's arrows)
        self.hops: list[list[Any]] = []
        #: derive() carried it on in a copy: its own end (at its receiver) is not a path's
        self.forked = False
        #: the chain derive() copied this one from, until this one is folded
        self.parent: _Chain | None = None
        #: what folding it added to its path (taken out if a copy made later is folded too)
        self.counted: _Counted | None = None

    def fork(self) -> _Chain:
        """A copy that derive() carries on. The receiver may end this one meanwhile, and the
        cold side fold it before it is marked forked: the copy's fold then takes it out."""
        self.forked = True
        copy = _Chain(self.origin, self.sent_ns, self.origin_call)
        copy.hops = [list(h) for h in self.hops]
        copy.parent = self
        return copy


# the hot side's tables; plain dicts (insertion-ordered: the oldest goes first when full), each
# step atomic under the GIL
_open: dict[int, tuple[_Chain, Any]] = {}  # holder -> (chain, input channel's stats)
_in_flight: dict[tuple[int, int], _Chain] = {}  # (channel id, msg_id) -> chain
_received_items: dict[int, tuple[int, _Chain]] = {}  # id(item) -> (holder, chain)
_sent_items: dict[int, tuple[int, int]] = {}  # id(item) -> (channel id, msg_id)
_derived: dict[int, _Chain] = {}  # id(item) about to be sent -> the chain it goes on
_outputs: dict[int | None, dict[int, Any]] = {}  # future id -> channel id -> stats
_receivers: set[int] = set()  # futures seen receiving: their sends are mid-path
_ended: deque[_Chain] = deque()
_dropped = [0]


def _holder(call_id: int | None) -> int:
    """The call receiving or sending (its id), else the task (minus its id), else the thread."""
    if call_id is not None:
        return call_id
    try:
        task = asyncio.current_task()
    except RuntimeError:
        task = None
    return -id(task) if task is not None else -threading.get_ident()


def _busy_now(now: int) -> int:
    r = _running_call()
    if r is None:
        return -1
    start = r.start
    return int(r.busy + (now - start if start else 0))


def _running_call() -> Any:
    return _futures.running_call_here()


def _put(table: dict[Any, Any], key: Any, value: Any, bound: int) -> Any:
    """Set ``table[key]``; past ``bound``, the oldest entry goes: returned (None: none went)."""
    table[key] = value
    if len(table) > bound:
        # another thread may take it meanwhile
        with contextlib.suppress(KeyError, StopIteration, RuntimeError):
            return table.pop(next(iter(table)))
    return None


def _end(chain: _Chain) -> None:
    """The chain's message went no further: hand it to the cold side."""
    if chain.hops:
        if len(_ended) >= MAX_ENDED:
            _dropped[0] += 1
            return
        _ended.append(chain)


def sent(stats: Any, channel_id: int, msg_id: int, item: Any, now: int, by: Any) -> None:
    """A timed send (the caller checked that a profiler listens): carry on the chain of the
    message the sending holder received last, or begin one."""
    call_id, future_id = by
    holder = _holder(call_id)
    chain = _derived.pop(id(item), None) if _derived else None
    if chain is not None:
        opened = None
    else:
        opened = _open.pop(holder, None) if _open else None
        if opened is not None:
            chain = opened[0]
    if chain is not None:
        if len(chain.hops) >= MAX_HOPS:
            _dropped[0] += 1
            chain = None
        else:
            last = chain.hops[-1]
            busy = _busy_now(now)
            last[5] = now - last[3]
            last[6] = busy - last[4] if busy >= 0 and last[4] >= 0 else -1
            if future_id != last[1]:  # derived, sent on by another task: the hop is theirs
                last[6], last[8] = -1, future_id  # (whose busy parts do not subtract)
    if chain is None:
        if future_id is not None and future_id in _receivers:
            # a stage whose input was not followed: its sends are the middle of a path
            chain = None
        else:
            chain = _Chain(future_id, now, call_id)
    outputs = _outputs.get(future_id)
    if outputs is None and len(_outputs) < MAX_OPEN:
        outputs = _outputs[future_id] = {}
    if outputs is not None and channel_id not in outputs and len(outputs) < _OUTPUTS_KEPT:
        outputs[channel_id] = stats
    if chain is not None:
        if _put(_in_flight, (channel_id, msg_id), chain, MAX_IN_FLIGHT) is not None:
            _dropped[0] += 1  # a message in flight for long: its channel is not read
        _put(_sent_items, id(item), (channel_id, msg_id), MAX_ITEMS)


def received(
    stats: Any,
    channel_id: int,
    msg_id: int,
    item: Any,
    sent_at: int,
    sender: tuple[int | None, int | None],
    now: int,
    by: Any,
) -> None:
    """A timed receive: the message's chain goes to the receiving holder, whose previous one
    (received and never sent on) ends."""
    call_id, future_id = by
    holder = _holder(call_id)
    previous = _open.pop(holder, None) if _open else None
    if previous is not None:
        _end(previous[0])
    chain = _in_flight.pop((channel_id, msg_id), None)
    if _sent_items.get(id(item)) == (channel_id, msg_id):
        del _sent_items[id(item)]  # its id may be another message's soon
    if chain is None:
        sender_call, sender_future = sender
        if sender_future is not None and sender_future in _receivers:
            return  # the middle of a path whose beginning was not followed
        chain = _Chain(sender_future, sent_at, sender_call)
    chain.hops.append(
        [channel_id, future_id, sent_at, now, _busy_now(now), -1, -1, call_id, future_id]
    )
    oldest = _put(_open, holder, (chain, stats), MAX_OPEN)
    if oldest is not None:  # a holder that has not sent on for long: its message ends there
        _end(oldest[0])
    _put(_received_items, id(item), (holder, chain), MAX_ITEMS)
    _stage(future_id)
    # and its next receive: if it receives again before it sends, the message ends here
    if stats.next_recv > stats.taken + 1:
        stats.next_recv = stats.taken + 1


def item(stream_id: int, item: Any, began: int, now: int) -> None:
    """A timed item of a stream (``asyncflow.stream``), handed to its consumer, who waited for
    it since ``began``: a message's way begins there (the stream is its source), and goes on
    with the consumer's next send."""
    r = _running_call()
    call_id, future_id = (None, None) if r is None else (r.call_id, r.future.id)
    holder = _holder(call_id)
    previous = _open.pop(holder, None) if _open else None
    if previous is not None:
        _end(previous[0])
    chain = _Chain(-stream_id, began, None)  # a stream's id, negative: not a future's
    chain.hops.append(
        [-stream_id, future_id, began, now, _busy_now(now), -1, -1, call_id, future_id]
    )
    oldest = _put(_open, holder, (chain, None), MAX_OPEN)
    if oldest is not None:
        _end(oldest[0])
    _put(_received_items, id(item), (holder, chain), MAX_ITEMS)
    _stage(future_id)


def _stage(future_id: int | None) -> None:
    """A stage received a followed message: its next send is timed (into the channels it sent
    into before), so that the message's way goes on."""
    if future_id is not None and future_id not in _receivers and len(_receivers) < MAX_OPEN:
        _receivers.add(future_id)
    for out in list(_outputs.get(future_id, {}).values()):
        if out.next_send > out.sent + 1:
            out.next_send = out.sent + 1


def holding() -> bool:
    """Whether any holder has a chain open (a receive not timed for itself may end one)."""
    return bool(_open)


def received_untimed(by: Any) -> None:
    """A receive timed only to see whether its holder sent on the chain it held: it did not."""
    previous = _open.pop(_holder(by[0]), None) if _open else None
    if previous is not None:
        _end(previous[0])


def derive(msg_from: Any, msg_to: Any) -> bool:
    """Say that ``msg_to`` (sent, or about to be sent, into an instrumented channel) was made
    from ``msg_from`` (received from one): ``msg_to``'s way goes on from ``msg_from``'s.

    For what the inference cannot see: a message handed to another task to send on, or made
    from several received ones. Only sampled messages are followed; a message that was not
    sampled is not an error.

    Args:
        msg_from: the item the program received from an instrumented channel (the same object).
        msg_to: the item it sends on, before or after its send.

    Returns:
        Whether the two were linked (False: no profiler listens, or ``msg_from`` was not a
        sampled message, or ``msg_to``'s send was not).

    Raises:
        ValueError: ``msg_from`` and ``msg_to`` are the same object.
        TypeError: either is None, a bool or a small int: shared objects that cannot stand for
            one message.
    """
    for name, value in (("msg_from", msg_from), ("msg_to", msg_to)):
        if value is None or isinstance(value, bool) or (type(value) is int and -5 <= value <= 256):
            raise TypeError(
                f"derive(): {name} is {value!r}, an object Python shares between all its uses: "
                "pass the message objects themselves (a str, a dict, your own class)"
            )
    if msg_from is msg_to:
        raise ValueError(
            "derive(): msg_from and msg_to are the same object; a message forwarded as it is "
            "is followed without derive()"
        )
    if _session.active is None:
        return False
    try:
        found = _received_items.get(id(msg_from))
        if found is None:
            return False
        holder, original = found
        opened = _open.get(holder)
        if opened is not None and opened[0] is original:
            _open.pop(holder, None)  # its holder does not send it on as well
        # A copy goes on: the holder may have ended the original already (it received again),
        # and the cold side may be folding it now; the original is then folded into no path.
        chain = original.fork()
        at = _sent_items.pop(id(msg_to), None)
        if at is not None and at in _in_flight:  # already sent: its way begins at chain's
            last = chain.hops[-1]
            last[5] = max(0, _in_flight[at].sent_ns - last[3])
            r = _running_call()  # (the task deriving it is taken for the one that sent it)
            by = None if r is None else r.future.id
            if by != last[1]:
                last[6], last[8] = -1, by
            del _in_flight[at]
            if len(chain.hops) >= MAX_HOPS:
                _dropped[0] += 1
                return False
            _put(_in_flight, at, chain, MAX_IN_FLIGHT)
            return True
        # not sent yet (an entry not in flight is another object's, of the same id, gone)
        _put(_derived, id(msg_to), chain, MAX_ITEMS)
        # its send should be timed: the channels the deriving call sent into before
        r = _running_call()
        for out in list(_outputs.get(None if r is None else r.future.id, {}).values()):
            if out.next_send > out.sent + 1:
                out.next_send = out.sent + 1
        return True
    except Exception as err:  # observing never breaks the program
        _session.internal_error("linking a derived message", err)
        return False


# -- the cold side ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HopReading:
    """One hop of a message: a channel (``stage`` None) or a stage."""

    channel_id: int | None
    future_id: int | None
    duration_ns: int
    #: a stage's busy part (-1: unknown)
    busy_ns: int = -1


@dataclass(frozen=True, slots=True)
class MessageReading:
    end_to_end_ns: int
    sent_ns: int
    hops: tuple[HopReading, ...]


@dataclass(frozen=True, slots=True)
class PathReading:
    """One path's figures: ``origin``, ``stages`` and ``senders`` are future ids (None:
    untracked code)."""

    origin: int | None
    channels: tuple[int, ...]
    stages: tuple[int | None, ...]
    messages: int
    end_to_end_hist: dict[int, int]
    max_ns: int
    #: sums over the messages, per hop (channel, stage, channel...)
    hop_sums: tuple[int, ...]
    busy_sums: tuple[int, ...]
    slowest: tuple[MessageReading, ...]
    #: per stage, the future that sent the message on: the stage's own, unless it handed the
    #: message to another task that sent a derived one (``derive()``)
    senders: tuple[int | None, ...] = ()


class _Path:
    __slots__ = ("busy_sums", "hist", "hop_sums", "max_ns", "messages", "slowest")

    def __init__(self, hops: int) -> None:
        self.messages = 0
        self.hist: Histogram = new_histogram()
        self.max_ns = 0
        self.hop_sums = [0] * (2 * hops - 1)
        self.busy_sums = [0] * (2 * hops - 1)
        self.slowest: list[MessageReading] = []


@dataclass(frozen=True, slots=True)
class ChainReading:
    """One message's whole way, for the trace's arrows: per channel (channel id, or minus a
    stream's; sent at; received at; the receiving call's id)."""

    seq: int
    origin_call: int | None
    hops: tuple[tuple[int, int, int, int | None], ...]


_cold_lock = threading.Lock()
_paths: dict[tuple[Any, ...], _Path] = {}
#: the messages that ended lately, for the trace (which reads them at each tick)
RECENT_KEPT = 1000
_recent: deque[ChainReading] = deque(maxlen=RECENT_KEPT)
_chain_seq = itertools.count(1)


@dataclass(slots=True)
class _Counted:
    """What one chain's fold added to its path."""

    key: tuple[Any, ...]
    total: int
    hop_adds: list[int]
    busy_adds: list[int]
    message: MessageReading


def _uncount(counted: _Counted) -> None:
    """Take a chain's fold out of its path again: a copy of it went on (derive() after the
    fold), and the message is counted once, on the way it went on."""
    path = _paths.get(counted.key)
    if path is None:
        return
    path.messages -= 1
    _record_ns(path.hist, counted.total, -1)
    for i, (hop, busy) in enumerate(zip(counted.hop_adds, counted.busy_adds, strict=True)):
        path.hop_sums[i] -= hop
        path.busy_sums[i] -= busy
    path.slowest = [m for m in path.slowest if m is not counted.message]
    if path.messages <= 0:
        del _paths[counted.key]


def _fold(chain: _Chain) -> None:
    parent = chain.parent
    if parent is not None:
        chain.parent = None
        counted, parent.counted = parent.counted, None
        if counted is not None:
            _uncount(counted)
    if chain.forked:
        return  # it went on in a derived message: that one's way is the path
    hops = chain.hops
    key = (chain.origin, *[(h[0], h[1], h[8]) for h in hops])
    path = _paths.get(key)
    if path is None:
        if len(_paths) >= MAX_PATHS:
            _dropped[0] += 1
            return
        path = _paths[key] = _Path(len(hops))
    readings: list[HopReading] = []
    hop_adds = [0] * len(path.hop_sums)
    busy_adds = [0] * len(path.busy_sums)
    for i, (channel_id, future_id, sent_at, received_at, _, _, busy_ns, _, _) in enumerate(hops):
        wait = max(0, received_at - sent_at)
        readings.append(HopReading(channel_id, None, wait))
        hop_adds[2 * i] = wait
        if i + 1 < len(hops):
            stage = max(0, hops[i + 1][2] - received_at)
            readings.append(HopReading(None, future_id, stage, busy_ns))
            hop_adds[2 * i + 1] = stage
            busy_adds[2 * i + 1] = max(0, busy_ns)
    for i, (hop, busy) in enumerate(zip(hop_adds, busy_adds, strict=True)):
        path.hop_sums[i] += hop
        path.busy_sums[i] += busy
    total = max(0, hops[-1][3] - chain.sent_ns)
    if len(hops) > 1:  # (the trace draws a chain of one channel as the message's arrow)
        _recent.append(
            ChainReading(
                next(_chain_seq),
                chain.origin_call,
                tuple((h[0], h[2], h[3], h[7]) for h in hops),
            )
        )
    path.messages += 1
    _record_ns(path.hist, total)
    if total > path.max_ns:
        path.max_ns = total
    message = MessageReading(total, chain.sent_ns, tuple(readings))
    slowest = path.slowest
    if len(slowest) < SLOWEST_KEPT or total > slowest[-1].end_to_end_ns:
        slowest.append(message)
        slowest.sort(key=lambda m: -m.end_to_end_ns)
        del slowest[SLOWEST_KEPT:]
    chain.counted = _Counted(key, total, hop_adds, busy_adds, message)


def _drain() -> None:
    """Fold the chains that ended into their paths (under ``_cold_lock``)."""
    while _ended:
        try:
            chain = _ended.popleft()
        except IndexError:
            break
        try:
            _fold(chain)
        except Exception as err:
            _session.internal_error("folding a message's lineage", err)


def fold() -> None:
    """Fold the chains that ended into their paths: the collector's drain calls it, so that the
    chains waiting stay few between two documents."""
    if _ended:
        with _cold_lock:
            _drain()


def recent(after: int) -> list[ChainReading]:
    """The messages that went their whole way through two channels or more lately (the last
    ``RECENT_KEPT``), numbered from 1 as they ended: those numbered past ``after``."""
    with _cold_lock:
        _drain()
        return [c for c in _recent if c.seq > after]


def paths() -> list[PathReading]:
    """Fold the chains that ended into their paths; every path's figures, most messages first."""
    with _cold_lock:
        _drain()
        out = [
            PathReading(
                origin=key[0],
                channels=tuple(h[0] for h in key[1:]),
                stages=tuple(h[1] for h in key[1:]),
                messages=p.messages,
                end_to_end_hist=dict(p.hist),
                max_ns=p.max_ns,
                hop_sums=tuple(p.hop_sums),
                busy_sums=tuple(p.busy_sums),
                slowest=tuple(p.slowest),
                senders=tuple(h[2] for h in key[1:]),
            )
            for key, p in _paths.items()
        ]
    out.sort(key=lambda p: -p.messages)
    return out


def dropped() -> int:
    """Sampled messages whose lineage was let go (a bounded table was full)."""
    return _dropped[0]


def sizes() -> dict[str, int]:
    """How full each bounded table is (for tests and benchmarks)."""
    return {
        "open": len(_open),
        "in_flight": len(_in_flight),
        "received_items": len(_received_items),
        "sent_items": len(_sent_items),
        "derived": len(_derived),
        "outputs": len(_outputs),
        "receivers": len(_receivers),
        "ended": len(_ended),
        "paths": len(_paths),
    }


def reset() -> None:
    """A new profiler starts from zero."""
    with _cold_lock:
        for table in (_open, _in_flight, _received_items, _sent_items, _derived, _outputs):
            table.clear()
        _receivers.clear()
        _ended.clear()
        _paths.clear()
        _recent.clear()
        _dropped[0] = 0
