"""Run a hook right after the program imports a module, without importing it first.

asyncflow adapts a few modules of other libraries (anyio's asyncio backend) but never imports
them itself: an import on the program's running loop blocks it, 100 ms and more on a loaded
machine, and a program that does not use the library must not pay for it. While a hook waits,
a finder at the front of ``sys.meta_path`` watches for the module's name; the import goes on
as it would, and the hook runs on the importing thread once the module's code has run. The
finder leaves ``sys.meta_path`` with the last hook waiting.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

from asyncflow.instrumentation import _session

__all__ = ["after_import"]

Hook = Callable[[ModuleType], None]

_lock = threading.Lock()
#: module name -> the hooks waiting for it, in the order they were asked for
_waiting: dict[str, list[Hook]] = {}


def after_import(name: str, hook: Hook) -> Callable[[], None]:
    """Run ``hook(module)`` once the module ``name`` is imported.

    At once, on this thread, if it is imported already; else right after the program's own
    import of it has run the module's code. A hook that raises is logged as asyncflow's
    internal error: the import goes on. Returns a function that cancels the hook if it has not
    run yet (idempotent).
    """
    module = sys.modules.get(name)
    if module is not None:
        _run(name, hook, module)
        return _nothing
    with _lock:
        _waiting.setdefault(name, []).append(hook)
        _sync()

    def cancel() -> None:
        with _lock:
            hooks = _waiting.get(name)
            if hooks is not None and hook in hooks:
                hooks.remove(hook)
                if not hooks:
                    del _waiting[name]
            _sync()

    return cancel


def waiting() -> dict[str, int]:
    """How many hooks wait for each module's import now (for tests and status)."""
    with _lock:
        return {name: len(hooks) for name, hooks in _waiting.items()}


def _nothing() -> None:
    pass


def _run(name: str, hook: Hook, module: ModuleType) -> None:
    try:
        hook(module)
    except Exception as err:  # observing never breaks the program: the import goes on
        _session.internal_error(f"adapting {name} after its import", err)


def _sync() -> None:
    """The finder is on ``sys.meta_path`` exactly while a hook waits (under _lock)."""
    watching = _watch in sys.meta_path
    if _waiting and not watching:
        sys.meta_path.insert(0, _watch)
    elif not _waiting and watching:
        sys.meta_path.remove(_watch)


class _Watch:
    """The finder: finds nothing itself, but wraps the spec the next finder finds for a
    watched name so that the hooks run right after the module's code."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in _waiting:  # (read without the lock: a dict lookup, on every import)
            return None
        try:
            for finder in list(sys.meta_path):
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(name, path, target)
                if spec is not None:
                    break
            else:
                return None
            loader = spec.loader
            run = getattr(loader, "exec_module", None)
            if run is None:
                return None

            def exec_module(module: ModuleType) -> None:
                run(module)
                with _lock:
                    hooks = _waiting.pop(name, [])
                    _sync()
                for hook in hooks:
                    _run(name, hook, module)

            loader.exec_module = exec_module
            return spec
        except Exception as err:  # observing never breaks the program: the import goes on
            _session.internal_error(f"watching for {name}'s import", err)
            return None


_watch = _Watch()
