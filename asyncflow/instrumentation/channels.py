"""Channel records shared by every kind of instrumented channel (asyncio queues, anyio streams).

Every message is counted exactly, in place: sends, receives and the depth high-water mark are a
few integer updates on the channel's figures, and a send's ``msg_id`` is its number on the
channel (1, 2, 3...), so a receive knows which send it pairs with by position or by a side record
of numbers, never by a record per message. Only a sample of the messages is timed: its send time,
its time in channel, which future sent and took it, and a log entry (see
``_session.next_interval``: every message while a channel is quiet, about a thousand a second
on a busy one). A timed message stands for the messages since the channel's previous timed one,
so edge counts and histograms are weighted and the flow graph adds up to the exact counts.
Waits on a full or empty channel are timed in full: they are rare, and timing them is cheap.

A channel that is gone (its queue or stream garbage-collected) is taken out of the registry by
the collector: the last ``GONE_KEPT`` stay as they were, older ones are folded into one
aggregate per label and kind, so memory follows the channels alive, not every channel ever made.
The messages a gone channel still held are counted as lost.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

from asyncflow import clock as _clock
from asyncflow.instrumentation import _session
from asyncflow.instrumentation import futures as _futures
from asyncflow.instrumentation import lineage as _lineage
from asyncflow.instrumentation._gone import AGGREGATES_KEPT, GONE_KEPT, Fold, GoneHistory
from asyncflow.stats import SMALL_BUCKET, SMALL_LIMIT, bucket_of, new_histogram

__all__ = [
    "AGGREGATES_KEPT",
    "CHANNEL_LOG_SIZE",
    "GONE_KEPT",
    "ChannelRecord",
    "ChannelStats",
    "Edge",
    "channel_registry",
    "edge_counts",
    "reap",
]

#: recent timed sends and receives kept per channel
CHANNEL_LOG_SIZE = 100
_MESSAGE_REPR_LIMIT = 200
#: a message number no channel reaches: nothing to time
_NEVER = 1 << 62


class Edge:
    """Messages one future sent into (or took from) one channel, with their time in channel.

    ``count`` is weighted: each timed message adds the number of messages it stands for.
    """

    __slots__ = ("count", "delay_hist", "delay_max", "delay_sum")

    def __init__(self) -> None:
        self.count = 0
        self.delay_sum = 0
        self.delay_max = 0
        self.delay_hist = new_histogram()


#: how a gone channel's edge adds into its aggregate's (every other int field is summed)
_EDGE_FOLD = Fold(
    Edge,
    maximum=("delay_max",),
    histogram=("delay_hist",),
    left=("count",),  # weighted by the channel's exact counts: see _merge_edges
)


class ChannelStats:
    """One session's figures for one channel; reset in place when a new profiler starts (the
    hooks of a queue hold them directly).

    ``sent`` and ``taken`` are bumped inline by the channel on every message: ``sent`` is also
    the last ``msg_id`` given, ``taken`` the number of the last message taken out. They move
    apart from ``received`` only when the storage is changed behind the channel's back, which
    ``skew`` accounts for.
    """

    __slots__ = (
        "blocked_ns",
        "delay_hist",
        "delay_max",
        "first_received",
        "first_sent_ns",
        "interval",
        "last_received",
        "last_receiver",
        "last_sender",
        "last_sent",
        "lost",
        "max_size",
        "next_recv",
        "next_send",
        "pending",
        "received_log",
        "receivers",
        "sampled_recv",
        "sampled_send",
        "senders",
        "sent",
        "sent_log",
        "skew",
        "starved_ns",
        "taken",
        "timed",
        "unpaired",
    )

    def __init__(self) -> None:
        self.sent = 0
        self.taken = 0
        self.skew = 0  # taken - received: messages that vanished from the storage unreceived
        self.unpaired = 0  # receives whose send was not seen (storage changed behind our back)
        self.max_size = 0
        #: messages sent and never received: the channel was freed with them still in it
        #: (set when the channel is reaped)
        self.lost = 0
        # sampling: the next msg_id to time, and the receive number that takes a timed one
        self.next_send = 1
        self.next_recv = _NEVER
        self.interval = 1
        self.sampled_send = 0  # msg_id of the last timed send
        self.sampled_recv = 0  # receive count at the last timed receive
        #: timed sends not received yet: msg_id -> (sent at, call id, future id, weight)
        self.pending: dict[int, tuple[int, int | None, int | None, int]] = {}
        self.timed = 0  # messages whose time in channel was measured
        self.delay_hist = new_histogram()
        self.delay_max = 0
        self.blocked_ns = 0
        self.starved_ns = 0
        self.first_sent_ns = 0
        self.last_sent: tuple[int, int] = (0, 0)  # (msg_id, at) of the last timed send
        self.first_received: tuple[int, int] = (0, 0)  # (receive count, at) of the first timed
        self.last_received: tuple[int, int] = (0, 0)
        # future id (or None: not inside a tracked call) -> Edge
        self.senders: dict[int | None, Edge] = {}
        self.receivers: dict[int | None, Edge] = {}
        self.last_sender: int | None = None
        self.last_receiver: int | None = None
        # (index, msg_id, timestamp, call_id, future_id, message repr)
        self.sent_log: deque[tuple[Any, ...]] = deque(maxlen=CHANNEL_LOG_SIZE)
        # (index, msg_id, timestamp, call_id, future_id, delay, message repr)
        self.received_log: deque[tuple[Any, ...]] = deque(maxlen=CHANNEL_LOG_SIZE)

    @property
    def received(self) -> int:
        """Messages taken out of the channel by its receive operations (exact)."""
        return self.taken - self.skew


#: how a gone channel's figures add into its aggregate (every other int field is summed)
_FOLD = Fold(
    ChannelStats,
    maximum=("delay_max", "interval", "max_size"),
    histogram=("delay_hist",),
    left=(
        # sampling state, the messages in flight and the logs: this channel's own
        "first_received",
        "first_sent_ns",
        "last_received",
        "last_receiver",
        "last_sender",
        "last_sent",
        "next_recv",
        "next_send",
        "pending",
        "received_log",
        "sampled_recv",
        "sampled_send",
        "sent_log",
        # added by _merge
        "receivers",
        "senders",
    ),
)


class ChannelRecord:
    """An instrumented channel: identity, labels, and the current session's figures."""

    __slots__ = (
        "__weakref__",
        "_measure",
        "_target",
        "_waits",
        "capacity",
        "closed",
        "folded",
        "id",
        "kind",
        "label",
        "log_messages",
        "stats",
    )

    def __init__(
        self,
        label: str,
        kind: str,
        capacity: float,
        log_messages: bool,
        target: Any,
        measure: Callable[[Any], int],
    ) -> None:
        self.id = next(_channel_ids)
        #: gone channels whose figures are summed here (an aggregate); 0 for a real channel
        self.folded = 0
        self.label = label
        self.kind = kind
        #: 0 for a rendezvous stream; ``math.inf`` when unbounded
        self.capacity = capacity
        self.log_messages = log_messages
        # Weak: observing a channel must not keep it (or its items) alive. When it dies, the
        # record is queued for the collector to reap (an aggregate has no target at all).
        self._target: Callable[[], Any] = _no_target
        if target is not None:
            self._target = _history.watch(self, target)
        self._measure = measure
        self.closed = False
        self.stats = ChannelStats()
        # Weak: the channel's own containers of waiting senders and receivers, read for the
        # waits still going on (a wait is added to the figures only when it ends)
        self._waits: list[weakref.ref[Any]] = []

    @property
    def alive(self) -> bool:
        """Whether the channel object still exists."""
        return self._target() is not None

    def lost_count(self) -> int:
        """Messages sent and never received because the channel was freed with them in it."""
        st = self.stats
        if st.lost or self.folded:
            return st.lost
        if self._target() is None:
            return max(0, st.sent - st.received)
        return 0

    def size(self) -> int:
        """Messages in the channel now (0 once it is gone)."""
        target = self._target()
        return 0 if target is None else self._measure(target)

    @property
    def channel_type(self) -> str:
        """``bounded[N]`` or ``unbounded``, as hotpath names it."""
        if self.capacity == float("inf"):
            return "unbounded"
        return f"bounded[{int(self.capacity)}]"

    def send(
        self, item: Any, at: int | None = None, by: tuple[int | None, int | None] | None = None
    ) -> int:
        """Count one message entering the channel; returns its ``msg_id``.

        For channels without an inlined fast path. ``at`` and ``by`` say when and by whom, for a
        send that waited before it was taken.
        """
        st = self.stats
        st.sent = msg_id = st.sent + 1
        if msg_id >= st.next_send:
            self.sample_send(msg_id, item, at, by)
        return msg_id

    def receive(self, msg_id: int, item: Any, at: int | None = None) -> None:
        """Count one message leaving the channel, paired with send ``msg_id`` (0: unpaired)."""
        st = self.stats
        st.taken += 1
        if not msg_id:
            st.unpaired += 1
        elif msg_id in st.pending:
            self.sample_receive(msg_id, item, at)

    def sample_send(
        self,
        msg_id: int,
        item: Any,
        at: int | None = None,
        by: tuple[int | None, int | None] | None = None,
    ) -> None:
        """Time send ``msg_id`` (already counted): the channel's next timed message."""
        st = self.stats
        try:
            now = _clock.now_ns() if at is None else at
            weight = msg_id - st.sampled_send
            st.interval = interval = _session.next_interval(st.interval, now - st.last_sent[1])
            st.next_send = msg_id + interval
            if _session.active is None:
                return
            call_id, future_id = caller() if by is None else by
            st.sampled_send = msg_id
            if not st.first_sent_ns:
                st.first_sent_ns = now
            st.last_sent = (msg_id, now)
            edge = st.senders.get(future_id)
            if edge is None:
                edge = st.senders[future_id] = Edge()
            edge.count += weight
            st.last_sender = future_id
            if not st.pending:
                st.next_recv = msg_id
            st.pending[msg_id] = (now, call_id, future_id, weight)
            text = _message_repr(item) if self.log_messages else None
            st.sent_log.append((msg_id - 1, msg_id, now, call_id, future_id, text))
            _lineage.sent(st, self.id, msg_id, item, now, (call_id, future_id))
        except Exception as err:  # observing never breaks the program
            _session.internal_error("recording a channel send", err)

    def sample_receive(
        self, msg_id: int, item: Any, at: int | None = None, in_order: bool = False
    ) -> None:
        """Time the receive of ``msg_id`` (already counted), if its send was timed.

        ``in_order``: the channel is FIFO and calls this once ``msg_id`` reaches ``next_recv``.
        """
        st = self.stats
        try:
            pending = st.pending
            sent = pending.pop(msg_id, None)
            if in_order:  # timed sends older than this one were lost, never to be received
                for older in [m for m in pending if m < msg_id]:
                    del pending[older]
                st.next_recv = next(iter(pending)) if pending else _NEVER
            if sent is None or _session.active is None:
                if _lineage.holding() and _session.active is not None:
                    _lineage.received_untimed(caller())  # timed to end a chain (see lineage)
                return
            now = _clock.now_ns() if at is None else at
            received = st.taken - st.skew
            weight = received - st.sampled_recv
            st.sampled_recv = received
            if not st.first_received[0]:
                st.first_received = (received, now)
            st.last_received = (received, now)
            call_id, future_id = caller()
            receiver = st.receivers.get(future_id)
            if receiver is None:
                receiver = st.receivers[future_id] = Edge()
            receiver.count += weight
            st.last_receiver = future_id
            sent_at, sender_call, sender_id, sent_weight = sent
            delay = now - sent_at
            # one bucket for the channel and both its edges, weighted by what the send stands for
            bucket = SMALL_BUCKET[delay] if 0 <= delay < SMALL_LIMIT else bucket_of(delay)
            st.timed += 1
            st.delay_hist[bucket] += sent_weight
            if delay > st.delay_max:
                st.delay_max = delay
            receiver.delay_sum += delay
            if delay > receiver.delay_max:
                receiver.delay_max = delay
            receiver.delay_hist[bucket] += sent_weight
            sender = st.senders.get(sender_id)
            if sender is not None:
                sender.delay_sum += delay
                if delay > sender.delay_max:
                    sender.delay_max = delay
                sender.delay_hist[bucket] += sent_weight
            text = _message_repr(item) if self.log_messages else None
            st.received_log.append((received - 1, msg_id, now, call_id, future_id, delay, text))
            sent_by = (sender_call, sender_id)
            _lineage.received(
                st, self.id, msg_id, item, sent_at, sent_by, now, (call_id, future_id)
            )
        except Exception as err:
            _session.internal_error("recording a channel receive", err)

    def forget_pending(self) -> None:
        """Drop the timed sends not received yet: the storage changed behind our back."""
        st = self.stats
        st.pending.clear()
        st.next_recv = _NEVER

    def depth(self, size: int) -> None:
        """Note the number of messages in the channel after a send."""
        if size > self.stats.max_size:
            self.stats.max_size = size

    def watch_waits(self, waits: Any) -> None:
        """Read ``waits`` (kept weakly), whose ``ongoing(now)`` gives the time its waits in
        progress have waited so far, as (blocked on a full channel, starved on an empty one)."""
        self._waits = [r for r in self._waits if r() is not None]
        self._waits.append(weakref.ref(waits))

    def waiting_ns(self, now: int) -> tuple[int, int]:
        """The time the waits still going on have waited so far: (producers blocked on a full
        channel, consumers starved on an empty one). A stuck consumer's wait counts while it
        lasts, not only once it ends (if it ever does)."""
        blocked = starved = 0
        for ref in list(self._waits):
            waits = ref()
            if waits is None:
                continue
            try:
                b, s = waits.ongoing(now)
            except Exception as err:  # the loop's thread may change them meanwhile
                _session.internal_error("reading a channel's waits in progress", err)
                continue
            blocked += b
            starved += s
        return blocked, starved

    def waited(self, blocked: bool, since: int) -> None:
        """Add a wait on a full (``blocked``) or empty channel that began at ``since``."""
        spent = _clock.now_ns() - since
        st = self.stats
        if blocked:
            st.blocked_ns += spent
        else:
            st.starved_ns += spent


