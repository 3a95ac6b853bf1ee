"""The bounded history of records whose object is gone, shared by streams, channels, resources.

A registry keeps a record for each instrumented object (a queue, a lock, the code of an async
generator) and watches that object through a weak reference. When the object dies, its record
leaves the registry for the history: the last ``GONE_KEPT`` stay as they were, older ones are
folded into one aggregate per (label, kind), at most ``AGGREGATES_KEPT`` of them, then into one
"other" aggregate per kind. Memory then follows what is alive, and every total stays exact.

A family's figures add up by ``Fold``, declared next to its figures' class: every ``int``
field is summed unless named otherwise, so a new counter reaches the aggregates with no other
edit. Each family keeps what is its own: what does not add up field by field (``merge``: the
edges, the logs), how an aggregate is made, what a record must let go of when it is reaped
(``retire``), and whether its figures are final yet (``final``).
"""

from __future__ import annotations

import operator
import threading
import weakref
from collections import deque
from collections.abc import Callable, Hashable
from typing import Any, Generic, Protocol, TypeVar

from asyncflow.instrumentation import _session
from asyncflow.stats import merge

__all__ = ["AGGREGATES_KEPT", "GONE_KEPT", "Fold", "GoneHistory", "Watch"]

#: gone records kept as they were, per family
GONE_KEPT = 100
#: aggregates of older gone records kept per family (then one "other" aggregate per kind)
AGGREGATES_KEPT = 256


class Folded(Protocol):
    """What the history reads and writes on a record."""

    id: int
    label: str
    #: gone records whose figures are summed here (an aggregate); 0 for a real one
    folded: int

    @property
    def alive(self) -> bool:
        """Whether the record's object still exists."""
        ...


_R = TypeVar("_R", bound=Folded)


def fields_of(cls: type) -> tuple[str, ...]:
    """The fields a slotted class declares, its bases' first (``__weakref__`` is none)."""
    return tuple(
        name
        for klass in reversed(cls.__mro__)
        for name in klass.__dict__.get("__slots__", ())
        if not name.startswith("__")
    )


class Fold:
    """How one kind's figures add up, field by field, when a gone object's record is folded into
    its aggregate. Declared next to the figures' class; applied by name (getattr and setattr:
    the cold path, under the family's lock), so it works on a compiled class with the same
    fields too.

    Every field of ``cls`` that is an ``int`` on a fresh instance and is not named below is
    summed: a new counter needs no other edit. The others must be named, or declaring the fold
    raises ``TypeError``: no field silently drops out of the aggregates.

    Args:
        cls: the figures' class (slotted, made with no arguments).
        maximum: fields whose larger value is kept (a longest time, a largest size).
        histogram: mappings whose counts are added key by key (``stats.merge``).
        left: fields not added here: state (sampling, what is live now), or what the family's
            own ``merge`` adds (edges, logs).
    """

    __slots__ = ("_read", "histogram", "left", "maximum", "summed")

    def __init__(
        self,
        cls: type,
        *,
        maximum: tuple[str, ...] = (),
        histogram: tuple[str, ...] = (),
        left: tuple[str, ...] = (),
    ) -> None:
        fields = fields_of(cls)
        named = (*maximum, *histogram, *left)
        for name in named:
            if name not in fields:
                raise TypeError(f"{cls.__qualname__} has no field {name!r} to fold")
            if named.count(name) > 1:
                raise TypeError(f"{cls.__qualname__}.{name} is declared to fold twice")
        fresh = cls()
        summed = []
        for name in fields:
            if name in named:
                continue
            if type(getattr(fresh, name)) is not int:
                raise TypeError(
                    f"{cls.__qualname__}.{name} is not an int counter: declare how it folds "
                    "(maximum, histogram or left)"
                )
            summed.append(name)
        self.summed = tuple(summed)
        #: the summed fields' values, as a tuple, in one call
        self._read: Callable[[Any], tuple[Any, ...]] = (
            operator.attrgetter(*summed)
            if len(summed) > 1
            else lambda obj: tuple(getattr(obj, name) for name in summed)
        )
        self.maximum = maximum
        self.histogram = histogram
        self.left = left

    def __call__(self, into: Any, other: Any) -> None:
        """Add the figures of ``other`` to ``into`` (an aggregate's)."""
        # (read at once; most of a short-lived object's counters are 0, and add nothing)
        for name, theirs in zip(self.summed, self._read(other), strict=True):
            if theirs:
                setattr(into, name, getattr(into, name) + theirs)
        for name in self.maximum:
            theirs = getattr(other, name)
            if theirs > getattr(into, name):
                setattr(into, name, theirs)
        for name in self.histogram:
            merge(getattr(into, name), getattr(other, name))


class Watch(weakref.ref):  # type: ignore[type-arg]
    """The weak reference to what a record stands for; queues itself for its family's reap when
    that dies."""

    __slots__ = ("key", "record")

    #: None once reaped: no cycle is left between the record and its reference
    record: Any
    #: the record's entry in its family's index, if it has one
    key: Hashable | None


