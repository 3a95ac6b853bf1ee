"""Never-awaited coroutines are counted in the whole program, and warned about as before."""

from __future__ import annotations

import gc
import sys
import warnings
from collections.abc import Iterator

import pytest

import asyncflow
from asyncflow.instrumentation import coroutines


@pytest.fixture
def tracking() -> Iterator[coroutines.NeverAwaitedTracking]:
    coroutines.reset_for_session()
    handle = asyncflow.track_never_awaited()
    yield handle
    handle.undo()
    coroutines.reset_for_session()


async def orphan() -> None:
    pass


def _forget_one() -> None:
    orphan()  # type: ignore[unused-coroutine]  # the planted bug: called, never awaited
    gc.collect()


def _counts() -> dict[str, int]:
    return {site.function: site.count for site in coroutines.never_awaited()}


def test_counted_even_when_the_program_filters_the_warning(
    tracking: coroutines.NeverAwaitedTracking,
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _forget_one()
        _forget_one()
    assert _counts() == {"orphan": 2}
    (site,) = coroutines.never_awaited()
    assert (site.file, site.line) == (__file__, orphan.__code__.co_firstlineno)
    assert site.created_at is None  # origin tracking is opt-in


def _warning_of_one() -> warnings.WarningMessage:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _forget_one()
    (warning,) = [w for w in seen if issubclass(w.category, RuntimeWarning)]
    return warning


def test_the_warning_is_the_one_python_gives_from_the_same_line() -> None:
    plain = _warning_of_one()
    with asyncflow.track_never_awaited():
        tracked = _warning_of_one()
    assert (str(tracked.message), tracked.category, tracked.filename, tracked.lineno) == (
        str(plain.message),
        plain.category,
        plain.filename,
        plain.lineno,
    )
    assert "orphan" in str(plain.message)


def test_origin_tracking_records_the_creating_line_and_is_put_back() -> None:
    coroutines.reset_for_session()
    before = sys.get_coroutine_origin_tracking_depth()
    with asyncflow.track_never_awaited(origin=True), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert sys.get_coroutine_origin_tracking_depth() >= 1
        _forget_one()
    assert sys.get_coroutine_origin_tracking_depth() == before
    (site,) = coroutines.never_awaited()
    assert site.created_at is not None
    file, line, function = site.created_at
    assert (file, function) == (__file__, "_forget_one")
    assert line == _forget_one.__code__.co_firstlineno + 1
    coroutines.reset_for_session()


def test_origin_tracking_stays_on_while_any_handle_that_asked_for_it_is_active() -> None:
    """Handles undone in any order: tracking goes off with the last that asked for it, back to
    the depth the program had, and a depth the program set meanwhile is left as it is."""
    before = sys.get_coroutine_origin_tracking_depth()
    first = asyncflow.track_never_awaited(origin=True)
    plain = asyncflow.track_never_awaited()
    second = asyncflow.track_never_awaited(origin=True)
    first.undo()
    assert sys.get_coroutine_origin_tracking_depth() == coroutines.ORIGIN_DEPTH  # second asks
    plain.undo()
    assert sys.get_coroutine_origin_tracking_depth() == coroutines.ORIGIN_DEPTH
    second.undo()
    assert sys.get_coroutine_origin_tracking_depth() == before
    handle = asyncflow.track_never_awaited(origin=True)
    sys.set_coroutine_origin_tracking_depth(5)  # the program's own choice, made meanwhile
    try:
        handle.undo()
        assert sys.get_coroutine_origin_tracking_depth() == 5
    finally:
        sys.set_coroutine_origin_tracking_depth(before)


def test_undo_puts_pythons_reporting_back_and_counting_stops() -> None:
    original = warnings._warn_unawaited_coroutine  # type: ignore[attr-defined]
    handle = asyncflow.track_never_awaited()
    inner = asyncflow.track_never_awaited()  # nested handles: the last undo restores
    inner.undo()
    assert warnings._warn_unawaited_coroutine is not original  # type: ignore[attr-defined]
    handle.undo()
    handle.undo()  # idempotent
    assert warnings._warn_unawaited_coroutine is original  # type: ignore[attr-defined]
    coroutines.reset_for_session()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _forget_one()
    assert coroutines.never_awaited() == []


def test_distinct_functions_are_bounded() -> None:
    coroutines.reset_for_session()
    namespace: dict[str, object] = {}
    with asyncflow.track_never_awaited(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(coroutines.MAX_SITES + 50):
            exec(f"async def made_{i}(): pass\nmade_{i}()", namespace)
            namespace.clear()
        gc.collect()
    sites = coroutines.never_awaited()
    assert len(sites) == coroutines.MAX_SITES + 1
    assert sum(s.count for s in sites) == coroutines.MAX_SITES + 50
    assert {s.function for s in sites if s.count == 50} == {"(other functions)"}
    coroutines.reset_for_session()


def test_bad_option() -> None:
    with pytest.raises(TypeError, match="origin"):
        asyncflow.track_never_awaited(origin="yes")  # type: ignore[arg-type]