def caller() -> tuple[int | None, int | None]:
    """(call id, future id) of the innermost tracked call running on this thread now, if any.

    The call that is actually sending or receiving: not the task's own coroutine, which is
    often someone else's wrapper around the tracked call (anyio's task group on some versions,
    ``wait_for``, a tracked caller that awaits it). See :func:`running_call`.
    """
    r = running_call()
    return _NOBODY if r is None else (r.call_id, r.future.id)


def running_call() -> Any:
    """The record of the innermost tracked call running on this thread now, or None.

    Read from the slot where the polls on this thread name the calls they run (on both paths;
    see ``futures._PollSlot``): only the sampled messages and the waits ask.
    """
    return _running_call_here()


_NOBODY: tuple[int | None, int | None] = (None, None)
_running_call_here = _futures.running_call_here


def _message_repr(item: Any) -> str:
    try:
        text = repr(item)
    except (KeyboardInterrupt, SystemExit) as exc:
        # Ctrl-C (or an exit) that came while repr() ran is the program's: counted, and
        # raised on (a program that does not use asyncio.run gets it wherever it is)
        _session.internal_error("repr() of a logged message or item", exc)
        raise
    except BaseException as exc:
        # The program's repr failed (even with CancelledError, which is not the program's
        # to get: raised here, it would leave its put() half done): counted, and logged.
        _session.internal_error("repr() of a logged message or item", exc)
        return f"<repr() failed: {type(exc).__name__}>"
    return text if len(text) <= _MESSAGE_REPR_LIMIT else text[: _MESSAGE_REPR_LIMIT - 1] + "…"