class GoneHistory(Generic[_R]):
    """One family's registry of live records (by id) and history of gone ones.

    Args:
        lock: the family's lock, held around every change of ``registry`` and the history.
        registry: the live records by id, oldest first (the family's own dict).
        other: the label of the aggregate that takes gone records past ``AGGREGATES_KEPT``
            labels, e.g. ``"(other gone channels)"``.
        kind: what, beside the label, keeps aggregates apart (a channel's kind, say).
        aggregate: an empty aggregate with this label, made from the first record folded into it.
        merge: adds a gone record's figures to an aggregate: its ``Fold``, then what does not
            add up field by field.
        retire: lets go of what a reaped record holds for its object (open holds, messages).
        final: whether a record whose object is gone has all its figures; it waits in the
            history's ``waiting`` list until then.
        index: the family's records by a key of their own (the ``id`` of a code object, say);
            a record's entry goes when its object dies, before that ``id`` can be reused.
    """

    def __init__(
        self,
        lock: threading.Lock,
        registry: dict[int, _R],
        *,
        other: str,
        kind: Callable[[_R], str],
        aggregate: Callable[[_R, str], _R],
        merge: Callable[[_R, _R], None],
        retire: Callable[[_R], None] | None = None,
        final: Callable[[_R], bool] | None = None,
        index: dict[Any, _R] | None = None,
    ) -> None:
        self.lock = lock
        self.registry = registry
        self.other = other
        self.kind = kind
        self.aggregate = aggregate
        self.merge = merge
        self.retire = retire
        self.final = final
        self.index = index
        self.kept = GONE_KEPT
        self.aggregates_kept = AGGREGATES_KEPT
        #: references whose object died, not reaped yet (appended by ``_died``, lock-free)
        self.dying: deque[Watch] = deque()
        #: references whose object died while the record's figures were not final
        self.waiting: list[Watch] = []
        self.gone: deque[_R] = deque()
        self.aggregates: dict[tuple[str, str], _R] = {}
        self._on_death = self._died  # one bound method for every reference, not one each

    def watch(self, record: _R, target: object, key: Hashable | None = None) -> Watch:
        """A weak reference to ``target`` (what ``record`` stands for), which queues ``record``
        to be reaped when ``target`` dies, and takes the ``index`` entry ``key`` out then."""
        ref = Watch(target, self._on_death)
        ref.record = record
        ref.key = key
        return ref

    def died(self, ref: Watch) -> None:
        """The record of ``ref`` ends now, as if its object had died (its object may live on,
        when something else decides the record's life). Lock-free, as ``_died``; harmless if
        the object then dies too."""
        self._died(ref)

    def _died(self, ref: Watch) -> None:
        # Runs in whichever thread frees the object, perhaps while it holds the lock: so no lock
        # here, only atomic dict and deque operations. The object's id cannot be reused before
        # this returns, so the index entry removed is this record's.
        index, key = self.index, ref.key
        if index is not None and key is not None and index.get(key) is ref.record:
            index.pop(key, None)
        self.dying.append(ref)

    def register(self, record: _R) -> None:
        """Add a live record (with no profiler to collect, reap first: the registry stays as
        large as what is alive as it grows)."""
        if self.dying or self.waiting:
            self.reap()
        with self.lock:
            self.registry[record.id] = record

    def listing(self) -> list[_R]:
        """Every record of the session (a copy): live ones oldest first, then the last gone
        ones, then the aggregates of older gone ones."""
        self.reap()
        with self.lock:
            return [*self.registry.values(), *self.gone, *self.aggregates.values()]

    def reap(self, collecting: bool = False, drain: Callable[[], object] | None = None) -> int:
        """Move the records whose object is gone (and whose figures are final) out of the
        registry, into the bounded history; returns how many moved.

        While a profiler runs, only its collector reaps (``collecting``), off the program's
        threads; with none running, whoever registers or lists records reaps. ``drain`` runs
        once the records to move are chosen and before they move, outside the lock (futures:
        it folds the finished calls still waiting for the collector, so that none of a gone
        future's calls is lost).
        """
        if not self.dying and not self.waiting:
            return 0
        if not collecting and _session.active is not None:
            return 0
        ready: list[tuple[Watch, _R]] = []
        with self.lock:
            refs, self.waiting = self.waiting, []
            while self.dying:
                refs.append(self.dying.popleft())
            for ref in refs:
                record = ref.record
                if record is None or record.id not in self.registry:  # dropped at a session start
                    ref.record = None
                elif self.final is not None and not self.final(record):
                    self.waiting.append(ref)
                else:
                    ready.append((ref, record))
        if not ready:
            return 0
        done = 0  # if anything below raises, the records not moved yet are reaped next time
        try:
            if drain is not None:
                drain()
            reaped = 0
            with self.lock:
                for ref, record in ready:
                    done += 1
                    ref.record = None  # no cycle left between the record and its reference
                    if self.registry.pop(record.id, None) is None:
                        continue  # dropped meanwhile, at a session start
                    reaped += 1
                    self.gone.append(record)  # (first: a failing retire or fold loses nothing)
                    if self.retire is not None:
                        self.retire(record)
                    while len(self.gone) > self.kept:
                        self._fold(self.gone.popleft())
        finally:
            self.dying.extend(ref for ref, _ in ready[done:])
        return reaped

    def _fold(self, record: _R) -> None:
        """Add a gone record's figures to the aggregate of its label (under the lock)."""
        kind = self.kind(record)
        key = (record.label, kind)
        agg = self.aggregates.get(key)
        if agg is None and len(self.aggregates) >= self.aggregates_kept:
            key = (self.other, kind)
            agg = self.aggregates.get(key)
        if agg is None:
            agg = self.aggregates[key] = self.aggregate(record, key[0])
        agg.folded += 1
        self.merge(agg, record)

    def forget(self, fresh: Callable[[_R], object]) -> None:
        """Forget the gone records, drop the dead ones still in the registry, and give the
        others fresh figures with ``fresh``: a new profiler starts from zero (under the lock)."""
        self.dying.clear()
        self.waiting.clear()
        self.gone.clear()
        self.aggregates.clear()
        for rid, record in list(self.registry.items()):
            if record.alive:
                fresh(record)
            else:
                del self.registry[rid]
