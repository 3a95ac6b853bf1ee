"""The wait-for graph of tasks adopted by an attach: the holders of plain locks (made before
it, not instrumented) come from ``TaskEntry.holds``, read from the tasks' references."""

from __future__ import annotations

from asyncflow import schema
from asyncflow.views import graph, lints

LOCK = "Lock at 0x10"
OTHER = "Lock at 0x20"


def _task(name: str, kind: str, words: str, holds: tuple[str, ...] = ()) -> schema.TaskEntry:
    where = schema.AwaitFrame("/app/svc.py", 5, name)
    target = schema.WaitTarget(kind, words, None, None, None, None)
    return schema.TaskEntry(
        name, 1, "waiting", name, None, None, None, None, [where], target, where, holds=list(holds)
    )


def _findings(tasks: list[schema.TaskEntry]) -> dict[str, lints.Finding]:
    doc = graph.graph_document(tasks, [], [])
    docs = lints.Documents(now_ns=1, elapsed_ns=1, graph=doc)
    return {f.kind: f for f in lints.evaluate(docs, lints.Thresholds(), lints.GRAPH_LINTS)}


def test_waiters_behind_a_holder_that_waits_on_an_event_are_named() -> None:
    tasks = [
        _task("handler-0", "event", "wait for event", holds=(LOCK,)),
        *(_task(f"client-{i}", "lock", f"acquire lock {LOCK}") for i in range(4)),
    ]
    found = _findings(tasks)
    assert set(found) == {"lock-held-by-waiter"}
    f = found["lock-held-by-waiter"]
    assert f.severity == "info"
    assert f.message.startswith(
        "4 tasks (`client-0`, `client-1`, `client-2`, ...) wait on Lock at 0x10 held by "
        "`handler-0` (handler-0), which waits at svc.py:5 (wait for event); the holder read"
    )
    assert (f.subject.label, f.evidence) == ("handler-0", {"tasks": 4})


def test_a_plain_lock_whose_holder_is_not_known_stays_open() -> None:
    # the holder took it with acquire(), or does not wait: nothing says who could release it
    tasks = [_task("client-0", "lock", f"acquire lock {LOCK}")]
    doc = graph.graph_document(tasks, [], [])
    assert not any(n.stuck for n in doc.nodes)
    assert _findings(tasks) == {}


def test_two_tasks_each_waiting_on_the_plain_lock_the_other_holds_are_a_deadlock() -> None:
    tasks = [
        _task("ab", "lock", f"acquire lock {OTHER}", holds=(LOCK,)),
        _task("ba", "lock", f"acquire lock {LOCK}", holds=(OTHER,)),
    ]
    found = _findings(tasks)
    assert set(found) == {"deadlock"}  # not lock-held-by-waiter too: one cause, one warning
    message = found["deadlock"].message
    assert message.startswith("Deadlock: 2 tasks wait on one another's locks in a cycle")
    assert "`ab` (ab) waits at svc.py:5 on lock `Lock at 0x20`, held by `ba`" in message
    assert message.endswith("the locks were made before asyncflow attached, and are not timed)")