def edge_counts(
    edges: dict[int | None, Edge], total: int, last: int | None
) -> dict[int | None, int]:
    """Messages per edge, the untimed tail since the last timed message given to its edge: the
    edges then add up to the channel's exact count."""
    counts = {fid: e.count for fid, e in list(edges.items())}
    tail = total - sum(counts.values())
    if tail > 0 and last in counts:
        counts[last] += tail
    return counts


def _no_target() -> None:
    return None


_channel_ids = itertools.count(1)
_lock = threading.Lock()
#: channels instrumented and not reaped yet, by id, oldest first
_registry: dict[int, ChannelRecord] = {}
#: Gone channels: the last GONE_KEPT as they were, older ones folded into one aggregate per
#: (label, kind), at most AGGREGATES_KEPT (then one "(other gone channels)" per kind).
OTHER_GONE = "(other gone channels)"


def register(record: ChannelRecord) -> ChannelRecord:
    """Add a channel to the registry the collector reads."""
    _history.register(record)
    return record


def channel_registry() -> list[ChannelRecord]:
    """Every channel of the session (a copy): live ones oldest first, then the last gone ones,
    then the aggregates of older gone ones."""
    return _history.listing()


def reap(*, collecting: bool = False) -> int:
    """Move the channels that are gone out of the registry, into the bounded history of gone
    channels (see ``_gone.GoneHistory.reap``); returns how many moved.

    A gone channel's figures are final (its hooks died with it).
    """
    return _history.reap(collecting)


def _retire(record: ChannelRecord) -> None:
    """A reaped channel: the messages still in it are lost."""
    st = record.stats
    st.lost = max(0, st.sent - st.received)
    st.pending.clear()  # timed sends that can never be received now


def _kind(record: ChannelRecord) -> str:
    return record.kind


def _aggregate(record: ChannelRecord, label: str) -> ChannelRecord:
    agg = ChannelRecord(label, record.kind, record.capacity, False, None, _no_size)
    agg.closed = True
    return agg


def _merge(agg: ChannelRecord, record: ChannelRecord) -> None:
    """Add a gone channel's figures to its aggregate (under _lock)."""
    if agg.capacity != record.capacity:
        agg.capacity = max(agg.capacity, record.capacity)
    a, s = agg.stats, record.stats
    _FOLD(a, s)
    _merge_edges(a.senders, s.senders, edge_counts(s.senders, s.sent, s.last_sender))
    _merge_edges(a.receivers, s.receivers, edge_counts(s.receivers, s.received, s.last_receiver))


def _merge_edges(
    into: dict[int | None, Edge], edges: dict[int | None, Edge], counts: dict[int | None, int]
) -> None:
    for fid, edge in edges.items():
        target = into.get(fid)
        if target is None:
            target = into[fid] = Edge()
        target.count += counts.get(fid, edge.count)
        _EDGE_FOLD(target, edge)


def _no_size(target: Any) -> int:
    return 0


_history: GoneHistory[ChannelRecord] = GoneHistory(
    _lock,
    _registry,
    other=OTHER_GONE,
    kind=_kind,
    aggregate=_aggregate,
    merge=_merge,
    retire=_retire,
)


def reset_for_session() -> None:
    """Give every channel fresh figures and forget channels that are gone: a new profiler
    starts from zero."""
    with _lock:
        _history.forget(lambda record: record.stats.__init__())  # type: ignore[misc]
    _lineage.reset()


def recording() -> bool:
    """Whether a profiler listens now."""
    return _session.active is not None
